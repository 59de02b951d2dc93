//! The timed part of a calibration: the ladder of sizes its budget allows, and the
//! interleaved rounds that time them.

use super::ladder::{cut_to, time_cap, Ladder};
use super::{
    invalid, median, Error, BASE_SHARE, BUDGET_CEILING, LADDER_TOP_BYTES, LARGE_BLOCK_SHARE, MAX_ROUNDS,
    MIN_BLOCKS_PER_RUN, MIN_ROUNDS, UNIFORM_BYTES,
};
use rdma_hint_core::fit::BlockSamples;
use std::time::Instant;

/// The clock a calibration keeps against its budget.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) started: Instant,
    pub(super) seconds: f64,
}

impl Budget {
    pub(super) fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// The block sizes a calibration times, each with its transfer length: a warm-up and a first
/// rate, a ladder of powers of two from `align` that fits the region and the first rounds'
/// share of the budget, and the slowest sizes' transfers cut to a common time where the
/// rounds would not fit.
pub(super) fn ladder_sizes(
    path: &mut Ladder<'_>,
    align: u64,
    region: u64,
    budget: Budget,
) -> Result<Vec<(u64, u64)>, Error> {
    // Warm-up and a first rate: one transfer of 64 KiB blocks (or the alignment's, if larger).
    let warm_block = align.max(64 << 10).min(region / MIN_BLOCKS_PER_RUN / align * align);
    let warm_len = (MIN_BLOCKS_PER_RUN * 4 * warm_block).min(region / warm_block * warm_block);
    path.time(warm_block, warm_len)?;
    let rate_bytes_per_s = warm_len as f64 / path.time(warm_block, warm_len)?;

    // The ladder: powers of two from the alignment while MIN_ROUNDS transfers of MIN_BLOCKS
    // blocks of every size fit the region and the first rounds' share of the budget.
    let base_s = budget.seconds * BASE_SHARE - budget.elapsed();
    let mut ladder = Vec::new();
    let mut block = align;
    while block <= LADDER_TOP_BYTES && block * MIN_BLOCKS_PER_RUN <= region {
        ladder.push(block);
        block *= 2;
    }
    // One round more than the fewest: the first is a warm-up and not kept.
    let slot_s = base_s / ((MIN_ROUNDS + 1) * ladder.len()) as f64;
    // Every size streams the same bytes per transfer (as a sweep does, so all see the same
    // caches), unless the time cap below cuts the slowest: as many as a slot holds at the
    // first rate, at most UNIFORM_BYTES (and half the region); sizes whose MIN_BLOCKS_PER_RUN
    // blocks do not fit that are left out. Where the first rate was taken at the ladder's
    // smallest block (GPU memory's 64 KiB page), on the curve's steepest part, larger blocks
    // join while their fewest blocks take at most LARGE_BLOCK_SHARE of a first round's share at
    // that rate: over loopback tcp from GPU memory on an H100 host that rate (1.7 GB/s, under
    // half the plateau) cut the ladder at 512 KiB-1 MiB where the sweeps still rose to 2 MiB,
    // and calibration answered 256-448 KiB against their 512 KiB-1 MiB knee (4, 1 and 2 of 5
    // met the rule; 5 and 5 with the longer ladder). Host memory's first rate, at the ladder's
    // fifth block, is near its plateau already; a longer ladder there reads the loopback tcp
    // curve's fall past 512 KiB and its noisy recovery at 2-4 MiB, and the 2-core machine's
    // answers spread 4.3x.
    let uniform =
        ((rate_bytes_per_s * slot_s) as u64).clamp(MIN_BLOCKS_PER_RUN * align, UNIFORM_BYTES.min(region / 2));
    let large_s = budget.seconds * BASE_SHARE / (MIN_ROUNDS + 1) as f64 * LARGE_BLOCK_SHARE;
    let steep_first_rate = warm_block <= align;
    ladder.retain(|block| {
        let fewest = block * MIN_BLOCKS_PER_RUN;
        fewest <= uniform
            || *block <= warm_block
            || (steep_first_rate && fewest as f64 / rate_bytes_per_s <= large_s)
    });
    if ladder.len() < 3 {
        return Err(invalid(format!(
            "the path moves {:.3} GB/s: {:.2} s is too short for {MIN_ROUNDS} rounds of three block sizes; give a longer budget",
            rate_bytes_per_s / 1e9,
            budget.seconds
        )));
    }
    let mut sizes: Vec<(u64, u64)> = ladder
        .iter()
        .map(|&block| (block, uniform.max(block * MIN_BLOCKS_PER_RUN).min(region) / block * block))
        .collect();
    // The first rate is the warm-up's block's; smaller blocks can be far slower per byte (over
    // a loaded loopback socket, 4 KiB streamed at 0.09 GB/s where 64 KiB ran at 1.2), and at
    // the uniform length their rounds outlast the budget. A probe of MIN_BLOCKS_PER_RUN blocks
    // per size tells; where the rounds would not fit the first rounds' share, the slowest
    // sizes' transfers are cut to a common time (never below MIN_BLOCKS_PER_RUN blocks) and
    // the rest keep the uniform length.
    let mut per_block_s = Vec::with_capacity(sizes.len());
    for &(block, _) in &sizes {
        // Twice, the faster kept: a size's first transfer pays for pages and caches, and one
        // slow probe would keep that size cut for the whole calibration.
        let probe = MIN_BLOCKS_PER_RUN * block;
        let seconds = path.time(block, probe)?.min(path.time(block, probe)?);
        per_block_s.push(seconds / MIN_BLOCKS_PER_RUN as f64);
    }
    let estimates: Vec<f64> =
        sizes.iter().zip(&per_block_s).map(|(&(block, len), s)| s * (len / block) as f64).collect();
    let round_share_s = (budget.seconds * BASE_SHARE - budget.elapsed()) / (MIN_ROUNDS + 1) as f64;
    if let Some(cap_s) = time_cap(&estimates, round_share_s) {
        tracing::debug!(cap_s, ?estimates, "calibration: the slowest sizes' transfers are cut");
        cut_to(&mut sizes, &per_block_s, cap_s);
    }
    Ok(sizes)
}

/// The rounds timed so far: per ladder size, the streams' seconds per block and the single
/// blocks' seconds.
pub(super) struct Rounds {
    pub(super) samples: Vec<BlockSamples>,
    pub(super) singles: Vec<Vec<f64>>,
    pub(super) taken: usize,
    /// What the next round is expected to take: the median of the rounds so far, so that one
    /// stall (a preempted VM) does not end the rounds after it; against the budget's ceiling,
    /// the larger of that and the last round, so a slow spell still going on is not forgotten.
    round_times: Vec<f64>,
    round_s: f64,
    last_round_s: f64,
}

impl Rounds {
    /// No round yet, after a warm-up round of every size, not kept (a size's first transfer
    /// pays for pages and caches the next ones do not).
    pub(super) fn after_warm_up(path: &mut Ladder<'_>, sizes: &[(u64, u64)]) -> Result<Rounds, Error> {
        for &(block, len) in sizes {
            path.time(block, len)?;
        }
        Ok(Rounds {
            samples: sizes
                .iter()
                .map(|&(block_bytes, _)| BlockSamples { block_bytes, seconds_per_block: Vec::new() })
                .collect(),
            singles: vec![Vec::new(); sizes.len()],
            taken: 0,
            round_times: Vec::with_capacity(MAX_ROUNDS),
            round_s: 0.0,
            last_round_s: 0.0,
        })
    }

    /// Times rounds while the next one is expected to end by `until_s` (seconds into the
    /// budget), the fewest ([`MIN_ROUNDS`]) included, none past the budget's ceiling.
    pub(super) fn run(
        &mut self,
        path: &mut Ladder<'_>,
        sizes: &[(u64, u64)],
        budget: Budget,
        until_s: f64,
    ) -> Result<(), Error> {
        // The fewest rounds are taken even past `until_s`, but never past the budget itself.
        while self.taken < MAX_ROUNDS
            && (self.taken < MIN_ROUNDS || budget.elapsed() + self.round_s <= until_s)
            && budget.elapsed() + self.round_s.max(self.last_round_s) <= budget.seconds * BUDGET_CEILING
        {
            let round_started = Instant::now();
            for (index, &(block, len)) in sizes.iter().enumerate() {
                let seconds = path.time(block, len)?;
                self.samples[index].seconds_per_block.push(seconds / (len / block) as f64);
                // One block alone, post to completion: what a transfer's first block costs,
                // right after a stream here, and below after other single blocks, away from
                // where the streams run (an application's small transfers follow both; the
                // shared-memory paths stream a copy that continues a long run of adjacent
                // writes past the cache, and copy one elsewhere plainly).
                self.singles[index].push(path.time(block, block)?);
            }
            for (index, &(block, _)) in sizes.iter().enumerate() {
                self.singles[index].push(path.time_apart(block)?);
            }
            path.rejoin_run(sizes)?;
            self.last_round_s = round_started.elapsed().as_secs_f64();
            self.round_times.push(self.last_round_s);
            self.round_s = median(&mut self.round_times);
            self.taken += 1;
        }
        Ok(())
    }
}
