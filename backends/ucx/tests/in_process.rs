//! Two transports in one process (separate UCP contexts and workers): the quickest end-to-end
//! check of connect, chunked puts, completions, arrivals and the bytes that arrived.

use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer};
use rdma_hint_core::{Arrival, MemoryKind, PeerEndpoint, SourceId, Transport};
use rdma_hint_ucx::UcxTransport;
use std::time::{Duration, Instant};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn transfer(tls: &str, len: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let receiver = UcxTransport::open(Some(tls)).unwrap();
    let target = receiver.register(MemoryKind::Host, len.next_multiple_of(4096)).unwrap();
    let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let receiving = std::thread::spawn(move || {
        rdma_hint_core::blocking::block_on(receiver.connect(
            PeerEndpoint::Listen(address),
            &[target.id],
            deadline,
        ))
        .unwrap();
        let mut arrivals = [Arrival::EMPTY; 4];
        let ready =
            rdma_hint_core::blocking::block_on(receiver.wait_arrivals(&mut arrivals, deadline)).unwrap();
        assert_eq!(ready, 1);
        assert_eq!(arrivals[0].imm, 99);
        let mut arrived = vec![0u8; len as usize];
        receiver.read_region(target.id, 0, &mut arrived).unwrap();
        arrived
    });
    let sender = UcxTransport::open(Some(tls)).unwrap();
    let source = sender.register(MemoryKind::Host, len.next_multiple_of(4096)).unwrap();
    let data = pattern(len as usize, 5);
    sender.write_region(source.id, 0, &data).unwrap();
    let remote =
        rdma_hint_core::blocking::block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline))
            .unwrap()[0];
    eprintln!("{tls}: lanes {:?}, estimate {:?}", sender.connected_lanes(), sender.estimate());
    let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, 4096).unwrap());
    rdma_hint_core::blocking::block_on(chunker.write(
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
    for tls in ["shm,self", "tcp,self"] {
        let deadline = Instant::now() + Duration::from_secs(30);
        let receiver = UcxTransport::open(Some(tls)).unwrap();
        let target = receiver.register(MemoryKind::Host, 4096).unwrap();
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let accepting = std::thread::spawn(move || {
            rdma_hint_core::blocking::block_on(receiver.connect(
                PeerEndpoint::Listen(address),
                &[target.id],
                deadline,
            ))
            .unwrap();
            receiver
        });
        let sender = UcxTransport::open(Some(tls)).unwrap();
        rdma_hint_core::blocking::block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline))
            .unwrap();
        let receiver = accepting.join().unwrap();
        let before = cpu_seconds();
        std::thread::sleep(Duration::from_secs(1));
        let used = cpu_seconds() - before;
        assert!(used < 0.3, "{tls}: {used:.2} CPU-seconds in one idle second");
        drop((sender, receiver));
    }
}
