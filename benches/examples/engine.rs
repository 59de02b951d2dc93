//! The transfer engine measured, in one run per transport id, against itself:
//!
//! * **lanes**: one transfer of `--mib` MiB at the hint over 1, 2 and 4 lanes (where the backend
//!   opens lanes), GB/s and the ratio to one lane;
//! * **paged**: 4096 16 KiB pages (64 MiB) scattered locally and back to back remotely, as a
//!   scatter request sent one work request per page (`gather_entries: 1`) and packed into
//!   gather requests of the hinted size (the default), against one contiguous transfer of the
//!   same bytes at the hint; the three interleaved run by run, each on its own connection;
//! * **behind bulk**: a 4 KiB transfer's submit-to-completion p50/p99 alone, and while 1 GiB
//!   transfers run on the same connection (bulk class, and the 4 KiB one latency-first);
//! * **alone**: a 4 KiB latency-first transfer on an idle connection of one lane, submit to
//!   `wait` returning, p50/p99 of 2000 (prints `RESULT alone <id> <p50 µs> <p99 µs>`; `ALONE_N`
//!   in the environment sets how many: a profiler wants a million), both sides in the default
//!   `Adaptive` wait mode;
//! * **alone-busy**: the same with the transport as `write_lat` measures it: both sides in
//!   `BusyPoll`, the peer spinning on its arrivals, each probe announced (an immediate), so that
//!   engine and transport are set side by side on one configuration (`RESULT alone-busy ...`).
//!
//! Medians of `--runs` runs (after one warm-up); every run's bytes are checked where they
//! landed (the 4 KiB probes' too).
//!
//! `engine [--mib 256] [--runs 5] [--ids staged:tcp,staged:shm] [--bulk-mib 1024] [--lane-kib N]
//! [--queue-us N] [--rows lanes,paged,behind,alone,alone-busy]` (`--lane-kib`: the engine's cap on bytes in
//! flight per lane; `--queue-us`: its queue time per lane; defaults `EngineConfig`'s)

use rdma_hint::engine::{Engine, EngineConfig, PeerId, Segment, TransferRequest};
use rdma_hint::transport::WaitMode;
use rdma_hint::{
    block_on, get_low_latency_rdma_size_hint_with, open_lanes, Arrival, Device, Error, LocalRegion,
    MemoryKind, OpenOptions, PeerEndpoint, RemoteRegion, SizeHint, Transport, TransportError, TransportId,
    TransportSelector,
};
use rdma_hint_benches::flags::Flags;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    bytes: u64,
    runs: usize,
    ids: Vec<TransportId>,
    bulk_bytes: u64,
    lane_bytes: Option<u64>,
    queue_time: Option<Duration>,
    rows: Vec<String>,
}

fn args() -> Args {
    let rows = ["lanes", "paged", "behind"].map(String::from).to_vec();
    let mut args = Args {
        bytes: 256 << 20,
        runs: 5,
        ids: Vec::new(),
        bulk_bytes: 1 << 30,
        lane_bytes: None,
        queue_time: None,
        rows,
    };
    let mut given = Flags::from_env(
        "usage: engine [--mib N] [--bulk-mib N] [--lane-kib N] [--runs N] [--queue-us N] [--rows lanes,paged,behind,alone,alone-busy] [--ids ID,ID]",
    );
    while let Some(flag) = given.next_arg() {
        match flag.as_str() {
            "--mib" => args.bytes = given.value::<u64>(&flag) << 20,
            "--bulk-mib" => args.bulk_bytes = given.value::<u64>(&flag) << 20,
            "--lane-kib" => args.lane_bytes = Some(given.value::<u64>(&flag) << 10),
            "--runs" => args.runs = given.value(&flag),
            "--queue-us" => args.queue_time = Some(Duration::from_micros(given.value(&flag))),
            "--rows" => args.rows = given.value::<String>(&flag).split(',').map(String::from).collect(),
            "--ids" => args.ids = given.list(&flag),
            other => given.fail(&format!("unknown argument {other}")),
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
    connect_in(id, lanes, len, WaitMode::Adaptive)
}

/// [`connect`], both sides in wait mode `mode`.
fn connect_in(id: &TransportId, lanes: usize, len: u64, mode: WaitMode) -> Option<Connection> {
    let options = OpenOptions::default().token(TOKEN).wait_mode(mode);
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

/// `EngineConfig`'s defaults with the bench's flags.
fn engine_config(args: &Args, gather_entries: u32) -> EngineConfig {
    let defaults = EngineConfig::default();
    EngineConfig {
        lane_bytes_in_flight: args.lane_bytes.unwrap_or(defaults.lane_bytes_in_flight),
        lane_queue_time: args.queue_time.unwrap_or(defaults.lane_queue_time),
        gather_entries,
        ..defaults
    }
}

fn engine_of(hint: &SizeHint, connection: &Connection, config: EngineConfig) -> (Engine, PeerId) {
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

/// One way of moving `segments` (a scatter request, or a single one for one segment) over
/// its own connection and engine.
struct Variant {
    connection: Connection,
    engine: Engine,
    peer: PeerId,
    segments: Vec<Segment>,
}

impl Variant {
    fn new(connection: Connection, (engine, peer): (Engine, PeerId), segments: Vec<Segment>) -> Variant {
        Variant { connection, engine, peer, segments }
    }

    /// GB/s of one transfer, its bytes checked.
    fn once(&self) -> f64 {
        let c = &self.connection;
        let request = match self.segments.as_slice() {
            [s] => TransferRequest::single(&c.source, s.local_offset, &c.remote, s.remote_offset, s.len),
            many => TransferRequest::scatter(&c.source, &c.remote, many.to_vec()),
        };
        let took = run(&self.engine, self.peer, request);
        check(c, &self.segments);
        self.segments.iter().map(|s| s.len).sum::<u64>() as f64 / took.as_secs_f64() / 1e9
    }
}

/// Median GB/s of each variant over `runs` rounds, one transfer of each per round (after one
/// warm-up round): noise that lasts a round hits them all.
fn rates(variants: &[Variant], runs: usize) -> Vec<f64> {
    for variant in variants {
        variant.once();
    }
    let mut rates = vec![Vec::new(); variants.len()];
    for _ in 0..runs {
        for (variant, rates) in variants.iter().zip(&mut rates) {
            rates.push(variant.once());
        }
    }
    rates.into_iter().map(median).collect()
}

fn lanes_row(id: &TransportId, hint: &SizeHint, args: &Args) {
    let whole = [Segment { local_offset: 0, remote_offset: 0, len: args.bytes }];
    let mut one_lane = None;
    for lanes in [1, 2, 4] {
        let Some(connection) = connect(id, lanes, args.bytes) else {
            println!("{id}: {lanes} lanes: not opened (the backend opens one lane per connection)");
            continue;
        };
        let engine =
            engine_of(hint, &connection, engine_config(args, EngineConfig::default().gather_entries));
        let gbps = rates(&[Variant::new(connection, engine, whole.to_vec())], args.runs)[0];
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
    // Pages every other slot in reverse order locally, back to back remotely: no run continues
    // on both sides, so unpacked each page is a work request.
    let pages: Vec<Segment> = (0..PAGES)
        .map(|k| Segment { local_offset: (PAGES - 1 - k) * 2 * PAGE, remote_offset: k * PAGE, len: PAGE })
        .collect();
    let contiguous = vec![Segment { local_offset: 0, remote_offset: 0, len: PAGES * PAGE }];
    let variant = |gather_entries: u32, segments: Vec<Segment>| {
        let connection = connect(id, 1, len).expect("one lane");
        let engine = engine_of(hint, &connection, engine_config(args, gather_entries));
        Variant::new(connection, engine, segments)
    };
    let packed_entries = EngineConfig::default().gather_entries;
    let variants = [variant(1, pages.clone()), variant(packed_entries, pages), variant(1, contiguous)];
    let max_sges = variants[1].connection.senders[0].capabilities().max_sges;
    let [per_page, packed, whole] = rates(&variants, args.runs)[..] else { unreachable!("three variants") };
    let (memcpy_pages, memcpy_whole) = memcpy_ceiling(&variants[0].segments, args.runs);
    println!(
        "{id}: paged {PAGES} x {} KiB scattered: one WR per page {per_page:.2} GB/s ({:.2}x); packed at {} KiB (max_sges {max_sges}) {packed:.2} GB/s ({:.2}x); contiguous at {} KiB {whole:.2} GB/s; medians of {}",
        PAGE >> 10,
        per_page / whole,
        hint.block_bytes.min(u64::from(max_sges.min(packed_entries)) * PAGE) >> 10,
        packed / whole,
        hint.block_bytes >> 10,
        args.runs,
    );
    println!(
        "{id}: paged: the CPU's memcpy of the same pages {memcpy_pages:.2} GB/s, of as many pages in a row {memcpy_whole:.2} GB/s ({:.2}x): the ceiling a copying transport's ratio meets",
        memcpy_pages / memcpy_whole
    );
}

/// Median GB/s of a plain `memcpy` of `pages` (heap to heap, in segment order) and of the same
/// bytes from one contiguous range in page-sized pieces, interleaved round by round: the memory
/// system's own price for the layout, which bounds what a transport that copies with the CPU
/// can reach.
fn memcpy_ceiling(pages: &[Segment], runs: usize) -> (f64, f64) {
    let source_len = pages.iter().map(|s| s.local_offset + s.len).max().unwrap_or(0) as usize;
    let len = pages.iter().map(|s| s.len).sum::<u64>() as usize;
    let source: Vec<u8> = (0..source_len).map(|i| i as u8).collect();
    let mut target = vec![0u8; len];
    let (mut scattered, mut whole) = (Vec::new(), Vec::new());
    for round in 0..=runs {
        let started = Instant::now();
        for s in pages {
            let (l, r, n) = (s.local_offset as usize, s.remote_offset as usize, s.len as usize);
            target[r..r + n].copy_from_slice(&source[l..l + n]);
        }
        let took_pages = started.elapsed();
        std::hint::black_box(&target);
        let started = Instant::now();
        for s in pages {
            let (r, n) = (s.remote_offset as usize, s.len as usize);
            target[r..r + n].copy_from_slice(&source[r..r + n]);
        }
        let took_whole = started.elapsed();
        std::hint::black_box(&target);
        if round > 0 {
            scattered.push(len as f64 / took_pages.as_secs_f64() / 1e9);
            whole.push(len as f64 / took_whole.as_secs_f64() / 1e9);
        }
    }
    (median(scattered), median(whole))
}

fn behind_bulk_row(id: &TransportId, hint: &SizeHint, args: &Args) {
    behind_bulk(id, hint, args, (1, false), &[false, true]);
    // The same connection as two lanes, striped alike, and with the second a control lane.
    behind_bulk(id, hint, args, (2, false), &[true]);
    behind_bulk(id, hint, args, (2, true), &[true]);
}

/// A 4 KiB transfer alone and behind 1 GiB transfers over a connection of `lanes` lanes (the
/// last a control lane when `control`), per class in `latency_first`; and the bulk transfers'
/// own rate meanwhile.
fn behind_bulk(
    id: &TransportId,
    hint: &SizeHint,
    args: &Args,
    (lanes, control): (usize, bool),
    latency_first: &[bool],
) {
    let probe_at = args.bulk_bytes;
    let Some(connection) = connect(id, lanes, args.bulk_bytes + 4096) else {
        println!("{id}: 4 KiB behind bulk over {lanes} lanes: not opened (the backend opens one lane per connection)");
        return;
    };
    let config =
        EngineConfig { control_lane: control, ..engine_config(args, EngineConfig::default().gather_entries) };
    let (engine, peer) = engine_of(hint, &connection, config);
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
    // Past every lane's first 256 requests (which the engine leaves to its driver thread), so
    // alone and behind both post from the caller.
    samples(&engine, false, 300);
    samples(&engine, true, 300);
    let alone = samples(&engine, control, 1000);
    let bulk = |engine: &Engine| {
        let deadline = Instant::now() + Duration::from_secs(120);
        let request = TransferRequest::single(&connection.source, 0, &connection.remote, 0, args.bulk_bytes);
        engine.submit(peer, request, deadline).expect("bulk")
    };
    for latency_first in latency_first.iter().copied() {
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut behind = Vec::new();
        let started = Instant::now();
        let mut running = bulk(&engine);
        let mut bulk_done = 0u64;
        while behind.len() < 1000 {
            behind.extend(samples(&engine, latency_first, 50));
            if !matches!(engine.status(running), rdma_hint::engine::TransferStatus::Running { .. }) {
                engine.wait_blocking(running, deadline).expect("bulk transfer");
                bulk_done += 1;
                running = bulk(&engine);
            }
        }
        engine.wait_blocking(running, deadline).expect("bulk transfer");
        let bulk_gbps = ((bulk_done + 1) * args.bulk_bytes) as f64 / started.elapsed().as_secs_f64() / 1e9;
        behind.sort_by(f64::total_cmp);
        let bulk_bytes = Segment { local_offset: 0, remote_offset: 0, len: args.bulk_bytes };
        check(
            &connection,
            &[bulk_bytes, Segment { local_offset: probe_at, remote_offset: probe_at, len: 4096 }],
        );
        let class = match (latency_first, control) {
            (false, _) => "bulk class".to_string(),
            (true, false) => format!("latency-first, {lanes} lane(s)"),
            (true, true) => format!("latency-first on a control lane, {lanes} lanes"),
        };
        println!(
            "{id}: 4 KiB p50/p99 alone {:.1}/{:.1} us; behind {} MiB transfers ({class}) {:.1}/{:.1} us (p99 {:.2}x alone); bulk meanwhile {bulk_gbps:.2} GB/s",
            percentile(&alone, 0.5),
            percentile(&alone, 0.99),
            args.bulk_bytes >> 20,
            percentile(&behind, 0.5),
            percentile(&behind, 0.99),
            percentile(&behind, 0.99) / percentile(&alone, 0.99)
        );
    }
}

/// A 4 KiB latency-first transfer on an idle connection of one lane, submit to `wait`
/// returning, after the lane's first 256 requests (which the engine leaves to its driver):
/// what `benches/engine-vs-write-lat.sh` sets against `write_lat`'s post-to-completion. In
/// `BusyPoll`, set up as `write_lat` is: the peer spins on its arrivals and each probe carries
/// an immediate, so the engine is measured on the transport `write_lat` measures.
fn alone_row(id: &TransportId, hint: &SizeHint, mode: WaitMode) {
    let busy = mode == WaitMode::BusyPoll;
    let connection = connect_in(id, 1, 1 << 20, mode).expect("one lane always opens");
    let (engine, peer) = engine_of(hint, &connection, EngineConfig::default());
    let probe = || {
        let request =
            TransferRequest::single(&connection.source, 0, &connection.remote, 0, 4096).latency_first();
        if busy {
            request.notify(1)
        } else {
            request
        }
    };
    let n = std::env::var("ALONE_N").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let stop = AtomicBool::new(false);
    let mut micros: Vec<f64> = std::thread::scope(|scope| {
        let peer_spins = busy.then(|| scope.spawn(|| spin_on_arrivals(&*connection.receivers[0], &stop)));
        // Stops the peer's thread however this ends: a failed transfer panics, and the scope
        // would otherwise wait for that thread for ever.
        let _stops = StopOnDrop(&stop);
        for _ in 0..300 {
            run(&engine, peer, probe());
        }
        let micros = (0..n).map(|_| run(&engine, peer, probe()).as_secs_f64() * 1e6).collect();
        stop.store(true, Ordering::Relaxed);
        if let Some(peer_spins) = peer_spins {
            let arrived = peer_spins.join().expect("the peer's thread");
            assert_eq!(arrived, 300 + n, "{id}: one arrival per probe");
        }
        micros
    });
    micros.sort_by(f64::total_cmp);
    check(&connection, &[Segment { local_offset: 0, remote_offset: 0, len: 4096 }]);
    let (p50, p99) = (percentile(&micros, 0.5), percentile(&micros, 0.99));
    let (row, both) = if busy { ("alone-busy", "BusyPoll") } else { ("alone", "Adaptive") };
    println!(
        "{id}: 4 KiB latency-first alone, both sides {both}, submit to wait, p50/p99 {p50:.2}/{p99:.2} us"
    );
    println!("RESULT {row} {id} {p50:.3} {p99:.3}");
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The peer of the `BusyPoll` alone row, as `write_lat`'s: spins on its arrivals until `stop`
/// (and what is still on its way after); how many arrived.
fn spin_on_arrivals(receiver: &dyn Transport, stop: &AtomicBool) -> usize {
    let mut arrivals = [Arrival::EMPTY; 64];
    let mut arrived = 0;
    let mut quiet_after_stop = false;
    loop {
        let deadline = Instant::now() + Duration::from_millis(10);
        match block_on(receiver.wait_arrivals(&mut arrivals, deadline)) {
            Ok(got) => {
                arrived += got;
                quiet_after_stop = false;
            }
            // Every probe completed before `stop`: two quiet looks after it leave none behind.
            Err(TransportError::DeadlineExceeded { .. }) if stop.load(Ordering::Relaxed) => {
                if std::mem::replace(&mut quiet_after_stop, true) {
                    return arrived;
                }
            }
            Err(TransportError::DeadlineExceeded { .. }) => {}
            Err(other) => panic!("arrivals: {other}"),
        }
    }
}

fn main() {
    let args = args();
    for id in &args.ids {
        let hint = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone()))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let row = |name: &str| args.rows.iter().any(|row| row == name);
        if row("lanes") {
            lanes_row(id, &hint, &args);
        }
        if row("paged") {
            paged_row(id, &hint, &args);
        }
        if row("behind") {
            behind_bulk_row(id, &hint, &args);
        }
        if row("alone") {
            alone_row(id, &hint, WaitMode::Adaptive);
        }
        if row("alone-busy") {
            alone_row(id, &hint, WaitMode::BusyPoll);
        }
    }
}
