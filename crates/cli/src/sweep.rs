//! `rdma-hint sweep`: the block-size curve of a real backend, its knee, and the model's hint
//! next to it.

use crate::units::{format_bytes, parse_bytes};
use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rdma_hint::calibration::{LoopbackLanes, LoopbackPair};
use rdma_hint::engine::{BlockSpec, Chunker, Engine, EngineConfig, PeerId, PostPolicy, TransferRequest};
use rdma_hint::model::{median, robust_knee, robust_plateau};
use rdma_hint::{
    open, BlockingTransport, Device, LocalRegion, MemoryKind, OpenOptions, PeerEndpoint, RemoteRegion,
    Transport, TransportId,
};
use serde::Serialize;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Above this share of one core busy per GB/s-path, a path that should bypass the CPU is
/// flagged (the seed's "CPU copy suspected").
const CPU_COPY_THRESHOLD: f64 = 0.5;
/// The piece the source region is filled with at a time.
const FILL_PIECE_BYTES: u64 = 4 << 20;
/// Alignment the sweep's blocks keep (staged ring slots; GPU blocks use 64 KiB).
const HOST_ALIGN: u64 = 4096;

/// Arguments of `sweep`.
pub(crate) struct SweepArgs {
    /// How both ends are opened (the token, if any).
    pub(crate) options: OpenOptions,
    pub(crate) transport: TransportId,
    pub(crate) source: Device,
    pub(crate) sizes: Vec<u64>,
    pub(crate) iters: u32,
    pub(crate) transfer_bytes: u64,
    pub(crate) latency_samples: u32,
    pub(crate) peer: Option<std::net::SocketAddr>,
    /// `--memory-cap`: what every region the sweep registers may add up to.
    pub(crate) memory_cap: Option<u64>,
    /// How long connecting may take, handshake and hand-off included.
    pub(crate) connect_timeout: Duration,
    /// Lanes each transfer stripes over (1: one transport, through the chunker).
    pub(crate) lanes: usize,
    pub(crate) record: bool,
}

/// One block size's measurements.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    pub(crate) block_bytes: u64,
    pub(crate) avg_gbps: f64,
    /// The median of the timed transfers' rates: what the plateau and the knee are read from,
    /// so one transfer a busy moment slowed does not move them.
    pub(crate) median_gbps: f64,
    pub(crate) peak_gbps: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
    pub(crate) sharpness: f64,
    pub(crate) cpu_util: f64,
    /// This block is the hint the library answered before the sweep.
    pub(crate) is_hint: bool,
    /// Hints at this block: `model`, `calibrated`, `recorded`.
    pub(crate) hints: Vec<&'static str>,
}

/// One of the three hints, judged against the curve.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HintVerdict {
    pub(crate) block_bytes: u64,
    /// Median bandwidth at the block over the robust plateau.
    pub(crate) efficiency: f64,
    /// Block over the robust knee.
    pub(crate) over_knee: f64,
}

/// The model's, the calibrated and the recorded hint the sweep measured, kept apart.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Hints {
    pub(crate) model: HintVerdict,
    pub(crate) calibrated: Option<HintVerdict>,
    pub(crate) recorded: Option<HintVerdict>,
}

/// What `serve` learns at the end of a sweep, as the immediate of one last block: the sweep
/// finished, or it stopped because the region `serve` exposes is too small.
pub(crate) const SWEEP_FINISHED: u32 = 0x5357_0001;
/// See [`SWEEP_FINISHED`].
pub(crate) const SWEEP_REGION_TOO_SMALL: u32 = 0x5357_0002;
/// The immediate on the last block of every bandwidth transfer to a `serve` peer: the sweep
/// is alive (serve ends a run whose peer stays silent for its idle timeout).
pub(crate) const SWEEP_PROGRESS: u32 = 0x5357_0003;

/// A sweep's report and what became of recording its hint.
pub(crate) struct Outcome {
    pub(crate) report: SweepReport,
    pub(crate) recording: Recording,
}

/// Whether the sweep stored its measured hint in the hint cache.
pub(crate) enum Recording {
    /// `--no-record`.
    NotAsked,
    /// Stored in `file`.
    Recorded { file: std::path::PathBuf, block_bytes: u64 },
    /// Not stored, and why (the measurement does not support a hint).
    Skipped(String),
    /// Storing failed (the measurement stands).
    Failed(String),
}

/// The whole sweep, as `--json` writes it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SweepReport {
    pub(crate) backend: String,
    pub(crate) transport: TransportId,
    pub(crate) source: Device,
    pub(crate) transfer_bytes: u64,
    pub(crate) iters: u32,
    /// Lanes each transfer striped over.
    pub(crate) lanes: usize,
    /// Robust plateau: the median of the three best medians, in GB/s.
    pub(crate) plateau_gbps: f64,
    /// The single best average, in GB/s (for reference; verdicts use the plateau).
    pub(crate) best_avg_gbps: f64,
    /// Robust knee: the smallest block reaching 90 % of the plateau with the next larger block.
    pub(crate) knee_bytes: u64,
    /// Whether a block larger than the knee confirmed it (false: the knee is the largest block
    /// swept, and the curve may still climb past it).
    pub(crate) plateau_reached: bool,
    /// The hint the library answered before this sweep, and where it came from.
    pub(crate) hint_bytes: u64,
    pub(crate) hint_origin: rdma_hint::model::Origin,
    pub(crate) efficiency_at_hint: f64,
    pub(crate) hint_over_knee: f64,
    pub(crate) hints: Hints,
    pub(crate) cpu_copy_suspected: bool,
    pub(crate) cpu_note: String,
    pub(crate) points: Vec<Point>,
}

/// Parses `4K..64M` (the powers of two from one power of two to another) or a comma list
/// `64K,1M`. Errors read after the flag's name: "--sizes `3K..5K`: …".
pub(crate) fn parse_sizes(text: &str) -> std::result::Result<Vec<u64>, String> {
    let sizes = match text.split_once("..") {
        Some((low, high)) => {
            let (low, high) = (parse_bytes(low)?, parse_bytes(high)?);
            if low == 0 || high < low {
                return Err(format!("`{text}`: need 0 < low ≤ high"));
            }
            if !low.is_power_of_two() || !high.is_power_of_two() {
                return Err(format!(
                    "`{text}`: a range runs between powers of two (e.g. 4K..64M); list other sizes (48K,96K)"
                ));
            }
            let mut sizes = Vec::new();
            let mut size = low;
            while size <= high {
                sizes.push(size);
                size = size.checked_mul(2).ok_or("size overflows")?;
            }
            sizes
        }
        None => text.split(',').map(parse_bytes).collect::<Result<Vec<_>, _>>()?,
    };
    if sizes.is_empty() || sizes.contains(&0) {
        return Err(format!("`{text}`: every size must be at least 1 byte"));
    }
    Ok(sizes)
}

/// `--memory-cap` bounds the sweep as a whole: every region it registers (a source, and the
/// target too where the receiver runs in this process) together, checked before any is.
fn check_memory_cap(args: &SweepArgs, region_bytes: u64) -> Result<()> {
    let Some(cap) = args.memory_cap else { return Ok(()) };
    let regions = if args.peer.is_some() { 1 } else { 2 };
    let needed = region_bytes.saturating_mul(regions);
    if needed > cap {
        bail!(
            "--memory-cap {}: this sweep registers {regions} region(s) of {} ({} in all); raise the cap or lower --transfer",
            format_bytes(cap),
            format_bytes(region_bytes),
            format_bytes(needed)
        );
    }
    Ok(())
}

/// A registration the machine (or the cap) refused is about `--transfer`: the refusal says
/// so, like every refusal of an argument.
fn name_the_size_flag(error: anyhow::Error, region_bytes: u64) -> anyhow::Error {
    use rdma_hint::TransportError;
    let about_size = |e: &TransportError| {
        matches!(e, TransportError::OutOfMemory { .. } | TransportError::Registration { .. })
    };
    let refused = error.chain().any(|cause| {
        cause.downcast_ref::<TransportError>().is_some_and(about_size)
            || matches!(cause.downcast_ref::<rdma_hint::Error>(), Some(rdma_hint::Error::Transport(e)) if about_size(e))
    });
    match refused {
        true => error.context(format!(
            "--transfer {}: a region of that size cannot be registered",
            format_bytes(region_bytes)
        )),
        false => error,
    }
}

struct Endpoints {
    sender: Arc<dyn Transport>,
    /// Every sending lane, `sender` first (only it, over one lane).
    lanes: Vec<Arc<dyn Transport>>,
    _receivers: Vec<Arc<dyn Transport>>,
    source: LocalRegion,
    remote: RemoteRegion,
}

fn connect(args: &SweepArgs, region_bytes: u64) -> Result<Endpoints> {
    let deadline = Instant::now() + args.connect_timeout;
    let endpoints = match args.peer {
        Some(address) => {
            let sender = open(&args.transport, &args.options)?;
            let source = sender.register(MemoryKind::of(args.source), region_bytes)?;
            let remote = sender
                .connect_blocking(PeerEndpoint::Dial(address), &[], deadline)
                .with_context(|| format!("connecting to the peer at {address}"))?;
            let remote = *remote.first().ok_or_else(|| anyhow!("the peer exposed no region"))?;
            let sender: Arc<dyn Transport> = Arc::from(sender);
            Endpoints { lanes: vec![sender.clone()], sender, _receivers: Vec::new(), source, remote }
        }
        None if args.lanes > 1 => {
            let lanes = LoopbackLanes::open(
                &args.transport,
                args.source,
                region_bytes,
                &args.options,
                args.lanes,
                deadline,
            )?;
            Endpoints {
                sender: lanes.senders[0].clone(),
                lanes: lanes.senders,
                _receivers: lanes.receivers,
                source: lanes.local,
                remote: lanes.remote,
            }
        }
        None => {
            let pair =
                LoopbackPair::open(&args.transport, args.source, region_bytes, &args.options, deadline)?;
            let sender: Arc<dyn Transport> = Arc::from(pair.sender);
            Endpoints {
                lanes: vec![sender.clone()],
                sender,
                _receivers: vec![Arc::from(pair.receiver)],
                source: pair.local,
                remote: pair.remote,
            }
        }
    };
    let (source, remote) = (endpoints.source, endpoints.remote);
    // Filled a piece at a time: a buffer of the region's size would be memory no check saw.
    let piece = vec![0x5a; region_bytes.min(FILL_PIECE_BYTES) as usize];
    for offset in (0..region_bytes).step_by(piece.len()) {
        let len = (region_bytes - offset).min(piece.len() as u64) as usize;
        endpoints.sender.write_region(source.id, offset, &piece[..len])?;
    }
    if remote.len < region_bytes {
        if args.peer.is_some() {
            endpoints.tell_peer(SWEEP_REGION_TOO_SMALL, args.source);
        }
        bail!(
            "the peer exposes {} ({} B); this sweep needs {} ({region_bytes} B): start `rdma-hint serve` with --bytes {}",
            format_bytes(remote.len),
            remote.len,
            format_bytes(region_bytes),
            format_bytes(region_bytes).replace(' ', "")
        );
    }
    Ok(endpoints)
}

impl Endpoints {
    /// Sends `outcome` to a `serve` peer as the immediate of one small block. Best effort: a
    /// peer that cannot take it learns the same from the closed connection.
    fn tell_peer(&self, outcome: u32, source: Device) {
        let transport = &*self.sender;
        let block = HOST_ALIGN.min(self.remote.len).min(self.source.len);
        let Ok(spec) = BlockSpec::new(block, block) else { return };
        let Ok(mut chunker) = Chunker::new(PostPolicy::default(), transport.capabilities()) else { return };
        chunker.set_hint(source, spec);
        let transfer = TransferRequest::single(&self.source, 0, &self.remote, 0, block).notify(outcome);
        let deadline = Instant::now() + Duration::from_secs(10);
        if let Err(e) = chunker.transfer_blocking(transport, transfer.from_source(source), deadline) {
            tracing::debug!(error = %e, "could not tell the peer how the sweep ended");
        }
    }
}

/// How long a sweep streams before its first point.
const WARM_UP: Duration = Duration::from_millis(1000);

/// Streams transfers of the first block for [`WARM_UP`] before anything is timed: the first
/// point of a fresh process otherwise pays for what the later ones find warm (on the 2-core
/// machine a sweep's first point over ucx:shm ran at half the rate it reached 30 transfers
/// later, whichever block came first), and a curve whose small blocks are measured cold
/// puts the knee too far. A 250 ms warm-up left a sweep's 16 KiB at 0.75–0.94 of the plateau
/// over six sweeps, 1 s at 0.89–0.94.
fn warm_up(mover: &mut Mover, endpoints: &Endpoints, args: &SweepArgs, block: &Block) -> Result<()> {
    mover.aim(args, block)?;
    let transfer = streamed(endpoints, args, block.bytes);
    let started = Instant::now();
    while started.elapsed() < WARM_UP {
        mover.write(endpoints, args, &transfer)?;
    }
    Ok(())
}

/// A ladder block's spec: it keeps the largest power of two that divides it, up to the ladder's
/// alignment (a hint need not be a multiple of it: UCX's is 512 B).
fn ladder_spec(block: u64, align: u64) -> Result<BlockSpec> {
    Ok(BlockSpec::new(block, align.min(1 << block.trailing_zeros()))?)
}

/// The transfer a point streams in blocks of `block`: whole blocks only, never past the region
/// (at least one block, at most the transfer size); a serve peer hears from us once per
/// transfer, the loopback receiver drains nothing.
fn streamed(endpoints: &Endpoints, args: &SweepArgs, block: u64) -> TransferRequest {
    let len = (args.transfer_bytes / block).max(1) * block;
    let transfer = TransferRequest::single(&endpoints.source, 0, &endpoints.remote, 0, len);
    if args.peer.is_some() {
        transfer.notify(SWEEP_PROGRESS)
    } else {
        transfer
    }
}

/// One block size of the sweep and the hints that sit at it.
struct Block {
    bytes: u64,
    /// Its spec on the ladder (used unless a hint sits here).
    spec: BlockSpec,
    marks: Marks,
}

/// One transfer of `len` bytes, or one block of it: through the chunker over one lane, through
/// the engine over several. One mover serves the whole sweep, aimed at each block in turn
/// (engines on the same lanes would take each other's completions).
enum Mover {
    Chunker(Box<Chunker>),
    Engine(Engine, PeerId),
}

impl Mover {
    fn new(endpoints: &Endpoints) -> Result<Mover> {
        if endpoints.lanes.len() == 1 {
            return Ok(Mover::Chunker(Box::new(Chunker::new(
                PostPolicy::default(),
                endpoints.sender.capabilities(),
            )?)));
        }
        let engine = Engine::new(EngineConfig::default())?;
        let peer = engine.add_peer(endpoints.lanes.clone(), &[endpoints.remote])?;
        Ok(Mover::Engine(engine, peer))
    }

    /// Cuts the next transfers at `block`: in the first hint's own spec where a hint sits there
    /// (a hint is measured as the chunker takes it from an embedder), else the ladder's.
    fn aim(&mut self, args: &SweepArgs, block: &Block) -> Result<()> {
        match (self, &block.marks.hint) {
            (Mover::Chunker(chunker), Some(hint)) => chunker.set_size_hint(hint)?,
            (Mover::Chunker(chunker), None) => chunker.set_hint(args.source, block.spec),
            (Mover::Engine(engine, _), Some(hint)) => engine.set_size_hint(hint)?,
            (Mover::Engine(engine, _), None) => engine.set_hint(args.source, block.spec),
        }
        Ok(())
    }

    /// Moves `request` and waits until it is delivered.
    fn write(&mut self, endpoints: &Endpoints, args: &SweepArgs, request: &TransferRequest) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        // One range: the clone copies it, no allocation.
        let request = request.clone().from_source(args.source);
        match self {
            Mover::Chunker(chunker) => {
                chunker.transfer_blocking(&*endpoints.sender, request, deadline)?;
            }
            Mover::Engine(engine, peer) => {
                let id = engine.submit(*peer, request, deadline)?;
                engine.wait_blocking(id, deadline)?;
            }
        }
        Ok(())
    }
}

/// What one block size's timed transfers add up to over the rounds.
#[derive(Debug, Clone, Default)]
struct Tally {
    /// Each transfer's rate, in GB/s.
    rates: Vec<f64>,
    wall_s: f64,
}

/// Times `args.iters` rounds of one streaming transfer of every block, then each block's
/// single-block latency.
///
/// Rounds, not one block size after another: a busy spell of the machine (another tenant, a
/// page reclaim) then slows one transfer of every size a little instead of every transfer of
/// one size, and the per-size medians see it as the outlier it is. Measured one size after
/// another, a 2-core machine's sweeps moved their knee from 8 KiB to 256 KiB between runs of
/// one binary, and a run's own point at one block read 0.4–1.2 of the median curve. Rounds
/// alternate their direction so a drift within one favours neither end of the curve.
fn measure_curve(
    mover: &mut Mover,
    endpoints: &Endpoints,
    args: &SweepArgs,
    blocks: &[Block],
    progress: &ProgressBar,
) -> Result<Vec<Point>> {
    let transfers: Vec<TransferRequest> = blocks.iter().map(|b| streamed(endpoints, args, b.bytes)).collect();
    // Every size's first transfer is not timed: it pays for what the later ones find warm.
    for (block, transfer) in blocks.iter().zip(&transfers) {
        mover.aim(args, block)?;
        mover.write(endpoints, args, transfer)?;
    }
    let mut tallies = vec![Tally::default(); blocks.len()];
    for round in 0..args.iters {
        progress.set_message(format!("round {} of {}", round + 1, args.iters));
        for step in 0..blocks.len() {
            let index = if round % 2 == 0 { step } else { blocks.len() - 1 - step };
            mover.aim(args, &blocks[index])?;
            let transfer = &transfers[index];
            let started = Instant::now();
            mover.write(endpoints, args, transfer)?;
            let wall_s = started.elapsed().as_secs_f64();
            let tally = &mut tallies[index];
            tally.rates.push(transfer.len() as f64 / wall_s / 1e9);
            tally.wall_s += wall_s;
        }
        progress.inc(1);
    }
    progress.set_message("latency");
    let mut points = Vec::with_capacity(blocks.len());
    for ((block, transfer), mut tally) in blocks.iter().zip(&transfers).zip(tallies) {
        mover.aim(args, block)?;
        let peak = tally.rates.iter().copied().fold(0.0, f64::max);
        let median_gbps = median(&mut tally.rates).unwrap_or(f64::NAN);
        let avg_gbps = transfer.len() as f64 * f64::from(args.iters) / tally.wall_s / 1e9;
        // Apart from the timed rounds: one interval long enough for the process clock to count
        // every thread (see `cpu_share`).
        let cpu_util = crate::cpu_share::share_while(|| mover.write(endpoints, args, transfer))?;
        // Latency: one block at a time, signalled, as ib_write_lat does.
        let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
        let single = TransferRequest::single(&endpoints.source, 0, &endpoints.remote, 0, block.bytes);
        for _ in 0..args.latency_samples {
            let started = Instant::now();
            mover.write(endpoints, args, &single)?;
            histogram.saturating_record((started.elapsed().as_nanos() as u64).max(1));
        }
        // A serve peer hears from us after each size's samples too: every size's samples back
        // to back (gigabytes at the default sizes) could outlast its idle timeout on a slow path.
        if args.peer.is_some() {
            mover.write(endpoints, args, &single.clone().notify(SWEEP_PROGRESS))?;
        }
        let us = |quantile: f64| histogram.value_at_quantile(quantile) as f64 / 1e3;
        let (p50_us, p99_us) = (us(0.5), us(0.99));
        points.push(Point {
            block_bytes: block.bytes,
            avg_gbps,
            median_gbps,
            peak_gbps: peak,
            p50_us,
            p99_us,
            p999_us: us(0.999),
            max_us: histogram.max() as f64 / 1e3,
            sharpness: if p50_us > 0.0 { p99_us / p50_us } else { f64::NAN },
            cpu_util,
            is_hint: block.marks.answered,
            hints: block.marks.hints.clone(),
        });
    }
    Ok(points)
}

/// Which hints sit at one block.
#[derive(Debug, Clone, Default)]
struct Marks {
    answered: bool,
    hints: Vec<&'static str>,
    /// The first hint at this block: measured in its own block spec, as an embedder gets it.
    hint: Option<rdma_hint::SizeHint>,
}

/// Runs the sweep.
pub(crate) fn run(args: &SweepArgs) -> Result<Outcome> {
    let transport_id = args.transport.clone();
    let set = rdma_hint::calibration::hint_set(args.source, &transport_id)
        .with_context(|| format!("no model hint for {} over {transport_id}", args.source))?;
    let answered = set.chosen().clone();
    let align = rdma_hint::calibration::ladder_alignment(&set.model);
    if let Some(odd) = args.sizes.iter().find(|size| *size % align != 0) {
        bail!(
            "--sizes: {} is not a multiple of the {} alignment {} needs over {transport_id}",
            format_bytes(*odd),
            format_bytes(align),
            args.source
        );
    }
    let blocks = marked_blocks(args, &set, &answered);
    let largest = blocks.iter().map(|b| b.0).max().unwrap_or(align);
    let region_bytes = args.transfer_bytes.max(largest);
    check_memory_cap(args, region_bytes)?;
    let endpoints = connect(args, region_bytes).map_err(|error| name_the_size_flag(error, region_bytes))?;

    let blocks = blocks
        .into_iter()
        .map(|(bytes, marks)| Ok(Block { bytes, spec: ladder_spec(bytes, align)?, marks }))
        .collect::<Result<Vec<Block>>>()?;
    let progress = progress_bar(args.iters);
    let mut mover = Mover::new(&endpoints)?;
    if let Some(first) = blocks.first() {
        warm_up(&mut mover, &endpoints, args, first)?;
    }
    let points = measure_curve(&mut mover, &endpoints, args, &blocks, &progress)?;
    // The mover's chunker or engine (and its driver thread) is done with the lanes before
    // `tell_peer` writes on them with a chunker of its own.
    drop(mover);
    progress.finish_and_clear();
    if args.peer.is_some() {
        endpoints.tell_peer(SWEEP_FINISHED, args.source);
    }

    let curve: Vec<(u64, f64)> = points.iter().map(|p| (p.block_bytes, p.median_gbps)).collect();
    let plateau_gbps = robust_plateau(&curve).unwrap_or(f64::NAN);
    let largest_swept = curve.iter().map(|p| p.0).max().unwrap_or(0);
    let knee = robust_knee(&curve, plateau_gbps);
    // A knee at the largest block swept has no larger block to confirm it: the curve may still
    // be climbing, so the plateau was not reached within these sizes.
    let plateau_reached = knee.is_some_and(|knee| knee < largest_swept);
    let knee_bytes = knee.unwrap_or(answered.block_bytes);
    let verdict = |block: u64| HintVerdict {
        block_bytes: block,
        efficiency: points.iter().find(|p| p.block_bytes == block).map_or(f64::NAN, |p| p.median_gbps)
            / plateau_gbps,
        over_knee: block as f64 / knee_bytes as f64,
    };
    let hints = Hints {
        model: verdict(set.model.block_bytes),
        calibrated: set.calibrated.as_ref().map(|h| verdict(h.block_bytes)),
        recorded: set.recorded.as_ref().map(|h| verdict(h.block_bytes)),
    };
    let at_answered = verdict(answered.block_bytes);
    let cpu_peak = points.iter().map(|p| p.cpu_util).fold(0.0, f64::max);
    let record_bytes = block_to_record(knee_bytes, hints.calibrated.as_ref());
    let recording = recording(args, (knee, plateau_reached), (record_bytes, largest_swept, plateau_gbps));
    let report = SweepReport {
        backend: args.transport.backend().to_string(),
        cpu_copy_suspected: args.transport.bypasses_cpu() && cpu_peak > CPU_COPY_THRESHOLD,
        transport: transport_id,
        source: args.source,
        transfer_bytes: args.transfer_bytes,
        iters: args.iters,
        lanes: args.lanes,
        plateau_gbps,
        best_avg_gbps: points.iter().map(|p| p.avg_gbps).fold(0.0, f64::max),
        knee_bytes,
        plateau_reached,
        hint_bytes: answered.block_bytes,
        hint_origin: answered.origin,
        efficiency_at_hint: at_answered.efficiency,
        hint_over_knee: at_answered.over_knee,
        hints,
        cpu_note: format!(
            "peak process CPU {:.0} % of one core during the bandwidth runs; staged, UCX over shm/tcp and Soft-RoCE copy with the CPU by design",
            cpu_peak * 100.0
        ),
        points,
    };
    Ok(Outcome { report, recording })
}

/// The block sizes to sweep: those asked for, each hint the pair has (model, calibrated,
/// recorded) that fits a transfer, marked with its labels, and which one the library answers.
fn marked_blocks(
    args: &SweepArgs,
    set: &rdma_hint::calibration::HintSet,
    answered: &rdma_hint::SizeHint,
) -> Vec<(u64, Marks)> {
    let mut blocks: Vec<(u64, Marks)> = args.sizes.iter().map(|s| (*s, Marks::default())).collect();
    let labelled = [
        ("model", Some(&set.model)),
        ("calibrated", set.calibrated.as_ref()),
        ("recorded", set.recorded.as_ref()),
    ];
    for (label, hint) in labelled {
        let Some(hint) = hint else { continue };
        // A block larger than a transfer is not a block of it: such a hint is reported as not
        // swept, not measured with a region larger than asked for.
        if hint.block_bytes > args.transfer_bytes {
            continue;
        }
        match blocks.iter_mut().find(|b| b.0 == hint.block_bytes) {
            Some(block) => {
                block.1.hints.push(label);
                block.1.hint.get_or_insert_with(|| hint.clone());
            }
            None => blocks.push((
                hint.block_bytes,
                Marks { answered: false, hints: vec![label], hint: Some(hint.clone()) },
            )),
        }
    }
    for block in &mut blocks {
        block.1.answered = block.0 == answered.block_bytes;
    }
    blocks.sort_unstable_by_key(|b| b.0);
    blocks
}

/// A progress bar on a terminal, nothing otherwise.
fn progress_bar(iters: u32) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(u64::from(iters));
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}") {
        bar.set_style(style);
    }
    bar
}

/// Records the knee as the pair's hint where the sweep was asked to and the curve vouches for
/// it (one lane, the plateau reached), or says why not.
fn recording(
    args: &SweepArgs,
    (knee, plateau_reached): (Option<u64>, bool),
    (record_bytes, largest_swept, plateau_gbps): (u64, u64, f64),
) -> Recording {
    match (args.record, plateau_reached) {
        (false, _) => Recording::NotAsked,
        (true, _) if args.lanes > 1 => Recording::Skipped(format!(
            "a curve over {} lanes: the hint cache holds the hint of one lane (sweep without --lanes to record it)",
            args.lanes
        )),
        (true, false) if knee.is_some() => Recording::Skipped(format!(
            "the plateau was not reached within the swept sizes (the knee would be the largest, {}): sweep larger blocks",
            format_bytes(largest_swept)
        )),
        (true, false) => {
            Recording::Skipped("no block reached 90 % of the plateau with the next one: nothing to record".into())
        }
        (true, true) => {
            match rdma_hint::calibration::record_measurement(args.source, &args.transport, record_bytes, plateau_gbps) {
                Ok(file) => Recording::Recorded { file, block_bytes: record_bytes },
                // The measurement stands: the table and --json still come; the caller fails last.
                Err(error) => Recording::Failed(error.to_string()),
            }
        }
    }
}

/// The block `sweep` records as the measured hint: the robust knee, or the calibrated hint when
/// this sweep shows it meets the rule (≥ 0.90 of the plateau, at most 2× the knee) at a smaller
/// block. A knee pushed up by a dip (a block below it that fell under 90 %) thus does not
/// replace a calibrated hint the same curve confirmed.
fn block_to_record(knee_bytes: u64, calibrated: Option<&HintVerdict>) -> u64 {
    match calibrated {
        Some(hint) if hint.efficiency >= 0.90 && hint.over_knee <= 2.0 && hint.block_bytes < knee_bytes => {
            hint.block_bytes
        }
        _ => knee_bytes,
    }
}

/// The table `sweep` prints, perftest style.
pub(crate) fn table(report: &SweepReport) -> String {
    let mut out = format!(
        "# rdma-hint sweep: {} from {}, {} per transfer, {} iterations{}\n{:>10} {:>10} {:>11} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6}\n",
        report.transport,
        report.source,
        format_bytes(report.transfer_bytes),
        report.iters,
        if report.lanes > 1 { format!(", striped over {} lanes", report.lanes) } else { String::new() },
        "block",
        "avg GB/s",
        "median GB/s",
        "peak GB/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "p99/p50",
        "CPU %"
    );
    for p in &report.points {
        out.push_str(&format!(
            "{:>10} {:>10.3} {:>11.3} {:>10.3} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7.2} {:>6.0}{}\n",
            format_bytes(p.block_bytes),
            p.avg_gbps,
            p.median_gbps,
            p.peak_gbps,
            p.p50_us,
            p.p99_us,
            p.p999_us,
            p.max_us,
            p.sharpness,
            p.cpu_util * 100.0,
            if p.hints.is_empty() { String::new() } else { format!("  ← {} hint", p.hints.join(" + ")) }
        ));
    }
    let knee = if report.plateau_reached {
        format!(
            "knee {} (smallest block at 90 % of the plateau with the next one)",
            format_bytes(report.knee_bytes)
        )
    } else {
        "plateau not reached: the largest block swept is the first at 90 % of the best, so the curve may still climb (sweep larger blocks)".to_string()
    };
    out.push_str(&format!(
        "plateau {:.3} GB/s (median of the 3 best medians; best average {:.3}); {knee}\n",
        report.plateau_gbps, report.best_avg_gbps,
    ));
    let hints = &report.hints;
    for (label, verdict) in [
        ("model", Some(&hints.model)),
        ("calibrated", hints.calibrated.as_ref()),
        ("recorded", hints.recorded.as_ref()),
    ] {
        match verdict {
            Some(v) if v.block_bytes > report.transfer_bytes => out.push_str(&format!(
                "{label:>10} hint {:>10} → not swept (larger than the {} transfer)\n",
                format_bytes(v.block_bytes),
                format_bytes(report.transfer_bytes)
            )),
            Some(v) => out.push_str(&format!(
                "{label:>10} hint {:>10} → {:.3} of plateau, {:.2}× the knee{}\n",
                format_bytes(v.block_bytes),
                v.efficiency,
                v.over_knee,
                if report.hint_origin == origin_of(label) { "  (what the library answered)" } else { "" }
            )),
            None => out.push_str(&format!("{label:>10} hint {:>10}\n", "(none)")),
        }
    }
    out.push_str(&format!(
        "{}{}\n",
        report.cpu_note,
        if report.cpu_copy_suspected { "\nCPU copy suspected: this path should bypass the CPU" } else { "" }
    ));
    out
}

fn origin_of(label: &str) -> rdma_hint::model::Origin {
    match label {
        "calibrated" => rdma_hint::model::Origin::Calibrated,
        "recorded" => rdma_hint::model::Origin::Measured,
        _ => rdma_hint::model::Origin::Model,
    }
}

#[cfg(test)]
mod tests {
    /// The recorded block: the knee, or the calibrated hint this curve confirms below it.
    #[test]
    fn a_confirmed_calibrated_hint_is_recorded_instead_of_a_knee_past_a_dip() {
        use super::{block_to_record, HintVerdict};
        let verdict = |block_bytes, efficiency, over_knee| HintVerdict { block_bytes, efficiency, over_knee };
        let knee = 2 << 20;
        assert_eq!(block_to_record(knee, Some(&verdict(620 << 10, 1.002, 0.3))), 620 << 10);
        assert_eq!(block_to_record(knee, Some(&verdict(620 << 10, 0.85, 0.3))), knee, "not at 90 %");
        assert_eq!(block_to_record(knee, Some(&verdict(8 << 20, 0.99, 4.0))), knee, "not below the knee");
        assert_eq!(block_to_record(knee, None), knee);
    }

    use super::*;

    #[test]
    fn size_ranges_parse() {
        assert_eq!(parse_sizes("4K..32K").unwrap(), vec![4096, 8192, 16384, 32768]);
        assert_eq!(parse_sizes("64K,1M").unwrap(), vec![65536, 1 << 20]);
        assert!(parse_sizes("0..4K").is_err());
        assert!(parse_sizes("8K..4K").is_err());
        assert!(parse_sizes("lots").is_err());
        assert!(parse_sizes("3K..5K").unwrap_err().contains("powers of two"));
        assert_eq!(parse_sizes("48K,96K").unwrap(), vec![48 << 10, 96 << 10]);
    }
}
