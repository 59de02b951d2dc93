//! [`ErrorKind`]: what the caller can do about an error, the same question for the three error
//! types an embedder handles (the facade's `Error`, [`TransportError`](crate::TransportError),
//! the engine's `TransferError`), each of which answers it with `kind()`.

/// What kind of failure an error is: what the caller can do about it, whichever operation
/// failed. Matching on it needs no knowledge of the variants, which grow.
///
/// ```
/// use rdma_hint_core::{ErrorKind, RegionId, TransportError};
/// let busy = TransportError::RegionBusy { region: RegionId(3), why: "ops in flight" };
/// assert_eq!(busy.kind(), ErrorKind::Busy); // try again once what holds it has finished
/// let gone = TransportError::PeerGone("closed".into());
/// assert_eq!(gone.kind(), ErrorKind::Peer); // connect again
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The call was wrong (an argument, a region, an id, a size, a state such as connecting
    /// twice): fix the call; retrying it as is fails again.
    InvalidInput,
    /// Not here: a backend, device, feature, route or calibration this machine or build does
    /// not have.
    Unsupported,
    /// Held or full for now (a region with ops in flight, a full queue, every transfer slot
    /// taken): retry once what holds it has finished.
    Busy,
    /// A limit ran out (memory, a memory cap, the registrations a device allows).
    Exhausted,
    /// A deadline passed first (some operations go on: see the variant).
    Deadline,
    /// The peer: gone, refusing, busy with another, or failing authentication or the
    /// handshake. Connect again (with the right token, to the right address).
    Peer,
    /// Cancelled by the caller, or the engine stopped.
    Cancelled,
    /// The machine or a library below failed (I/O, a driver, an op's completion status, a
    /// file the cache could not write).
    System,
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;
    use crate::{MemoryKind, RegionId, TransportError as E};

    #[test]
    fn each_transport_error_says_what_the_caller_can_do() {
        let cases = [
            (E::Unavailable { backend: "verbs", reason: "no device".into() }, ErrorKind::Unsupported),
            (E::UnsupportedMemory { kind: MemoryKind::DmaBuf }, ErrorKind::Unsupported),
            (
                E::OutOfMemory { len: 1 << 30, available: 0, limited_by: "the cap".into() },
                ErrorKind::Exhausted,
            ),
            (E::Registration { len: 4096, reason: "ENOMEM".into() }, ErrorKind::System),
            (E::OutOfBounds { side: "remote", offset: 1, len: 1, region_len: 1 }, ErrorKind::InvalidInput),
            (E::NotConnected, ErrorKind::InvalidInput),
            (E::QueueFull { given: 2, max: 1 }, ErrorKind::Busy),
            (E::RegionBusy { region: RegionId(1), why: "exposed" }, ErrorKind::Busy),
            (E::DeadlineExceeded { what: "a completion", waited_ms: 5 }, ErrorKind::Deadline),
            (E::PeerGone("closed".into()), ErrorKind::Peer),
            (E::Unauthorized { peer: "127.0.0.1:1".into() }, ErrorKind::Peer),
            (E::Handshake("bad hello".into()), ErrorKind::Peer),
            (E::Io(std::io::Error::other("disk")), ErrorKind::System),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error}");
        }
        // A refused registration is its reason's kind, the memory handed back.
        let refused = E::from(crate::Refused {
            error: E::OutOfMemory { len: 8, available: 0, limited_by: "the cap".into() },
            memory: crate::CallerMemory::from(vec![7u8; 8]),
        });
        assert_eq!(refused.kind(), ErrorKind::Exhausted);
        assert!(matches!(refused, E::MemoryRefused { ref memory, .. } if memory.len() == 8));
        let driver = E::Driver { call: "cuMemAlloc", detail: "out of memory".into() };
        assert_eq!(driver.kind(), ErrorKind::System);
    }
}
