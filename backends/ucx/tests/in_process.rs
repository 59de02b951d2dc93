//! Two transports in one process (separate UCP contexts and workers): the quickest end-to-end
//! check of connect, chunked puts, completions, arrivals and the bytes that arrived.

use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer};
use rdma_hint_model::SourceId;
use rdma_hint_transport::{Arrival, MemoryKind, PeerEndpoint, Transport};
use rdma_hint_ucx::UcxTransport;

mod common;
use std::time::{Duration, Instant};

/// Both ends hold this token: the UCX backend connects only to authenticated peers.
const TEST_TOKEN: &[u8] = b"rdma-hint test peers";

fn open(tls: &str) -> UcxTransport {
    UcxTransport::open(Some(tls)).unwrap().with_token(TEST_TOKEN).unwrap()
}

/// The idle test measures the whole process's CPU time: the tests of this binary take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn transfer(tls: &str, len: u64) {
    let _alone = alone();
    let deadline = Instant::now() + Duration::from_secs(30);
    let receiver = open(tls);
    let target = receiver.register(MemoryKind::Host, len.next_multiple_of(4096)).unwrap();
    let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let receiving = std::thread::spawn(move || {
        rdma_hint_transport::blocking::block_on(receiver.connect(
            PeerEndpoint::Listen(address),
            &[target.id],
            deadline,
        ))
        .unwrap();
        let mut arrivals = [Arrival::EMPTY; 4];
        let ready =
            rdma_hint_transport::blocking::block_on(receiver.wait_arrivals(&mut arrivals, deadline)).unwrap();
        assert_eq!(ready, 1);
        assert_eq!(arrivals[0].imm, 99);
        let mut arrived = vec![0u8; len as usize];
        receiver.read_region(target.id, 0, &mut arrived).unwrap();
        arrived
    });
    let sender = open(tls);
    let source = sender.register(MemoryKind::Host, len.next_multiple_of(4096)).unwrap();
    let data = pattern(len as usize, 5);
    sender.write_region(source.id, 0, &data).unwrap();
    let remote =
        rdma_hint_transport::blocking::block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline))
            .unwrap()[0];
    eprintln!("{tls}: lanes {:?}, estimate {:?}", sender.connected_lanes(), sender.estimate());
    let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, 4096).unwrap());
    rdma_hint_transport::blocking::block_on(chunker.write(
        &sender,
        Transfer::new(&source, &remote, len).notify(99),
        deadline,
    ))
    .unwrap();
    let arrived = receiving.join().unwrap();
    assert!(arrived == data, "{tls}: bytes differ");
}

#[test]
fn shm_in_one_process() {
    transfer("shm,self", (1 << 20) + 3);
}

#[test]
fn tcp_in_one_process() {
    transfer("tcp,self", (1 << 20) + 3);
}

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
        let pair = common::pair(tls, 4096, common::loopback());
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
    use rdma_hint_transport::WriteOp;
    let _alone = alone();
    let block: u64 = 4 << 20;
    let blocks = 16u64;
    let len = block * blocks;
    let common::Pair { sender, receiver, source, target, remote } =
        common::pair("tcp,self", len, common::loopback());
    let data = pattern(len as usize, 11);
    sender.write_region(source.id, 0, &data).unwrap();
    let ops: Vec<WriteOp> = (0..blocks)
        .map(|i| WriteOp {
            wr_id: i,
            local: source.id,
            local_offset: i * block,
            remote: remote.id,
            remote_offset: i * block,
            len: block,
            signalled: false,
            imm: None,
        })
        .collect();
    sender.post_writes(&ops).unwrap();
    sender.deregister(source.id).unwrap();
    let mut arrived = vec![0u8; len as usize];
    receiver.read_region(target.id, 0, &mut arrived).unwrap();
    assert!(arrived == data, "deregister returned before the unsignalled puts had landed");
}
