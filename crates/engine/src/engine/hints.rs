//! The block specs an engine cuts transfers with: per source, for one transport (a
//! [`SizeHint`](rdma_hint_core::SizeHint) names the transport it was computed for) or for any.

use super::request::RequestError;
use crate::plan::BlockSpec;
use rdma_hint_core::{SourceId, TransportId};
use std::collections::BTreeMap;

/// Every source's specs.
#[derive(Debug, Default)]
pub(crate) struct Hints(BTreeMap<SourceId, SourceHints>);

#[derive(Debug, Default)]
struct SourceHints {
    /// Set without a transport ([`Engine::set_hint`](crate::Engine::set_hint)): any lane.
    any: Option<BlockSpec>,
    /// Set from a hint of one transport: lanes of that transport only.
    by_transport: Vec<(TransportId, BlockSpec)>,
}

impl Hints {
    /// Sets `source`'s spec for lanes of `transport`; `None`: for every lane, replacing the
    /// specs set for single transports too (the last word on the source).
    pub(crate) fn set(&mut self, source: SourceId, transport: Option<TransportId>, spec: BlockSpec) {
        let hints = self.0.entry(source).or_default();
        match transport {
            None => {
                hints.any = Some(spec);
                hints.by_transport.clear();
            }
            Some(transport) => match hints.by_transport.iter_mut().find(|(id, _)| *id == transport) {
                Some((_, held)) => *held = spec,
                None => hints.by_transport.push((transport, spec)),
            },
        }
    }

    /// The spec transfers from `source` over lanes of `transport` are cut with: the one set
    /// for that transport, else the one for any. A hint set only for other transports is
    /// refused, naming both (a shm hint of 16 KiB on tcp lanes ran at a third of their
    /// plateau, silently). Allocates only to refuse.
    pub(crate) fn spec(&self, source: SourceId, transport: &TransportId) -> Result<BlockSpec, RequestError> {
        let Some(hints) = self.0.get(&source) else { return Err(RequestError::NoHint(source)) };
        if let Some((_, spec)) = hints.by_transport.iter().find(|(id, _)| id == transport) {
            return Ok(*spec);
        }
        match (hints.any, hints.by_transport.first()) {
            (Some(spec), _) => Ok(spec),
            (None, Some((hinted, _))) => Err(RequestError::HintForAnotherTransport {
                memory: source,
                hinted: hinted.to_string(),
                lanes: transport.to_string(),
            }),
            (None, None) => Err(RequestError::NoHint(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_answers_lanes_of_its_own_transport_only() {
        let mut hints = Hints::default();
        let (shm, tcp) = (BlockSpec::new(16 << 10, 4096).unwrap(), BlockSpec::new(512 << 10, 4096).unwrap());
        hints.set(SourceId::Host(0), Some(TransportId::STAGED_SHM), shm);
        assert_eq!(hints.spec(SourceId::Host(0), &TransportId::STAGED_SHM), Ok(shm));
        let refused = hints.spec(SourceId::Host(0), &TransportId::STAGED_TCP).unwrap_err();
        assert!(
            matches!(&refused, RequestError::HintForAnotherTransport { hinted, lanes, .. }
            if hinted == "staged:shm" && lanes == "staged:tcp"),
            "{refused}"
        );
        hints.set(SourceId::Host(0), Some(TransportId::STAGED_TCP), tcp);
        assert_eq!(hints.spec(SourceId::Host(0), &TransportId::STAGED_TCP), Ok(tcp));
        assert_eq!(
            hints.spec(SourceId::Host(1), &TransportId::STAGED_TCP),
            Err(RequestError::NoHint(SourceId::Host(1)))
        );
        // A spec for any transport answers where none of its own was set.
        hints.set(SourceId::Host(2), None, tcp);
        assert_eq!(hints.spec(SourceId::Host(2), &TransportId::STAGED_SHM), Ok(tcp));
        // A spec for every transport is the last word: it replaces the transport's own.
        hints.set(SourceId::Host(0), None, shm);
        assert_eq!(hints.spec(SourceId::Host(0), &TransportId::STAGED_TCP), Ok(shm));
    }
}
