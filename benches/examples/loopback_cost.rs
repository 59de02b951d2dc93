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

use rdma_hint::{
    Arrival, Completion, LoopbackPair, OpenOptions, SourceId, Transport, TransportId, WaitMode, WriteOp,
};
use std::time::{Duration, Instant};

/// Polls `poll` until it yields an item, fails, or `deadline` passes.
fn one(
    deadline: Instant,
    mut poll: impl FnMut() -> Result<usize, rdma_hint::TransportError>,
    what: &str,
) -> Result<(), String> {
    while poll().map_err(|e| format!("{what}: {e}"))? == 0 {
        if Instant::now() > deadline {
            return Err(format!("no {what} before the deadline"));
        }
    }
    Ok(())
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let id: TransportId =
        args.next().unwrap_or_else(|| "staged:shm".into()).parse().map_err(|e| format!("{e}"))?;
    let writes: u64 = args.next().map_or(Ok(2_000_000), |a| a.parse()).map_err(|e| format!("writes: {e}"))?;
    let runs: usize = args.next().map_or(Ok(5), |a| a.parse()).map_err(|e| format!("runs: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let options = OpenOptions::default().token(b"rdma-hint bench").wait_mode(WaitMode::BusyPoll);
    let pair =
        LoopbackPair::open(&id, SourceId::Host(0), 4096, &options, deadline).map_err(|e| e.to_string())?;
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
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        for _ in 0..writes {
            sender.post_writes(&[op]).map_err(|e| e.to_string())?;
            one(deadline, || receiver.poll_arrivals(&mut arrivals), "arrival")?;
            one(deadline, || sender.poll_completions(&mut completions), "completion")?;
            if arrivals[0].imm != 7 {
                return Err(format!("arrival {:?}, not the immediate written", arrivals[0]));
            }
        }
        per_write.push(started.elapsed().as_secs_f64() * 1e9 / writes as f64);
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
