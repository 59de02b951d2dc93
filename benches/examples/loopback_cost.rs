//! The software cost of one write with immediate, with no second CPU in it: both ends of a
//! transport in this process and one thread doing everything a ping-pong's two sides do for
//! one block (post a signalled 8 B write with immediate, take its arrival, take its
//! completion). No cache line moves between cores, so what is left is the transport's own
//! instructions, locks and fences: the part of [`write_lat`](write_lat.rs)'s half round trip
//! that is ours. Medians of RUNS runs, ns per write.
//!
//! The same round through the transfer engine (`MODE` `engine`: submit a 4 KiB latency-first
//! transfer with an immediate, take its arrival, `wait` for it), against the transport posted
//! by hand with the same op (`raw`), runs alternating (`both`): what the engine
//! adds per transfer, with no second CPU and no wake-up in it. Under `valgrind --tool=callgrind`
//! one mode at a time counts the instructions of each.
//!
//! ```text
//! cargo build --release -p rdma-hint-benches --example loopback_cost
//! target/release/examples/loopback_cost [TRANSPORT_ID] [WRITES] [RUNS] [write|raw|engine|both]
//! # default staged:shm 2000000 5 write (8 B writes); raw, engine and both move 4 KiB
//! ```

use rdma_hint::calibration::LoopbackPair;
use rdma_hint::engine::{BlockSpec, Engine, EngineConfig, PeerId, TransferRequest};
use rdma_hint::transport::{CompletionStatus, WaitMode};
use rdma_hint::{
    Arrival, Completion, Device, LocalRegion, OpenOptions, RemoteRegion, Transport, TransportId, WriteOp,
};
use rdma_hint_benches::flags::Flags;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one wait may take.
const PATIENCE: Duration = Duration::from_secs(10);
/// The engine's transfer (and the hand-posted write it is set against), in bytes.
const TRANSFER: u64 = 4096;
/// Transfers before the timed ones: past a lane's first requests, which the engine leaves to
/// its driver thread.
const WARM: u64 = 1000;

/// Polls `poll` until it yields an item, fails, or [`PATIENCE`] passes (the clock is read only
/// once nothing was there at the first look).
fn one(mut poll: impl FnMut() -> Result<usize, rdma_hint::TransportError>, what: &str) -> Result<(), String> {
    let mut deadline = None;
    while poll().map_err(|e| format!("{what}: {e}"))? == 0 {
        let now = Instant::now();
        if now > *deadline.get_or_insert(now + PATIENCE) {
            return Err(format!("no {what} within {PATIENCE:?}"));
        }
    }
    Ok(())
}

/// The two ends of a loopback pair and their regions.
struct Ends<'a> {
    sender: &'a dyn Transport,
    receiver: &'a dyn Transport,
    local: LocalRegion,
    remote: RemoteRegion,
    target: LocalRegion,
}

fn main() -> Result<(), String> {
    let usage = "usage: loopback_cost [TRANSPORT_ID [WRITES [RUNS [write|raw|engine|both]]]]";
    let mut args = Flags::from_env(usage).rest().into_iter();
    let id: TransportId =
        args.next().unwrap_or_else(|| "staged:shm".into()).parse().map_err(|e| format!("{e}"))?;
    let writes: u64 = args.next().map_or(Ok(2_000_000), |a| a.parse()).map_err(|e| format!("writes: {e}"))?;
    let runs = args.next().map_or(Ok(5), |a| a.parse::<usize>()).map_err(|e| format!("runs: {e}"))?;
    // Each run writes a pattern of its own (a byte of its number): at most 100 tell apart.
    if !(1..=100).contains(&runs) {
        return Err(format!("runs: {runs}; give 1 to 100"));
    }
    let mode = args.next().unwrap_or_else(|| "write".into());
    let deadline = Instant::now() + Duration::from_secs(60);
    let options = OpenOptions::default().token(b"rdma-hint bench").wait_mode(WaitMode::BusyPoll);
    let LoopbackPair { sender, receiver, local, remote, target } =
        LoopbackPair::open(&id, Device::Host(0), TRANSFER, &options, deadline).map_err(|e| e.to_string())?;
    let sender: Arc<dyn Transport> = Arc::from(sender);
    let ends = Ends { sender: &*sender, receiver: &*receiver, local, remote, target };
    match mode.as_str() {
        "write" => {
            let per_write = (0..runs)
                .map(|run| checked(&ends, run as u8, 8, || hand_posted(&ends, 8, writes)))
                .collect::<Result<Vec<_>, _>>()?;
            report(&id, "write (post, arrival, completion)", &per_write);
        }
        "raw" | "engine" | "both" => against_the_engine(&id, &ends, &sender, writes, runs, &mode)?,
        other => return Err(format!("{other}: {usage}")),
    }
    Ok(())
}

/// Runs `round` on a pattern of its own (`tag`) in the sender's first `len` bytes, and checks
/// that the pattern is what landed.
fn checked(
    ends: &Ends<'_>,
    tag: u8,
    len: u64,
    round: impl FnOnce() -> Result<f64, String>,
) -> Result<f64, String> {
    let pattern = vec![tag.wrapping_add(1); len as usize];
    ends.sender.write_region(ends.local.id, 0, &pattern).map_err(|e| e.to_string())?;
    let ns = round()?;
    let mut arrived = vec![0u8; len as usize];
    ends.receiver.read_region(ends.target.id, 0, &mut arrived).map_err(|e| e.to_string())?;
    if arrived != pattern {
        return Err(format!("run {tag}: the bytes that arrived are not the {len} written"));
    }
    Ok(ns)
}

/// `writes` rounds of one signalled write of `len` bytes with an immediate posted by hand:
/// post, take its arrival, take its completion; ns per round.
fn hand_posted(ends: &Ends<'_>, len: u64, writes: u64) -> Result<f64, String> {
    let op = WriteOp {
        wr_id: 1,
        local: ends.local.id,
        local_offset: 0,
        remote: ends.remote.id,
        remote_offset: 0,
        len,
        signalled: true,
        imm: Some(7),
    };
    let (mut completions, mut arrivals) = ([Completion::EMPTY; 4], [Arrival::EMPTY; 4]);
    let done = Completion { wr_id: 1, status: CompletionStatus::Success };
    let landed = Arrival { imm: 7, region: ends.target.id, len };
    let started = Instant::now();
    for _ in 0..writes {
        ends.sender.post_writes(&[op]).map_err(|e| e.to_string())?;
        one(|| ends.receiver.poll_arrivals(&mut arrivals), "arrival")?;
        one(|| ends.sender.poll_completions(&mut completions), "completion")?;
        if arrivals[0] != landed || completions[0] != done {
            return Err(format!("{:?} and {:?}, not {landed:?} and {done:?}", arrivals[0], completions[0]));
        }
    }
    Ok(started.elapsed().as_secs_f64() * 1e9 / writes as f64)
}

/// `writes` rounds through `engine`: submit a latency-first transfer of [`TRANSFER`] bytes
/// with an immediate, take its arrival, `wait` for it; ns per round.
fn engine_rounds(engine: &Engine, peer: PeerId, ends: &Ends<'_>, writes: u64) -> Result<f64, String> {
    let mut arrivals = [Arrival::EMPTY; 4];
    let landed = Arrival { imm: 7, region: ends.target.id, len: TRANSFER };
    let started = Instant::now();
    for _ in 0..writes {
        let deadline = Instant::now() + PATIENCE;
        let request =
            TransferRequest::single(&ends.local, 0, &ends.remote, 0, TRANSFER).latency_first().notify(7);
        let id = engine.submit(peer, request, deadline).map_err(|e| e.to_string())?;
        one(|| ends.receiver.poll_arrivals(&mut arrivals), "arrival")?;
        let delivered = engine.wait_blocking(id, deadline).map_err(|e| e.to_string())?;
        if arrivals[0] != landed || delivered.bytes != TRANSFER {
            return Err(format!("{:?} and {delivered:?}, not {landed:?} and {TRANSFER} bytes", arrivals[0]));
        }
    }
    Ok(started.elapsed().as_secs_f64() * 1e9 / writes as f64)
}

/// The engine against the transport posted by hand with the same write, runs alternating;
/// `mode` `raw` or `engine` runs one of them (for callgrind).
fn against_the_engine(
    id: &TransportId,
    ends: &Ends<'_>,
    sender: &Arc<dyn Transport>,
    writes: u64,
    runs: usize,
    mode: &str,
) -> Result<(), String> {
    // No engine (nor its driver thread) where only the hand-posted side runs.
    let engine = match mode {
        "raw" => None,
        _ => {
            let engine = Engine::new(EngineConfig::default()).map_err(|e| e.to_string())?;
            engine.set_hint(Device::Host(0), BlockSpec::new(TRANSFER, 4096).map_err(|e| e.to_string())?);
            let peer = engine.add_peer(vec![sender.clone()], &[ends.remote]).map_err(|e| e.to_string())?;
            engine_rounds(&engine, peer, ends, WARM)?;
            Some((engine, peer))
        }
    };
    let (mut raw, mut through) = (Vec::new(), Vec::new());
    for run in 0..runs {
        if mode != "engine" {
            raw.push(checked(ends, 2 * run as u8, TRANSFER, || hand_posted(ends, TRANSFER, writes))?);
        }
        if let Some((engine, peer)) = &engine {
            through.push(checked(ends, 2 * run as u8 + 1, TRANSFER, || {
                engine_rounds(engine, *peer, ends, writes)
            })?);
        }
    }
    if !raw.is_empty() {
        report(id, "4 KiB write posted by hand (post, arrival, completion)", &raw);
    }
    if !through.is_empty() {
        report(id, "4 KiB transfer through the engine (submit, arrival, wait)", &through);
    }
    if mode == "both" {
        let (hand, ours) = (median(&raw), median(&through));
        println!("RESULT loopback-engine {id} {hand:.1} {ours:.1} {:.2}x +{:.1}ns", ours / hand, ours - hand);
    }
    Ok(())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Prints "ID: X ns per WHAT, median of N runs: a b c" (the runs sorted).
fn report(id: &TransportId, what: &str, ns: &[f64]) {
    let mut sorted = ns.to_vec();
    sorted.sort_by(f64::total_cmp);
    let runs: Vec<String> = sorted.iter().map(|ns| format!("{ns:.1}")).collect();
    println!("{id}: {:.1} ns per {what}, median of {} runs: {}", median(ns), ns.len(), runs.join(" "));
}
