//! Helpers for the criterion benches in `benches/`: a null transport (posting costs only), the
//! library's `block_on`, and the [`write_bw`] measurement the backend-vs-peer-tool scripts
//! run, and the examples' command lines ([`flags`]). Run the benches with `cargo bench -p rdma-hint-benches`.
#![forbid(unsafe_code)]

#[path = "flags.rs"]
pub mod flags;
#[path = "write_bw.rs"]
pub mod write_bw;

use async_trait::async_trait;
use crossbeam_channel::{Receiver, Sender};
use rdma_hint::engine::PostPolicy;
use rdma_hint::transport::{Capabilities, CompletionStatus, Domain, WaitMode};
use rdma_hint::transport::{TransportFacts, TransportKind};
use rdma_hint::TransportId;
use rdma_hint::{
    Arrival, Completion, LocalRegion, MemoryKind, PeerEndpoint, RegionId, RemoteRegion, Transport,
    TransportError, WriteOp,
};
use std::net::SocketAddr;
use std::time::Instant;

/// The library's own blocking executor (allocation-free after its first call on a thread).
pub use rdma_hint::block_on;

/// A transport that moves no bytes: every signalled op completes at once. Measures what the
/// posting machinery itself costs per block.
#[derive(Debug)]
pub struct NullTransport {
    caps: Capabilities,
    completed: Sender<Completion>,
    completions: Receiver<Completion>,
}

impl NullTransport {
    /// A null transport with `max_outstanding` completions in flight.
    pub fn new(max_outstanding: u32) -> NullTransport {
        let (completed, completions) = crossbeam_channel::bounded(max_outstanding as usize);
        NullTransport {
            caps: Capabilities {
                facts: TransportFacts {
                    id: TransportId::Custom("null".into()),
                    kind: TransportKind::Loopback,
                    wire_gbps: 1e6,
                    nic_pcie: None,
                    per_op_overhead_us: 0.0,
                    mtu_bytes: None,
                    max_msg_bytes: 1 << 40,
                    max_payload_bytes: None,
                    queried_from_backend: true,
                    rate_note: None,
                },
                max_outstanding_wrs: max_outstanding,
                max_wrs_per_post: 64,
                max_sges: 1,
                memory_kinds: vec![MemoryKind::Host],
                caller_memory: Vec::new(),
                posts_without_waiting: false,
            },
            completed,
            completions,
        }
    }

    /// A region handle of `len` bytes (nothing is allocated).
    pub fn region(&self, id: u32, len: u64) -> LocalRegion {
        LocalRegion { id: RegionId(id), kind: MemoryKind::Host, len }
    }
}

impl Domain for NullTransport {
    fn register(&self, kind: MemoryKind, len: u64) -> Result<LocalRegion, TransportError> {
        Ok(LocalRegion { id: RegionId(0), kind, len })
    }
    fn deregister(&self, _region: RegionId) -> Result<(), TransportError> {
        Ok(())
    }
    // Nothing is ever freed here, so a hold guards nothing.
    fn hold(&self, _region: RegionId) -> Result<(), TransportError> {
        Ok(())
    }
    fn unhold(&self, _region: RegionId) {}
    fn write_region(&self, _region: RegionId, _offset: u64, _data: &[u8]) -> Result<(), TransportError> {
        Ok(())
    }
    fn read_region(&self, _region: RegionId, _offset: u64, _out: &mut [u8]) -> Result<(), TransportError> {
        Ok(())
    }
    fn copied_bytes(&self) -> rdma_hint::transport::CopiedBytes {
        rdma_hint::transport::CopiedBytes::default() // it moves no bytes at all
    }
}

#[async_trait]
impl Transport for NullTransport {
    fn domain(&self) -> &dyn Domain {
        self
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        Ok(address)
    }
    fn set_wait_mode(&self, _mode: WaitMode) {}
    fn wait_mode(&self) -> WaitMode {
        WaitMode::BusyPoll
    }
    async fn connect(
        &self,
        _peer: PeerEndpoint,
        expose: &[RegionId],
        _deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        Ok(expose.iter().map(|id| RemoteRegion { id: *id, len: u64::MAX }).collect())
    }
    /// No peer: `connect` hands back what it was given and keeps no list.
    fn peer_regions(&self) -> Vec<RemoteRegion> {
        Vec::new()
    }
    fn post_reads(&self, ops: &[rdma_hint::ReadOp]) -> Result<(), TransportError> {
        for op in ops.iter().filter(|op| op.signalled) {
            self.completed
                .try_send(Completion { wr_id: op.wr_id, status: CompletionStatus::Success })
                .map_err(|_| TransportError::QueueFull { given: 1, max: self.caps.max_outstanding_wrs })?;
        }
        Ok(())
    }

    fn post_writes(&self, ops: &[WriteOp]) -> Result<(), TransportError> {
        for op in ops.iter().filter(|op| op.signalled) {
            self.completed
                .try_send(Completion { wr_id: op.wr_id, status: CompletionStatus::Success })
                .map_err(|_| TransportError::QueueFull { given: 1, max: self.caps.max_outstanding_wrs })?;
        }
        Ok(())
    }
    fn poll_completions(&self, out: &mut [Completion]) -> Result<usize, TransportError> {
        Ok(out
            .iter_mut()
            .zip(self.completions.try_iter())
            .map(|(slot, completion)| *slot = completion)
            .count())
    }
    async fn wait_completions(
        &self,
        out: &mut [Completion],
        _deadline: Instant,
    ) -> Result<usize, TransportError> {
        self.poll_completions(out)
    }
    fn poll_arrivals(&self, _out: &mut [Arrival]) -> Result<usize, TransportError> {
        Ok(0)
    }
    async fn wait_arrivals(&self, _out: &mut [Arrival], _deadline: Instant) -> Result<usize, TransportError> {
        Ok(0)
    }
}

/// The posting loop a careful user would write by hand for the same policy (N per doorbell,
/// signal every k-th and the last, window W), without planning or checks: the yardstick the
/// chunker is compared against. Returns the number of blocks posted.
pub fn hand_written_loop<T: Transport>(transport: &T, len: u64, block: u64, policy: &PostPolicy) -> u64 {
    let (n, k, window) =
        (policy.wrs_per_doorbell as usize, u64::from(policy.signal_every), u64::from(policy.window));
    let count = len.div_ceil(block);
    let mut ops = [WriteOp {
        wr_id: 0,
        local: RegionId(0),
        local_offset: 0,
        remote: RegionId(1),
        remote_offset: 0,
        len: 0,
        signalled: false,
        imm: None,
    }; 64];
    let mut completions = [Completion::EMPTY; 256];
    let (mut posted, mut retired, mut filled) = (0u64, 0u64, 0usize);
    while retired < count {
        while posted < count && posted - retired + (n as u64) <= window {
            let index = posted;
            let offset = index * block;
            ops[filled] = WriteOp {
                wr_id: index,
                local_offset: offset,
                remote_offset: offset,
                len: block.min(len - offset),
                signalled: (index + 1) % k == 0 || index + 1 == count,
                ..ops[filled]
            };
            filled += 1;
            posted += 1;
            if filled == n || posted == count {
                transport.post_writes(&ops[..filled]).expect("post");
                filled = 0;
            }
        }
        let ready = transport.poll_completions(&mut completions).expect("poll");
        for completion in &completions[..ready] {
            retired = retired.max(completion.wr_id + 1);
        }
    }
    count
}
