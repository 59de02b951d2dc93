//! Calibration: time a ladder of block sizes on the live path for about a second, fit
//! `t(s) = o + s/B` to the per-block times ([`fit`](rdma_hint_core::fit)), store `o` and `B` in
//! the hint cache and compute the hint from them (origin `calibrated`).
//!
//! The model's constants were calibrated on two machines; on a third its hint can miss by 2×.
//! A fit on the path itself does not, as long as the curve has the model's shape; when it does
//! not (a poor fit), the calibration says why and the hint falls back to the recorded knee, or
//! the model's.

use crate::error::Error;
use crate::loopback::LoopbackPair;
use crate::measured::{self, CalibratedPath};
use crate::open::{OpenOptions, TransportId};
use crate::Device;
use crate::HintCache;
use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer};
use rdma_hint_core::fit::{fit_path, BlockTiming, PathFit};
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
/// Timed transfers per block size: at least this many, more while the size's time share lasts.
pub const MIN_RUNS: u32 = 3;
/// At most this many timed transfers per block size.
pub const MAX_RUNS: u32 = 9;
/// Fewest blocks in one timed transfer: a stream, not one block.
const MIN_BLOCKS_PER_RUN: u64 = 8;
/// Share of the budget planned for measuring; the rest absorbs misestimated rates.
const PLANNED_SHARE: f64 = 0.8;
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
    /// The fitted `o` and `B` with goodness of fit and the points it left out.
    pub fit: PathFit,
    /// Median timings per block size.
    pub points: Vec<CalibrationPoint>,
    /// Time spent measuring, in ms.
    pub elapsed_ms: f64,
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

/// The alignment a measured ladder keeps on this path: the model's, at least 4 KiB for host
/// memory (a page, the staged ring's slot) and 64 KiB for GPU memory (a GPUDirect page).
pub fn ladder_alignment(hint: &SizeHint) -> u64 {
    match hint.source {
        SourceId::Gpu(_) => hint.align_bytes.max(64 << 10),
        SourceId::Host(_) => hint.align_bytes.max(4 << 10),
    }
}

fn invalid(why: String) -> Error {
    Error::Transport(TransportError::InvalidArgument { what: "calibration", why })
}

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

/// Streams `len` bytes (whole blocks) from the cursor and returns the seconds it took.
fn timed_transfer(
    chunker: &mut Chunker,
    transport: &dyn Transport,
    source: SourceId,
    (local, remote, cursor): (&LocalRegion, &RemoteRegion, &mut Cursor),
    (len, align): (u64, u64),
) -> Result<f64, Error> {
    let at = cursor.next(len, align);
    let transfer = Transfer::new(local, remote, len).at(at, at);
    let started = Instant::now();
    chunker.write_blocking(transport, transfer.from_source(source), started + TRANSFER_DEADLINE)?;
    Ok(started.elapsed().as_secs_f64())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Calibrates `transport` (connected; `local` in `source`'s memory, `remote` the peer's region)
/// within `budget` of measuring: a ladder of power-of-two blocks from the alignment to 4 MiB
/// (fewer when the regions or a slow path do not allow), each timed over at least
/// [`MIN_RUNS`] streaming transfers, the medians fitted to `o + s/B`.
///
/// A good fit is stored in the hint cache (`calibrated.json` beside the measured knees, keyed
/// like them) and becomes the hint `get_low_latency_rdma_size_hint` answers until a newer
/// sweep records a knee. A poor fit removes any stored calibration of the pair and answers the
/// recorded knee or the model's hint, with the reason.
///
/// ```
/// use rdma_hint::{calibrate, LoopbackPair, OpenOptions, SourceId, TransportId};
/// use std::time::{Duration, Instant};
/// # std::env::set_var("RDMA_HINT_CACHE_DIR", std::env::temp_dir().join("rdma-hint-doc-calibrate"));
/// let deadline = Instant::now() + Duration::from_secs(30);
/// let pair = LoopbackPair::open(&TransportId::STAGED_SHM, SourceId::Host(0), 16 << 20, &OpenOptions::default(), deadline)?;
/// let calibration = calibrate(&*pair.sender, SourceId::Host(0), &pair.local, &pair.remote, Duration::from_millis(500))?;
/// assert!(calibration.hint.block_bytes > 0);
/// println!("o = {:.2} µs, B = {:.1} GB/s, R² = {:.3}", calibration.fit.fixed_cost_us,
///          calibration.fit.bandwidth_gbps, calibration.fit.r2);
/// # Ok::<(), rdma_hint::Error>(())
/// ```
pub fn calibrate(
    transport: &dyn Transport,
    source: Device,
    local: &LocalRegion,
    remote: &RemoteRegion,
    budget: Duration,
) -> Result<Calibration, Error> {
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
    let planned = budget.as_secs_f64() * PLANNED_SHARE;
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities())?;
    let mut cursor = Cursor { offset: 0, region, written: 0 };

    // Warm-up and a first rate: one transfer of 64 KiB blocks (or the alignment's, if larger).
    let warm_block = align.max(64 << 10).min(region / MIN_BLOCKS_PER_RUN / align * align);
    chunker.set_hint(source, BlockSpec::new(warm_block, align)?);
    let warm_len = (MIN_BLOCKS_PER_RUN * 4 * warm_block).min(region / warm_block * warm_block);
    timed_transfer(&mut chunker, transport, source, (local, remote, &mut cursor), (warm_len, align))?;
    let seconds =
        timed_transfer(&mut chunker, transport, source, (local, remote, &mut cursor), (warm_len, align))?;
    let mut rate_bytes_per_s = warm_len as f64 / seconds;

    // The ladder: powers of two from the alignment while MIN_RUNS transfers of MIN_BLOCKS
    // blocks fit the region and this size's share of the plan.
    let mut ladder = Vec::new();
    let mut block = align;
    while block <= LADDER_TOP_BYTES && block * MIN_BLOCKS_PER_RUN <= region {
        ladder.push(block);
        block *= 2;
    }
    let share = (planned - started.elapsed().as_secs_f64()) / ladder.len() as f64;
    ladder.retain(|block| {
        (f64::from(MIN_RUNS) * (block * MIN_BLOCKS_PER_RUN) as f64 / rate_bytes_per_s) <= share
            || *block <= warm_block
    });
    if ladder.len() < 3 {
        return Err(invalid(format!(
            "the path moves {:.3} GB/s: {:.2} s is too short for three block sizes; give a longer budget",
            rate_bytes_per_s / 1e9,
            budget.as_secs_f64()
        )));
    }

    let mut points = Vec::with_capacity(ladder.len());
    let mut runs_seconds = Vec::with_capacity(MAX_RUNS as usize);
    for (index, &block) in ladder.iter().enumerate() {
        let remaining = planned - started.elapsed().as_secs_f64();
        if remaining <= 0.0 && points.len() >= 3 {
            tracing::debug!(block, "calibration budget spent; the ladder stops here");
            break;
        }
        let share = remaining.max(0.0) / (ladder.len() - index) as f64;
        // Bytes for MIN_RUNS runs in this size's share at the last rate (blocks get faster
        // with size, so the rate of the previous size is the conservative one).
        let fitting = (rate_bytes_per_s * share / f64::from(MIN_RUNS)) as u64;
        let len = fitting.clamp(block * MIN_BLOCKS_PER_RUN, region) / block * block;
        chunker.set_hint(source, BlockSpec::new(block, align)?);
        runs_seconds.clear();
        let size_started = Instant::now();
        while runs_seconds.len() < MAX_RUNS as usize
            && (runs_seconds.len() < MIN_RUNS as usize || size_started.elapsed().as_secs_f64() < share)
        {
            runs_seconds.push(timed_transfer(
                &mut chunker,
                transport,
                source,
                (local, remote, &mut cursor),
                (len, align),
            )?);
        }
        let runs = runs_seconds.len() as u32;
        let seconds = median(&mut runs_seconds);
        rate_bytes_per_s = len as f64 / seconds;
        let blocks = (len / block) as f64;
        points.push(CalibrationPoint {
            block_bytes: block,
            gbps: rate_bytes_per_s / 1e9,
            us_per_block: seconds / blocks * 1e6,
            runs,
            transfer_bytes: len,
        });
    }
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    let timings: Vec<BlockTiming> = points
        .iter()
        .map(|p| BlockTiming { block_bytes: p.block_bytes, seconds_per_block: p.us_per_block / 1e6 })
        .collect();
    let fit = fit_path(&timings).map_err(|e| invalid(e.to_string()))?;
    let file = measured::cache_file();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let entry = CalibratedPath {
        source,
        transport: id.clone(),
        versions: profile.versions.clone(),
        fixed_cost_us: fit.fixed_cost_us,
        bandwidth_gbps: fit.bandwidth_gbps,
        fit_r2: fit.r2,
        gradual: fit.gradual,
        measured_at_unix: now,
    };
    let (hint, stored) = match &fit.poor {
        None => (measured::calibrated_hint(&profile, &policy, &model, &entry)?, Some(entry)),
        Some(why) => {
            // Without this pair's calibration, the cache answers the recorded knee or the model.
            if let Some(file) = &file {
                let _ = measured::store_calibration(file, source, &id, None);
            }
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
                        _ => "the model's",
                    }
                ),
            ));
            (hint, None)
        }
    };
    let (stored_in, not_stored) = match (stored, &file) {
        (Some(entry), Some(file)) => match measured::store_calibration(file, source, &id, Some(entry)) {
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
    Ok(Calibration {
        source,
        transport: id,
        hint,
        fit,
        points,
        elapsed_ms,
        stored_in,
        not_stored,
        written_bytes: cursor.written,
    })
}

/// [`calibrate`] over both ends of `id` in this process ([`LoopbackPair`], regions of
/// [`LOOPBACK_REGION_BYTES`]), then checks that the bytes arrived: a path that corrupts data
/// is not calibrated.
pub fn calibrate_loopback(
    id: &TransportId,
    source: Device,
    options: &OpenOptions,
    budget: Duration,
) -> Result<Calibration, Error> {
    // An unknown device or transport is named before any memory is registered.
    crate::profile_of(source, id)?;
    let deadline = Instant::now() + TRANSFER_DEADLINE;
    let pair = LoopbackPair::open(id, source, LOOPBACK_REGION_BYTES, options, deadline)?;
    let pattern: Vec<u8> = (0..LOOPBACK_REGION_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    pair.sender.write_region(pair.local.id, 0, &pattern)?;
    let calibration = calibrate(&*pair.sender, source, &pair.local, &pair.remote, budget)?;
    let moved = calibration.written_bytes as usize;
    let mut landed = vec![0u8; moved];
    pair.receiver.read_region(pair.target.id, 0, &mut landed)?;
    if landed != pattern[..moved] {
        return Err(Error::Transport(TransportError::Handshake(format!(
            "{id}: the bytes that arrived during calibration differ from those sent"
        ))));
    }
    Ok(calibration)
}
