//! What a caller asks the engine to move, and the checks a request passes before the engine
//! takes it: every segment inside both regions, nothing empty, nothing past the bounds.

use rdma_hint_core::{ErrorKind, LocalRegion, RegionId, RemoteRegion, SourceId};
use thiserror::Error;

/// Segments one request may list, at most (a paged KV cache of 1 Mi pages).
pub const MAX_SEGMENTS: usize = 1 << 20;

/// One contiguous piece of a transfer: `len` bytes from `local[local_offset..]` to
/// `remote[remote_offset..]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Start in the local region, in bytes.
    pub local_offset: u64,
    /// Start in the remote region, in bytes.
    pub remote_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// How a transfer's blocks are queued against other transfers on the same connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Class {
    /// Blocks interleave with every other bulk transfer's, one block per turn.
    #[default]
    Bulk,
    /// Control traffic: its blocks go before any bulk block not yet posted.
    LatencyFirst,
}

#[derive(Debug, Clone)]
pub(crate) enum Segments {
    One(Segment),
    Many(Vec<Segment>),
}

impl Segments {
    pub(crate) fn as_slice(&self) -> &[Segment] {
        match self {
            Segments::One(segment) => std::slice::from_ref(segment),
            Segments::Many(segments) => segments,
        }
    }
}

/// A transfer for [`Engine::submit`](crate::Engine::submit): a single range, or a scatter
/// (paged) list of ranges between one local and one remote region.
///
/// ```
/// use rdma_hint_engine::{Segment, TransferRequest};
/// use rdma_hint_core::{LocalRegion, MemoryKind, RegionId, RemoteRegion};
/// let local = LocalRegion { id: RegionId(0), kind: MemoryKind::Host, len: 1 << 20 };
/// let remote = RemoteRegion { id: RegionId(0), len: 1 << 20 };
/// let single = TransferRequest::single(&local, 0, &remote, 4096, 65_536).notify(7);
/// assert_eq!(single.len(), 65_536);
/// // Eight scattered 16 KiB pages, landing back to back at the remote end.
/// let pages: Vec<Segment> = (0..8u64)
///     .map(|page| Segment { local_offset: (7 - page) * 32_768, remote_offset: page * 16_384, len: 16_384 })
///     .collect();
/// assert_eq!(TransferRequest::scatter(&local, &remote, pages).len(), 8 * 16_384);
/// ```
#[derive(Debug, Clone)]
pub struct TransferRequest {
    pub(crate) local: LocalRegion,
    pub(crate) remote: RemoteRegion,
    pub(crate) segments: Segments,
    pub(crate) notify: Option<u32>,
    pub(crate) source: Option<SourceId>,
    pub(crate) class: Class,
    /// Fetches the remote ranges into the local ones (an RDMA read) instead of writing.
    pub(crate) read: bool,
}

impl TransferRequest {
    /// `len` bytes from `local[local_offset..]` to `remote[remote_offset..]`.
    pub fn single(
        local: &LocalRegion,
        local_offset: u64,
        remote: &RemoteRegion,
        remote_offset: u64,
        len: u64,
    ) -> TransferRequest {
        let segment = Segment { local_offset, remote_offset, len };
        TransferRequest::new(local, remote, Segments::One(segment))
    }

    /// Every segment of `segments`, in order, from `local` to `remote`. Segments that continue
    /// each other on both sides are merged into one run before blocks are cut.
    pub fn scatter(local: &LocalRegion, remote: &RemoteRegion, segments: Vec<Segment>) -> TransferRequest {
        TransferRequest::new(local, remote, Segments::Many(segments))
    }

    fn new(local: &LocalRegion, remote: &RemoteRegion, segments: Segments) -> TransferRequest {
        TransferRequest {
            local: *local,
            remote: *remote,
            segments,
            notify: None,
            source: None,
            class: Class::Bulk,
            read: false,
        }
    }

    /// Announces the transfer to the receiver with `imm` once every byte of it has landed.
    pub fn notify(self, imm: u32) -> TransferRequest {
        TransferRequest { notify: Some(imm), ..self }
    }

    /// Cuts the blocks with `source`'s hint instead of the local region's device's.
    pub fn from_source(self, source: SourceId) -> TransferRequest {
        TransferRequest { source: Some(source), ..self }
    }

    /// Reads instead: each segment's remote range (of memory the peer exposed) is fetched into
    /// its local range, in blocks of the local region's device's hint, as its write would be
    /// cut. A read announces nothing to the peer: with [`notify`](Self::notify) it is
    /// refused ([`RequestError::NotifyOnRead`]).
    pub fn read(self) -> TransferRequest {
        TransferRequest { read: true, ..self }
    }

    /// Queues the transfer as control traffic, ahead of bulk blocks.
    pub fn latency_first(self) -> TransferRequest {
        TransferRequest { class: Class::LatencyFirst, ..self }
    }

    /// Payload bytes of all segments (saturating: an absurd list is refused at submit).
    pub fn len(&self) -> u64 {
        self.segments.as_slice().iter().fold(0u64, |sum, segment| sum.saturating_add(segment.len))
    }

    /// Whether the request moves no byte (which submit refuses).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The local region the request reads from (or, for a [`read`](Self::read), into).
    pub fn local_region(&self) -> RegionId {
        self.local.id
    }
}

/// Why the engine refused a request or a peer. Nothing was posted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RequestError {
    /// A request with no segment.
    #[error("the request lists no segment")]
    NoSegments,
    /// More segments than [`MAX_SEGMENTS`].
    #[error("{given} segments exceed the limit of {max}")]
    TooManySegments {
        /// Listed.
        given: usize,
        /// Allowed.
        max: usize,
    },
    /// A segment of zero bytes.
    #[error("segment {segment} has zero length")]
    ZeroLength {
        /// Its index in the request.
        segment: usize,
    },
    /// A segment that runs past the end of a region (or overflows).
    #[error("segment {segment}: {side} range {offset}+{len} B lies outside the {region_len} B region")]
    OutOfRegion {
        /// Its index in the request.
        segment: usize,
        /// `local` or `remote`.
        side: &'static str,
        /// Offset in bytes.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Region length in bytes.
        region_len: u64,
    },
    /// The peer never exposed this remote region, or exposed it with another length.
    #[error("remote region {id:?} of {len} B is not one the peer exposed")]
    UnknownRemoteRegion {
        /// The region named.
        id: RegionId,
        /// The length given for it.
        len: u64,
    },
    /// A peer id this engine never handed out.
    #[error("peer {0} is not one of this engine's")]
    UnknownPeer(u32),
    /// No block hint for the request's source: set one with `Engine::set_hint`.
    #[error("no block hint set for {0}; call Engine::set_hint first")]
    NoHint(SourceId),
    /// A dma-buf region names no device whose hint could cut it.
    #[error("a dma-buf region has no known source device; name it with TransferRequest::from_source")]
    UnknownSource,
    /// Every transfer slot is taken: wait for one to finish, or use `submit_when_ready`.
    #[error("all {max_transfers} transfer slots are in use")]
    Full {
        /// Transfers the engine tracks at once.
        max_transfers: u32,
    },
    /// A peer with no lane, too many lanes, or too many peers.
    #[error("invalid peer: {0}")]
    InvalidPeer(String),
    /// The local region cannot be held for the transfer on the peer's lanes (not registered
    /// there, say).
    #[error("local region {id:?}: {why}")]
    LocalRegion {
        /// The region named.
        id: RegionId,
        /// What the lane answered.
        why: String,
    },
    /// The source's hint was set for another transport than the peer's lanes
    /// ([`Engine::set_size_hint`](crate::Engine::set_size_hint)).
    #[error("the hint for {memory} was set for {hinted}, and this peer's lanes are {lanes}: set the {lanes} hint too (or one for any transport with Engine::set_hint)")]
    HintForAnotherTransport {
        /// The transfer's source.
        memory: SourceId,
        /// A transport the source has a hint for.
        hinted: String,
        /// The peer's lanes' transport.
        lanes: String,
    },
    /// Every lane of the peer's connection has failed: open a new connection.
    #[error("every lane to the peer has failed ({0}); add a new connection")]
    PeerGone(String),
    /// A read asked to announce itself: only a write carries an immediate to the peer.
    #[error("a read cannot notify the peer: only writes carry an immediate")]
    NotifyOnRead,
    /// The engine is shutting down.
    #[error("the engine is shutting down")]
    Stopped,
}

impl RequestError {
    /// What kind of refusal this is: the request's own fault, every slot taken
    /// ([`ErrorKind::Busy`]), a peer with no lane left, or an engine shutting down.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RequestError::Full { .. } => ErrorKind::Busy,
            RequestError::PeerGone(_) => ErrorKind::Peer,
            RequestError::Stopped => ErrorKind::Cancelled,
            RequestError::NoSegments
            | RequestError::TooManySegments { .. }
            | RequestError::ZeroLength { .. }
            | RequestError::OutOfRegion { .. }
            | RequestError::UnknownRemoteRegion { .. }
            | RequestError::UnknownPeer(_)
            | RequestError::NoHint(_)
            | RequestError::UnknownSource
            | RequestError::InvalidPeer(_)
            | RequestError::LocalRegion { .. }
            | RequestError::HintForAnotherTransport { .. }
            | RequestError::NotifyOnRead => ErrorKind::InvalidInput,
        }
    }
}

/// Checks `segments` against a local region of `local_len` and a remote one of `remote_len`
/// bytes and merges the ones that continue each other on both sides, in place. Returns the
/// payload bytes.
///
/// ```
/// use rdma_hint_engine::{validate_segments, RequestError, Segment};
/// let mut segments = vec![
///     Segment { local_offset: 0, remote_offset: 0, len: 4096 },
///     Segment { local_offset: 4096, remote_offset: 4096, len: 4096 }, // continues the first
///     Segment { local_offset: 65_536, remote_offset: 8192, len: 4096 },
/// ];
/// assert_eq!(validate_segments(&mut segments, 1 << 20, 1 << 20), Ok(12_288));
/// assert_eq!(segments.len(), 2);
/// let mut past_end = vec![Segment { local_offset: u64::MAX, remote_offset: 0, len: 2 }];
/// assert!(matches!(validate_segments(&mut past_end, 1 << 20, 1 << 20),
///                  Err(RequestError::OutOfRegion { side: "local", .. })));
/// ```
pub fn validate_segments(
    segments: &mut Vec<Segment>,
    local_len: u64,
    remote_len: u64,
) -> Result<u64, RequestError> {
    check_all(segments, local_len, remote_len)?;
    let mut kept = 0;
    for index in 0..segments.len() {
        let next = segments[index];
        if kept > 0 {
            let previous = &mut segments[kept - 1];
            if previous.local_offset + previous.len == next.local_offset
                && previous.remote_offset + previous.len == next.remote_offset
            {
                previous.len += next.len;
                continue;
            }
        }
        segments[kept] = next;
        kept += 1;
    }
    segments.truncate(kept);
    segments.iter().try_fold(0u64, |sum, segment| sum.checked_add(segment.len)).ok_or(
        RequestError::OutOfRegion {
            segment: 0,
            side: "local",
            offset: 0,
            len: u64::MAX,
            region_len: local_len,
        },
    )
}

/// The checks without the merge (for one inline segment).
pub(crate) fn check_all(segments: &[Segment], local_len: u64, remote_len: u64) -> Result<(), RequestError> {
    if segments.is_empty() {
        return Err(RequestError::NoSegments);
    }
    if segments.len() > MAX_SEGMENTS {
        return Err(RequestError::TooManySegments { given: segments.len(), max: MAX_SEGMENTS });
    }
    for (index, segment) in segments.iter().enumerate() {
        if segment.len == 0 {
            return Err(RequestError::ZeroLength { segment: index });
        }
        check_side(index, "local", segment.local_offset, segment.len, local_len)?;
        check_side(index, "remote", segment.remote_offset, segment.len, remote_len)?;
    }
    Ok(())
}

fn check_side(
    segment: usize,
    side: &'static str,
    offset: u64,
    len: u64,
    region_len: u64,
) -> Result<(), RequestError> {
    if offset.checked_add(len).is_none_or(|end| end > region_len) {
        return Err(RequestError::OutOfRegion { segment, side, offset, len, region_len });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bad_lists_are_refused_by_kind() {
        let segment = |local_offset, remote_offset, len| Segment { local_offset, remote_offset, len };
        assert_eq!(validate_segments(&mut vec![], 64, 64), Err(RequestError::NoSegments));
        assert_eq!(
            validate_segments(&mut vec![segment(0, 0, 0)], 64, 64),
            Err(RequestError::ZeroLength { segment: 0 })
        );
        let remote_past_end = validate_segments(&mut vec![segment(0, 0, 8), segment(8, 60, 8)], 64, 64);
        assert!(matches!(remote_past_end, Err(RequestError::OutOfRegion { segment: 1, side: "remote", .. })));
    }

    proptest! {
        /// Whatever the list, an accepted one keeps its bytes and stays inside both regions.
        #[test]
        fn accepted_lists_stay_inside_and_keep_their_bytes(
            raw in proptest::collection::vec((0u64..96, 0u64..96, 0u64..40), 0..12),
        ) {
            let mut segments: Vec<Segment> =
                raw.iter().map(|&(l, r, n)| Segment { local_offset: l, remote_offset: r, len: n }).collect();
            let before: u64 = segments.iter().map(|s| s.len).sum();
            if let Ok(total) = validate_segments(&mut segments, 100, 100) {
                prop_assert_eq!(total, before);
                prop_assert_eq!(segments.iter().map(|s| s.len).sum::<u64>(), before);
                for s in &segments {
                    prop_assert!(s.len > 0 && s.local_offset + s.len <= 100 && s.remote_offset + s.len <= 100);
                }
            }
        }
    }
}
