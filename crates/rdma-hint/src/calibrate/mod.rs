//! Calibration: time a ladder of block sizes on the live path for about a second, in
//! interleaved rounds, fit `t(s) = o + s/B` to the per-block times
//! ([`fit`](rdma_hint_core::fit)), give every figure an interval by bootstrap over the rounds,
//! store `o`, `B` and their margins in the hint cache and compute the hint from them (origin
//! `calibrated`).
//!
//! The model's constants were calibrated on two machines; on a third its hint can miss by 2×.
//! A fit on the path itself does not, as long as the curve has the model's shape; when it does
//! not (a poor fit), the calibration says why and the hint falls back to the recorded knee, or
//! the model's.

mod choice;
mod ladder;

use crate::error::Error;
use crate::loopback::LoopbackPair;
pub use crate::margins::{LadderTiming, Margins};
use crate::measured::{self, ladder_alignment, BlockRule, CalibratedPath};
use crate::open::{OpenOptions, TransportId};
use crate::Device;
use crate::HintCache;
use choice::{curve_crossing, curve_knee_of, flatness, overshoots, raised_block, robust_choice, Spread};
use ladder::{cut_to, time_cap, Ladder};
use rdma_hint_core::fit::{
    fit_path, median_interval, BlockSamples, BlockTiming, Interval, PathFit, CONFIDENCE,
};
use rdma_hint_core::model::{Factor, Reason};
use rdma_hint_core::{HintPolicy, SizeHint, SourceId};
use rdma_hint_core::{LocalRegion, RemoteRegion, Transport, TransportError};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The measuring time `rdma-hint calibrate` spends per path by default.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(1);
/// Longest budget accepted (a calibration is a quick look, a sweep is the long one).
pub const MAX_BUDGET: Duration = Duration::from_secs(600);
/// Largest block of the ladder: the default policy's largest hint.
pub const LADDER_TOP_BYTES: u64 = 4 << 20;
/// Region each end of [`calibrate_loopback`] registers, in bytes: as large as a sweep's
/// transfer, so blocks stream from memory as they do there, not from a warm cache.
pub const LOOPBACK_REGION_BYTES: u64 = 64 << 20;
/// Fewest blocks in one timed transfer: a stream, not one block.
const MIN_BLOCKS_PER_RUN: u64 = 8;
/// Deadline of one timed transfer.
const TRANSFER_DEADLINE: Duration = Duration::from_secs(30);

/// One block size as calibration measured it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalibrationPoint {
    /// Block size in bytes.
    pub block_bytes: u64,
    /// Median streaming bandwidth of the runs, in GB/s.
    pub gbps: f64,
    /// Median wall time per block, in µs.
    pub us_per_block: f64,
    /// Timed transfers at this size.
    pub runs: u32,
    /// Bytes per timed transfer.
    pub transfer_bytes: u64,
}

/// What a calibration found and the hint it gives.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// Memory source.
    pub source: SourceId,
    /// Transport id.
    pub transport: TransportId,
    /// The hint: `origin: calibrated` from the fit, or the recorded/model hint when the fit is
    /// poor (its last reason says why).
    pub hint: SizeHint,
    /// The fitted `o` and `B` (of the per-size medians) with goodness of fit and the points it
    /// left out.
    pub fit: PathFit,
    /// The intervals of the figures (none for a poor fit).
    pub margins: Option<Margins>,
    /// How far below the plateau the smallest and the hinted blocks sit (none for a poor fit).
    pub flatness: Option<Flatness>,
    /// Interleaved rounds timed (each one transfer of every ladder size).
    pub rounds: usize,
    /// Whether the hint's interval was too wide after the first rounds, so more were timed.
    pub measured_longer: bool,
    /// The block this run answered alone, in bytes (none for a poor fit); `hint` answers the
    /// median of [`Calibration::pooled_blocks_bytes`].
    pub own_block_bytes: Option<u64>,
    /// The blocks of the calibrations the hint pools, oldest first, this run's last: the pair's
    /// stored calibrations of the last day, at most
    /// [`POOLED_CALIBRATIONS`](crate::measured::POOLED_CALIBRATIONS) (empty for a poor fit).
    pub pooled_blocks_bytes: Vec<u64>,
    /// Median timings per block size.
    pub points: Vec<CalibrationPoint>,
    /// Time the whole calibration took, in ms (at most `budget_ms`, give or take the last
    /// round).
    pub elapsed_ms: f64,
    /// The budget it was given, in ms.
    pub budget_ms: f64,
    /// The cache file the fit was stored in (none for a poor fit or without a cache directory).
    pub stored_in: Option<PathBuf>,
    /// Why the fit was not stored, when it was not (a poor fit, no cache directory, a cache
    /// the file system refused).
    pub not_stored: Option<String>,
    /// Bytes from the start of the regions the timed transfers wrote.
    #[serde(skip)]
    written_bytes: u64,
}

impl Calibration {
    /// Whether the hint came from the fit (not a fallback).
    pub fn is_calibrated(&self) -> bool {
        self.fit.poor.is_none() && self.hint.origin == rdma_hint_core::Origin::Calibrated
    }
}

fn invalid(why: String) -> Error {
    Error::Transport(TransportError::InvalidArgument { what: "calibration", why })
}

/// [`fit::median`](rdma_hint_core::fit::median), NaN for no values (a spread of poor fits
/// only: the caller refuses it as poor).
fn median(values: &mut [f64]) -> f64 {
    rdma_hint_core::fit::median(values).unwrap_or(f64::NAN)
}

/// How many times wider than its bottom the hint's interval may be before calibration
/// measures longer, and after that before it answers the robust choice instead of the
/// middle of the interval.
pub const MAX_HINT_SPREAD: f64 = 2.0;
/// Fewest interleaved rounds (one timed transfer of every ladder size each) a calibration
/// takes; the bootstrap needs repetitions to draw from.
pub const MIN_ROUNDS: usize = 5;
/// Most rounds a calibration takes, however long its budget.
pub const MAX_ROUNDS: usize = 61;
/// Bootstrap resamples behind every interval.
pub const RESAMPLES: usize = 200;
/// Share of the budget the first rounds may take; up to [`EXTENDED_SHARE`] is spent on more
/// rounds when the hint's interval is too wide, the rest absorbs misestimated rates and the
/// one-block transfers an estimate needs.
const BASE_SHARE: f64 = 0.45;
/// See [`BASE_SHARE`].
const EXTENDED_SHARE: f64 = 0.7;
/// No round starts that would end past this share of the budget, the fewest rounds included.
const BUDGET_CEILING: f64 = 0.85;
/// Share of calibration's timed transfers left outside `stream_ratio` and `single_block_ratio`
/// at each end.
pub const PREDICTION_TAIL: f64 = 0.01;
/// Share of its plateau the calibration's own curve must reach at the answered block (where
/// that is no more than twice the block at 90 %): above the 90 % a sweep's knee reaches,
/// because a curve's 90 % point wanders with the noise of a busy machine (on the 2-core machine
/// a sweep's block at its calibration's 0.95 point reached 0.87 to 0.93 of the plateau over
/// ucx:shm) and the hint should hold in every run, not half of them.
pub const CURVE_KNEE_SHARE: f64 = 0.97;
/// Bytes a timed transfer streams at most (fewer where the budget or the region is short):
/// past the caches, as a sweep's transfers are.
const UNIFORM_BYTES: u64 = 16 << 20;
/// The share of a first round's time that one transfer of a ladder block larger than the
/// uniform length may take at the first rate (it streams MIN_BLOCKS_PER_RUN blocks).
const LARGE_BLOCK_SHARE: f64 = 1.0 / 3.0;

/// How far a run of adjacent writes goes before the shared-memory paths stream its copies
/// (`rdma_hint_stream_copy::STREAM_AFTER_BYTES`, 4 MiB), and a block more.
const RUN_REJOIN_BYTES: u64 = (4 << 20) + (64 << 10);

/// How flat the measured curve is near the hint: shares of the robust plateau.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Flatness {
    /// Robust plateau of the median curve, in GB/s.
    pub plateau_gbps: f64,
    /// The smallest ladder block's median bandwidth over the plateau.
    pub smallest_block_share: f64,
    /// The fitted line's bandwidth at the hinted block over the plateau.
    pub hinted_block_share: f64,
}

/// Calibrates `transport` (connected; `local` in `source`'s memory, `remote` the peer's region)
/// within `budget`, everything included: a ladder of power-of-two blocks from the alignment to
/// 4 MiB (fewer when the regions or a slow path do not allow), timed in interleaved rounds
/// (one streaming transfer of every size per round, at least [`MIN_ROUNDS`]), the per-size
/// medians fitted to `o + s/B`, and [`RESAMPLES`] bootstrap resamples of the rounds giving
/// every figure its interval ([`Margins`]).
///
/// The hint follows from the margin. When the resampled fits agree on the block within
/// [`MAX_HINT_SPREAD`], the answer is the hint of their median `o` and `B`. When they do not,
/// calibration runs more rounds (up to 70 % of the budget); if they still disagree,
/// it answers the robust choice, the smallest block whose lower bound still reaches the target
/// efficiency (the hint of the resamples' 95th percentile of `o·B`) or the measured curve's
/// knee where that is smaller, never below the hint of the median fit, and says so in the
/// hint's reasons. Either way the block stays within the model's bounds (the 16 KiB floor among them).
///
/// A good fit is stored in the hint cache (`calibrated.json` beside the measured knees, keyed
/// like them), pooled with the pair's calibrations of the last day
/// ([`POOLED_CALIBRATIONS`](crate::measured::POOLED_CALIBRATIONS) at most): the hint
/// `get_low_latency_rdma_size_hint` answers, until a newer sweep records a knee, is the median
/// of their own blocks. A poor fit stores nothing, leaves the pool as it was and answers it,
/// the recorded knee or the model's hint, with the reason.
///
/// ```
/// use rdma_hint::{calibrate, LoopbackPair, OpenOptions, SourceId, TransportId};
/// use std::time::{Duration, Instant};
/// # let cache = std::env::temp_dir().join(format!("rdma-hint-doc-calibrate-{}", std::process::id()));
/// # std::env::set_var("RDMA_HINT_CACHE_DIR", &cache);
/// let deadline = Instant::now() + Duration::from_secs(30);
/// let pair = LoopbackPair::open(&TransportId::STAGED_SHM, SourceId::Host(0), 16 << 20, &OpenOptions::default(), deadline)?;
/// // Generous: an idle machine ends at the most rounds long before it, a busy one still fits
/// // the fewest.
/// let calibration = calibrate(&*pair.sender, SourceId::Host(0), &pair.local, &pair.remote, Duration::from_secs(20))?;
/// assert!(calibration.hint.block_bytes > 0 && calibration.budget_ms == 20_000.0);
/// println!("o = {:.2} µs, B = {:.1} GB/s, R² = {:.3}", calibration.fit.fixed_cost_us,
///          calibration.fit.bandwidth_gbps, calibration.fit.r2);
/// if let Some(margins) = &calibration.margins {
///     println!("o within {:.2}…{:.2} µs", margins.fixed_cost_us.low, margins.fixed_cost_us.high);
/// }
/// # let _ = std::fs::remove_dir_all(&cache);
/// # Ok::<(), rdma_hint::Error>(())
/// ```
pub fn calibrate(
    transport: &dyn Transport,
    source: Device,
    local: &LocalRegion,
    remote: &RemoteRegion,
    budget: Duration,
) -> Result<Calibration, Error> {
    let (calibration, entry) = measure(transport, source, local, remote, budget, Pool::Join)?;
    Ok(keep(calibration, entry))
}

/// Whether a calibration joins the pair's stored calibrations of the day or starts anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Join,
    Restart,
}

/// Everything [`calibrate`] does but store: the calibration, and the entry to store (none for
/// a poor fit), so that a caller can check the bytes that arrived before anything is kept.
fn measure(
    transport: &dyn Transport,
    source: Device,
    local: &LocalRegion,
    remote: &RemoteRegion,
    budget: Duration,
    pool: Pool,
) -> Result<(Calibration, Option<CalibratedPath>), Error> {
    if budget.is_zero() || budget > MAX_BUDGET {
        return Err(invalid(format!(
            "a budget of {budget:?}: give more than 0 s and at most {MAX_BUDGET:?}"
        )));
    }
    let id = transport.capabilities().facts.id.clone();
    let profile = crate::profile_of(source, &id)?;
    let policy = HintPolicy::default();
    let model = rdma_hint_core::compute_hint(&profile, &policy)?;
    let align = ladder_alignment(&model);
    let region = local.len.min(remote.len) / align * align;
    if region < 3 * align * MIN_BLOCKS_PER_RUN {
        return Err(invalid(format!(
            "regions of {} B and {} B: calibration needs at least {} B of each",
            local.len,
            remote.len,
            3 * align * MIN_BLOCKS_PER_RUN
        )));
    }
    let started = Instant::now();
    let budget_s = budget.as_secs_f64();
    let mut path = Ladder::new(transport, source, (local, remote), region, align)?;

    // Warm-up and a first rate: one transfer of 64 KiB blocks (or the alignment's, if larger).
    let warm_block = align.max(64 << 10).min(region / MIN_BLOCKS_PER_RUN / align * align);
    let warm_len = (MIN_BLOCKS_PER_RUN * 4 * warm_block).min(region / warm_block * warm_block);
    path.time(warm_block, warm_len)?;
    let rate_bytes_per_s = warm_len as f64 / path.time(warm_block, warm_len)?;

    // The ladder: powers of two from the alignment while MIN_ROUNDS transfers of MIN_BLOCKS
    // blocks of every size fit the region and the first rounds' share of the budget.
    let base_s = budget_s * BASE_SHARE - started.elapsed().as_secs_f64();
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
    let large_s = budget_s * BASE_SHARE / (MIN_ROUNDS + 1) as f64 * LARGE_BLOCK_SHARE;
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
            budget_s
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
    let round_share_s = (budget_s * BASE_SHARE - started.elapsed().as_secs_f64()) / (MIN_ROUNDS + 1) as f64;
    if let Some(cap_s) = time_cap(&estimates, round_share_s) {
        tracing::debug!(cap_s, ?estimates, "calibration: the slowest sizes' transfers are cut");
        cut_to(&mut sizes, &per_block_s, cap_s);
    }
    let mut samples: Vec<BlockSamples> = ladder
        .iter()
        .map(|&block_bytes| BlockSamples { block_bytes, seconds_per_block: Vec::new() })
        .collect();
    // The warm-up round: every size once, not kept (a size's first transfer pays for pages and
    // caches the next ones do not).
    for &(block, len) in &sizes {
        path.time(block, len)?;
    }
    let mut rounds = 0;
    // What the next round is expected to take: the median of the rounds so far, so that one
    // stall (a preempted VM) does not end the rounds after it; against the budget's ceiling,
    // the larger of that and the last round, so a slow spell still going on is not forgotten.
    let mut round_times: Vec<f64> = Vec::with_capacity(MAX_ROUNDS);
    let (mut round_s, mut last_round_s) = (0.0f64, 0.0f64);
    let mut singles: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    let mut run_rounds = |until_s: f64, samples: &mut Vec<BlockSamples>, path: &mut Ladder<'_>| {
        // The fewest rounds are taken even past `until_s`, but never past the budget itself.
        while rounds < MAX_ROUNDS
            && (rounds < MIN_ROUNDS || started.elapsed().as_secs_f64() + round_s <= until_s)
            && started.elapsed().as_secs_f64() + round_s.max(last_round_s) <= budget_s * BUDGET_CEILING
        {
            let round_started = Instant::now();
            for (index, &(block, len)) in sizes.iter().enumerate() {
                let seconds = path.time(block, len)?;
                samples[index].seconds_per_block.push(seconds / (len / block) as f64);
                // One block alone, post to completion: what a transfer's first block costs,
                // right after a stream here, and below after other single blocks, away from
                // where the streams run (an application's small transfers follow both; the
                // shared-memory paths stream a copy that continues a long run of adjacent
                // writes past the cache, and copy one elsewhere plainly).
                singles[index].push(path.time(block, block)?);
            }
            for (index, &(block, _)) in sizes.iter().enumerate() {
                singles[index].push(path.time_apart(block)?);
            }
            path.rejoin_run(&sizes)?;
            last_round_s = round_started.elapsed().as_secs_f64();
            round_times.push(last_round_s);
            round_s = median(&mut round_times);
            rounds += 1;
        }
        Ok::<(), Error>(())
    };
    run_rounds(budget_s * BASE_SHARE, &mut samples, &mut path)?;
    // Each round leaves one sample per size.
    let taken = samples[0].seconds_per_block.len();
    if taken < 3 {
        return Err(invalid(format!(
            "{taken} rounds of {} block sizes fit {:.2} s on a path this slow; give a longer budget",
            sizes.len(),
            budget_s
        )));
    }
    let mut spread = Spread::of(&samples, &profile, &policy, &model)?;
    let extended = spread.block_bytes.ratio() > MAX_HINT_SPREAD;
    if extended {
        tracing::debug!(interval = ?spread.block_bytes, "calibration: the hint's interval is wide; measuring longer");
        run_rounds(budget_s * EXTENDED_SHARE, &mut samples, &mut path)?;
        spread = Spread::of(&samples, &profile, &policy, &model)?;
    }
    let timings: Vec<BlockTiming> = samples.iter().filter_map(BlockSamples::median).collect();
    let fit = fit_path(&timings).map_err(|e| invalid(e.to_string()))?;
    let points: Vec<CalibrationPoint> = sizes
        .iter()
        .zip(&timings)
        .map(|(&(block, len), timing)| CalibrationPoint {
            block_bytes: block,
            gbps: timing.gbps(),
            us_per_block: timing.seconds_per_block * 1e6,
            runs: rounds as u32,
            transfer_bytes: len,
        })
        .collect();
    let file = measured::cache_file();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    // The middle of the resampled fits, unless the measured curve reaches CURVE_KNEE_SHARE of
    // its plateau only at a larger block: then that block, within a bound of the line's; or
    // unless the fits disagree too much to pick a block: then the robust choice.
    let robust = spread.block_bytes.ratio() > MAX_HINT_SPREAD;
    let curve_knee = curve_knee_of(&samples, CURVE_KNEE_SHARE);
    let line = spread.block_bytes_median;
    let top = Some(spread.block_bytes.high as u64).filter(|_| spread.block_bytes.high.is_finite());
    let robust_choice = robust_choice(line, top, curve_knee);
    let crossing_97 = curve_crossing(&timings, CURVE_KNEE_SHARE);
    let raised = raised_block(&timings, line, crossing_97);
    // Where the line promises more at its block than the curve's robust plateau (its `B` is
    // not a rate the path reached), the curve's own crossing answers: over loopback tcp on the
    // 2-core machine the fits put `B` at 5.0-6.4 GB/s over a ladder whose plateau read 3.7-5.5
    // and answered 600-800 KiB, where the curve reached 97 % near 240 KiB and the sweeps'
    // median knee sat at 256 KiB. Not for GPU memory over shared memory: that curve is the copy
    // engines' line itself, read under it at the largest blocks only because a 16 MiB transfer
    // of 2-4 MiB blocks pays its first block's latency unhidden; lowered there, an H100 host's
    // GPU shm answer fell from the line's 1.5 MiB to 896 KiB, which read 0.88 of the sweeps'
    // plateau. GPU memory over tcp is the socket's curve, as host memory's is: unlowered, the
    // same host answered 896-960 KiB against the sweeps' 256 KiB knee (0 of 5), lowered 448-832
    // KiB against a 512 KiB one (5 of 5).
    let copy_engines_line = matches!(source, Device::Gpu(_)) && id == TransportId::STAGED_SHM;
    let lowered = crossing_97
        .filter(|_| !copy_engines_line)
        .filter(|crossing| *crossing < line)
        .filter(|_| overshoots(&timings, spread.fixed_cost_us_median, spread.bandwidth_gbps_median, line))
        .map(|crossing| crossing as u64);
    let (robust_block_bytes, block_rule) = match (raised, lowered, robust) {
        (Some(raised), _, _) => (Some(raised), Some(BlockRule::Raised)),
        (None, Some(lowered), _) => (Some(lowered), Some(BlockRule::Lowered)),
        (None, None, true) => (robust_choice, robust_choice.map(|_| BlockRule::Robust)),
        (None, None, false) => (None, None),
    };
    let (fixed_cost_us, bandwidth_gbps) = (spread.fixed_cost_us_median, spread.bandwidth_gbps_median);
    let mut entry = CalibratedPath {
        source,
        transport: id.clone(),
        versions: profile.versions.clone(),
        fixed_cost_us,
        bandwidth_gbps,
        fit_r2: fit.r2,
        gradual: spread.gradual,
        measured_at_unix: now,
        margins: None,
        robust_block_bytes,
        block_rule,
        own_block_bytes: None,
        earlier: Vec::new(),
    };
    // A curve's own crossing (raised or lowered) answers even where the fits disagree: the
    // measured curve vouches for it.
    let poor = fit.poor.clone().or_else(|| spread.all_poor()).or_else(|| {
        (robust && robust_block_bytes.is_none()).then(|| {
            format!("the hinted block's interval stays wider than {MAX_HINT_SPREAD}× and no block's lower bound reaches 90 % of the plateau")
        })
    });
    let (hint, stored, margins, flatness, own_block_bytes, pooled_blocks_bytes) = match &poor {
        None => {
            // This run's own answer, then the answer of the pool it joins (the pair's stored
            // calibrations of the last day).
            let own = measured::calibrated_hint(&profile, &policy, &model, &entry)?.block_bytes;
            entry.own_block_bytes = Some(own);
            let previous = file
                .as_deref()
                .filter(|_| pool == Pool::Join)
                .and_then(|file| measured::lookup_calibration(file, source, &id, &profile.versions));
            entry = entry.pooled_with(previous);
            let mut hint = measured::calibrated_hint(&profile, &policy, &model, &entry)?;
            let blocks = spread.block_bytes;
            // A stream's blocks after its first: what one more block adds, the stream's median
            // less its first block, over the blocks that follow it.
            let ladder_timings: Vec<LadderTiming> = samples
                .iter()
                .zip(&singles)
                .zip(&sizes)
                .filter_map(|((size, single), &(block, len))| {
                    let blocks = (len / block) as f64;
                    let after_first = |stream_s: f64, single_s: f64| {
                        ((stream_s - single_s) / (blocks - 1.0)).max(stream_s / blocks / 2.0) * 1e6
                    };
                    let stream_s = size.median()?.seconds_per_block * blocks;
                    let single_s = median(&mut single.clone());
                    // How sure each median is: the bootstrap interval of it.
                    let stream_interval = median_interval(&size.seconds_per_block, RESAMPLES, block)?;
                    let single_interval = median_interval(single, RESAMPLES, block)?;
                    Some(LadderTiming {
                        block_bytes: size.block_bytes,
                        stream_us_per_block: after_first(stream_s, single_s),
                        single_block_us: single_s * 1e6,
                        stream_us_per_block_interval: Interval {
                            low: after_first(stream_interval.low * blocks, single_interval.high),
                            high: after_first(stream_interval.high * blocks, single_interval.low),
                        },
                        single_block_us_interval: Interval {
                            low: single_interval.low * 1e6,
                            high: single_interval.high * 1e6,
                        },
                    })
                })
                .collect();
            // Every timed transfer over its size's median, streams and single blocks apart: a
            // transfer's first block strays as one-block transfers did, the rest as streams.
            let ratio = |values: Vec<f64>| {
                Interval::between(&values, PREDICTION_TAIL, 1.0 - PREDICTION_TAIL)
                    .unwrap_or(Interval { low: 1.0, high: 1.0 })
            };
            let stream_ratio = ratio(
                samples
                    .iter()
                    .filter_map(|size| {
                        let median = size.median()?.seconds_per_block;
                        Some(size.seconds_per_block.iter().map(move |t| t / median))
                    })
                    .flatten()
                    .collect(),
            );
            let single_block_ratio = ratio(
                singles
                    .iter()
                    .flat_map(|times| {
                        let median = median(&mut times.clone());
                        times.iter().map(move |t| t / median)
                    })
                    .collect(),
            );
            let margins = Margins {
                fixed_cost_us: spread.fixed_cost_us.including(fit.fixed_cost_us),
                bandwidth_gbps: spread.bandwidth_gbps.including(fit.bandwidth_gbps),
                block_bytes: blocks,
                ladder: ladder_timings,
                stream_ratio,
                single_block_ratio,
                poor_resamples: spread.poor,
            };
            // Before the pool's reason, which `calibrated_hint` gave last: the pool answers.
            let before_pool = hint.reasons.len() - usize::from(!entry.earlier.is_empty());
            hint.reasons.insert(
                before_pool,
                Reason::new(
                    Factor::Calibrated,
                    format!("{:.0}…{:.0} KiB", blocks.low / 1024.0, blocks.high / 1024.0),
                    format!(
                        "the hinted block of {RESAMPLES} resampled fits ({:.0} % interval{}){}",
                        CONFIDENCE * 100.0,
                        if extended { ", after measuring longer because it was wider than 2×" } else { "" },
                        match block_rule {
                            Some(rule) => format!("; {}", rule.why()),
                            None => "; this run alone answers the middle of the fits".to_string(),
                        }
                    ),
                ),
            );
            let flatness = flatness(&timings, &entry, hint.block_bytes);
            entry.margins = Some(margins.clone());
            let pooled = entry.pooled_blocks(own);
            (hint, Some(entry), Some(margins), flatness, Some(own), pooled)
        }
        Some(why) => {
            // Nothing of this run is kept; the pair's pooled calibrations of the day (if any)
            // stay, and the cache answers them, a newer recorded knee or the model.
            let mut hint = measured::hint(&profile, &policy, file.as_deref())?;
            hint.reasons.push(Reason::new(
                Factor::Calibrated,
                "poor fit",
                format!(
                    "calibration fitted o = {:.2} µs, B = {:.3} GB/s, R² {:.3}, but {why}; the hint stays {}",
                    fit.fixed_cost_us,
                    fit.bandwidth_gbps,
                    fit.r2,
                    match hint.origin {
                        rdma_hint_core::Origin::Measured => "the recorded knee",
                        rdma_hint_core::Origin::Calibrated =>
                            "the earlier calibrations' (kept, not pooled with this run)",
                        _ => "the model's",
                    }
                ),
            ));
            (hint, None, None, None, None, Vec::new())
        }
    };
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    // A fit refused for its spread (every resample poor, or no block the margins can vouch for)
    // is reported as poor too: its `poor` says why the hint is not the fit's.
    let fit = PathFit { poor, ..fit };
    let calibration = Calibration {
        source,
        transport: id,
        hint,
        fit,
        margins,
        flatness,
        rounds,
        measured_longer: extended,
        own_block_bytes,
        pooled_blocks_bytes,
        points,
        elapsed_ms,
        budget_ms: budget_s * 1e3,
        stored_in: None,
        not_stored: None,
        written_bytes: path.written(),
    };
    Ok((calibration, stored))
}

/// Stores `entry` (the pair's new pool) and says in `calibration` where, or why not.
fn keep(mut calibration: Calibration, entry: Option<CalibratedPath>) -> Calibration {
    let file = measured::cache_file();
    let (source, id) = (calibration.source, &calibration.transport);
    (calibration.stored_in, calibration.not_stored) = match (entry, &file) {
        (Some(entry), Some(file)) => match measured::store_calibration(file, source, id, Some(entry)) {
            Ok(()) => (Some(measured::calibration_file(file)), None),
            Err(e) => {
                let target = measured::calibration_file(file);
                (None, Some(format!("cannot write {}: {e}", target.display())))
            }
        },
        (None, _) => (None, Some("a poor fit is not kept".to_string())),
        (Some(_), None) => {
            (None, Some("no cache directory: set RDMA_HINT_CACHE_DIR, XDG_CACHE_HOME or HOME".to_string()))
        }
    };
    HintCache::global().clear();
    calibration
}

/// [`calibrate`] over both ends of `id` in this process ([`LoopbackPair`], regions of
/// [`LOOPBACK_REGION_BYTES`]), then checks that the bytes arrived: a path that corrupts data
/// is not calibrated, and nothing of it is stored.
///
/// The calibration joins the pair's pool: the hint answers the median block of the last
/// [`POOLED_CALIBRATIONS`](crate::measured::POOLED_CALIBRATIONS) calibrations of the day.
pub fn calibrate_loopback(
    id: &TransportId,
    source: Device,
    options: &OpenOptions,
    budget: Duration,
) -> Result<Calibration, Error> {
    loopback(id, source, options, budget, Pool::Join)
}

/// [`calibrate_loopback`], but this calibration starts a new pool and the hint answers it
/// alone (after moving a card or a NIC, which the driver versions do not tell). The pair's
/// earlier calibrations are replaced only once this one is stored: a run that fails, or fits
/// poorly, leaves them as they were.
pub fn recalibrate_loopback(
    id: &TransportId,
    source: Device,
    options: &OpenOptions,
    budget: Duration,
) -> Result<Calibration, Error> {
    loopback(id, source, options, budget, Pool::Restart)
}

fn loopback(
    id: &TransportId,
    source: Device,
    options: &OpenOptions,
    budget: Duration,
    pool: Pool,
) -> Result<Calibration, Error> {
    // An unknown device or transport is named before any memory is registered.
    crate::profile_of(source, id)?;
    let deadline = Instant::now() + TRANSFER_DEADLINE;
    let pair = LoopbackPair::open(id, source, LOOPBACK_REGION_BYTES, options, deadline)?;
    let pattern: Vec<u8> = (0..LOOPBACK_REGION_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    pair.sender.write_region(pair.local.id, 0, &pattern)?;
    let (calibration, entry) = measure(&*pair.sender, source, &pair.local, &pair.remote, budget, pool)?;
    let moved = calibration.written_bytes as usize;
    let mut landed = vec![0u8; moved];
    pair.receiver.read_region(pair.target.id, 0, &mut landed)?;
    if landed != pattern[..moved] {
        return Err(Error::Transport(TransportError::Handshake(format!(
            "{id}: the bytes that arrived during calibration differ from those sent"
        ))));
    }
    Ok(keep(calibration, entry))
}

#[cfg(test)]
mod tests;
