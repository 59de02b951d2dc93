//! The rules, one function each, generic over the backend. Rules that count process-wide
//! resources (descriptors, threads, resident memory) run alone; the others run side by side.

use crate::backend::{Backend, TEST_TOKEN};
use crate::pair::{chunker, deadline, pair, round_trip, Pair};
use crate::peer::{spawn, spawn_receiver};
use crate::Subject;
use rdma_hint_backend_core::blocking::{block_on, BlockingTransport};
use rdma_hint_core::SourceId;
use rdma_hint_core::{
    Arrival, CallerMemory, Completion, GatherEntry, GatherOp, LocalRegion, MemoryKind, PeerEndpoint,
    RegionId, Transport, TransportError, WaitMode, WriteOp,
};
use rdma_hint_engine::{BlockSpec, Chunker, Delivered, PostPolicy, TransferError, TransferRequest};
use rdma_hint_integration_tests::{
    first_mismatch, held, held_change, ip, is_root, open_fds, random_bytes, resident_kib, threads, TwoHosts,
};
use std::io::Write;
use std::net::TcpListener;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

static PROCESS: RwLock<()> = RwLock::new(());

/// Most rules share the process; a backend's own test in a suite's binary takes it too, so it
/// never runs beside a counting rule.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    PROCESS.read().unwrap_or_else(PoisonError::into_inner)
}

/// The counting rules have it to themselves; a backend's own test that measures the whole
/// process (CPU time, descriptors) takes it too.
pub fn alone() -> RwLockWriteGuard<'static, ()> {
    PROCESS.write().unwrap_or_else(PoisonError::into_inner)
}

/// The sizes every backend must move exactly: one byte, odd sizes around a page and a MiB, and
/// the backend's largest.
fn ladder(max: u64) -> Vec<u64> {
    let mut sizes: Vec<u64> =
        [1, 4095, 4097, 64 * 1024, (1 << 20) + 3].into_iter().filter(|s| *s < max).collect();
    sizes.push(max);
    sizes
}

/// Asserts that `result` is a failed transfer the way a dead peer fails one: a typed transport
/// error (or the deadline), fewer bytes confirmed than asked.
fn assert_failed_short(what: &str, result: Result<Delivered, TransferError>, len: u64) {
    match result {
        Err(TransferError::Transport {
            source: TransportError::PeerGone(_) | TransportError::Completion { .. },
            confirmed_bytes,
        })
        | Err(TransferError::DeadlineExceeded { confirmed_bytes, .. }) => {
            assert!(confirmed_bytes < len, "{what}: {confirmed_bytes} of {len} B confirmed")
        }
        other => panic!("{what}: expected the transfer to fail, got {other:?}"),
    }
}

/// Every size of the ladder arrives byte for byte with its immediate, in one process.
pub fn bytes_over_the_size_ladder_arrive_exact<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let max = s.backend.scale().ladder_max_bytes;
    let p = pair(s.backend, max, s.backend.listen_address());
    for (round, len) in ladder(max).into_iter().enumerate() {
        for block in [4096, 64 * 1024] {
            round_trip(&p, &mut chunker(&p.sender, block), len, len ^ block, round as u32);
        }
    }
}

/// The ladder again, to a receiver in another process that checks every byte itself.
pub fn writes_to_a_peer_process_arrive_byte_exact<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    for len in ladder(s.backend.scale().ladder_max_bytes) {
        let seed = len ^ 0x5eed;
        let (mut peer, address) = spawn_receiver(s.key, len, seed, s.backend.listen_address());
        let transport = s.backend.open(Some(TEST_TOKEN));
        let source = transport.register(MemoryKind::Host, len.next_multiple_of(4096)).expect("register");
        transport.write_region(source.id, 0, &random_bytes(len as usize, seed)).expect("fill");
        let remote =
            block_on(transport.connect(PeerEndpoint::Dial(address), &[], deadline(30))).expect("dial");
        assert_eq!(remote.len(), 1, "the peer exposes one region");
        let transfer = TransferRequest::single(&source, 0, &remote[0], 0, len).notify(7);
        let report = block_on(chunker(&transport, 64 * 1024).transfer(&transport, transfer, deadline(60)));
        assert_eq!(report.expect("transfer").bytes, len);
        assert_eq!(peer.expect("RESULT"), format!("OK {len}"), "{len} B");
    }
}

/// Both sides write to each other at once, every block signalled: nothing deadlocks, both
/// receive what the other sent.
pub fn writes_in_both_directions_at_once_complete<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let len = s.backend.scale().ladder_max_bytes.min(32 << 20);
    let (a, b) = (s.backend.open(s.backend.token()), s.backend.open(s.backend.token()));
    let regions = |t: &B::Transport| {
        (
            t.register(MemoryKind::Host, len).expect("source"),
            t.register(MemoryKind::Host, len).expect("target"),
        )
    };
    let (a_regions, b_regions) = (regions(&a), regions(&b));
    let address = a.bind(s.backend.listen_address()).expect("bind");
    let policy = PostPolicy { wrs_per_doorbell: 8, signal_every: 1, window: 64 };
    let run = |t: &B::Transport,
               peer: PeerEndpoint,
               (source, target): (LocalRegion, LocalRegion),
               seed: u32| {
        t.write_region(source.id, 0, &random_bytes(len as usize, u64::from(seed))).expect("fill");
        let remote = block_on(t.connect(peer, &[target.id], deadline(30))).expect("connect")[0];
        let mut chunker = Chunker::new(policy, t.capabilities()).expect("policy");
        chunker.set_hint(SourceId::Host(0), BlockSpec::new(256 * 1024, 4096).expect("spec"));
        block_on(chunker.transfer(
            t,
            TransferRequest::single(&source, 0, &remote, 0, len).notify(seed),
            deadline(60),
        ))
        .expect("write");
        let mut arrivals = [Arrival::EMPTY; 1];
        block_on(t.wait_arrivals(&mut arrivals, deadline(60))).expect("arrival");
        let mut arrived = vec![0u8; len as usize];
        t.read_region(target.id, 0, &mut arrived).expect("read");
        assert!(arrived == random_bytes(len as usize, u64::from(3 - seed)), "side {seed} received garbage");
    };
    std::thread::scope(|scope| {
        let (run, a, b) = (&run, &a, &b);
        scope.spawn(move || run(a, PeerEndpoint::Listen(address), a_regions, 1));
        scope.spawn(move || run(b, PeerEndpoint::Dial(address), b_regions, 2));
    });
}

/// A deadline shorter than the transfer ends it with `DeadlineExceeded`, soon after.
pub fn a_deadline_shorter_than_the_transfer_stops_it_in_time<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let scale = s.backend.scale();
    let len = scale.long_transfer_bytes;
    let p = pair(s.backend, len, s.backend.listen_address());
    let started = Instant::now();
    let result = block_on(chunker(&p.sender, 4096).transfer(
        &p.sender,
        TransferRequest::single(&p.source, 0, &p.remote, 0, len),
        started + Duration::from_millis(20),
    ));
    match result {
        Err(TransferError::DeadlineExceeded { confirmed_bytes, len: asked }) => {
            assert!(confirmed_bytes < asked)
        }
        other => panic!("expected the deadline, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(scale.report_within_s),
        "stopped after {:?}",
        started.elapsed()
    );
}

/// The receiving transport is dropped mid-transfer: the sender ends with a typed error well
/// before its deadline and never reports the transfer complete, in either wait mode.
pub fn a_receiver_that_goes_away_fails_the_sender_in_time<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let scale = s.backend.scale();
    // Four times the long transfer: still running when the receiver goes, on a loaded machine.
    let len = 4 * scale.long_transfer_bytes;
    // In `BusyPoll` the sender's own polls take the socket: they must see the end too.
    for mode in [WaitMode::Adaptive, WaitMode::BusyPoll] {
        let p = pair(s.backend, len, s.backend.listen_address());
        let Pair { sender, receiver, source, remote, .. } = p;
        sender.set_wait_mode(mode);
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(receiver);
        });
        let started = Instant::now();
        let result = block_on(chunker(&sender, 4096).transfer(
            &sender,
            TransferRequest::single(&source, 0, &remote, 0, len),
            started + Duration::from_secs(4 * scale.report_within_s),
        ));
        closer.join().expect("closer");
        assert_failed_short(&format!("receiver dropped ({mode:?})"), result, len);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(scale.report_within_s), "{mode:?}: took {took:?}");
    }
}

/// The receiver is another process, killed mid-transfer: the sender fails in time, and stays
/// failed (a new transfer is refused at once with a typed error).
pub fn a_receiver_process_killed_mid_transfer_fails_the_sender_in_time<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let scale = s.backend.scale();
    let len = 4 * scale.long_transfer_bytes;
    let (mut peer, address) = spawn_receiver(s.key, len, 3, s.backend.listen_address());
    let transport = s.backend.open(Some(TEST_TOKEN));
    let source = transport.register(MemoryKind::Host, len).expect("register");
    let remote =
        block_on(transport.connect(PeerEndpoint::Dial(address), &[], deadline(30))).expect("dial")[0];
    let killer = std::thread::spawn(move || {
        peer.expect("CONNECTED");
        std::thread::sleep(Duration::from_millis(30));
        peer.child.kill().expect("kill the receiver");
        peer
    });
    let mut chunker = chunker(&transport, 4096);
    let started = Instant::now();
    let result = block_on(chunker.transfer(
        &transport,
        TransferRequest::single(&source, 0, &remote, 0, len).notify(1),
        started + Duration::from_secs(4 * scale.report_within_s),
    ));
    drop(killer.join().expect("killer"));
    assert_failed_short("receiver killed", result, len);
    assert!(
        started.elapsed() < Duration::from_secs(2 * scale.report_within_s),
        "took {:?}",
        started.elapsed()
    );
    let again = block_on(chunker.transfer(
        &transport,
        TransferRequest::single(&source, 0, &remote, 0, 4096),
        deadline(scale.report_within_s),
    ));
    assert!(
        matches!(again, Err(TransferError::Transport { .. } | TransferError::DeadlineExceeded { .. })),
        "{again:?}"
    );
}

/// Three pairs in turn on one port: each connects and moves its bytes.
pub fn sender_and_receiver_restart_and_reconnect_on_the_same_port<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let address =
        TcpListener::bind(s.backend.listen_address()).expect("a free port").local_addr().expect("addr");
    for cycle in 0..3u32 {
        let p = pair(s.backend, 1 << 20, address);
        round_trip(&p, &mut chunker(&p.sender, 64 * 1024), 1 << 20, u64::from(cycle), cycle);
    }
}

/// Descriptors, threads and the backend's own resources before and after `work`.
fn unchanged_by<B: Backend>(s: &Subject<'_, B>, what: &str, work: impl FnOnce()) {
    let _alone = alone();
    s.backend.warm_up();
    drop(pair(s.backend, 64 * 1024, s.backend.listen_address()));
    let count = || (open_fds(), threads(), s.backend.resources());
    // Background threads and descriptors of a dropped pair wind down within moments: count
    // once two looks 50 ms apart agree (before and after alike).
    let settled = || {
        let until = Instant::now() + Duration::from_secs(5);
        let mut last = count();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let now = count();
            if now == last || Instant::now() >= until {
                return now;
            }
            last = now;
        }
    };
    let before = settled();
    let held_before = held();
    work();
    // What a dropped connection holds goes within the time the backend reports a failure in
    // (at least 5 s). The look goes on for twice that, so that a failure says whether it went
    // late or never; a pass that needed more than 5 s says what was held then, on the test's
    // stderr itself (the harness keeps a passing test's prints to itself).
    let bound = Duration::from_secs(5.max(s.backend.scale().report_within_s));
    let started = Instant::now();
    let until = started + 2 * bound;
    let mut after = settled();
    let mut lingering = None;
    while after != before && Instant::now() < until {
        if lingering.is_none() && started.elapsed() >= Duration::from_secs(5) {
            lingering = Some(held_change(&held_before, &held()));
        }
        after = settled();
    }
    let took = started.elapsed();
    if let Some(lingering) = lingering.as_ref().filter(|_| after == before && took <= bound) {
        let _ = writeln!(
            std::io::stderr(),
            "{what}: settled only after {took:?}; held 5 s after the work: {lingering:?}"
        );
    }
    assert_eq!(
        before,
        after,
        "(descriptors, threads, backend resources) before and after {what}; changed: {:?}; 5 s after the work: {lingering:?}",
        held_change(&held_before, &held())
    );
    assert!(
        took <= bound,
        "{what}: released only after {took:?} (bound {bound:?}); held 5 s after the work: {lingering:?}"
    );
}

/// Region ids are reused and the region limit counts live regions only: 10 000
/// register/deregister cycles, then registers still succeed.
pub fn regions_are_reused_after_ten_thousand_cycles<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let lone = s.backend.open(s.backend.token());
    for cycle in 0..10_000u32 {
        let region =
            lone.register(MemoryKind::Host, 4096).unwrap_or_else(|e| panic!("cycle {cycle}: register: {e}"));
        lone.deregister(region.id).unwrap_or_else(|e| panic!("cycle {cycle}: deregister: {e}"));
    }
    let kept: Vec<_> = (0..8)
        .map(|_| lone.register(MemoryKind::Host, 4096).expect("a register after 10 000 cycles"))
        .collect();
    for region in kept {
        lone.deregister(region.id).expect("deregister");
    }
}

/// 100 connect/transfer/drop cycles leave descriptors, threads and backend resources as they were.
pub fn a_hundred_cycles_leak_nothing<B: Backend>(s: &Subject<'_, B>) {
    unchanged_by(s, "100 cycles", || {
        for cycle in 0..100u32 {
            let p = pair(s.backend, 64 * 1024, s.backend.listen_address());
            round_trip(&p, &mut chunker(&p.sender, 16 * 1024), 64 * 1024, u64::from(cycle), cycle);
        }
    });
}

/// 100 transfers whose receiver goes away mid-way fail with typed errors and leak nothing.
pub fn a_hundred_failed_transfers_leak_nothing<B: Backend>(s: &Subject<'_, B>) {
    let len = s.backend.scale().long_transfer_bytes.min(32 << 20);
    unchanged_by(s, "100 failed transfers", || {
        let mut failed = 0;
        for cycle in 0..100u32 {
            let Pair { sender, receiver, source, remote, .. } =
                pair(s.backend, len, s.backend.listen_address());
            let closer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(500));
                drop(receiver);
            });
            let result = block_on(chunker(&sender, 4096).transfer(
                &sender,
                TransferRequest::single(&source, 0, &remote, 0, len),
                deadline(30),
            ));
            closer.join().expect("closer");
            if let Err(e) = result {
                assert!(matches!(e, TransferError::Transport { .. }), "cycle {cycle}: {e}");
                failed += 1;
            }
        }
        assert!(failed >= 90, "only {failed} of 100 transfers saw the receiver go");
    });
}

/// Four connections at once, 200 transfers each of pseudo-random sizes up to 512 KiB, every
/// transfer's bytes verified; resident memory stays flat.
pub fn soak_four_connections_verify_every_transfer<B: Backend>(s: &Subject<'_, B>) {
    let _alone = alone();
    let run = |seed: u64| {
        let p = pair(s.backend, 1 << 20, s.backend.listen_address());
        let mut chunker = chunker(&p.sender, 64 * 1024);
        let mut state = seed | 1;
        for round in 0..200u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            round_trip(&p, &mut chunker, 1 + state % (1 << 20) / 2, state >> 32, round);
        }
    };
    run(99); // warm the backend and the allocator before measuring
    let before = resident_kib();
    std::thread::scope(|scope| {
        for seed in 1..=4 {
            scope.spawn(move || run(seed));
        }
    });
    let grown = resident_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "resident memory grew by {grown} KiB over 800 transfers");
}

/// Zero-length and absurd registrations, posts before connecting, unknown regions, ranges past
/// either end, empty and oversized ops: each a typed error, and nothing arrives.
pub fn bad_memory_and_bad_ops_fail_before_posting<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let lone = s.backend.open(s.backend.token());
    for len in [0, u64::MAX] {
        let registered = lone.register(MemoryKind::Host, len);
        assert!(matches!(registered, Err(TransportError::Registration { .. })), "{len} B: {registered:?}");
    }
    // Half a TiB passes the size check but not the memory check of any machine this runs on:
    // refused before a byte is allocated, saying how much could be committed.
    let unaffordable = lone.register(MemoryKind::Host, 1 << 39);
    assert!(matches!(unaffordable, Err(TransportError::OutOfMemory { .. })), "{unaffordable:?}");
    let region = lone.register(MemoryKind::Host, 4096).expect("register");
    let op = WriteOp {
        wr_id: 1,
        local: region.id,
        local_offset: 0,
        remote: RegionId(0),
        remote_offset: 0,
        len: 4096,
        signalled: true,
        imm: Some(5),
    };
    assert!(matches!(lone.post_writes(&[op]), Err(TransportError::NotConnected)), "before connecting");
    lone.deregister(region.id).expect("deregister");
    assert!(matches!(lone.write_region(region.id, 0, &[1]), Err(TransportError::UnregisteredRegion(_))));

    let p = pair(s.backend, 64 * 1024, s.backend.listen_address());
    let good = WriteOp { local: p.source.id, remote: p.remote.id, len: 4096, ..op };
    let max_msg = p.sender.capabilities().facts.max_msg_bytes;
    type Expect = fn(&TransportError) -> bool;
    let unregistered: Expect = |e| matches!(e, TransportError::UnregisteredRegion(_));
    let out_of_bounds: Expect = |e| matches!(e, TransportError::OutOfBounds { .. });
    let cases: [(&str, WriteOp, Expect); 7] = [
        ("unknown local region", WriteOp { local: RegionId(999), ..good }, unregistered),
        ("unknown remote region", WriteOp { remote: RegionId(999), ..good }, unregistered),
        ("past the local end", WriteOp { local_offset: 64 * 1024 - 100, ..good }, out_of_bounds),
        ("past the remote end", WriteOp { remote_offset: 64 * 1024 - 100, ..good }, out_of_bounds),
        ("offset overflow", WriteOp { remote_offset: u64::MAX - 10, ..good }, out_of_bounds),
        ("empty", WriteOp { len: 0, ..good }, |e| matches!(e, TransportError::ZeroLength { .. })),
        ("over the max message", WriteOp { len: max_msg.saturating_add(1), ..good }, |e| {
            matches!(e, TransportError::MessageTooLarge { .. } | TransportError::OutOfBounds { .. })
        }),
    ];
    for (what, bad, expected) in cases {
        match p.sender.post_writes(&[good, bad]) {
            Err(error) => assert!(expected(&error), "{what}: {error:?}"),
            Ok(()) => panic!("{what}: posted"),
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut arrivals = [Arrival::EMPTY; 4];
    assert_eq!(p.receiver.poll_arrivals(&mut arrivals).expect("poll"), 0, "a rejected batch moved nothing");
    // The pair still works.
    round_trip(&p, &mut chunker(&p.sender, 16 * 1024), 64 * 1024, 9, 9);
}

/// Gather writes take scattered local ranges (one byte, odd lengths, the region's last byte)
/// into one contiguous remote range per work request, up to the transport's `max_sges`; the
/// arrival reports the whole request; malformed gathers are typed errors before anything moves.
/// A transport with `max_sges` 1 posts one-entry gathers and refuses longer ones.
pub fn gather_writes_land_back_to_back_and_bad_ones_fail_before_posting<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let len: u64 = 256 * 1024;
    let p = pair(s.backend, len, s.backend.listen_address());
    let max_sges = p.sender.capabilities().max_sges;
    let entry = |offset: u64, len: u64| GatherEntry { local: p.source.id, offset, len };
    let op = |wr_id: u64, first: u32, count: u32, remote_offset: u64| GatherOp {
        wr_id,
        first,
        count,
        remote: p.remote.id,
        remote_offset,
        signalled: false,
        imm: None,
    };
    // The first op takes up to 5 odd pieces; the second as many 1000-byte pieces as a request
    // may gather (32 at most here), from the end of the region backwards.
    let mut entries =
        vec![entry(200_000, 1), entry(0, 4096), entry(100_001, 12_345), entry(len - 777, 777), entry(7, 3)];
    entries.truncate(max_sges.min(5) as usize);
    let first_count = entries.len() as u32;
    let second_count = max_sges.min(32);
    entries.extend((0..u64::from(second_count)).map(|k| entry(len - 1000 * (k + 2), 1000)));
    let landing = 64 * 1024;
    let ops = [
        op(1, 0, first_count, 0),
        GatherOp { signalled: true, imm: Some(77), ..op(2, first_count, second_count, landing) },
    ];
    let mut completions = [Completion::EMPTY; 4];
    let mut arrivals = [Arrival::EMPTY; 4];
    // Both wait modes (in BusyPoll the TCP channel sends from the posting thread), other bytes
    // each time.
    for (seed, mode) in [(61, WaitMode::Adaptive), (62, WaitMode::BusyPoll)] {
        p.sender.set_wait_mode(mode);
        let source = random_bytes(len as usize, seed);
        p.sender.write_region(p.source.id, 0, &source).expect("fill the source");
        let posted = p.sender.post_gather_writes(&ops, &entries);
        if max_sges == 1 {
            posted.expect("one-entry gathers are plain writes");
        } else {
            posted.expect("post the gathers");
        }
        let got = p.sender.wait_completions_blocking(&mut completions, deadline(20)).expect("completion");
        assert_eq!(
            &completions[..got],
            &[Completion { wr_id: 2, ..Completion::EMPTY }],
            "one signalled request"
        );
        let got = p.receiver.wait_arrivals_blocking(&mut arrivals, deadline(20)).expect("arrival");
        let second_len = 1000 * u64::from(second_count);
        assert_eq!(&arrivals[..got], &[Arrival { imm: 77, region: p.target.id, len: second_len }]);
        let expected = |range: std::ops::Range<usize>| -> Vec<u8> {
            entries[range]
                .iter()
                .flat_map(|e| source[e.offset as usize..(e.offset + e.len) as usize].to_vec())
                .collect()
        };
        let first = expected(0..first_count as usize);
        let second = expected(first_count as usize..entries.len());
        let mut arrived = vec![0u8; first.len()];
        p.receiver.read_region(p.target.id, 0, &mut arrived).expect("read the first landing");
        assert_eq!(first_mismatch(&arrived, &first), None, "the first gather, back to back at 0");
        let mut arrived = vec![0u8; second.len()];
        p.receiver.read_region(p.target.id, landing, &mut arrived).expect("read the second landing");
        assert_eq!(first_mismatch(&arrived, &second), None, "the second gather, back to back at {landing}");
    }

    // Malformed gathers, each after a good one in the same post: nothing of the post moves.
    let good_entries = [entry(0, 4096), entry(8192, 4096)];
    let good = GatherOp { signalled: true, imm: Some(99), ..op(3, 0, 2.min(max_sges), 0) };
    type Expect = fn(&TransportError) -> bool;
    let too_many: Expect = |e| matches!(e, TransportError::TooManyEntries { .. });
    let out_of_bounds: Expect = |e| matches!(e, TransportError::OutOfBounds { .. });
    let mut entries = good_entries.to_vec();
    entries.extend([
        entry(len - 100, 4096),
        entry(0, 0),
        GatherEntry { local: RegionId(999), offset: 0, len: 8 },
    ]);
    let cases: [(&str, GatherOp, Expect); 7] = [
        ("no entries", op(4, 0, 0, 0), |e| matches!(e, TransportError::ZeroLength { .. })),
        ("more than max_sges", op(4, 0, max_sges + 1, 0), too_many),
        ("entries past the slice", op(4, 4, 3, 0), |e| {
            matches!(e, TransportError::InvalidArgument { .. } | TransportError::TooManyEntries { .. })
        }),
        ("an entry past the local end", op(4, 2, 1, 0), out_of_bounds),
        ("an empty entry", op(4, 3, 1, 0), |e| matches!(e, TransportError::ZeroLength { .. })),
        ("an unknown local region", op(4, 4, 1, 0), |e| matches!(e, TransportError::UnregisteredRegion(_))),
        ("past the remote end", op(4, 0, 1, len - 100), out_of_bounds),
    ];
    for (what, bad, expected) in cases {
        match p.sender.post_gather_writes(&[good, bad], &entries) {
            Err(error) => assert!(expected(&error), "{what}: {error:?}"),
            Ok(()) => panic!("{what}: posted"),
        }
    }
    if max_sges == 1 {
        let two = p.sender.post_gather_writes(&[op(5, 0, 2, 0)], &good_entries);
        assert!(matches!(two, Err(TransportError::TooManyEntries { given: 2, max_sges: 1 })), "{two:?}");
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(p.receiver.poll_arrivals(&mut arrivals).expect("poll"), 0, "a rejected post moved nothing");
    assert_eq!(p.sender.poll_completions(&mut completions).expect("poll"), 0, "and completed nothing");
    round_trip(&p, &mut chunker(&p.sender, 16 * 1024), 64 * 1024, 9, 9);
}

/// For backends that cross hosts ([`two_hosts!`](crate::two_hosts)): a sender and a receiver in two network namespaces move
/// the ladder's largest transfer; then the sender's link goes down mid-transfer and it stops
/// at its deadline with a typed error.
pub fn two_hosts_over_network_namespaces_and_a_link_going_down<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    assert!(
        is_root(),
        "network namespaces need root: run this rule with --ignored as root (test-all.sh does)"
    );
    let hosts = TwoHosts::create(s.key.len() as u32 + 1);
    let listen = format!("{}:0", hosts.addresses[1]);
    let len = s.backend.scale().ladder_max_bytes;
    let vars = |len: u64| vec![("LEN", len.to_string()), ("SEED", (len ^ 0xabc).to_string())];
    // UCX would otherwise look at every interface; each side uses its own veth.
    let device = |side: usize| vec![("UCX_NET_DEVICES", hosts.links[side].clone())];
    let mut receiver = spawn(
        s.key,
        Some(&hosts.names[1]),
        "receiver",
        &[vars(len), device(1), vec![("LISTEN", listen.clone())]].concat(),
    );
    let address = receiver.expect("LISTENING");
    assert!(
        address.starts_with(&hosts.addresses[1]),
        "the receiver listens on its namespace's address: {address}"
    );
    let mut sender = spawn(
        s.key,
        Some(&hosts.names[0]),
        "sender",
        &[vars(len), device(0), vec![("DIAL", address)]].concat(),
    );
    assert_eq!(receiver.expect("RESULT"), format!("OK {len}"));
    assert_eq!(sender.expect("SENT"), len.to_string());

    let len = 1u64 << 30;
    let mut receiver = spawn(
        s.key,
        Some(&hosts.names[1]),
        "receiver",
        &[vars(len), device(1), vec![("LISTEN", listen)]].concat(),
    );
    let address = receiver.expect("LISTENING");
    let dial = vec![("DIAL", address), ("DEADLINE_MS", "3000".to_string())];
    let mut sender =
        spawn(s.key, Some(&hosts.names[0]), "sender-outcome", &[vars(len), device(0), dial].concat());
    sender.expect("CONNECTED");
    std::thread::sleep(Duration::from_millis(50));
    ip(&["-n", &hosts.names[0], "link", "set", &hosts.links[0], "down"]);
    let outcome = sender.expect("OUTCOME");
    let elapsed_ms: u64 =
        outcome.split_whitespace().next().and_then(|ms| ms.parse().ok()).expect("elapsed ms");
    assert!(outcome.contains("failed after"), "{outcome}");
    assert!(elapsed_ms < 6000, "{outcome}");
}

/// Caller memory is registered in place: a `Vec` the sender filled moves into a `Vec` the
/// receiver gave, with no `write_region` or `read_region`; the source can be neither released
/// nor lent while an op may still read it, nor the target while the peer may write it (from
/// the start of `connect` until the peer has gone); the sender's buffer comes back intact, at
/// the address it was given at, and the receiver's, once the peer has left, with what was
/// sent. Zero-length and misaligned caller memory are typed errors that hand the memory back.
pub fn caller_memory_moves_in_place_and_comes_back_intact<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let lone = s.backend.open(s.backend.token());
    let refused = lone.register_memory(CallerMemory::from(Vec::new())).expect_err("zero bytes");
    let TransportError::MemoryRefused { error, .. } = refused else { panic!("{refused:?}") };
    assert!(matches!(*error, TransportError::Registration { len: 0, .. }), "{error:?}");
    // A buffer whose first byte sits one past an aligned address (safe code can make one).
    let mut odd = bytes::BytesMut::from(&[5u8; 4097][..]);
    bytes::Buf::advance(&mut odd, 1);
    let refused = lone.register_memory(CallerMemory::from(odd)).expect_err("misaligned");
    let TransportError::MemoryRefused { error, memory } = refused else { panic!("{refused:?}") };
    assert!(matches!(*error, TransportError::Misaligned { .. }), "{error:?}");
    let back: bytes::BytesMut = memory.take().expect("the refused buffer comes back");
    assert_eq!(&back[..], &[5u8; 4096][..]);
    let owned = lone.register(MemoryKind::Host, 4096).expect("register");
    assert!(matches!(lone.release(owned.id), Err(TransportError::InvalidArgument { .. })), "transport-owned");
    drop(lone);

    let len = s.backend.scale().long_transfer_bytes.min(256 << 20);
    let expected = random_bytes(len as usize, 24);
    let receiver = s.backend.open(s.backend.token());
    let target =
        receiver.register_memory(CallerMemory::from(vec![0u8; len as usize])).expect("register the target");
    let address = receiver.bind(s.backend.listen_address()).expect("bind");
    let receiver = std::sync::Arc::new(receiver);
    let listening = receiver.clone();
    let accepting = std::thread::spawn(move || {
        block_on(listening.connect(PeerEndpoint::Listen(address), &[target.id], deadline(20)))
            .expect("accept");
    });
    // While the listen is pending, the hello that names the target may already be on its way:
    // the target is exposed from the start of `connect`, not from its end. Lending it is
    // refused once that start is reached (a lend before it is harmless), and so is releasing.
    let until = Instant::now() + Duration::from_secs(10);
    while receiver.access_region(target.id, &mut |_| ()).is_ok() {
        assert!(Instant::now() < until, "still lent 10 s into a pending connect");
        std::thread::sleep(Duration::from_millis(5));
    }
    let refused = receiver.release(target.id).map(drop);
    assert!(
        matches!(refused, Err(TransportError::RegionBusy { .. })),
        "released during connect: {refused:?}"
    );
    let sender = s.backend.open(s.backend.token());
    let buffer = expected.clone();
    let given_at = buffer.as_ptr() as usize;
    let source = sender.register_memory(CallerMemory::from(buffer)).expect("register the source");
    let mut lent_at = 0;
    sender
        .access_region(source.id, &mut |bytes| lent_at = bytes.as_ptr() as usize)
        .expect("lend before posting");
    assert_eq!(lent_at, given_at, "the region is the caller's buffer, not a copy of it");
    let remote = block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline(20))).expect("dial")[0];
    accepting.join().expect("accepting thread");

    let caps = sender.capabilities();
    let count = u64::from(caps.max_wrs_per_post.min(8));
    let block = len.div_ceil(count).min(caps.facts.max_msg_bytes);
    let ops: Vec<WriteOp> = (0..len.div_ceil(block))
        .map(|index| {
            let offset = index * block;
            let last = offset + block >= len;
            WriteOp {
                wr_id: index,
                local: source.id,
                local_offset: offset,
                remote: remote.id,
                remote_offset: offset,
                len: block.min(len - offset),
                signalled: last,
                imm: last.then_some(24),
            }
        })
        .collect();
    sender.post_writes(&ops).expect("post");
    let busy = |result: Result<(), TransportError>| matches!(result, Err(TransportError::RegionBusy { .. }));
    // A transport that moved the bytes inside `post_writes` (staged shm from host memory) has
    // nothing in flight once it returns: its completion is there already.
    let mut completions = [rdma_hint_core::Completion::EMPTY; 1];
    if sender.poll_completions(&mut completions).expect("poll") == 0 {
        assert!(busy(sender.release(source.id).map(drop)), "released with {len} B in flight");
        assert!(busy(sender.access_region(source.id, &mut |_| ())), "lent with {len} B in flight");
        block_on(sender.wait_completions(&mut completions, deadline(60))).expect("completion");
    }
    assert_eq!(completions[0].status, rdma_hint_core::CompletionStatus::Success);
    let mut arrivals = [Arrival::EMPTY; 1];
    block_on(receiver.wait_arrivals(&mut arrivals, deadline(60))).expect("arrival");
    assert_eq!((arrivals[0].imm, arrivals[0].region), (24, target.id));

    // The peer may write the target at any time while connected: neither lent nor released.
    assert!(busy(receiver.access_region(target.id, &mut |_| ())), "lent while the peer may write it");
    assert!(busy(receiver.release(target.id).map(drop)), "released while the peer may write it");
    let back: Vec<u8> = sender.release(source.id).expect("release").take().expect("the Vec comes back");
    assert_eq!(back.as_ptr() as usize, given_at, "handed back without a copy");
    assert_eq!(first_mismatch(&back, &expected), None, "the source changed");
    for (side, copied) in [("sender", sender.copied_bytes()), ("receiver", receiver.copied_bytes())] {
        assert_eq!((copied.write_region, copied.read_region), (0, 0), "{side} copied in or out");
    }
    // Once the peer has gone, the receiver's own buffer comes back holding what was sent.
    drop(sender);
    let until = Instant::now() + Duration::from_secs(s.backend.scale().report_within_s);
    let landed = loop {
        match receiver.release(target.id) {
            Ok(memory) => break memory.take::<Vec<u8>>().expect("the receiver's Vec comes back"),
            Err(TransportError::RegionBusy { .. }) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("the receiver's buffer after the peer left: {e}"),
        }
    };
    assert_eq!(first_mismatch(&landed, &expected), None, "{len} B into caller memory: first wrong byte");
}

pub use crate::answers::*;
pub use crate::exposure::*;
pub use crate::handshake::*;
pub use crate::lanes::*;
pub use crate::posting::*;
pub use crate::reads::*;
