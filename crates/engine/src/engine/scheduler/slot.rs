//! A transfer slot: where a transfer stands, which block of it goes next.

use super::super::request::{Segment, Segments};
use super::super::Delivered;
use crate::TransferError;
use rdma_hint_core::RegionId;
use std::time::Instant;

/// One posted work request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Posted {
    pub(super) seq: u64,
    pub(super) slot: u32,
    pub(super) generation: u64,
    pub(super) bytes: u64,
}

/// Where a transfer stands.
pub(super) enum Phase {
    Free,
    Running,
    Finished(Result<Delivered, TransferError>),
    /// Its result was handed out; posted blocks may still be retiring.
    Collected,
}

pub(super) struct Slot {
    pub(super) generation: u64,
    pub(super) phase: Phase,
    pub(super) peer: u32,
    pub(super) local: RegionId,
    pub(super) remote: RegionId,
    pub(super) segments: Segments,
    pub(super) segment: usize,
    pub(super) offset: u64,
    pub(super) block_bytes: u64,
    pub(super) notify: Option<u32>,
    /// Its blocks are reads.
    pub(super) read: bool,
    pub(super) deadline: Instant,
    pub(super) total: u64,
    pub(super) confirmed: u64,
    pub(super) blocks: u64,
    pub(super) in_flight: u64,
    pub(super) cancelled: bool,
    /// Lanes its blocks went to, a bit each.
    pub(super) lanes_used: u16,
    /// Whether it holds its local region on every lane of its peer (the driver took the
    /// hold at submit; an `Unhold` event ends it).
    pub(super) holds_source: bool,
    /// Latency-first: its time from queue to end teaches its peer's expected latency.
    pub(super) latency_first: bool,
    pub(super) queued_at: Instant,
}

/// One work request's worth of a transfer (see [`Slot::next_block`]).
pub(super) struct Block {
    /// The first piece's local offset.
    pub(super) local_offset: u64,
    pub(super) remote_offset: u64,
    pub(super) len: u64,
    /// Local ranges it gathers.
    pub(super) pieces: u32,
    /// Whether it is the transfer's last.
    pub(super) last: bool,
    /// Where the next block starts: segment and offset in it.
    segment: usize,
    offset: u64,
}

impl Slot {
    pub(super) fn free(now: Instant) -> Slot {
        Slot {
            generation: 0,
            phase: Phase::Free,
            peer: 0,
            local: RegionId(0),
            remote: RegionId(0),
            segments: Segments::One(Segment { local_offset: 0, remote_offset: 0, len: 0 }),
            segment: 0,
            offset: 0,
            block_bytes: 1,
            notify: None,
            read: false,
            deadline: now,
            total: 0,
            confirmed: 0,
            blocks: 0,
            in_flight: 0,
            cancelled: false,
            lanes_used: 0,
            holds_source: false,
            latency_first: false,
            queued_at: now,
        }
    }

    pub(super) fn running(&self) -> bool {
        matches!(self.phase, Phase::Running)
    }

    /// The next block: up to `block_bytes` from where the last one ended, packed with the
    /// segments after it while they land right behind it remotely, `max_pieces` local ranges
    /// at most (segments smaller than the hint share one work request). Each local range goes
    /// to `piece` as (offset, len). `None` once all are posted.
    pub(super) fn next_block(&self, max_pieces: u32, mut piece: impl FnMut(u64, u64)) -> Option<Block> {
        if let Some(block) = self.next_whole_block() {
            piece(block.local_offset, block.len);
            return Some(block);
        }
        let segments = self.segments.as_slice();
        let first = segments.get(self.segment)?;
        let (mut segment, mut offset) = (self.segment, self.offset);
        let (local_offset, remote_offset) = (first.local_offset + offset, first.remote_offset + offset);
        let (mut len, mut pieces) = (0, 0);
        loop {
            let at = segments[segment];
            let take = (at.len - offset).min(self.block_bytes - len);
            piece(at.local_offset + offset, take);
            (len, pieces, offset) = (len + take, pieces + 1, offset + take);
            if offset == at.len {
                (segment, offset) = (segment + 1, 0);
            }
            let continues =
                segments.get(segment).is_some_and(|next| next.remote_offset == remote_offset + len);
            if len == self.block_bytes || pieces == max_pieces || !continues {
                break;
            }
        }
        let last = segment == segments.len();
        Some(Block { local_offset, remote_offset, len, pieces, last, segment, offset })
    }

    /// [`next_block`](Self::next_block) where it is one piece and packs nothing: a whole
    /// block of the current segment, or the rest of the last one. `None` where it would pack
    /// the segments after it, or once all are posted.
    #[inline]
    pub(super) fn next_whole_block(&self) -> Option<Block> {
        let segments = self.segments.as_slice();
        let at = segments.get(self.segment)?;
        let left = at.len - self.offset;
        if left < self.block_bytes && self.segment + 1 < segments.len() {
            return None;
        }
        let len = left.min(self.block_bytes);
        let (segment, offset) =
            if len == left { (self.segment + 1, 0) } else { (self.segment, self.offset + len) };
        Some(Block {
            local_offset: at.local_offset + self.offset,
            remote_offset: at.remote_offset + self.offset,
            len,
            pieces: 1,
            last: segment == segments.len(),
            segment,
            offset,
        })
    }

    #[inline]
    pub(super) fn advance(&mut self, block: &Block) {
        (self.segment, self.offset) = (block.segment, block.offset);
        self.blocks += 1;
        self.in_flight += 1;
    }

    pub(super) fn all_posted(&self) -> bool {
        self.segment >= self.segments.as_slice().len()
    }

    /// Ends a running transfer with `result`; `false` if it had already ended.
    pub(super) fn end(&mut self, result: Result<Delivered, TransferError>) -> bool {
        if !self.running() {
            return false;
        }
        self.phase = Phase::Finished(result);
        true
    }
}
