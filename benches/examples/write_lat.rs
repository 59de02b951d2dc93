//! Latency of one block in `BusyPoll` mode, measured the way `ucx_perftest -t ucp_put_lat`
//! and `ib_write_lat` measure theirs: a ping-pong of writes between two processes, each write
//! announced to the other side (write with immediate), latency = round trip / 2; each write's
//! completion is drained after its answer arrived, off the critical path. Then, in a phase of
//! its own, the completion latency of one signalled write (post → completion), which is what
//! the chunker waits for. Last, the wake-up: after 10 ms of silence a write reaches a receiver
//! whose wait sleeps ([`WaitMode::Adaptive`]), which answers at once; half that round trip is
//! what the first write of a burst costs. Between the first two, the latency of one signalled
//! read of the peer's region (post → completion), as `ib_read_lat` measures its own, while the
//! peer spins in `BusyPoll`. Run by `benches/latency-vs-perftest.sh`.
//!
//! ```text
//! write_lat <transport-id> <bytes> serve <listen-address> <iterations>   # prints LISTENING <address>
//! write_lat <transport-id> <bytes> run <address> <iterations>            # prints RESULT lines
//! ```
//!
//! `RESULT pingpong <p50 µs> <p99 µs>` is half the round trip; `RESULT completion <p50> <p99>`
//! the post-to-completion time of one signalled write; `RESULT read <p50> <p99>` that of one
//! signalled read; `RESULT wakeup <p50> <p99>` half the round trip of a write that wakes a
//! sleeping (`Adaptive`) receiver after 10 ms of silence.

use rdma_hint::transport::WaitMode;
use rdma_hint::{
    open, Arrival, BlockingTransport, Completion, LocalRegion, MemoryKind, OpenOptions, PeerEndpoint, ReadOp,
    RemoteRegion, Transport, TransportId, WriteOp,
};
use rdma_hint_benches::flags::Flags;
use std::time::{Duration, Instant};

/// Warm-up round trips before timing.
const WARMUP: usize = 100;
/// Writes after silence, and the silence before each.
const WAKE_ROUNDS: usize = 200;
const SILENCE: Duration = Duration::from_millis(10);

fn write(
    transport: &dyn Transport,
    local: &LocalRegion,
    remote: &RemoteRegion,
    bytes: u64,
    imm: Option<u32>,
) {
    let op = WriteOp {
        wr_id: 1,
        local: local.id,
        local_offset: 0,
        remote: remote.id,
        remote_offset: 0,
        len: bytes,
        signalled: true,
        imm,
    };
    // A peer that takes its arrivals slower than this side completes writes (the completion
    // phase) fills its notice ring: a full queue moved nothing, so the write goes again, and
    // its time counts. The clock is read only then: a timed write pays for no extra call.
    let mut deadline = None;
    loop {
        match transport.post_writes(&[op]) {
            Err(rdma_hint::TransportError::QueueFull { .. })
                if *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(10))
                    > Instant::now() =>
            {
                std::hint::spin_loop()
            }
            posted => return posted.expect("post"),
        }
    }
}

/// One signalled read of the peer's region into `local`.
fn read(transport: &dyn Transport, local: &LocalRegion, remote: &RemoteRegion, bytes: u64) {
    let op = ReadOp {
        wr_id: 2,
        local: local.id,
        local_offset: 0,
        remote: remote.id,
        remote_offset: 0,
        len: bytes,
        signalled: true,
    };
    transport.post_reads(&[op]).expect("post a read");
}

/// Takes the completion of the one outstanding write (BusyPoll: spins until it is there).
fn complete(transport: &dyn Transport, deadline: Instant) {
    let mut completions = [Completion::EMPTY; 4];
    let mut got = 0;
    while got == 0 {
        got =
            rdma_hint::block_on(transport.wait_completions(&mut completions, deadline)).expect("completion");
    }
}

/// Takes exactly one arrival: the phases count them.
fn arrive(transport: &dyn Transport, deadline: Instant) {
    let mut arrivals = [Arrival::EMPTY; 1];
    let mut got = 0;
    while got == 0 {
        got = rdma_hint::block_on(transport.wait_arrivals(&mut arrivals, deadline)).expect("arrival");
    }
}

fn percentile(samples: &mut [f64], quantile: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() - 1) as f64 * quantile).round() as usize]
}

fn main() -> Result<(), String> {
    let args: Vec<String> =
        Flags::from_env("usage: write_lat TRANSPORT_ID BYTES serve|run ADDRESS ITERATIONS").rest();
    let [id, bytes, role, address, iterations] = args.as_slice() else {
        return Err("usage: write_lat TRANSPORT_ID BYTES serve|run ADDRESS ITERATIONS".into());
    };
    let id: TransportId = id.parse().map_err(|e: rdma_hint::TransportError| e.to_string())?;
    let bytes: u64 = bytes.parse().map_err(|e| format!("bytes: {e}"))?;
    let iterations: usize = iterations.parse().map_err(|e| format!("iterations: {e}"))?;
    let address = address.parse().map_err(|e| format!("address: {e}"))?;
    let transport =
        open(&id, &OpenOptions::default().token(b"rdma-hint bench").wait_mode(WaitMode::BusyPoll))
            .map_err(|e| e.to_string())?;
    // A source of its own and a target the peer writes, as the peer tools keep a send and a
    // receive buffer: one buffer for both would bounce its cache lines between the two cores.
    let register = || transport.register(MemoryKind::Host, bytes.max(4096)).map_err(|e| e.to_string());
    let (source, target) = (register()?, register()?);
    let deadline = Instant::now() + Duration::from_secs(300);
    let connect = |peer| {
        transport
            .connect_blocking(peer, &[target.id], deadline)
            .map_err(|e| e.to_string())?
            .first()
            .copied()
            .ok_or_else(|| "the peer exposed no region".to_string())
    };
    match role.as_str() {
        "serve" => {
            let bound = transport.bind(address).map_err(|e| e.to_string())?;
            println!("LISTENING {bound}");
            let remote = connect(PeerEndpoint::Listen(bound))?;
            // Answer every write of the ping-pong, then take the completion phase's writes.
            for _ in 0..WARMUP + iterations {
                arrive(&*transport, deadline);
                write(&*transport, &source, &remote, bytes, Some(0));
                complete(&*transport, deadline);
            }
            for _ in 0..WARMUP + iterations {
                arrive(&*transport, deadline);
            }
            transport.set_wait_mode(WaitMode::Adaptive);
            for _ in 0..WAKE_ROUNDS {
                arrive(&*transport, deadline);
                write(&*transport, &source, &remote, bytes, Some(0));
                complete(&*transport, deadline);
            }
            Ok(())
        }
        "run" => {
            let remote = connect(PeerEndpoint::Dial(address))?;
            let mut completion = Vec::with_capacity(iterations);
            let mut pingpong = Vec::with_capacity(iterations);
            for round in 0..WARMUP + iterations {
                let started = Instant::now();
                write(&*transport, &source, &remote, bytes, Some(1));
                arrive(&*transport, deadline);
                let round_trip = started.elapsed();
                complete(&*transport, deadline);
                if round >= WARMUP {
                    pingpong.push(round_trip.as_secs_f64() * 1e6 / 2.0);
                }
            }
            // One-sided: the peer spins (BusyPoll) on the next phase's arrivals meanwhile, and answers
            // a read itself where the medium needs it (staged tcp).
            let mut reads = Vec::with_capacity(iterations);
            for round in 0..WARMUP + iterations {
                let started = Instant::now();
                read(&*transport, &source, &remote, bytes);
                complete(&*transport, deadline);
                if round >= WARMUP {
                    reads.push(started.elapsed().as_secs_f64() * 1e6);
                }
            }
            for round in 0..WARMUP + iterations {
                let started = Instant::now();
                write(&*transport, &source, &remote, bytes, Some(1));
                complete(&*transport, deadline);
                if round >= WARMUP {
                    completion.push(started.elapsed().as_secs_f64() * 1e6);
                }
            }
            let mut wakeup = Vec::with_capacity(WAKE_ROUNDS);
            for _ in 0..WAKE_ROUNDS {
                std::thread::sleep(SILENCE);
                let started = Instant::now();
                write(&*transport, &source, &remote, bytes, Some(1));
                arrive(&*transport, deadline);
                wakeup.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
                complete(&*transport, deadline);
            }
            let phases = [
                ("pingpong", &mut pingpong),
                ("completion", &mut completion),
                ("read", &mut reads),
                ("wakeup", &mut wakeup),
            ];
            for (name, samples) in phases {
                let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
                println!("RESULT {name} {p50:.3} {p99:.3}");
            }
            Ok(())
        }
        other => Err(format!("unknown role `{other}` (serve or run)")),
    }
}
