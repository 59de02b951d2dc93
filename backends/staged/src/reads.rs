//! Reads over the TCP channel: a read asks the peer with a [`FrameKind::ReadRequest`] and
//! its bytes come back as a [`FrameKind::ReadData`] answer, in the order the requests went.
//! What waits (in an [`AnswerQueue`]) is each asked read's destination, held (its memory cannot
//! be freed) until its bytes are placed or the link ends.
//!
//! Over shared memory a read needs none of this: the reader copies out of its mapping of the
//! peer's region.

use crate::answers::AnswerQueue;
use crate::region::RegionMemory;
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

/// Our reads waiting for their bytes, oldest first.
pub(crate) type Reads = AnswerQueue<PendingRead>;

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

/// The header of the answer to the peer's read `wr_id`: `len` bytes follow.
pub(crate) fn answer_frame(region: u32, wr_id: u64, len: u64) -> Frame {
    Frame { kind: FrameKind::ReadData, flags: 0, status: 0, region, offset: 0, len, wr_id, imm: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_hint_core::MemoryKind;

    #[test]
    fn a_waiting_read_holds_its_destination_until_it_is_let_go() {
        let local = Arc::new(RegionMemory::allocate(MemoryKind::Host, 4096, false).unwrap());
        let reads = Reads::new(2);
        let read = PendingRead { wr_id: 4, local: local.clone(), local_offset: 0, len: 64, signalled: true };
        reads.push(read, &crate::answers::AnswerClock::new(std::time::Instant::now())).unwrap();
        assert_eq!(reads.front(|read| (read.wr_id, read.len)), Some((4, 64)));
        assert_eq!(Arc::strong_count(&local), 2);
        drop(reads.drain());
        assert_eq!(Arc::strong_count(&local), 1);
    }
}
