//! The shared `Transport` contract (tests/conformance) over UCX's shared memory and tcp
//! transports on loopback, and what only the UCX backend has: progress threads that sleep, and
//! a deregister that waits out unsignalled puts.

use rdma_hint_conformance::{alone, pair, shared, suite, two_hosts, Backend, Transport, TEST_TOKEN};
use rdma_hint_core::WriteOp;
use rdma_hint_ucx::UcxTransport;
use std::time::Duration;

struct Ucx(&'static str);

impl Backend for Ucx {
    type Transport = UcxTransport;

    fn open(&self, token: Option<&[u8]>) -> UcxTransport {
        // UCX's tcp transport stays on loopback (peers in namespaces get their veth): the
        // environment must say so before any thread starts (test-all.sh exports it), as
        // setting it here would race UCX's own getenv on other test threads.
        assert!(
            std::env::var_os("UCX_NET_DEVICES").is_some(),
            "run the UCX tests with UCX_NET_DEVICES=lo (test-all.sh does)"
        );
        let transport = UcxTransport::open(Some(self.0)).expect("UCX");
        match token {
            Some(token) => transport.with_token(token).expect("token"),
            None => transport,
        }
    }

    /// The UCX backend connects only to authenticated peers.
    fn token(&self) -> Option<&'static [u8]> {
        Some(TEST_TOKEN)
    }

    fn open_lane(&self, first: &UcxTransport) -> Option<UcxTransport> {
        Some(first.open_lane().expect("another worker of the context"))
    }
}

suite! {
    shm: Ucx("shm,self"),
    tcp: Ucx("tcp,self"),
}
two_hosts! { tcp: Ucx("tcp,self") }

/// CPU seconds this process has used (utime + stime from /proc/self/stat, 10 ms ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / 100.0
}

/// A connected pair with nothing to do must not spin a core: the progress threads sleep on the
/// worker's event fd. Not a timing assertion: an idle spinner burns ~1 CPU-second per second,
/// a sleeper a few milliseconds; the bound is ten times above the latter.
#[test]
fn idle_connections_do_not_spin() {
    let _alone = alone();
    for tls in ["shm,self", "tcp,self"] {
        let pair = pair(&Ucx(tls), 4096, "127.0.0.1:0".parse().unwrap());
        // Let the connection settle (and anything an earlier test left wind down).
        std::thread::sleep(Duration::from_millis(200));
        let before = cpu_seconds();
        std::thread::sleep(Duration::from_secs(1));
        let used = cpu_seconds() - before;
        assert!(used < 0.3, "{tls}: {used:.2} CPU-seconds in one idle second");
        drop(pair);
    }
}

/// Unsignalled puts have no request to watch, yet their source must stay mapped until they
/// have left it: deregistering the source right after posting waits for them (a flush), so
/// when it returns every byte has reached the peer; nothing reads unmapped memory.
#[test]
fn deregistering_a_source_waits_out_its_unsignalled_puts() {
    let _shared = shared();
    let (block, blocks) = (4u64 << 20, 16u64);
    let len = block * blocks;
    let p = pair(&Ucx("tcp,self"), len, "127.0.0.1:0".parse().unwrap());
    let data = rdma_hint_integration_tests::random_bytes(len as usize, 11);
    p.sender.write_region(p.source.id, 0, &data).unwrap();
    let ops: Vec<WriteOp> = (0..blocks)
        .map(|i| WriteOp {
            wr_id: i,
            local: p.source.id,
            local_offset: i * block,
            remote: p.remote.id,
            remote_offset: i * block,
            len: block,
            signalled: false,
            imm: None,
        })
        .collect();
    p.sender.post_writes(&ops).unwrap();
    p.sender.deregister(p.source.id).unwrap();
    let mut arrived = vec![0u8; len as usize];
    p.receiver.read_region(p.target.id, 0, &mut arrived).unwrap();
    assert!(arrived == data, "deregister returned before the unsignalled puts had landed");
}

/// A peer that leaves its notice ring full (its application takes no arrivals for a while)
/// makes a post answer `QueueFull` at once; the transfer engine waits and posts the same
/// requests again, so nothing fails and no lane is lost: once the peer takes its arrivals,
/// every transfer is delivered, every notice arrives once, and the bytes are where they belong.
#[test]
fn an_engine_whose_peer_leaves_its_notice_ring_full_waits_and_delivers_everything() {
    use rdma_hint_backend_core::blocking::block_on;
    use rdma_hint_core::{Arrival, SourceId, WaitMode};
    use rdma_hint_engine::{BlockSpec, Engine, EngineConfig, TransferRequest, TransferStatus};
    let _shared = shared();
    // Past the ring's 4096 slots.
    const TRANSFERS: u64 = 6000;
    const BLOCK: u64 = 4096;
    let len = TRANSFERS * BLOCK;
    let p = pair(&Ucx("shm,self"), len, "127.0.0.1:0".parse().unwrap());
    // Only the receiver's own waits take notices off its ring now (no progress thread moving
    // them into its arrival queue meanwhile).
    p.receiver.set_wait_mode(WaitMode::BusyPoll);
    let data = rdma_hint_integration_tests::random_bytes(len as usize, 17);
    p.sender.write_region(p.source.id, 0, &data).expect("fill the source");
    let engine =
        Engine::new(EngineConfig { max_transfers: 8192, ..EngineConfig::default() }).expect("engine");
    engine.set_hint(SourceId::Host(0), BlockSpec::new(BLOCK, BLOCK).expect("block"));
    let sender: std::sync::Arc<dyn Transport> = std::sync::Arc::new(p.sender);
    let peer = engine.add_peer(vec![sender], &[p.remote]).expect("peer");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let ids: Vec<_> = (0..TRANSFERS)
        .map(|k| {
            let request = TransferRequest::single(&p.source, k * BLOCK, &p.remote, k * BLOCK, BLOCK);
            engine.submit(peer, request.notify(k as u32), deadline).expect("submit")
        })
        .collect();
    // The ring fills: the last transfers wait, none fails, the lane lives.
    std::thread::sleep(Duration::from_millis(300));
    let lost = engine.lane_stats(peer).unwrap()[0].failed.clone();
    assert!(lost.is_none(), "a full ring lost the lane: {lost:?}");
    let last = engine.status(*ids.last().unwrap());
    assert!(matches!(last, TransferStatus::Running { .. }), "{last:?}: the ring never filled");
    let mut arrivals = vec![Arrival::EMPTY; 256];
    let mut imms = Vec::with_capacity(TRANSFERS as usize);
    while imms.len() < TRANSFERS as usize {
        let got = block_on(p.receiver.wait_arrivals(&mut arrivals, deadline))
            .unwrap_or_else(|e| panic!("after {} arrivals: {e}", imms.len()));
        imms.extend(arrivals[..got].iter().map(|arrival| arrival.imm));
    }
    for (k, id) in ids.into_iter().enumerate() {
        let delivered = engine.wait_blocking(id, deadline).unwrap_or_else(|e| panic!("transfer {k}: {e}"));
        assert_eq!(delivered.bytes, BLOCK);
    }
    imms.sort_unstable();
    assert_eq!(imms, (0..TRANSFERS as u32).collect::<Vec<_>>(), "every notice once");
    let mut landed = vec![0u8; len as usize];
    p.receiver.read_region(p.target.id, 0, &mut landed).expect("read the target");
    assert!(landed == data, "the bytes landed where they belong");
}
