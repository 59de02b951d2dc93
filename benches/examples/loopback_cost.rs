//! The software cost of one write with immediate, with no second CPU in it: both ends of a
//! transport in this process and one thread doing everything a ping-pong's two sides do for
//! one block (post a signalled 8 B write with immediate, take its arrival, take its
//! completion). No cache line moves between cores, so what is left is the transport's own
//! instructions, locks and fences: the part of [`write_lat`](write_lat.rs)'s half round trip
//! that is ours. Medians of RUNS runs, ns per write.
//!
//! ```text
//! cargo build --release -p rdma-hint-benches --example loopback_cost
//! target/release/examples/loopback_cost [TRANSPORT_ID] [WRITES] [RUNS]   # default staged:shm 2000000 5
//! ```

use rdma_hint::calibration::LoopbackPair;
use rdma_hint::transport::{CompletionStatus, WaitMode};
use rdma_hint::{Arrival, Completion, Device, OpenOptions, Transport, TransportId, WriteOp};
use rdma_hint_benches::flags::Flags;
use std::time::{Duration, Instant};

/// How long one wait may take.
const PATIENCE: Duration = Duration::from_secs(10);

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

fn main() -> Result<(), String> {
    let mut args = Flags::from_env("usage: loopback_cost [TRANSPORT_ID [WRITES [RUNS]]]").rest().into_iter();
    let id: TransportId =
        args.next().unwrap_or_else(|| "staged:shm".into()).parse().map_err(|e| format!("{e}"))?;
    let writes: u64 = args.next().map_or(Ok(2_000_000), |a| a.parse()).map_err(|e| format!("writes: {e}"))?;
    let runs: usize = args.next().map_or(Ok(5), |a| a.parse()).map_err(|e| format!("runs: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let options = OpenOptions::default().token(b"rdma-hint bench").wait_mode(WaitMode::BusyPoll);
    let pair =
        LoopbackPair::open(&id, Device::Host(0), 4096, &options, deadline).map_err(|e| e.to_string())?;
    let op = WriteOp {
        wr_id: 1,
        local: pair.local.id,
        local_offset: 0,
        remote: pair.remote.id,
        remote_offset: 0,
        len: 8,
        signalled: true,
        imm: Some(7),
    };
    let (sender, receiver): (&dyn Transport, &dyn Transport) = (&*pair.sender, &*pair.receiver);
    let (mut completions, mut arrivals) = ([Completion::EMPTY; 4], [Arrival::EMPTY; 4]);
    let mut per_write = Vec::with_capacity(runs);
    let done = Completion { wr_id: 1, status: CompletionStatus::Success };
    let landed = Arrival { imm: 7, region: pair.target.id, len: 8 };
    for run in 0..runs.max(1) {
        // Each run writes its own bytes: the last write of the run must have carried them.
        let pattern = [run as u8 + 1; 8];
        sender.write_region(pair.local.id, 0, &pattern).map_err(|e| e.to_string())?;
        let started = Instant::now();
        for _ in 0..writes {
            sender.post_writes(&[op]).map_err(|e| e.to_string())?;
            one(|| receiver.poll_arrivals(&mut arrivals), "arrival")?;
            one(|| sender.poll_completions(&mut completions), "completion")?;
            if arrivals[0] != landed || completions[0] != done {
                return Err(format!(
                    "{:?} and {:?}, not {landed:?} and {done:?}",
                    arrivals[0], completions[0]
                ));
            }
        }
        per_write.push(started.elapsed().as_secs_f64() * 1e9 / writes as f64);
        let mut arrived = [0u8; 8];
        receiver.read_region(pair.target.id, 0, &mut arrived).map_err(|e| e.to_string())?;
        if arrived != pattern {
            return Err(format!("run {run}: {arrived:?} arrived, {pattern:?} was written"));
        }
    }
    per_write.sort_by(f64::total_cmp);
    let runs_ns: Vec<String> = per_write.iter().map(|ns| format!("{ns:.1}")).collect();
    println!(
        "{id}: {:.1} ns per write (post, arrival, completion), median of {} runs: {}",
        per_write[per_write.len() / 2],
        per_write.len(),
        runs_ns.join(" ")
    );
    Ok(())
}
