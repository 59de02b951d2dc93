//! The two channels of the staged backend and what the model may assume about them.

use rdma_hint_core::{Capabilities, MemoryKind, TransportFacts, TransportKind};
use std::fmt;

/// How staged blocks cross between processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StagedChannel {
    /// Shared memory between processes of one host.
    SharedMemory,
    /// TCP between hosts (or across network namespaces).
    Tcp,
}

impl StagedChannel {
    /// Both channels.
    pub const ALL: [StagedChannel; 2] = [StagedChannel::SharedMemory, StagedChannel::Tcp];

    /// Transport id suffix: `shm` or `tcp`.
    pub fn name(&self) -> &'static str {
        match self {
            StagedChannel::SharedMemory => "shm",
            StagedChannel::Tcp => "tcp",
        }
    }
}

impl fmt::Display for StagedChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", crate::BACKEND, self.name())
    }
}

/// Rates and per-block costs the model assumes for a channel, before any sweep calibrates them.
///
/// * shared memory: every byte is copied twice (into and out of the ring) by one core each;
///   ≈ 10 GB/s per memcpy stream, ≈ 1 µs per block for the ring handoff (atomics + futex wake);
/// * TCP: loopback/datacenter socket streams reach ≈ 3 GB/s per connection, ≈ 8 µs per block
///   (syscalls on both sides plus a wakeup).
///
/// ```
/// use rdma_hint_staged::{capabilities, StagedChannel};
/// let caps = capabilities(StagedChannel::Tcp);
/// assert_eq!(caps.facts.id, "staged:tcp");
/// assert!(caps.facts.wire_gbps > 0.0);
/// ```
pub fn capabilities(channel: StagedChannel) -> Capabilities {
    let (wire_gbps, per_op_overhead_us) = match channel {
        StagedChannel::SharedMemory => (10.0, 1.0),
        StagedChannel::Tcp => (3.0, 8.0),
    };
    let mut memory_kinds = vec![MemoryKind::Host];
    memory_kinds.extend(crate::gpu::visible_ordinals().map(|ordinal| MemoryKind::CudaDevice { ordinal }));
    Capabilities {
        facts: TransportFacts {
            id: channel.to_string(),
            kind: TransportKind::Staged,
            wire_gbps,
            nic_pcie: None,
            per_op_overhead_us,
            mtu_bytes: None,
            // Blocks are framed with a u64 length; the ring bounds what is in flight, not a block.
            max_msg_bytes: 1 << 40,
            max_payload_bytes: None,
            queried_from_backend: false,
        },
        max_outstanding_wrs: 256,
        max_wrs_per_post: 64,
        max_sges: 1,
        memory_kinds,
    }
}
