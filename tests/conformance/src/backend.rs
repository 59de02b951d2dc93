//! What a backend tells the suite: how to open a transport, and how much it can move.

use rdma_hint_core::Transport;
use std::net::SocketAddr;

/// The token both ends of every test pair hold, for backends that require one (and for the
/// rules that listen on a namespace address, where a listener without one is refused).
pub const TEST_TOKEN: &[u8] = b"rdma-hint test peers";

/// How much the suite moves: hosts move GiBs, an emulated NIC in a VM KiBs to MiBs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    /// Largest transfer of the size ladder, bytes.
    pub ladder_max_bytes: u64,
    /// A transfer that takes longer than the short deadlines and the kill delays, bytes.
    pub long_transfer_bytes: u64,
    /// The bound a failure must be reported within (a dead peer, a deadline), seconds.
    pub report_within_s: u64,
}

impl Default for Scale {
    fn default() -> Scale {
        Scale { ladder_max_bytes: 64 << 20, long_transfer_bytes: 256 << 20, report_within_s: 10 }
    }
}

/// A backend under test.
pub trait Backend: Sync {
    /// The transport it opens.
    type Transport: Transport + Send + Sync + 'static;

    /// A fresh transport holding `token` (`None`: no token).
    fn open(&self, token: Option<&[u8]>) -> Self::Transport;

    /// The token ordinary test pairs hold: [`TEST_TOKEN`] for a backend that only connects
    /// authenticated peers, `None` otherwise.
    fn token(&self) -> Option<&'static [u8]> {
        None
    }

    /// Another lane of `first`'s connection (same region ids, same memory), where the
    /// backend opens lanes; `None` (the default): one lane per connection.
    fn open_lane(&self, first: &Self::Transport) -> Option<Self::Transport> {
        let _ = first;
        None
    }

    /// Where listeners bind (loopback; inside the VM, loopback too).
    fn listen_address(&self) -> SocketAddr {
        "127.0.0.1:0".parse().expect("loopback")
    }

    /// How much this backend moves in the suite.
    fn scale(&self) -> Scale {
        Scale::default()
    }

    /// Backend resources to count in the leak rules besides descriptors and threads (the staged
    /// backend's shm mappings).
    fn resources(&self) -> usize {
        0
    }

    /// Memory one process's transports keep for the process's life (UCX's contexts), which the
    /// leak rules warm before counting.
    fn warm_up(&self) {}
}
