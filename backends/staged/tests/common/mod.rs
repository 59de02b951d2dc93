//! Helpers shared by the in-process fault and leak tests.
#![allow(dead_code)] // each test binary uses its own subset

use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy};
use rdma_hint_model::SourceId;
use rdma_hint_staged::{StagedChannel, StagedTransport};
use rdma_hint_transport::{LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, Transport};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub(crate) fn deadline(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

pub(crate) struct Pair {
    pub(crate) sender: StagedTransport,
    pub(crate) receiver: StagedTransport,
    pub(crate) source: LocalRegion,
    pub(crate) target: LocalRegion,
    pub(crate) remote: RemoteRegion,
}

/// A connected sender/receiver pair in this process over real sockets (and shm files).
pub(crate) fn pair(channel: StagedChannel, len: u64, address: SocketAddr) -> Pair {
    let receiver = StagedTransport::new(channel);
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
    let sender = StagedTransport::new(channel);
    let source = sender.register(MemoryKind::Host, len).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(sender.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(10),
    ))
    .unwrap()[0];
    Pair { sender, receiver: accepting.join().unwrap(), source, target, remote }
}

pub(crate) fn chunker(transport: &StagedTransport, block: u64) -> Chunker {
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(block, 4096).unwrap());
    chunker
}

pub(crate) fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}
