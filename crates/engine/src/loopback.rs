//! An in-process transport: regions are host buffers, a post is a `memcpy`, completions travel
//! through a bounded crossbeam queue. Real data movement for tests and benches, not a mock.

use async_trait::async_trait;
use rdma_hint_backend_core::caller_memory::{admit, busy_exposed, not_caller_memory, CopyMeter};
use rdma_hint_backend_core::gather::{gathered, Pieces};
use rdma_hint_backend_core::queue::{event_queue, EventQueue, EventSender};
use rdma_hint_backend_core::region_table::busy_held;
use rdma_hint_backend_core::wait::WaitModeCell;
use rdma_hint_core::{
    Arrival, CallerMemory, CallerMemoryPath, Capabilities, Completion, CompletionStatus, CopiedBytes, Domain,
    GatherEntry, GatherOp, LocalRegion, MemoryKind, PeerEndpoint, ReadOp, Refused, RegionId, RemoteRegion,
    Transport, TransportError, WaitMode, WriteOp, MAX_OPS_PER_POST,
};
use rdma_hint_core::{TransportFacts, TransportKind};
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Largest region the loopback transport registers (16 GiB): bigger asks are typed errors,
/// not aborts.
pub(crate) const MAX_REGION_BYTES: u64 = 16 << 30;

#[derive(Debug, Default)]
struct Regions {
    buffers: Vec<Option<Vec<u8>>>,
    exposed: Vec<bool>,
    /// Whether the region was exposed and then withdrawn (a post to it names that).
    withdrawn: Vec<bool>,
    /// Whether the buffer is the caller's (a `Vec<u8>` given to `register_memory`).
    caller: Vec<bool>,
    /// Transfers queued or in flight that name the region ([`Transport::hold`]).
    holds: Vec<u32>,
}

/// Two (or more) regions in one process, connected to itself.
///
/// `connect` exposes regions as remote regions of the same transport; `post_writes` copies
/// each op's bytes right away and queues a completion for every signalled op (and wakes
/// waits), so a wait only sleeps when nothing is outstanding, until its deadline.
#[derive(Debug)]
pub struct LoopbackTransport {
    caps: Capabilities,
    /// Shared with the lanes opened from this transport.
    regions: std::sync::Arc<Mutex<Regions>>,
    completed: EventSender<Completion>,
    completions: EventQueue<Completion>,
    arrived: EventSender<Arrival>,
    arrivals: EventQueue<Arrival>,
    wait_mode: WaitModeCell,
    copies: CopyMeter,
}

/// Local ranges one gather write takes, at most.
const MAX_SGES: u32 = 32;

/// Writes-with-immediate the receiver side has not drained yet, at most.
const MAX_PENDING_ARRIVALS: usize = 4096;

impl LoopbackTransport {
    /// A loopback transport allowing `max_outstanding` signalled completions in flight.
    pub fn new(max_outstanding: u32) -> LoopbackTransport {
        let max_outstanding = max_outstanding.max(1);
        let (completed, completions) = event_queue(max_outstanding as usize);
        let (arrived, arrivals) = event_queue(MAX_PENDING_ARRIVALS);
        LoopbackTransport {
            caps: Capabilities {
                facts: TransportFacts {
                    id: rdma_hint_core::TransportId::Loopback,
                    kind: TransportKind::Loopback,
                    wire_gbps: 10.0,
                    nic_pcie: None,
                    per_op_overhead_us: 0.05,
                    mtu_bytes: None,
                    max_msg_bytes: MAX_REGION_BYTES,
                    max_payload_bytes: None,
                    queried_from_backend: true,
                    rate_note: None,
                },
                max_outstanding_wrs: max_outstanding,
                max_wrs_per_post: MAX_OPS_PER_POST as u32,
                max_sges: MAX_SGES,
                memory_kinds: vec![MemoryKind::Host],
                // A post is one memcpy between the two buffers, the medium's copy.
                caller_memory: vec![CallerMemoryPath {
                    kind: MemoryKind::Host,
                    send_copies: 0,
                    receive_copies: Some(0),
                    medium_copies: 1,
                }],
                // A post is its copy and a queued completion.
                posts_without_waiting: true,
            },
            regions: std::sync::Arc::default(),
            completed,
            completions,
            arrived,
            arrivals,
            wait_mode: WaitModeCell::default(),
            copies: CopyMeter::default(),
        }
    }

    /// Another lane of the same connection: a transport with its own completion and arrival
    /// queues over the same regions (same ids, same bytes), as a backend's lanes are.
    ///
    /// ```
    /// use rdma_hint_engine::LoopbackTransport;
    /// use rdma_hint_core::{MemoryKind, Transport};
    /// let first = LoopbackTransport::new(64);
    /// let region = first.register(MemoryKind::Host, 4096).unwrap();
    /// first.write_region(region.id, 0, b"shared").unwrap();
    /// let second = first.open_lane();
    /// let mut seen = [0u8; 6];
    /// second.read_region(region.id, 0, &mut seen).unwrap();
    /// assert_eq!(&seen, b"shared");
    /// ```
    pub fn open_lane(&self) -> LoopbackTransport {
        let lane = LoopbackTransport::new(self.caps.max_outstanding_wrs);
        LoopbackTransport { regions: self.regions.clone(), ..lane }
    }

    /// Puts `buffer` in the next slot.
    fn insert(&self, buffer: Vec<u8>, caller: bool) -> LocalRegion {
        let len = buffer.len() as u64;
        let mut regions = self.regions();
        let id = RegionId(regions.buffers.len() as u32);
        regions.buffers.push(Some(buffer));
        regions.exposed.push(false);
        regions.withdrawn.push(false);
        regions.caller.push(caller);
        regions.holds.push(0);
        LocalRegion { id, kind: MemoryKind::Host, len }
    }

    fn regions(&self) -> MutexGuard<'_, Regions> {
        // Every critical section leaves the table consistent, so a poisoned lock is still usable.
        self.regions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn buffer(regions: &Regions, id: RegionId) -> Result<&Vec<u8>, TransportError> {
    regions.buffers.get(id.0 as usize).and_then(Option::as_ref).ok_or(TransportError::UnregisteredRegion(id))
}

/// `Ok` when the peer side may post to `id`: it is exposed (else withdrawn, or never exposed).
fn exposed(regions: &Regions, id: RegionId) -> Result<(), TransportError> {
    let index = id.0 as usize;
    match (regions.exposed.get(index), regions.withdrawn.get(index)) {
        (Some(true), _) => Ok(()),
        (_, Some(true)) => Err(TransportError::RegionWithdrawn(id)),
        _ => Err(TransportError::UnregisteredRegion(id)),
    }
}

fn range(offset: u64, len: usize, region_len: usize) -> Result<std::ops::Range<usize>, TransportError> {
    let out = || TransportError::OutOfBounds {
        side: "local",
        offset,
        len: len as u64,
        region_len: region_len as u64,
    };
    let start = usize::try_from(offset).map_err(|_| out())?;
    let end = start.checked_add(len).filter(|end| *end <= region_len).ok_or_else(out)?;
    Ok(start..end)
}

impl Domain for LoopbackTransport {
    fn register(&self, kind: MemoryKind, len: u64) -> Result<LocalRegion, TransportError> {
        if kind != MemoryKind::Host {
            return Err(TransportError::UnsupportedMemory { kind });
        }
        if len == 0 || len > MAX_REGION_BYTES {
            return Err(TransportError::Registration {
                len,
                reason: format!("length must be 1 B … {MAX_REGION_BYTES} B"),
            });
        }
        rdma_hint_backend_core::memory_limit::check_commit(len, None, 0)?;
        let mut buffer = Vec::new();
        buffer
            .try_reserve_exact(len as usize)
            .map_err(|e| TransportError::Registration { len, reason: e.to_string() })?;
        buffer.resize(len as usize, 0);
        Ok(self.insert(buffer, false))
    }

    /// Takes caller memory given as a `Vec<u8>` (other forms are refused: this transport
    /// moves bytes with safe slice copies only).
    fn register_memory(&self, memory: CallerMemory) -> Result<LocalRegion, TransportError> {
        let memory = admit(memory, &self.caps.caller_memory)?;
        if memory.len() > MAX_REGION_BYTES {
            let reason = format!("length must be 1 B … {MAX_REGION_BYTES} B");
            return Err(Refused {
                error: TransportError::Registration { len: memory.len(), reason },
                memory,
            }
            .into());
        }
        match memory.take::<Vec<u8>>() {
            Ok(buffer) => Ok(self.insert(buffer, true)),
            Err(memory) => Err(Refused {
                error: TransportError::InvalidArgument {
                    what: "caller memory",
                    why: "the loopback transport registers caller memory given as Vec<u8> only".into(),
                },
                memory,
            }
            .into()),
        }
    }

    fn release(&self, region: RegionId) -> Result<CallerMemory, TransportError> {
        let mut regions = self.regions();
        let index = region.0 as usize;
        buffer(&regions, region)?;
        if !regions.caller[index] {
            return Err(not_caller_memory());
        }
        if regions.exposed[index] {
            return Err(busy_exposed(region));
        }
        if regions.holds[index] > 0 {
            return Err(busy_held(region));
        }
        let taken = regions.buffers[index].take().ok_or(TransportError::UnregisteredRegion(region))?;
        Ok(CallerMemory::from(taken))
    }

    fn hold(&self, region: RegionId) -> Result<(), TransportError> {
        let mut regions = self.regions();
        buffer(&regions, region)?;
        let holds = &mut regions.holds[region.0 as usize];
        *holds = holds
            .checked_add(1)
            .ok_or(TransportError::RegionBusy { region, why: "4 294 967 295 transfers already name it" })?;
        Ok(())
    }

    fn unhold(&self, region: RegionId) {
        if let Some(holds) = self.regions().holds.get_mut(region.0 as usize) {
            *holds = holds.saturating_sub(1);
        }
    }

    /// Posts copy at once, so nothing is ever in flight.
    fn access_region(
        &self,
        region: RegionId,
        access: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), TransportError> {
        let mut regions = self.regions();
        let lent = regions.buffers.get_mut(region.0 as usize).and_then(Option::as_mut);
        access(lent.ok_or(TransportError::UnregisteredRegion(region))?);
        Ok(())
    }

    fn device_pointer(&self, region: RegionId) -> Result<u64, TransportError> {
        buffer(&self.regions(), region)?;
        Err(TransportError::UnsupportedMemory { kind: MemoryKind::Host })
    }

    fn copied_bytes(&self) -> CopiedBytes {
        self.copies.copied()
    }

    fn deregister(&self, region: RegionId) -> Result<(), TransportError> {
        let mut regions = self.regions();
        let index = region.0 as usize;
        if regions.holds.get(index).is_some_and(|holds| *holds > 0) {
            return Err(busy_held(region));
        }
        match regions.buffers.get_mut(index) {
            Some(slot @ Some(_)) => {
                *slot = None;
                regions.exposed[index] = false;
                regions.withdrawn[index] = false;
                regions.caller[index] = false;
                Ok(())
            }
            _ => Err(TransportError::UnregisteredRegion(region)),
        }
    }

    fn write_region(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        let mut regions = self.regions();
        let target = regions.buffers.get_mut(region.0 as usize).and_then(Option::as_mut);
        let target = target.ok_or(TransportError::UnregisteredRegion(region))?;
        let span = range(offset, data.len(), target.len())?;
        target[span].copy_from_slice(data);
        self.copies.write_region(data.len());
        Ok(())
    }

    fn read_region(&self, region: RegionId, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        let regions = self.regions();
        let source = buffer(&regions, region)?;
        let span = range(offset, out.len(), source.len())?;
        out.copy_from_slice(&source[span]);
        self.copies.read_region(out.len());
        Ok(())
    }
}

#[async_trait]
impl Transport for LoopbackTransport {
    fn domain(&self) -> &dyn Domain {
        self
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// Nothing to bind: the peer is this transport. Returns `address` unchanged.
    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        Ok(address)
    }

    fn set_wait_mode(&self, mode: WaitMode) {
        self.wait_mode.set(mode);
    }

    fn wait_mode(&self) -> WaitMode {
        self.wait_mode.get()
    }

    async fn connect(
        &self,
        _peer: PeerEndpoint,
        expose: &[RegionId],
        _deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        let mut regions = self.regions();
        let mut remote = Vec::with_capacity(expose.len());
        for id in expose {
            let len = buffer(&regions, *id)?.len() as u64;
            regions.exposed[id.0 as usize] = true;
            remote.push(RemoteRegion { id: *id, len });
        }
        Ok(remote)
    }

    /// Posts copy at once: the region is loaded by its own transport the moment it is named.
    async fn expose(&self, region: RegionId, _deadline: Instant) -> Result<(), TransportError> {
        let mut regions = self.regions();
        buffer(&regions, region)?;
        let index = region.0 as usize;
        if regions.exposed[index] {
            return Err(TransportError::InvalidArgument {
                what: "expose",
                why: format!("{region:?} is exposed already"),
            });
        }
        regions.exposed[index] = true;
        regions.withdrawn[index] = false;
        Ok(())
    }

    /// Posts copy at once: nothing posted to the region is still in flight.
    async fn withdraw(&self, region: RegionId, _deadline: Instant) -> Result<(), TransportError> {
        let mut regions = self.regions();
        buffer(&regions, region)?;
        let index = region.0 as usize;
        if !regions.exposed[index] {
            return Err(TransportError::InvalidArgument {
                what: "withdraw",
                why: format!("{region:?} is not exposed"),
            });
        }
        regions.exposed[index] = false;
        regions.withdrawn[index] = true;
        Ok(())
    }

    fn peer_regions(&self) -> Vec<RemoteRegion> {
        let regions = self.regions();
        let exposed = regions.buffers.iter().zip(&regions.exposed).enumerate();
        exposed
            .filter_map(|(index, (buffer, exposed))| {
                let len = buffer.as_ref().filter(|_| *exposed)?.len() as u64;
                Some(RemoteRegion { id: RegionId(index as u32), len })
            })
            .collect()
    }

    fn post_writes(&self, ops: &[WriteOp]) -> Result<(), TransportError> {
        self.post(ops)
    }

    fn post_gather_writes(&self, ops: &[GatherOp], entries: &[GatherEntry]) -> Result<(), TransportError> {
        gathered(ops, entries, &self.caps, |views| self.post(views))
    }

    /// A read is the write the other way: checked as a read (the peer's side exposed), then
    /// the remote bytes copied into the local region.
    fn post_reads(&self, ops: &[ReadOp]) -> Result<(), TransportError> {
        self.caps.check_post(ops.len())?;
        {
            let regions = self.regions();
            for op in ops {
                let local = buffer(&regions, op.local)?.len() as u64;
                let remote = buffer(&regions, op.remote)?.len() as u64;
                exposed(&regions, op.remote)?;
                op.ranges().check_lens(local, remote, self.caps.facts.max_msg_bytes)?;
            }
        }
        let mut reversed = [WriteOp::EMPTY; MAX_OPS_PER_POST];
        let reversed = ReadOp::ranges_of(ops, &mut reversed)?;
        for op in reversed.iter_mut() {
            (op.local, op.local_offset, op.remote, op.remote_offset) =
                (op.remote, op.remote_offset, op.local, op.local_offset);
        }
        self.move_bytes(reversed, false)
    }

    fn poll_completions(&self, out: &mut [Completion]) -> Result<usize, TransportError> {
        Ok(self.completions.try_drain(out).unwrap_or(0))
    }

    async fn wait_completions(
        &self,
        out: &mut [Completion],
        deadline: Instant,
    ) -> Result<usize, TransportError> {
        let mode = self.wait_mode.get();
        self.completions.wait(out, mode, deadline, "loopback completions", closed).await
    }

    fn poll_arrivals(&self, out: &mut [Arrival]) -> Result<usize, TransportError> {
        Ok(self.arrivals.try_drain(out).unwrap_or(0))
    }

    async fn wait_arrivals(&self, out: &mut [Arrival], deadline: Instant) -> Result<usize, TransportError> {
        let mode = self.wait_mode.get();
        self.arrivals.wait(out, mode, deadline, "loopback arrivals", closed).await
    }
}

impl LoopbackTransport {
    /// Moves plain or gather writes, piece by piece (an arrival reports the whole request).
    fn post(&self, requests: &[impl Pieces]) -> Result<(), TransportError> {
        self.caps.check_post(requests.len())?;
        self.move_bytes(requests, true)
    }

    /// Checks every op (the destination exposed where `writes`: a read's reversed ops were
    /// checked as reads) and then copies each, completing and announcing as it asks.
    fn move_bytes(&self, requests: &[impl Pieces], writes: bool) -> Result<(), TransportError> {
        let ops = || {
            requests.iter().flat_map(|request| {
                let len = request.head().len;
                request.pieces().map(move |piece| (piece, len))
            })
        };
        let mut regions = self.regions();
        // Check every op before moving a byte: a rejected batch changes nothing.
        let (mut signalled, mut notifying) = (0, 0);
        for (op, _) in ops() {
            let local = buffer(&regions, op.local)?.len() as u64;
            let remote = buffer(&regions, op.remote)?.len() as u64;
            if writes {
                exposed(&regions, op.remote)?;
            }
            op.check_lens(local, remote, self.caps.facts.max_msg_bytes)?;
            signalled += usize::from(op.signalled);
            notifying += usize::from(op.imm.is_some());
        }
        let free = self.caps.max_outstanding_wrs as usize - self.completions.len();
        if signalled > free {
            return Err(TransportError::QueueFull { given: signalled as u32, max: free as u32 });
        }
        if notifying > MAX_PENDING_ARRIVALS - self.arrivals.len() {
            return Err(TransportError::QueueFull {
                given: notifying as u32,
                max: MAX_PENDING_ARRIVALS as u32,
            });
        }
        for (op, request_len) in ops() {
            let (len, from, to) = (op.len as usize, op.local_offset as usize, op.remote_offset as usize);
            if op.local == op.remote {
                if let Some(buffer) = regions.buffers[op.local.0 as usize].as_mut() {
                    buffer.copy_within(from..from + len, to);
                }
            } else {
                // Taking the source out of the table lends both buffers at once without copying.
                let source = regions.buffers[op.local.0 as usize].take();
                if let (Some(source), Some(target)) =
                    (&source, regions.buffers[op.remote.0 as usize].as_mut())
                {
                    target[to..to + len].copy_from_slice(&source[from..from + len]);
                }
                regions.buffers[op.local.0 as usize] = source;
            }
            if let Some(imm) = op.imm {
                let arrival = Arrival { imm, region: op.remote, len: request_len };
                if self.arrived.try_send(arrival).is_err() {
                    return Err(TransportError::QueueFull { given: 1, max: 0 });
                }
            }
            if op.signalled {
                let completion = Completion { wr_id: op.wr_id, status: CompletionStatus::Success };
                if self.completed.try_send(completion).is_err() {
                    return Err(TransportError::QueueFull { given: 1, max: 0 });
                }
            }
        }
        Ok(())
    }
}

fn closed() -> TransportError {
    TransportError::PeerGone("loopback queue closed".into())
}
