//! The two channels of the staged backend and what the model may assume about them.

use rdma_hint_core::TransportId;
use rdma_hint_core::{CallerMemoryPath, Capabilities, MemoryKind, MAX_OPS_PER_POST};
use rdma_hint_core::{TransportFacts, TransportKind};
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

    /// The transport id: `staged:shm` or `staged:tcp`.
    pub fn id(&self) -> TransportId {
        match self {
            StagedChannel::SharedMemory => TransportId::STAGED_SHM,
            StagedChannel::Tcp => TransportId::STAGED_TCP,
        }
    }

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

/// Rates and per-block costs the model assumes for a channel, calibrated with `rdma-hint sweep`
/// on a 2-core CI-class VM and the 16-core H200 host (README, "Hint fidelity") so the hint lands
/// within 2× of the measured knee at ≥ 0.9 of the plateau on both; a sweep on the target machine
/// replaces them with measured hints.
///
/// * shared memory: one `memcpy` per block by the sender thread into the peer's mapping:
///   plateau ≈ 5.5 GB/s, ≈ 1.3 µs per block (queue handoff, thread wake-up, completion);
/// * TCP: plateau ≈ 3.0 GB/s per connection, ≈ 19.4 µs per block (frame, syscalls and the
///   acknowledgement on both sides).
///
/// ```
/// use rdma_hint_staged::{capabilities, StagedChannel};
/// let caps = capabilities(StagedChannel::Tcp);
/// assert_eq!(caps.facts.id.to_string(), "staged:tcp");
/// assert!(caps.facts.wire_gbps > 0.0);
/// ```
pub fn capabilities(channel: StagedChannel) -> Capabilities {
    let (wire_gbps, per_op_overhead_us) = match channel {
        StagedChannel::SharedMemory => (5.5, 1.3),
        StagedChannel::Tcp => (3.0, 19.4),
    };
    let mut memory_kinds = vec![MemoryKind::Host];
    memory_kinds.extend(crate::gpu::visible_ordinals().map(|ordinal| MemoryKind::CudaDevice { ordinal }));
    let caller_memory = memory_kinds.iter().filter_map(|kind| caller_memory_path(channel, *kind)).collect();
    Capabilities {
        facts: TransportFacts {
            id: channel.id(),
            kind: TransportKind::Staged,
            wire_gbps,
            nic_pcie: None,
            per_op_overhead_us,
            mtu_bytes: None,
            // Blocks are framed with a u64 length; the ring bounds what is in flight, not a block.
            max_msg_bytes: 1 << 40,
            max_payload_bytes: None,
            queried_from_backend: false,
            rate_note: None,
        },
        max_outstanding_wrs: 256,
        max_wrs_per_post: MAX_OPS_PER_POST as u32,
        // A gather write's pieces leave from their sources: one `sendmsg` on TCP, copies
        // straight into the peer's mapping on shm.
        max_sges: crate::request::MAX_SGES,
        memory_kinds,
        caller_memory,
        // shm: a post copies its blocks into the peer's mapping (or queues them for the sender
        // thread, never waiting for room) and returns. TCP in `BusyPoll` sends from the
        // posting thread, and a full socket makes the send wait.
        posts_without_waiting: channel == StagedChannel::SharedMemory,
    }
}

/// What caller memory of `kind` costs on `channel`, per payload byte:
///
/// * TCP: the socket sends from and receives into the caller's bytes (the kernel's two
///   socket copies are the medium's); GPU memory crosses pinned halves on the copy engines,
///   which are not the CPU;
/// * shm: one copy from the caller's buffer straight into the peer's mapping; a receiving
///   region in caller memory, which the peer cannot map, is filled by one copy out of a shared
///   bounce mapping; GPU memory is copied into the peer's mapping by a copy engine, and a
///   receiving GPU region is filled by the copy engine from a page-locked bounce.
fn caller_memory_path(channel: StagedChannel, kind: MemoryKind) -> Option<CallerMemoryPath> {
    let gpu = match kind {
        MemoryKind::Host => false,
        MemoryKind::CudaDevice { .. } if cfg!(feature = "cuda") => true,
        _ => return None,
    };
    let (send_copies, receive_copies, medium_copies) = match (channel, gpu) {
        (StagedChannel::Tcp, _) => (0, Some(0), 2),
        (StagedChannel::SharedMemory, false) => (1, Some(1), 0),
        (StagedChannel::SharedMemory, true) => (0, Some(0), 0),
    };
    Some(CallerMemoryPath { kind, send_copies, receive_copies, medium_copies })
}
