//! The ladder of block sizes timed on the connected pair, and the cut that fits its transfers
//! into the budget.

use super::{Error, MIN_BLOCKS_PER_RUN, RUN_REJOIN_BYTES, TRANSFER_DEADLINE};
use crate::Device;
use rdma_hint_core::{LocalRegion, RemoteRegion, Transport};
use rdma_hint_engine::{BlockSpec, Chunker, PostPolicy, TransferRequest};
use std::time::Instant;

/// Where the next timed transfer starts: runs walk through the whole region, so each one
/// streams memory the previous ones did not just leave in the cache.
struct Cursor {
    offset: u64,
    region: u64,
    /// Runs walk on from 0 without gaps: everything below this was written.
    written: u64,
}

impl Cursor {
    fn next(&mut self, len: u64, align: u64) -> u64 {
        if self.offset + len > self.region {
            self.offset = 0;
        }
        let start = self.offset;
        self.offset = (start + len).div_ceil(align) * align;
        self.written = self.written.max(start + len);
        start
    }
}

/// The time `cap` that cuts the longest of `estimates` (seconds) so that they add up to
/// `total` (each becomes `min(estimate, cap)`); none when they fit already. A `total` too small
/// for anything gives 0 (every transfer then takes its fewest blocks).
pub(super) fn time_cap(estimates: &[f64], total: f64) -> Option<f64> {
    if estimates.iter().sum::<f64>() <= total {
        return None;
    }
    let mut sorted = estimates.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut left = total.max(0.0);
    for (index, estimate) in sorted.iter().enumerate() {
        let cap = left / (sorted.len() - index) as f64;
        if cap <= *estimate {
            return Some(cap);
        }
        left -= estimate;
    }
    None
}

/// Cuts each `(block, len)` transfer to the blocks `cap_s` holds at that size's seconds per
/// block: never below MIN_BLOCKS_PER_RUN blocks, never longer than it was (a size that probed
/// at 0 s keeps its length).
pub(super) fn cut_to(sizes: &mut [(u64, u64)], per_block_s: &[f64], cap_s: f64) {
    for ((block, len), seconds) in sizes.iter_mut().zip(per_block_s) {
        let most = *len / *block;
        // `f64::min` takes the number when the ratio is NaN (0 / 0); infinity is capped too.
        let blocks = (cap_s / seconds).min(most as f64) as u64;
        *len = blocks.max(MIN_BLOCKS_PER_RUN).min(most) * *block;
    }
}

/// The connected pair calibration times transfers on.
pub(super) struct Ladder<'a> {
    transport: &'a dyn Transport,
    source: Device,
    local: &'a LocalRegion,
    remote: &'a RemoteRegion,
    align: u64,
    chunker: Chunker,
    cursor: Cursor,
}

impl<'a> Ladder<'a> {
    pub(super) fn new(
        transport: &'a dyn Transport,
        source: Device,
        (local, remote): (&'a LocalRegion, &'a RemoteRegion),
        region: u64,
        align: u64,
    ) -> Result<Ladder<'a>, Error> {
        let chunker = Chunker::new(PostPolicy::default(), transport.capabilities())?;
        let cursor = Cursor { offset: 0, region, written: 0 };
        Ok(Ladder { transport, source, local, remote, align, chunker, cursor })
    }

    /// Streams `len` bytes in blocks of `block` from the cursor; the seconds it took.
    pub(super) fn time(&mut self, block: u64, len: u64) -> Result<f64, Error> {
        let at = self.cursor.next(len, self.align);
        self.time_at(block, len, at)
    }

    /// One block of host memory at the region's start (which the first transfer wrote: the
    /// same bytes land again), away from where the cursor's transfers run; GPU memory, which
    /// the copy engines move whatever came before, from the cursor. The seconds it took.
    pub(super) fn time_apart(&mut self, block: u64) -> Result<f64, Error> {
        match self.source {
            Device::Host(_) => self.time_at(block, block, 0),
            Device::Gpu(_) => self.time(block, block),
        }
    }

    /// After [`Ladder::time_apart`]: one untimed transfer from the cursor, in the ladder's
    /// largest blocks, long enough that the next round's first stream continues a run the
    /// shared-memory paths stream (else its first [`RUN_REJOIN_BYTES`] would be copied plainly,
    /// in every round, and only that size's).
    pub(super) fn rejoin_run(&mut self, sizes: &[(u64, u64)]) -> Result<(), Error> {
        if let (Device::Host(_), Some(&(block, len))) = (self.source, sizes.last()) {
            self.time(
                block,
                RUN_REJOIN_BYTES.div_ceil(block).max(1).saturating_mul(block).min(len.max(block)),
            )?;
        }
        Ok(())
    }

    /// Bytes from the region's start that the runs so far have written.
    pub(super) fn written(&self) -> u64 {
        self.cursor.written
    }

    fn time_at(&mut self, block: u64, len: u64, at: u64) -> Result<f64, Error> {
        self.chunker.set_hint(self.source, BlockSpec::new(block, self.align)?);
        let transfer = TransferRequest::single(self.local, at, self.remote, at, len);
        let started = Instant::now();
        self.chunker.transfer_blocking(
            self.transport,
            transfer.from_source(self.source),
            started + TRANSFER_DEADLINE,
        )?;
        Ok(started.elapsed().as_secs_f64())
    }
}
