//! Reads over the TCP channel: a read asks the peer with a [`FrameKind::ReadRequest`] and
//! its bytes come back as a [`FrameKind::ReadData`] answer, in the order the requests went.
//! What waits here is each asked read's destination, held (its memory cannot be freed) until
//! its bytes are placed or the link ends.
//!
//! Over shared memory a read needs none of this: the reader copies out of its mapping of the
//! peer's region.

use crate::region::RegionMemory;
use crate::wire::{Frame, FrameKind};
use rdma_hint_core::WriteOp;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

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

/// The reads waiting for their answers, oldest first, at most `max` of them (what the peer's
/// window of queued answers admits).
#[derive(Debug)]
pub(crate) struct Reads {
    waiting: Mutex<Waiting>,
    max: usize,
}

/// The queue, and whether it was drained for good (the link's reader ended).
#[derive(Debug, Default)]
struct Waiting {
    reads: VecDeque<PendingRead>,
    closed: bool,
}

impl Reads {
    pub(crate) fn new(max: usize) -> Reads {
        Reads { waiting: Mutex::new(Waiting { reads: VecDeque::with_capacity(max), closed: false }), max }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads that may still be asked.
    pub(crate) fn room(&self) -> usize {
        self.max.saturating_sub(self.waiting().reads.len())
    }

    /// `read` is about to be asked: recorded before its request leaves, so its answer cannot
    /// overtake it. Handed back once the queue was drained for good (nobody would answer it).
    pub(crate) fn ask(&self, read: PendingRead) -> Result<(), PendingRead> {
        let mut waiting = self.waiting();
        if waiting.closed {
            return Err(read);
        }
        waiting.reads.push_back(read);
        Ok(())
    }

    /// The tag and length the next answer must carry.
    pub(crate) fn next(&self) -> Option<(u64, u64)> {
        self.waiting().reads.front().map(|read| (read.wr_id, read.len))
    }

    /// The oldest read, its answer admitted.
    pub(crate) fn take(&self) -> Option<PendingRead> {
        self.waiting().reads.pop_front()
    }

    /// Every read still waiting, at the link's end: none will be answered, and none is asked
    /// after this.
    pub(crate) fn drain(&self) -> Vec<PendingRead> {
        let mut waiting = self.waiting();
        waiting.closed = true;
        waiting.reads.drain(..).collect()
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

/// The header of the answer to the peer's read `wr_id`: `len` bytes follow.
pub(crate) fn answer_frame(region: u32, wr_id: u64, len: u64) -> Frame {
    Frame { kind: FrameKind::ReadData, flags: 0, status: 0, region, offset: 0, len, wr_id, imm: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_hint_core::MemoryKind;

    fn pending(wr_id: u64) -> PendingRead {
        let local = Arc::new(RegionMemory::allocate(MemoryKind::Host, 4096, false).unwrap());
        PendingRead { wr_id, local, local_offset: 0, len: 64, signalled: true }
    }

    #[test]
    fn answers_are_awaited_in_the_order_the_reads_were_asked_within_the_window() {
        let reads = Reads::new(2);
        assert_eq!((reads.room(), reads.next()), (2, None));
        reads.ask(pending(4)).unwrap();
        reads.ask(pending(5)).unwrap();
        assert_eq!((reads.room(), reads.next()), (0, Some((4, 64))));
        assert_eq!(reads.take().map(|read| read.wr_id), Some(4));
        assert_eq!(reads.next(), Some((5, 64)));
        let left = reads.drain();
        assert_eq!((left.len(), reads.room()), (1, 2));
        assert!(reads.ask(pending(6)).is_err(), "asked after the reader ended");
        // The destination is held while its read waits, and let go with it.
        assert_eq!(Arc::strong_count(&left[0].local), 1);
    }
}
