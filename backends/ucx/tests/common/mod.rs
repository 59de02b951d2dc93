//! Helpers shared by the in-process fault, leak and soak tests of the UCX backend.
#![allow(dead_code)] // each test binary uses its own subset

use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer};
use rdma_hint_model::SourceId;
use rdma_hint_transport::{Arrival, LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, Transport};
use rdma_hint_ucx::UcxTransport;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The scopes every test covers: shared memory and tcp on loopback.
pub(crate) const SCOPES: [&str; 2] = ["shm,self", "tcp,self"];

/// The token both ends of every test pair hold (the UCX backend connects only to
/// authenticated peers).
pub(crate) const TEST_TOKEN: &[u8] = b"rdma-hint test peers";

/// A transport for `tls` holding [`TEST_TOKEN`].
pub(crate) fn open(tls: &str) -> UcxTransport {
    UcxTransport::open(Some(tls)).unwrap().with_token(TEST_TOKEN).unwrap()
}

pub(crate) fn deadline(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

pub(crate) fn loopback() -> SocketAddr {
    // UCX's tcp transport must stay on loopback too.
    std::env::set_var("UCX_NET_DEVICES", "lo");
    "127.0.0.1:0".parse().unwrap()
}

pub(crate) struct Pair {
    pub(crate) sender: UcxTransport,
    pub(crate) receiver: UcxTransport,
    pub(crate) source: LocalRegion,
    pub(crate) target: LocalRegion,
    pub(crate) remote: RemoteRegion,
}

/// A connected sender/receiver pair in this process (separate UCP contexts and workers).
pub(crate) fn pair(tls: &str, len: u64, address: SocketAddr) -> Pair {
    let receiver = open(tls);
    let target = receiver.register(MemoryKind::Host, len).unwrap();
    let address = receiver.bind(address).unwrap();
    let accepting = std::thread::spawn(move || {
        rdma_hint_transport::blocking::block_on(receiver.connect(
            PeerEndpoint::Listen(address),
            &[target.id],
            deadline(10),
        ))
        .unwrap();
        receiver
    });
    let sender = open(tls);
    let source = sender.register(MemoryKind::Host, len).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(sender.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(10),
    ))
    .unwrap()[0];
    Pair { sender, receiver: accepting.join().unwrap(), source, target, remote }
}

pub(crate) fn chunker(transport: &UcxTransport, block: u64) -> Chunker {
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(block, 4096.min(block)).unwrap());
    chunker
}

/// Writes `len` bytes of `byte` through the pair with immediate `imm` and checks what landed.
pub(crate) fn round_trip(p: &Pair, chunker: &mut Chunker, len: u64, byte: u8, imm: u32) {
    p.sender.write_region(p.source.id, 0, &vec![byte; len as usize]).unwrap();
    let transfer = Transfer::new(&p.source, &p.remote, len).notify(imm);
    rdma_hint_transport::blocking::block_on(chunker.write(&p.sender, transfer, deadline(20))).unwrap();
    let mut arrivals = [Arrival::EMPTY; 1];
    rdma_hint_transport::blocking::block_on(p.receiver.wait_arrivals(&mut arrivals, deadline(20))).unwrap();
    assert_eq!(arrivals[0].imm, imm);
    let mut arrived = vec![0u8; len as usize];
    p.receiver.read_region(p.target.id, 0, &mut arrived).unwrap();
    assert!(arrived.iter().all(|b| *b == byte), "{len} B of {byte:#x}");
}
