//! The transfer engine measured, in one run per transport id, against itself:
//!
//! * **lanes**: one transfer of `--mib` MiB at the hint over 1, 2 and 4 lanes (where the backend
//!   opens lanes), GB/s and the ratio to one lane;
//! * **paged**: 4096 scattered 16 KiB pages (64 MiB) as a scatter request with one work request
//!   per page, against one contiguous transfer of the same bytes at the hint;
//! * **behind bulk**: a 4 KiB transfer's submit-to-completion p50/p99 alone, and while 1 GiB
//!   transfers run on the same connection (bulk class, and the 4 KiB one latency-first).
//!
//! Medians of `--runs` runs (after one warm-up); every run's bytes are checked where they
//! landed (the 4 KiB probes' too).
//!
//! `engine [--mib 256] [--runs 5] [--ids staged:tcp,staged:shm] [--bulk-mib 1024] [--lane-kib N]`
//! (`--lane-kib`: the engine's bytes in flight per lane; default `EngineConfig`'s)

use rdma_hint::chunker::{Engine, EngineConfig, PeerId, Segment, TransferRequest};
use rdma_hint::{
    block_on, get_low_latency_rdma_size_hint_with, open_lanes, Device, Error, LocalRegion, MemoryKind,
    OpenOptions, PeerEndpoint, RemoteRegion, SizeHint, Transport, TransportId, TransportSelector,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    bytes: u64,
    runs: usize,
    ids: Vec<TransportId>,
    bulk_bytes: u64,
    lane_bytes: Option<u64>,
}

fn args() -> Args {
    let mut args = Args { bytes: 256 << 20, runs: 5, ids: Vec::new(), bulk_bytes: 1 << 30, lane_bytes: None };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || given.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--mib" => args.bytes = value().parse::<u64>().expect("--mib N") << 20,
            "--bulk-mib" => args.bulk_bytes = value().parse::<u64>().expect("--bulk-mib N") << 20,
            "--lane-kib" => args.lane_bytes = Some(value().parse::<u64>().expect("--lane-kib N") << 10),
            "--runs" => args.runs = value().parse().expect("--runs N"),
            "--ids" => args.ids = value().split(',').map(|id| id.parse().expect("a transport id")).collect(),
            other => panic!("unknown argument {other}"),
        }
    }
    if args.ids.is_empty() {
        args.ids = vec![TransportId::STAGED_TCP, TransportId::STAGED_SHM];
    }
    args
}

const TOKEN: &[u8] = b"rdma-hint engine bench";
const PAGE: u64 = 16 * 1024;
const PAGES: u64 = 4096;

/// Connected lanes (`lanes` of them, or `None` where the backend opens fewer), regions of
/// `len` bytes; the source holds a pattern.
struct Connection {
    senders: Vec<Arc<dyn Transport>>,
    receivers: Vec<Arc<dyn Transport>>,
    source: LocalRegion,
    target: LocalRegion,
    remote: RemoteRegion,
    pattern: Vec<u8>,
}

fn connect(id: &TransportId, lanes: usize, len: u64) -> Option<Connection> {
    let options = OpenOptions::default().token(TOKEN);
    let open = |n| match open_lanes(id, &options, n) {
        Ok(opened) => Some(opened),
        Err(Error::Lanes { .. }) => None,
        Err(other) => panic!("{id}: {other}"),
    };
    let receivers = open(lanes)?;
    let senders = open(lanes)?;
    let target = receivers[0].register(MemoryKind::Host, len).expect("register the target");
    let source = senders[0].register(MemoryKind::Host, len).expect("register the source");
    let pattern: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    senders[0].write_region(source.id, 0, &pattern).expect("fill");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut remote = None;
    for (receiver, sender) in receivers.iter().zip(&senders) {
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        std::thread::scope(|scope| {
            let accepting = scope.spawn(|| {
                block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline))
                    .expect("accept")
            });
            remote =
                Some(block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline)).expect("dial")[0]);
            accepting.join().expect("accepting thread");
        });
    }
    Some(Connection { senders, receivers, source, target, remote: remote.expect("a lane"), pattern })
}

fn engine_for(hint: &SizeHint, connection: &Connection, lane_bytes: Option<u64>) -> (Engine, PeerId) {
    let defaults = EngineConfig::default();
    let config = EngineConfig {
        lane_bytes_in_flight: lane_bytes.unwrap_or(defaults.lane_bytes_in_flight),
        ..defaults
    };
    let engine = Engine::new(config).expect("engine");
    engine.set_size_hint(hint).expect("hint");
    let peer = engine.add_peer(connection.senders.clone(), &[connection.remote]).expect("peer");
    (engine, peer)
}

fn run(engine: &Engine, peer: PeerId, request: TransferRequest) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(120);
    let started = Instant::now();
    let id = engine.submit(peer, request, deadline).expect("submit");
    engine.wait_blocking(id, deadline).expect("transfer");
    started.elapsed()
}

fn check(connection: &Connection, segments: &[Segment]) {
    let mut landed = vec![0u8; connection.target.len as usize];
    connection.receivers[0].read_region(connection.target.id, 0, &mut landed).expect("read");
    for s in segments {
        let (l, r, n) = (s.local_offset as usize, s.remote_offset as usize, s.len as usize);
        assert!(landed[r..r + n] == connection.pattern[l..l + n], "bytes of {s:?}");
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile(sorted: &[f64], share: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * share).round() as usize]
}

/// Median GB/s of `runs` transfers of `request()` after one warm-up, bytes checked each run.
fn rate(
    connection: &Connection,
    engine: &Engine,
    peer: PeerId,
    runs: usize,
    segments: &[Segment],
    scatter: bool,
) -> f64 {
    let bytes: u64 = segments.iter().map(|s| s.len).sum();
    let request = || match scatter {
        true => TransferRequest::scatter(&connection.source, &connection.remote, segments.to_vec()),
        false => {
            let s = segments[0];
            TransferRequest::single(
                &connection.source,
                s.local_offset,
                &connection.remote,
                s.remote_offset,
                s.len,
            )
        }
    };
    run(engine, peer, request());
    let mut rates = Vec::new();
    for _ in 0..runs {
        let took = run(engine, peer, request());
        check(connection, segments);
        rates.push(bytes as f64 / took.as_secs_f64() / 1e9);
    }
    median(rates)
}

fn lanes_row(id: &TransportId, hint: &SizeHint, args: &Args) {
    let whole = [Segment { local_offset: 0, remote_offset: 0, len: args.bytes }];
    let mut one_lane = None;
    for lanes in [1, 2, 4] {
        let Some(connection) = connect(id, lanes, args.bytes) else {
            println!("{id}: {lanes} lanes: not opened (the backend opens one lane per connection)");
            continue;
        };
        let (engine, peer) = engine_for(hint, &connection, args.lane_bytes);
        let gbps = rate(&connection, &engine, peer, args.runs, &whole, false);
        let base = *one_lane.get_or_insert(gbps);
        println!(
            "{id}: {lanes} lane(s), {} MiB at {} KiB blocks: {gbps:.2} GB/s median of {} ({:.2}x one lane)",
            args.bytes >> 20,
            hint.block_bytes >> 10,
            args.runs,
            gbps / base
        );
    }
}

fn paged_row(id: &TransportId, hint: &SizeHint, args: &Args) {
    let len = 2 * PAGES * PAGE;
    let connection = connect(id, 1, len).expect("one lane");
    let (engine, peer) = engine_for(hint, &connection, args.lane_bytes);
    // Pages every other slot in reverse order locally, back to back remotely: one work
    // request per page (no run continues on both sides).
    let pages: Vec<Segment> = (0..PAGES)
        .map(|k| Segment { local_offset: (PAGES - 1 - k) * 2 * PAGE, remote_offset: k * PAGE, len: PAGE })
        .collect();
    let per_page = rate(&connection, &engine, peer, args.runs, &pages, true);
    let contiguous = [Segment { local_offset: 0, remote_offset: 0, len: PAGES * PAGE }];
    let whole = rate(&connection, &engine, peer, args.runs, &contiguous, false);
    println!(
        "{id}: paged {PAGES} x {} KiB scattered, one WR per page: {per_page:.2} GB/s; contiguous at {} KiB: {whole:.2} GB/s ({:.2}x)",
        PAGE >> 10,
        hint.block_bytes >> 10,
        per_page / whole
    );
}

fn behind_bulk_row(id: &TransportId, hint: &SizeHint, args: &Args) {
    let probe_at = args.bulk_bytes;
    let connection = connect(id, 1, args.bulk_bytes + 4096).expect("one lane");
    let (engine, peer) = engine_for(hint, &connection, args.lane_bytes);
    let probe = || TransferRequest::single(&connection.source, probe_at, &connection.remote, probe_at, 4096);
    let samples = |engine: &Engine, latency_first: bool, count: usize| {
        let mut micros: Vec<f64> = (0..count)
            .map(|_| {
                let request = if latency_first { probe().latency_first() } else { probe() };
                run(engine, peer, request).as_secs_f64() * 1e6
            })
            .collect();
        micros.sort_by(f64::total_cmp);
        micros
    };
    samples(&engine, false, 100);
    let alone = samples(&engine, false, 1000);
    let bulk = |engine: &Engine| {
        let deadline = Instant::now() + Duration::from_secs(120);
        let request = TransferRequest::single(&connection.source, 0, &connection.remote, 0, args.bulk_bytes);
        engine.submit(peer, request, deadline).expect("bulk")
    };
    for latency_first in [false, true] {
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut behind = Vec::new();
        let mut running = bulk(&engine);
        while behind.len() < 1000 {
            behind.extend(samples(&engine, latency_first, 50));
            if !matches!(engine.status(running), rdma_hint::chunker::TransferStatus::Running { .. }) {
                engine.wait_blocking(running, deadline).expect("bulk transfer");
                running = bulk(&engine);
            }
        }
        engine.wait_blocking(running, deadline).expect("bulk transfer");
        behind.sort_by(f64::total_cmp);
        let bulk_bytes = Segment { local_offset: 0, remote_offset: 0, len: args.bulk_bytes };
        check(
            &connection,
            &[bulk_bytes, Segment { local_offset: probe_at, remote_offset: probe_at, len: 4096 }],
        );
        let class = if latency_first { "latency-first" } else { "bulk class" };
        println!(
            "{id}: 4 KiB p50/p99 alone {:.1}/{:.1} us; behind {} MiB transfers ({class}) {:.1}/{:.1} us (p99 {:.2}x alone)",
            percentile(&alone, 0.5),
            percentile(&alone, 0.99),
            args.bulk_bytes >> 20,
            percentile(&behind, 0.5),
            percentile(&behind, 0.99),
            percentile(&behind, 0.99) / percentile(&alone, 0.99)
        );
    }
}

fn main() {
    let args = args();
    for id in &args.ids {
        let hint = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone()))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        lanes_row(id, &hint, &args);
        paged_row(id, &hint, &args);
        behind_bulk_row(id, &hint, &args);
    }
}
