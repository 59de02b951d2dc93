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
mod intervals;
mod ladder;
mod rounds;

use crate::error::Error;
use crate::loopback::LoopbackPair;
pub use crate::margins::{LadderTiming, Margins};
use crate::measured::{self, ladder_alignment, BlockRule, CalibratedPath};
use crate::open::{OpenOptions, TransportId};
use crate::Device;
use crate::HintCache;
use choice::{curve_crossing, curve_knee_of, flatness, overshoots, raised_block, robust_choice, Spread};
use intervals::margins_of;
use ladder::Ladder;
use rdma_hint_core::fit::{fit_path, BlockSamples, BlockTiming, PathFit, CONFIDENCE};
use rdma_hint_core::model::{Factor, Reason};
use rdma_hint_core::{HintPolicy, SizeHint, SourceId};
use rdma_hint_core::{LocalRegion, RemoteRegion, Transport, TransportError};
use rounds::{ladder_sizes, Budget, Rounds};
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
    /// [`POOLED_CALIBRATIONS`](crate::calibration::POOLED_CALIBRATIONS) (empty for a poor fit).
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
pub(crate) const CURVE_KNEE_SHARE: f64 = 0.97;
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
/// ([`POOLED_CALIBRATIONS`](crate::calibration::POOLED_CALIBRATIONS) at most): the hint
/// `get_low_latency_rdma_size_hint` answers, until a newer sweep records a knee, is the median
/// of their own blocks. A poor fit stores nothing, leaves the pool as it was and answers it,
/// the recorded knee or the model's hint, with the reason.
///
/// ```
/// use rdma_hint::{calibrate, Device, OpenOptions, TransportId};
/// use rdma_hint::calibration::LoopbackPair;
/// use std::time::{Duration, Instant};
/// # let cache = std::env::temp_dir().join(format!("rdma-hint-doc-calibrate-{}", std::process::id()));
/// # std::env::set_var("RDMA_HINT_CACHE_DIR", &cache);
/// let deadline = Instant::now() + Duration::from_secs(30);
/// let pair = LoopbackPair::open(&TransportId::STAGED_SHM, Device::Host(0), 16 << 20, &OpenOptions::default(), deadline)?;
/// // Generous: an idle machine ends at the most rounds long before it, a busy one still fits
/// // the fewest.
/// let calibration = calibrate(&*pair.sender, Device::Host(0), &pair.local, &pair.remote, Duration::from_secs(20))?;
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
    let model = Model { profile: &profile, policy: &policy, hint: &model };
    let align = ladder_alignment(model.hint);
    let region = local.len.min(remote.len) / align * align;
    if region < 3 * align * MIN_BLOCKS_PER_RUN {
        return Err(invalid(format!(
            "regions of {} B and {} B: calibration needs at least {} B of each",
            local.len,
            remote.len,
            3 * align * MIN_BLOCKS_PER_RUN
        )));
    }
    let clock = Budget { started: Instant::now(), seconds: budget.as_secs_f64() };
    let mut path = Ladder::new(transport, source, (local, remote), region, align)?;
    let sizes = ladder_sizes(&mut path, align, region, clock)?;
    let mut rounds = Rounds::after_warm_up(&mut path, &sizes)?;
    rounds.run(&mut path, &sizes, clock, clock.seconds * BASE_SHARE)?;
    if rounds.taken < 3 {
        return Err(invalid(format!(
            "{} rounds of {} block sizes fit {:.2} s on a path this slow; give a longer budget",
            rounds.taken,
            sizes.len(),
            clock.seconds
        )));
    }
    let mut spread = Spread::of(&rounds.samples, model.profile, model.policy, model.hint)?;
    let extended = spread.block_bytes.ratio() > MAX_HINT_SPREAD;
    if extended {
        tracing::debug!(interval = ?spread.block_bytes, "calibration: the hint's interval is wide; measuring longer");
        rounds.run(&mut path, &sizes, clock, clock.seconds * EXTENDED_SHARE)?;
        spread = Spread::of(&rounds.samples, model.profile, model.policy, model.hint)?;
    }
    let timings: Vec<BlockTiming> = rounds.samples.iter().filter_map(BlockSamples::median).collect();
    let fit = fit_path(&timings).map_err(|e| invalid(e.to_string()))?;
    let points = points_of(&sizes, &timings, rounds.taken);
    // The middle of the resampled fits, unless the measured curve reaches CURVE_KNEE_SHARE of
    // its plateau only at a larger block: then that block, within a bound of the line's; or
    // unless the fits disagree too much to pick a block: then the robust choice.
    let robust = spread.block_bytes.ratio() > MAX_HINT_SPREAD;
    let (robust_block_bytes, block_rule) =
        block_choice(&timings, &rounds.samples, &spread, robust, (source, &id));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let entry = CalibratedPath {
        source,
        transport: id.clone(),
        versions: profile.versions.clone(),
        fixed_cost_us: spread.fixed_cost_us_median,
        bandwidth_gbps: spread.bandwidth_gbps_median,
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
    let file = measured::cache_file();
    let outcome = match &poor {
        None => {
            let margins = margins_of(&rounds, &sizes, &spread, &fit);
            let previous = file
                .as_deref()
                .filter(|_| pool == Pool::Join)
                .and_then(|file| measured::lookup_calibration(file, source, &id, &profile.versions));
            fitted(&model, entry, previous, margins, &timings, extended)?
        }
        Some(why) => poor_outcome(&model, file.as_deref(), &fit, why)?,
    };
    let elapsed_ms = clock.elapsed() * 1e3;
    // A fit refused for its spread (every resample poor, or no block the margins can vouch for)
    // is reported as poor too: its `poor` says why the hint is not the fit's.
    let fit = PathFit { poor, ..fit };
    let calibration = Calibration {
        source,
        transport: id,
        hint: outcome.hint,
        fit,
        margins: outcome.margins,
        flatness: outcome.flatness,
        rounds: rounds.taken,
        measured_longer: extended,
        own_block_bytes: outcome.own_block_bytes,
        pooled_blocks_bytes: outcome.pooled_blocks_bytes,
        points,
        elapsed_ms,
        budget_ms: clock.seconds * 1e3,
        stored_in: None,
        not_stored: None,
        written_bytes: path.written(),
    };
    Ok((calibration, outcome.stored))
}

/// The calibration's table: each ladder size's median timing.
fn points_of(sizes: &[(u64, u64)], timings: &[BlockTiming], rounds: usize) -> Vec<CalibrationPoint> {
    sizes
        .iter()
        .zip(timings)
        .map(|(&(block, len), timing)| CalibrationPoint {
            block_bytes: block,
            gbps: timing.gbps(),
            us_per_block: timing.seconds_per_block * 1e6,
            runs: rounds as u32,
            transfer_bytes: len,
        })
        .collect()
}

/// What a calibration's decisions read: the path's profile, the policy, the model's hint.
struct Model<'a> {
    profile: &'a rdma_hint_core::PathProfile,
    policy: &'a HintPolicy,
    hint: &'a SizeHint,
}

/// The hint a calibration answers and what it keeps.
struct Outcome {
    hint: SizeHint,
    /// The entry to store (none for a poor fit).
    stored: Option<CalibratedPath>,
    margins: Option<Margins>,
    flatness: Option<Flatness>,
    own_block_bytes: Option<u64>,
    pooled_blocks_bytes: Vec<u64>,
}

/// The block the measured curve vouches for where the line's does not hold, and why: raised
/// to where the curve reaches [`CURVE_KNEE_SHARE`], lowered to it where the line overshoots
/// the curve, or the robust choice where the fits disagree (`robust`).
fn block_choice(
    timings: &[BlockTiming],
    samples: &[BlockSamples],
    spread: &Spread,
    robust: bool,
    (source, id): (Device, &TransportId),
) -> (Option<u64>, Option<BlockRule>) {
    let curve_knee = curve_knee_of(samples, CURVE_KNEE_SHARE);
    let line = spread.block_bytes_median;
    let top = Some(spread.block_bytes.high as u64).filter(|_| spread.block_bytes.high.is_finite());
    let robust_choice = robust_choice(line, top, curve_knee);
    let crossing_97 = curve_crossing(timings, CURVE_KNEE_SHARE);
    let raised = raised_block(timings, line, crossing_97);
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
    let copy_engines_line = matches!(source, Device::Gpu(_)) && *id == TransportId::STAGED_SHM;
    let lowered = crossing_97
        .filter(|_| !copy_engines_line)
        .filter(|crossing| *crossing < line)
        .filter(|_| overshoots(timings, spread.fixed_cost_us_median, spread.bandwidth_gbps_median, line))
        .map(|crossing| crossing as u64);
    match (raised, lowered, robust) {
        (Some(raised), _, _) => (Some(raised), Some(BlockRule::Raised)),
        (None, Some(lowered), _) => (Some(lowered), Some(BlockRule::Lowered)),
        (None, None, true) => (robust_choice, robust_choice.map(|_| BlockRule::Robust)),
        (None, None, false) => (None, None),
    }
}

/// A good fit's answer: this run's own block, then the answer of the pool it joins (the
/// pair's stored calibrations of the last day, `previous`), with the margins and the reasons.
fn fitted(
    model: &Model<'_>,
    mut entry: CalibratedPath,
    previous: Option<CalibratedPath>,
    margins: Margins,
    timings: &[BlockTiming],
    extended: bool,
) -> Result<Outcome, Error> {
    let block_rule = entry.block_rule;
    let own = measured::calibrated_hint(model.profile, model.policy, model.hint, &entry)?.block_bytes;
    entry.own_block_bytes = Some(own);
    entry = entry.pooled_with(previous);
    let mut hint = measured::calibrated_hint(model.profile, model.policy, model.hint, &entry)?;
    // Before the pool's reason, which `calibrated_hint` gave last: the pool answers.
    let before_pool = hint.reasons.len() - usize::from(!entry.earlier.is_empty());
    hint.reasons.insert(
        before_pool,
        Reason::new(
            Factor::Calibrated,
            format!("{:.0}…{:.0} KiB", margins.block_bytes.low / 1024.0, margins.block_bytes.high / 1024.0),
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
    let flatness = flatness(timings, &entry, hint.block_bytes);
    entry.margins = Some(margins.clone());
    let pooled_blocks_bytes = entry.pooled_blocks(own);
    Ok(Outcome {
        hint,
        stored: Some(entry),
        margins: Some(margins),
        flatness,
        own_block_bytes: Some(own),
        pooled_blocks_bytes,
    })
}

/// A poor fit's answer: nothing of this run is kept; the pair's pooled calibrations of the day
/// (if any) stay, and the cache answers them, a newer recorded knee or the model.
fn poor_outcome(
    model: &Model<'_>,
    file: Option<&std::path::Path>,
    fit: &PathFit,
    why: &str,
) -> Result<Outcome, Error> {
    let mut hint = measured::hint(model.profile, model.policy, file)?;
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
    Ok(Outcome {
        hint,
        stored: None,
        margins: None,
        flatness: None,
        own_block_bytes: None,
        pooled_blocks_bytes: Vec::new(),
    })
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
/// [`POOLED_CALIBRATIONS`](crate::calibration::POOLED_CALIBRATIONS) calibrations of the day.
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
