//! Reads over the TCP channel: a read asks the peer with a [`FrameKind::ReadRequest`] and
//! its bytes come back as a [`FrameKind::ReadData`] answer, in the order the requests went.
//! What waits (in the link's [`Session`](crate::session::Session)) is each asked read's
//! destination, held (its memory cannot be freed) until its bytes are placed or the link ends.
//!
//! Over shared memory a read needs none of this: the reader copies out of its mapping of the
//! peer's region.

use crate::region::RegionMemory;
use crate::session::AwaitedRead;
use crate::wire::{Frame, FrameKind};
use rdma_hint_core::WriteOp;
use std::sync::Arc;

/// A read of ours whose bytes have not come back yet.
#[derive(Debug)]
pub(crate) struct PendingRead {
    pub(crate) wr_id: u64,
    /// Where its bytes go.
    pub(crate) local: Arc<RegionMemory>,
    pub(crate) local_offset: u64,
    pub(crate) len: u64,
    pub(crate) signalled: bool,
}

impl AwaitedRead for PendingRead {
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    fn asked_bytes(&self) -> u64 {
        self.len
    }
}

/// The request for `op` (a read's ranges: `remote` is the peer's region).
pub(crate) fn request_frame(op: &WriteOp) -> Frame {
    Frame {
        kind: FrameKind::ReadRequest,
        flags: 0,
        status: 0,
        region: op.remote.0,
        offset: op.remote_offset,
        len: op.len,
        wr_id: op.wr_id,
        imm: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Inbox;
    use crate::session::Session;
    use crate::wire::ChannelKind;
    use rdma_hint_core::MemoryKind;
    use std::time::Instant;

    #[test]
    fn a_waiting_read_holds_its_destination_until_the_end_lets_it_go() {
        let local = Arc::new(RegionMemory::allocate(MemoryKind::Host, 4096, false).unwrap());
        let inbox = Arc::new(Inbox::new(ChannelKind::Tcp, &[(0, 4096)], 1 << 20));
        let mut session = Session::new(inbox, 2, Instant::now());
        let read = PendingRead { wr_id: 4, local: local.clone(), local_offset: 0, len: 64, signalled: true };
        session.reserve_reads(1).unwrap();
        session.asked_read(read, Instant::now()).unwrap();
        assert!(session.awaits_answers());
        assert_eq!(Arc::strong_count(&local), 2);
        drop(session.end());
        assert_eq!(Arc::strong_count(&local), 1);
    }
}
