//! A connected sender/receiver pair in this process, and the round trip most rules make.

use crate::backend::Backend;
use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_core::SourceId;
use rdma_hint_core::{Arrival, LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, Transport};
use rdma_hint_engine::{BlockSpec, Chunker, PostPolicy, TransferRequest};
use rdma_hint_integration_tests::{first_mismatch, random_bytes};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// `seconds` from now.
pub fn deadline(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

/// Two connected transports of one backend: `sender` writes `source` into the receiver's
/// `target`, which it knows as `remote`.
#[derive(Debug)]
pub struct Pair<T> {
    /// Dialled; writes.
    pub sender: T,
    /// Listened; exposes `target`.
    pub receiver: T,
    /// The sender's region.
    pub source: LocalRegion,
    /// The receiver's region.
    pub target: LocalRegion,
    /// `target` as the sender knows it.
    pub remote: RemoteRegion,
}

/// Connects a pair with regions of `len` bytes, the receiver listening on `address`.
pub fn pair<B: Backend>(backend: &B, len: u64, address: SocketAddr) -> Pair<B::Transport> {
    let receiver = backend.open(backend.token());
    let target = receiver.register(MemoryKind::Host, len).expect("register the target");
    let address = receiver.bind(address).expect("bind");
    let accepting = std::thread::spawn(move || {
        block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline(20)))
            .expect("accept the sender");
        receiver
    });
    let sender = backend.open(backend.token());
    let source = sender.register(MemoryKind::Host, len).expect("register the source");
    let remote = block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline(20)))
        .expect("dial the receiver")[0];
    Pair { sender, receiver: accepting.join().expect("accepting thread"), source, target, remote }
}

/// A chunker over `transport` in `block`-byte blocks, aligned to 4 KiB (or the block).
pub fn chunker<T: Transport + ?Sized>(transport: &T, block: u64) -> Chunker {
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).expect("default policy");
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(block, 4096.min(block)).expect("block spec"));
    chunker
}

/// Writes `len` pseudo-random bytes (from `seed`) through the pair with immediate `imm`, waits
/// for the arrival and checks every byte that landed.
pub fn round_trip<T: Transport>(p: &Pair<T>, chunker: &mut Chunker, len: u64, seed: u64, imm: u32) {
    let expected = random_bytes(len as usize, seed);
    p.sender.write_region(p.source.id, 0, &expected).expect("fill the source");
    let transfer = TransferRequest::single(&p.source, 0, &p.remote, 0, len).notify(imm);
    block_on(chunker.transfer(&p.sender, transfer, deadline(60))).expect("transfer");
    let mut arrivals = [Arrival::EMPTY; 1];
    block_on(p.receiver.wait_arrivals(&mut arrivals, deadline(60))).expect("arrival");
    assert_eq!((arrivals[0].imm, arrivals[0].region), (imm, p.target.id), "the arrival of {len} B");
    let mut arrived = vec![0u8; len as usize];
    p.receiver.read_region(p.target.id, 0, &mut arrived).expect("read the target");
    assert_eq!(first_mismatch(&arrived, &expected), None, "{len} B: first wrong byte");
}
