//! The shared `Transport` contract (tests/conformance) over the staged backend's two
//! channels, with real sockets and shm files.

use rdma_hint_conformance::{pair, shared, suite, two_hosts, Backend, Transport};
use rdma_hint_core::TransportError;
use rdma_hint_staged::{StagedChannel, StagedTransport};
use std::time::{Duration, Instant};

struct Staged(StagedChannel);

impl Backend for Staged {
    type Transport = StagedTransport;

    fn open(&self, token: Option<&[u8]>) -> StagedTransport {
        let transport = StagedTransport::new(self.0);
        match token {
            Some(token) => transport.with_token(token).expect("token"),
            None => transport,
        }
    }

    fn open_lane(&self, first: &StagedTransport) -> Option<StagedTransport> {
        Some(first.open_lane())
    }

    /// Shared regions still mapped in this process (ours and peers').
    fn resources(&self) -> usize {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
        maps.lines().filter(|line| line.contains("memfd:rdma-hint-region")).count()
    }
}

suite! {
    shm: Staged(StagedChannel::SharedMemory),
    tcp: Staged(StagedChannel::Tcp),
}
two_hosts! { tcp: Staged(StagedChannel::Tcp) }

/// The staged backend's own rule: a region the peer may still write cannot be released while
/// the link is up (its mapping or socket reader would write into freed memory).
#[test]
fn an_exposed_region_cannot_be_released_while_the_peer_is_connected() {
    let _shared = shared();
    for channel in StagedChannel::ALL {
        let p = pair(&Staged(channel), 1 << 20, "127.0.0.1:0".parse().unwrap());
        let busy = p.receiver.deregister(p.target.id);
        assert!(matches!(busy, Err(TransportError::RegionBusy { .. })), "{channel:?}: {busy:?}");
        // The sender's own (unexposed) region can go; once the peer is gone, so can the target.
        p.sender.deregister(p.source.id).unwrap();
        drop(p.sender);
        let started = Instant::now();
        while p.receiver.deregister(p.target.id).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "{channel:?}: the link never broke");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
