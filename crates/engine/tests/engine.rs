//! The engine over the in-process transport: many peers and lanes, scatter lists, fairness,
//! back-pressure, cancel and deadlines, every byte checked where it landed.

use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_core::{
    Arrival, LocalRegion, MemoryKind, PeerEndpoint, RegionId, RemoteRegion, SourceId, Transport,
};
use rdma_hint_engine::{
    BlockSpec, Engine, EngineConfig, LoopbackTransport, RequestError, Segment, TransferError,
    TransferRequest, TransferStatus,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod wrapper;

use wrapper::{Gate, Pollers, Wrapper};

const BLOCK: u64 = 64 * 1024;

struct Connection {
    lanes: Vec<Arc<LoopbackTransport>>,
    src: LocalRegion,
    dst: LocalRegion,
    remote: Vec<RemoteRegion>,
}

/// A loopback connection of `lanes` lanes with a source and a destination region of `len`
/// bytes; the source holds the pattern of `seed`.
fn connection(lanes: usize, len: u64, seed: u8) -> Connection {
    let first = Arc::new(LoopbackTransport::new(256));
    let src = first.register(MemoryKind::Host, len).unwrap();
    let dst = first.register(MemoryKind::Host, len).unwrap();
    first.write_region(src.id, 0, &pattern(len, seed)).unwrap();
    let mut all = vec![first.clone()];
    all.extend((1..lanes).map(|_| Arc::new(first.open_lane())));
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let mut remote = Vec::new();
    for lane in &all {
        remote = block_on(lane.connect(listen, &[dst.id], soon())).unwrap();
    }
    Connection { lanes: all, src, dst, remote }
}

/// A source and a target of `len` bytes on `lane`, the source filled with `pattern(len, seed)`,
/// and the lane connected to itself: (source, target, the source's bytes, the remote list).
fn wrapped(lane: &Wrapper, len: u64, seed: u8) -> (LocalRegion, LocalRegion, Vec<u8>, Vec<RemoteRegion>) {
    let src = lane.register(MemoryKind::Host, len).unwrap();
    let dst = lane.register(MemoryKind::Host, len).unwrap();
    let bytes = pattern(len, seed);
    lane.write_region(src.id, 0, &bytes).unwrap();
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(lane.connect(listen, &[dst.id], soon())).unwrap();
    (src, dst, bytes, remote)
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect()
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

fn engine(max_transfers: u32) -> Engine {
    let engine = Engine::new(EngineConfig { max_transfers, ..EngineConfig::default() }).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(BLOCK, 4096).unwrap());
    engine
}

fn add(engine: &Engine, connection: &Connection) -> rdma_hint_engine::PeerId {
    let lanes = connection.lanes.iter().map(|lane| lane.clone() as Arc<dyn Transport>).collect();
    engine.add_peer(lanes, &connection.remote).unwrap()
}

fn landed(connection: &Connection, offset: u64, len: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    connection.lanes[0].read_region(connection.dst.id, offset, &mut out).unwrap();
    out
}

#[test]
fn sixty_four_mixed_transfers_to_four_peers_over_two_lanes_all_land() {
    let len = 16 << 20;
    let connections: Vec<Connection> = (0..4).map(|peer| connection(2, len, peer as u8)).collect();
    let engine = engine(4096);
    let peers: Vec<_> = connections.iter().map(|c| add(&engine, c)).collect();
    // 16 transfers per peer into disjoint ranges: sizes from 1 B to 1 MiB.
    let mut submitted = Vec::new();
    for (peer_index, peer) in peers.iter().enumerate() {
        let connection = &connections[peer_index];
        for k in 0..16u64 {
            let size = [1, 4096, 100_000, (1 << 20) - 64][k as usize % 4] + k;
            let offset = k * (len / 16);
            let request =
                TransferRequest::single(&connection.src, offset, &connection.remote[0], offset, size);
            submitted.push((
                peer_index,
                offset,
                size,
                engine.submit(*peer, request.notify(k as u32), soon()).unwrap(),
            ));
        }
    }
    for (peer_index, offset, size, id) in &submitted {
        let delivered = engine.wait_blocking(*id, soon()).unwrap();
        assert_eq!(delivered.bytes, *size);
        let expected = &pattern(len, *peer_index as u8)[*offset as usize..(*offset + *size) as usize];
        assert!(
            landed(&connections[*peer_index], *offset, *size) == expected,
            "peer {peer_index} at {offset}"
        );
    }
    // Every transfer announced itself once, on one of its connection's lanes.
    for connection in &connections {
        let mut seen = Vec::new();
        for lane in &connection.lanes {
            let mut arrivals = [Arrival::EMPTY; 64];
            let count = lane.poll_arrivals(&mut arrivals).unwrap();
            seen.extend(arrivals[..count].iter().map(|a| a.imm));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..16).collect::<Vec<u32>>());
    }
}

#[test]
fn both_lanes_carry_blocks_of_one_large_transfer() {
    let len = 16 << 20;
    let connection = connection(2, len, 3);
    let engine = engine(16);
    let peer = add(&engine, &connection);
    let request = TransferRequest::single(&connection.src, 0, &connection.remote[0], 0, len);
    let delivered = engine.wait_blocking(engine.submit(peer, request, soon()).unwrap(), soon()).unwrap();
    assert_eq!(delivered, rdma_hint_engine::Delivered { bytes: len, blocks: len / BLOCK });
    assert!(landed(&connection, 0, len) == pattern(len, 3));
    let moved: Vec<u64> = engine.lane_stats(peer).unwrap().iter().map(|lane| lane.posted_bytes).collect();
    assert!(moved.iter().all(|bytes| *bytes > 0), "bytes per lane: {moved:?}");
    assert_eq!(moved.iter().sum::<u64>(), len);
}

#[test]
fn scattered_pages_land_where_their_segments_say_and_runs_are_merged() {
    let page = 16 * 1024;
    let pages = 256u64;
    let len = 2 * pages * page;
    let connection = connection(1, len, 9);
    let engine = engine(16);
    let peer = add(&engine, &connection);
    // Pages taken from every other slot, in reverse, landing back to back.
    let scattered: Vec<Segment> = (0..pages)
        .map(|k| Segment { local_offset: (pages - 1 - k) * 2 * page, remote_offset: k * page, len: page })
        .collect();
    let request = TransferRequest::scatter(&connection.src, &connection.remote[0], scattered.clone());
    let delivered = engine.wait_blocking(engine.submit(peer, request, soon()).unwrap(), soon()).unwrap();
    assert_eq!(delivered.blocks, pages * page / BLOCK, "pages landing back to back are packed at the hint");
    let source = pattern(len, 9);
    let lands_as_said = |segments: &[Segment], page: u64| {
        let arrived = landed(&connection, 0, len);
        for segment in segments {
            let from = &source[segment.local_offset as usize..(segment.local_offset + page) as usize];
            let to = &arrived[segment.remote_offset as usize..(segment.remote_offset + page) as usize];
            assert!(from == to, "page landing at {}", segment.remote_offset);
        }
    };
    lands_as_said(&scattered, page);
    // Pages of 24 KiB: a packed request cuts a page at the hint, the next one goes on from there.
    let odd = 24 * 1024;
    let count = pages / 2;
    let odd_pages: Vec<Segment> = (0..count)
        .map(|k| Segment { local_offset: (count - 1 - k) * 2 * odd, remote_offset: k * odd, len: odd })
        .collect();
    let request = TransferRequest::scatter(&connection.src, &connection.remote[0], odd_pages.clone());
    let delivered = engine.wait_blocking(engine.submit(peer, request, soon()).unwrap(), soon()).unwrap();
    assert_eq!(delivered.blocks, (count * odd).div_ceil(BLOCK));
    lands_as_said(&odd_pages, odd);
    // Apart on both sides: nothing to pack, one work request per page.
    let apart: Vec<Segment> = (0..pages / 2)
        .map(|k| Segment {
            local_offset: (pages / 2 - 1 - k) * 2 * page,
            remote_offset: 2 * k * page,
            len: page,
        })
        .collect();
    let request = TransferRequest::scatter(&connection.src, &connection.remote[0], apart.clone());
    let delivered = engine.wait_blocking(engine.submit(peer, request, soon()).unwrap(), soon()).unwrap();
    assert_eq!(delivered.blocks, pages / 2, "pages apart on both sides are one request each");
    lands_as_said(&apart, page);
    // The same bytes as pages that continue each other: merged into runs, cut at the hint.
    let contiguous: Vec<Segment> =
        (0..pages).map(|k| Segment { local_offset: k * page, remote_offset: k * page, len: page }).collect();
    let request = TransferRequest::scatter(&connection.src, &connection.remote[0], contiguous);
    let delivered = engine.wait_blocking(engine.submit(peer, request, soon()).unwrap(), soon()).unwrap();
    assert_eq!(delivered.blocks, pages * page / BLOCK);
    assert!(landed(&connection, 0, pages * page) == source[..(pages * page) as usize]);
}

#[test]
fn a_small_transfer_is_not_queued_behind_a_large_one() {
    let len = 64 << 20;
    let connection = connection(1, len, 5);
    let engine = Engine::new(EngineConfig::default()).unwrap();
    // 4 KiB blocks: the large transfer is 16 383 of them.
    engine.set_hint(SourceId::Host(0), BlockSpec::new(4096, 4096).unwrap());
    let peer = add(&engine, &connection);
    let large = TransferRequest::single(&connection.src, 0, &connection.remote[0], 0, len - 4096);
    let large = engine.submit(peer, large, soon()).unwrap();
    let small = TransferRequest::single(&connection.src, len - 4096, &connection.remote[0], len - 4096, 4096);
    let small = engine.submit(peer, small, soon()).unwrap();
    engine.wait_blocking(small, soon()).unwrap();
    assert!(
        matches!(engine.status(large), TransferStatus::Running { .. }),
        "the small transfer finished only after the large one: {:?}",
        engine.status(large)
    );
    assert_eq!(engine.wait_blocking(large, soon()).unwrap().bytes, len - 4096);
    assert!(landed(&connection, 0, len) == pattern(len, 5));
}

#[test]
fn bad_requests_are_refused_by_kind_and_post_nothing() {
    let connection = connection(1, 1 << 20, 1);
    let engine = engine(4);
    let peer = add(&engine, &connection);
    let remote = connection.remote[0];
    let src = &connection.src;
    let refused = |request: TransferRequest| match engine.submit(peer, request, soon()) {
        Err(TransferError::Refused(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(matches!(
        refused(TransferRequest::single(src, 0, &remote, 1 << 20, 1)),
        RequestError::OutOfRegion { side: "remote", .. }
    ));
    assert!(matches!(
        refused(TransferRequest::single(src, 0, &remote, 0, 0)),
        RequestError::ZeroLength { .. }
    ));
    assert!(matches!(refused(TransferRequest::scatter(src, &remote, Vec::new())), RequestError::NoSegments));
    let forged = RemoteRegion { id: remote.id, len: u64::MAX };
    assert!(matches!(
        refused(TransferRequest::single(src, 0, &forged, 0, 4096)),
        RequestError::UnknownRemoteRegion { .. }
    ));
    let other = RemoteRegion { id: RegionId(9), len: 4096 };
    assert!(matches!(
        refused(TransferRequest::single(src, 0, &other, 0, 4096)),
        RequestError::UnknownRemoteRegion { .. }
    ));
    let gpu = LocalRegion { kind: MemoryKind::CudaDevice { ordinal: 0 }, ..*src };
    assert!(matches!(
        refused(TransferRequest::single(&gpu, 0, &remote, 0, 4096)),
        RequestError::NoHint(SourceId::Gpu(0))
    ));
    // A refusal and a transfer's end are one error type to a caller that uses `?`.
    let submit_and_wait = |request: TransferRequest| -> Result<u64, TransferError> {
        let id = engine.submit(peer, request, soon())?;
        Ok(engine.wait_blocking(id, soon())?.bytes)
    };
    let read_with_notice = TransferRequest::single(src, 0, &remote, 0, 4096).read().notify(1);
    assert!(matches!(
        submit_and_wait(read_with_notice),
        Err(TransferError::Refused(RequestError::NotifyOnRead))
    ));
    // None of it reached the transport.
    assert_eq!(engine.lane_stats(peer).unwrap()[0].posted_wrs, 0);
    assert!(matches!(
        engine.add_peer(Vec::new(), &[]),
        Err(rdma_hint_core::TransportError::InvalidArgument { what: "lanes", .. })
    ));
}

#[test]
fn a_full_engine_says_so_and_submit_when_ready_waits_for_room() {
    let connection = connection(1, 1 << 20, 2);
    let engine = engine(2);
    let peer = add(&engine, &connection);
    let request =
        |offset| TransferRequest::single(&connection.src, offset, &connection.remote[0], offset, 4096);
    let first = engine.submit(peer, request(0), soon()).unwrap();
    let second = engine.submit(peer, request(4096), soon()).unwrap();
    // Slots stay taken until their results are collected.
    std::thread::sleep(Duration::from_millis(20));
    assert!(matches!(
        engine.submit(peer, request(8192), soon()),
        Err(TransferError::Refused(RequestError::Full { max_transfers: 2 }))
    ));
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| block_on(engine.submit_when_ready(peer, request(8192), soon())));
        std::thread::sleep(Duration::from_millis(20));
        engine.wait_blocking(first, soon()).unwrap();
        let third = waiting.join().unwrap().unwrap();
        engine.wait_blocking(third, soon()).unwrap();
    });
    engine.wait_blocking(second, soon()).unwrap();
    assert!(landed(&connection, 0, 12_288) == pattern(1 << 20, 2)[..12_288]);
    assert!(matches!(engine.wait_blocking(first, soon()), Err(TransferError::UnknownTransfer)));
}

#[test]
fn cancel_and_deadlines_end_a_transfer_with_what_was_confirmed() {
    let len = 64 << 20;
    let connection = connection(1, len, 4);
    let engine = Engine::new(EngineConfig::default()).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(4096, 4096).unwrap());
    let peer = add(&engine, &connection);
    let whole = || TransferRequest::single(&connection.src, 0, &connection.remote[0], 0, len);
    let cancelled = engine.submit(peer, whole(), soon()).unwrap();
    assert!(engine.cancel(cancelled));
    match engine.wait_blocking(cancelled, soon()) {
        Err(TransferError::Cancelled { confirmed_bytes }) => assert!(confirmed_bytes < len),
        other => panic!("{other:?}"),
    }
    let hurried = engine.submit(peer, whole(), Instant::now() + Duration::from_millis(1)).unwrap();
    match engine.wait_blocking(hurried, soon()) {
        Err(TransferError::DeadlineExceeded { confirmed_bytes, len: asked }) => {
            assert!(confirmed_bytes < asked && asked == len)
        }
        other => panic!("{other:?}"),
    }
    // The connection still works afterwards.
    let after = TransferRequest::single(&connection.src, 0, &connection.remote[0], 0, 1 << 20);
    let id = engine.submit(peer, after, soon()).unwrap();
    assert_eq!(engine.wait_blocking(id, soon()).unwrap().bytes, 1 << 20);
    assert!(landed(&connection, 0, 1 << 20) == pattern(len, 4)[..1 << 20]);
}

#[test]
fn a_wait_that_times_out_leaves_the_transfer_running() {
    let len = 64 << 20;
    let connection = connection(1, len, 6);
    let engine = Engine::new(EngineConfig::default()).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(4096, 4096).unwrap());
    let peer = add(&engine, &connection);
    let id = engine
        .submit(peer, TransferRequest::single(&connection.src, 0, &connection.remote[0], 0, len), soon())
        .unwrap();
    assert!(matches!(engine.wait_blocking(id, Instant::now()), Err(TransferError::WaitDeadline)));
    assert_eq!(engine.wait_blocking(id, soon()).unwrap().bytes, len);
}

#[test]
fn a_lane_that_promises_gathers_it_does_not_take_stops_packing_and_loses_nothing() {
    let lane =
        Arc::new(Wrapper { inner: LoopbackTransport::new(256), silent: false, gate: None, pollers: None });
    let len = 4 << 20;
    let (src, dst, bytes, remote) = wrapped(&lane, len, 13);
    let engine = engine(16);
    let peer = engine.add_peer(vec![lane.clone() as Arc<dyn Transport>], &remote).unwrap();
    let page = 16 * 1024;
    let pages = len / (2 * page);
    let scattered: Vec<Segment> = (0..pages)
        .map(|k| Segment { local_offset: (pages - 1 - k) * 2 * page, remote_offset: k * page, len: page })
        .collect();
    for _ in 0..2 {
        let request = TransferRequest::scatter(&src, &remote[0], scattered.clone()).notify(1);
        let delivered = engine.wait_blocking(engine.submit(peer, request, soon()).unwrap(), soon()).unwrap();
        assert_eq!(delivered.bytes, pages * page);
        let mut landed = vec![0u8; (pages * page) as usize];
        lane.read_region(dst.id, 0, &mut landed).unwrap();
        for s in &scattered {
            let (l, r) = (s.local_offset as usize, s.remote_offset as usize);
            assert!(landed[r..r + page as usize] == bytes[l..l + page as usize], "page at {r}");
        }
    }
    assert!(engine.lane_stats(peer).unwrap()[0].failed.is_none());
}

#[test]
fn a_lane_whose_queue_is_full_now_and_then_delivers_every_transfer_and_goes_on() {
    let len = 16 << 20;
    let gate = Arc::new(Gate { full_every: 3.into(), ..Gate::default() });
    gate.open();
    let lane = Arc::new(Wrapper::gated(&gate));
    let (src, dst, bytes, remote) = wrapped(&lane, len, 29);
    let engine = engine(64);
    let peer = engine.add_peer(vec![lane.clone() as Arc<dyn Transport>], &remote).unwrap();
    // Transfers of one to four blocks (and a short one), many in flight at once, each
    // announced: a full queue (every third post) loses, doubles and misplaces none of them.
    let sizes = [4096, BLOCK, 3 * BLOCK + 100, 4 * BLOCK];
    let (mut at, mut ids) = (0, Vec::new());
    for k in 0..64u32 {
        let size = sizes[k as usize % sizes.len()];
        let request = TransferRequest::single(&src, at, &remote[0], at, size).notify(k);
        ids.push((engine.submit(peer, request, soon()).unwrap(), size));
        at += size;
    }
    for (id, size) in ids {
        assert_eq!(engine.wait_blocking(id, soon()).expect("delivered despite the full queue").bytes, size);
    }
    let mut landed = vec![0u8; at as usize];
    lane.read_region(dst.id, 0, &mut landed).unwrap();
    assert!(landed == bytes[..at as usize], "the bytes landed where they belong");
    let mut arrivals = vec![Arrival::EMPTY; 64];
    let mut imms = Vec::new();
    while imms.len() < 64 {
        let got = lane.poll_arrivals(&mut arrivals).unwrap();
        imms.extend(arrivals[..got].iter().map(|arrival| arrival.imm));
    }
    imms.sort_unstable();
    assert_eq!(imms, (0..64).collect::<Vec<_>>(), "every notice once");
    assert!(engine.lane_stats(peer).unwrap()[0].failed.is_none(), "a full queue loses no lane");
    assert!(gate.posts.load(std::sync::atomic::Ordering::SeqCst) >= 3, "the queue was full at least once");
}

#[test]
fn a_lane_that_stops_answering_fails_its_transfers_and_frees_their_slots() {
    let silent =
        Arc::new(Wrapper { inner: LoopbackTransport::new(64), silent: true, gate: None, pollers: None });
    let src = silent.register(MemoryKind::Host, 1 << 20).unwrap();
    let dst = silent.register(MemoryKind::Host, 1 << 20).unwrap();
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(silent.connect(listen, &[dst.id], soon())).unwrap();
    let config =
        EngineConfig { max_transfers: 1, lane_stall: Duration::from_millis(200), ..EngineConfig::default() };
    let engine = Engine::new(config).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(BLOCK, 4096).unwrap());
    let peer = engine.add_peer(vec![silent.clone() as Arc<dyn Transport>], &remote).unwrap();
    let request = || TransferRequest::single(&src, 0, &remote[0], 0, 4096);
    // The transfer's own deadline passes first; its block stays in flight.
    let id = engine.submit(peer, request(), Instant::now() + Duration::from_millis(50)).unwrap();
    let ended = engine.wait_blocking(id, soon());
    assert!(matches!(ended, Err(TransferError::DeadlineExceeded { .. })), "{ended:?}");
    // The one slot comes free once the lane is given up (after `lane_stall`), not never.
    let started = Instant::now();
    let next = block_on(engine.submit_when_ready(peer, request(), soon()));
    assert!(matches!(next, Err(TransferError::Refused(RequestError::PeerGone(_)))), "{next:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "the slot came free after {:?}", started.elapsed());
    assert!(engine.lane_stats(peer).unwrap()[0].failed.is_some());
}

#[test]
fn a_request_the_transport_refuses_fails_alone_and_the_lane_goes_on() {
    let connection = connection(1, 1 << 20, 8);
    let engine = engine(16);
    let peer = add(&engine, &connection);
    // A region id this transport never registered, with a length that passes the engine's
    // checks: only the transport can tell, and it does at submit, when the engine holds the
    // source on the peer's lanes.
    let forged = LocalRegion { id: RegionId(77), ..connection.src };
    let bad =
        engine.submit(peer, TransferRequest::single(&forged, 0, &connection.remote[0], 0, 4096), soon());
    assert!(
        matches!(bad, Err(TransferError::Refused(RequestError::LocalRegion { id: RegionId(77), .. }))),
        "{bad:?}"
    );
    // A real region given with a forged length passes the engine's checks and the hold: only
    // the transport's own bounds check at post time can catch it.
    let stretched = LocalRegion { len: 4 << 20, ..connection.src };
    let bad = TransferRequest::single(&stretched, 2 << 20, &connection.remote[0], 0, 4096);
    let bad = engine.submit(peer, bad, soon()).unwrap();
    let good = TransferRequest::single(&connection.src, 0, &connection.remote[0], 0, 200_000);
    let good = engine.submit(peer, good, soon()).unwrap();
    match engine.wait_blocking(bad, soon()) {
        Err(TransferError::Transport {
            source: rdma_hint_core::TransportError::OutOfBounds { .. }, ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(engine.wait_blocking(good, soon()).unwrap().bytes, 200_000);
    assert!(engine.lane_stats(peer).unwrap()[0].failed.is_none());
    assert!(landed(&connection, 0, 200_000) == pattern(1 << 20, 8)[..200_000]);
}

#[test]
fn a_transport_cannot_be_two_lanes() {
    let connection = connection(1, 4096, 0);
    let engine = engine(4);
    let lane = connection.lanes[0].clone() as Arc<dyn Transport>;
    assert!(matches!(
        engine.add_peer(vec![lane.clone(), lane.clone()], &connection.remote),
        Err(rdma_hint_core::TransportError::InvalidArgument { what: "lanes", .. })
    ));
    engine.add_peer(vec![lane.clone()], &connection.remote).unwrap();
    assert!(matches!(
        engine.add_peer(vec![lane], &connection.remote),
        Err(rdma_hint_core::TransportError::InvalidArgument { what: "lanes", .. })
    ));
}

#[test]
fn two_hundred_waiters_at_once_all_end() {
    let connection = connection(1, 1 << 20, 7);
    let engine = engine(256);
    let peer = add(&engine, &connection);
    std::thread::scope(|scope| {
        let waiters: Vec<_> = (0..200u64)
            .map(|k| {
                let request =
                    TransferRequest::single(&connection.src, k * 4096, &connection.remote[0], k * 4096, 4096);
                let id = engine.submit(peer, request, soon()).unwrap();
                let engine = &engine;
                scope.spawn(move || engine.wait_blocking(id, soon()).unwrap().bytes)
            })
            .collect();
        assert!(waiters.into_iter().all(|w| w.join().unwrap() == 4096));
    });
    assert!(landed(&connection, 0, 200 * 4096) == pattern(1 << 20, 7)[..200 * 4096]);
}

#[test]
fn a_control_lane_carries_latency_first_transfers_alone_and_bulk_the_others() {
    let len = 16 << 20;
    let connection = connection(3, len, 17);
    let config = EngineConfig { control_lane: true, ..EngineConfig::default() };
    let engine = Engine::new(config).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(BLOCK, 4096).unwrap());
    let peer = add(&engine, &connection);
    let bulk_len = len - (1 << 20);
    let bulk = TransferRequest::single(&connection.src, 0, &connection.remote[0], 0, bulk_len);
    let bulk = engine.submit(peer, bulk, soon()).unwrap();
    let small: Vec<_> = (0..16u64)
        .map(|k| {
            let at = bulk_len + k * 4096;
            let request = TransferRequest::single(&connection.src, at, &connection.remote[0], at, 4096);
            engine.submit(peer, request.latency_first(), soon()).unwrap()
        })
        .collect();
    for id in small {
        assert_eq!(engine.wait_blocking(id, soon()).unwrap().bytes, 4096);
    }
    assert_eq!(engine.wait_blocking(bulk, soon()).unwrap().bytes, bulk_len);
    let moved: Vec<u64> = engine.lane_stats(peer).unwrap().iter().map(|lane| lane.posted_bytes).collect();
    assert_eq!(moved[2], 16 * 4096, "the control lane carried the small transfers alone: {moved:?}");
    assert!(
        moved[0] > 0 && moved[1] > 0 && moved[0] + moved[1] == bulk_len,
        "bulk over the others: {moved:?}"
    );
    let expected = pattern(len, 17);
    assert!(landed(&connection, 0, bulk_len + 16 * 4096) == expected[..(bulk_len + 16 * 4096) as usize]);
}

#[test]
fn a_waiter_polls_the_lanes_of_its_own_transfer_only() {
    // Polling a lane does that lane's work on the caller's thread (UCX progresses its puts,
    // staged tcp pumps its socket): a latency-first transfer on the control lane must not wait
    // while its waiter polls the bulk lane. Here the bulk lane's doorbell hangs in its post, so
    // that lane has requests in flight the whole time the small transfers are waited for.
    let len = 8 << 20;
    let first = LoopbackTransport::new(256);
    let src = first.register(MemoryKind::Host, len).unwrap();
    let dst = first.register(MemoryKind::Host, len).unwrap();
    first.write_region(src.id, 0, &pattern(len, 5)).unwrap();
    let control = Arc::new(first.open_lane());
    let (gate, pollers) = (Arc::new(Gate::default()), Arc::new(Pollers::default()));
    let bulk_lane =
        Wrapper { inner: first, silent: false, gate: Some(gate.clone()), pollers: Some(pollers.clone()) };
    let bulk_lane = Arc::new(bulk_lane);
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(bulk_lane.connect(listen, &[dst.id], soon())).unwrap();
    block_on(control.connect(listen, &[dst.id], soon())).unwrap();
    let engine = Engine::new(EngineConfig { control_lane: true, ..EngineConfig::default() }).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(BLOCK, 4096).unwrap());
    let lanes: Vec<Arc<dyn Transport>> = vec![bulk_lane.clone(), control.clone()];
    let peer = engine.add_peer(lanes, &remote).unwrap();
    let small = |k: u64| {
        let at = len - 4096 * (1 + k % 64);
        TransferRequest::single(&src, at, &remote[0], at, 4096).latency_first()
    };
    // Past the control lane's first requests (the driver's), so that callers post on it.
    for k in 0..300 {
        engine.wait_blocking(engine.submit(peer, small(k), soon()).unwrap(), soon()).unwrap();
    }
    let bulk = engine.submit(peer, TransferRequest::single(&src, 0, &remote[0], 0, len / 2), soon()).unwrap();
    let until = soon();
    while !gate.waiting.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(Instant::now() < until, "the bulk lane's doorbell never reached its post");
        std::thread::yield_now();
    }
    pollers.recording.store(true, std::sync::atomic::Ordering::SeqCst);
    for k in 0..32 {
        assert_eq!(
            engine.wait_blocking(engine.submit(peer, small(k), soon()).unwrap(), soon()).unwrap().bytes,
            4096
        );
    }
    pollers.recording.store(false, std::sync::atomic::Ordering::SeqCst);
    let here = std::thread::current().id();
    assert!(!pollers.threads.lock().unwrap().contains(&here), "the waiter polled the bulk lane");
    gate.open();
    assert_eq!(engine.wait_blocking(bulk, soon()).unwrap().bytes, len / 2);
    let (mut arrived, expected) = (vec![0u8; len as usize], pattern(len, 5));
    control.read_region(dst.id, 0, &mut arrived).unwrap();
    let tail = (len - 64 * 4096) as usize;
    assert!(arrived[..len as usize / 2] == expected[..len as usize / 2], "the bulk transfer's bytes");
    assert!(arrived[tail..] == expected[tail..], "the small transfers' bytes");
}

#[test]
fn bulk_goes_over_the_control_lane_once_every_other_lane_failed() {
    let first = LoopbackTransport::new(256);
    let len = 4 << 20;
    let src = first.register(MemoryKind::Host, len).unwrap();
    let dst = first.register(MemoryKind::Host, len).unwrap();
    first.write_region(src.id, 0, &pattern(len, 23)).unwrap();
    let control = Arc::new(first.open_lane());
    let silent = Arc::new(Wrapper { inner: first, silent: true, gate: None, pollers: None });
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(silent.connect(listen, &[dst.id], soon())).unwrap();
    block_on(control.connect(listen, &[dst.id], soon())).unwrap();
    let config = EngineConfig {
        control_lane: true,
        lane_stall: Duration::from_millis(200),
        ..EngineConfig::default()
    };
    let engine = Engine::new(config).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(BLOCK, 4096).unwrap());
    let lanes = vec![silent.clone() as Arc<dyn Transport>, control.clone() as Arc<dyn Transport>];
    let peer = engine.add_peer(lanes, &remote).unwrap();
    let request = || TransferRequest::single(&src, 0, &remote[0], 0, len);
    // The bulk lane never answers: its transfer fails once the lane is given up.
    let stuck = engine.submit(peer, request(), soon()).unwrap();
    assert!(matches!(engine.wait_blocking(stuck, soon()), Err(TransferError::Transport { .. })));
    // Then bulk goes over the one lane left, the control lane, and lands.
    let id = engine.submit(peer, request(), soon()).unwrap();
    assert_eq!(engine.wait_blocking(id, soon()).unwrap().bytes, len);
    let mut landed = vec![0u8; len as usize];
    control.read_region(dst.id, 0, &mut landed).unwrap();
    assert!(landed == pattern(len, 23));
}

/// A hint carries the transport it was computed for: over lanes of another transport the
/// engine refuses the transfer naming both (before, a shm hint of 16 KiB cut tcp lanes'
/// transfers silently, at a third of their plateau); the lanes' own hint then answers.
#[test]
fn a_hint_for_another_transport_is_refused_naming_both() {
    use rdma_hint_core::{compute_hint, HintPolicy, PathProfile, TransportId};
    let connection = connection(1, 1 << 20, 5);
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let mut hint = compute_hint(&PathProfile::example_host_nic(), &HintPolicy::default()).unwrap();
    hint.source = SourceId::Host(0);
    hint.transport = TransportId::STAGED_SHM;
    engine.set_size_hint(&hint).unwrap();
    let peer = add(&engine, &connection);
    let request = || TransferRequest::single(&connection.src, 0, &connection.remote[0], 0, 200_000);
    let refused = engine.submit(peer, request(), soon());
    assert!(
        matches!(&refused, Err(TransferError::Refused(RequestError::HintForAnotherTransport { hinted, lanes, .. }))
            if hinted == "staged:shm" && lanes == &TransportId::Loopback.to_string()),
        "{refused:?}"
    );
    hint.transport = TransportId::Loopback;
    engine.set_size_hint(&hint).unwrap();
    let id = engine.submit(peer, request(), soon()).unwrap();
    assert_eq!(engine.wait_blocking(id, soon()).unwrap().bytes, 200_000);
    assert!(landed(&connection, 0, 200_000) == pattern(1 << 20, 5)[..200_000]);
}

/// A lane that fails while the driver still rings a doorbell of a transfer outside the
/// engine's lock: the transfer ends and is collected, but its source stays held until that
/// doorbell has rung (before, the hold ended with the transfer: the source could be released
/// and its id given to other memory while its blocks were on their way into `post_writes`).
#[test]
fn a_source_stays_held_until_its_last_ringing_doorbell_has_rung() {
    use std::sync::atomic::Ordering::SeqCst;
    let gate = Arc::new(Gate::default());
    let lane = Arc::new(Wrapper::gated(&gate));
    let len = 16u64 << 20;
    let src = lane.register(MemoryKind::Host, len).unwrap();
    let dst = lane.register(MemoryKind::Host, len).unwrap();
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(lane.connect(listen, &[dst.id], soon())).unwrap();
    let engine = engine(16);
    let peer = engine.add_peer(vec![lane.clone() as Arc<dyn Transport>], &remote).unwrap();
    // The submit's own doorbell passes; the driver's next one blocks in `post_writes`.
    gate.passes.store(1, SeqCst);
    let id = engine.submit(peer, TransferRequest::single(&src, 0, &remote[0], 0, len), soon()).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !gate.waiting.load(SeqCst) {
        assert!(Instant::now() < until, "the driver never rang a second doorbell");
        std::thread::sleep(Duration::from_millis(1));
    }
    gate.broken.store(true, SeqCst);
    assert!(matches!(engine.wait_blocking(id, soon()), Err(TransferError::Transport { .. })));
    let busy = lane.deregister(src.id);
    assert!(
        matches!(busy, Err(rdma_hint_core::TransportError::RegionBusy { .. })),
        "deregistered while a doorbell of its transfer still rang: {busy:?}"
    );
    gate.open();
    let until = Instant::now() + Duration::from_secs(10);
    while lane.deregister(src.id).is_err() {
        assert!(Instant::now() < until, "still held after the doorbell rang");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether a `lane_stats` call (which takes the engine's lock) from another thread returns
/// within `patience` while `engine`'s caller is blocked in its post at `gate`: the caller rang
/// outside the lock. Free, the lock answers within microseconds; held, never until the gate
/// opens: the patience is long where the lock should be free (a loaded machine may be slow to
/// run the other thread) and short where it should be held.
fn lock_free_while_posting(
    engine: &Engine,
    peer: rdma_hint_engine::PeerId,
    gate: &Gate,
    patience: Duration,
) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let until = Instant::now() + Duration::from_secs(10);
    while !gate.waiting.load(SeqCst) {
        assert!(Instant::now() < until, "the submit never reached its post");
        std::thread::sleep(Duration::from_millis(1));
    }
    let answered = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            engine.lane_stats(peer);
            answered.store(true, SeqCst);
        });
        let until = Instant::now() + patience;
        while !answered.load(SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        let free = answered.load(SeqCst);
        gate.open();
        free
    })
}

#[test]
fn a_small_doorbell_rings_under_the_lock_where_posts_never_wait_and_a_large_one_outside_it() {
    use std::sync::atomic::Ordering::SeqCst;
    for (len, under_lock) in [(4096u64, true), (BLOCK, false)] {
        let gate = Arc::new(Gate::default());
        // The loopback's posts never wait (its capabilities say so); the gate makes this
        // lane's wait, so the test sees which side of the lock the caller's post is on.
        let lane = Arc::new(Wrapper::gated(&gate));
        assert!(lane.capabilities().posts_without_waiting);
        let src = lane.register(MemoryKind::Host, BLOCK).unwrap();
        let dst = lane.register(MemoryKind::Host, BLOCK).unwrap();
        lane.write_region(src.id, 0, &pattern(BLOCK, 5)).unwrap();
        let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
        let remote = block_on(lane.connect(listen, &[dst.id], soon())).unwrap();
        let engine = engine(16);
        let peer = engine.add_peer(vec![lane.clone() as Arc<dyn Transport>], &remote).unwrap();
        let one = || TransferRequest::single(&src, 0, &remote[0], 0, len).latency_first();
        // A lane's first doorbells are the driver's; past them, the caller rings its own.
        gate.passes.store(u32::MAX, SeqCst);
        for _ in 0..300 {
            let id = engine.submit(peer, one(), soon()).unwrap();
            engine.wait_blocking(id, soon()).unwrap();
        }
        gate.passes.store(0, SeqCst);
        let free = std::thread::scope(|scope| {
            let submitting = scope.spawn(|| engine.submit(peer, one(), soon()).unwrap());
            let patience = Duration::from_millis(if under_lock { 500 } else { 10_000 });
            let free = lock_free_while_posting(&engine, peer, &gate, patience);
            let id = submitting.join().unwrap();
            assert_eq!(engine.wait_blocking(id, soon()).unwrap().bytes, len);
            free
        });
        assert_eq!(free, !under_lock, "{len} B: rung under the lock {}", !free);
        let mut landed = vec![0u8; len as usize];
        lane.read_region(dst.id, 0, &mut landed).unwrap();
        assert_eq!(landed, pattern(BLOCK, 5)[..len as usize]);
    }
}
