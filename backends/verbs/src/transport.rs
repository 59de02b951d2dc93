//! `VerbsTransport`: one RC queue pair, the `Transport` implementation.

use crate::context::Context;
use crate::cq::{CompletionChannel, CompletionQueue};
use crate::device::{self, DeviceFacts};
use crate::events::{EventThread, Events, Watched};
use crate::lane::{lock, Lane, Polling, Posting, VerbsDomain};
use crate::lending::Lending;
use crate::pd::ProtectionDomain;
use crate::qp::{PeerPath, QueuePair};
use crate::region::VerbsMemory;
use crate::status::unavailable;
use crate::wire::{ExposedRegion, Hello, LIMITS, MAX_REGIONS, READY};
use async_trait::async_trait;
use rdma_hint_backend_core::gather::{gathered, Pieces};
use rdma_hint_backend_core::lanes::Exposure;
use rdma_hint_backend_core::peer_regions::{PeerRegions, Withdrawals};
use rdma_hint_backend_core::wait::{ready, wait};
use rdma_hint_backend_core::DomainCore;
use rdma_hint_core::{
    Arrival, Capabilities, Completion, CompletionStatus, Domain, GatherEntry, GatherOp, MemoryKind,
    PeerEndpoint, ReadOp, RegionId, RemoteRegion, Transport, TransportError, WaitMode, WriteOp,
    MAX_OPS_PER_POST,
};
use rdma_hint_oob::{confirm, ControlChannel, Rendezvous};
use rdma_mummy_sys as ibv;
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Send-queue depth asked for (bounded by the device's `max_qp_wr`).
const SQ_DEPTH: u32 = 1024;
/// Receive WRs kept posted for writes with immediate (each consumes one).
const RQ_DEPTH: u32 = 256;
/// Scatter/gather entries per WR asked of the QP (below the device's `max_sge`).
const SGES_WANTED: u32 = 16;
/// How often polls look at the out-of-band socket for a peer that went away (the event
/// thread also watches it).
const LIVENESS_EVERY: Duration = Duration::from_millis(1);
/// Empty polls between two looks at the clock for [`LIVENESS_EVERY`]: a clock read per empty
/// poll was most of a busy poll's cost in the emulated Soft-RoCE guest.
const POLLS_PER_CLOCK: u32 = 64;
/// `Arrival::region` when the receiver exposed several regions: RDMA WRITE WITH IMM does not
/// say which one was written.
pub const UNKNOWN_REGION: RegionId = RegionId(u32::MAX);

/// Raw ibverbs RC transport over one device port.
///
/// `register` maps and registers host memory for local access; `connect` exchanges QP numbers,
/// PSNs, GIDs, MTU and, for each exposed region, address, length and the rkey of a second
/// registration with remote write (regions never exposed have no rkey), then moves the QP
/// INIT → RTR → RTS. `post_writes` chains one `ibv_send_wr` per op (RDMA WRITE, or WRITE WITH
/// IMM) into a single `ibv_post_send`; only ops marked signalled produce completions. Both CQs
/// report to one completion channel; a thread sleeps on its fd and the out-of-band socket and
/// wakes the waiting tasks, so a wait polls the CQ, spins briefly and then sleeps
/// ([`WaitMode::Adaptive`]: the CQs are re-armed after every event) or polls it from the
/// waiting thread until the deadline ([`WaitMode::BusyPoll`]: the CQs stay unarmed, so no
/// completion wakes the event thread). A peer that dies is `PeerGone` at once, before RC retries run out.
///
/// ```no_run
/// use rdma_hint_core::{MemoryKind, PeerEndpoint, Transport};
/// use rdma_hint_backend_core::BlockingTransport;
/// use rdma_hint_verbs::VerbsTransport;
/// use std::time::{Duration, Instant};
///
/// let transport = VerbsTransport::open(Some("rxe0")).unwrap();
/// let region = transport.register(MemoryKind::Host, 1 << 20).unwrap();
/// let deadline = Instant::now() + Duration::from_secs(10);
/// let peer = PeerEndpoint::Dial("10.77.0.2:7000".parse().unwrap());
/// let remote = transport.connect_blocking(peer, &[region.id], deadline).unwrap();
/// ```
pub struct VerbsTransport {
    // Fields drop in declaration order, after `Drop` has stopped the event thread and taken
    // back every loan, so the transport is then the last owner of its lane's verbs objects and
    // they go in this order: the QP, then (as its last owner) the send and the receive CQ; then
    // what it shares with its other lanes, by the last lane to go: the regions' MRs; the PD;
    // the completion channel and the context as the last fields.
    pub(crate) lane: Arc<Lane>,
    /// The regions and lanes of this connection (this lane included): a region is busy while
    /// a WR of any lane may read it or the peer of any lane may write it.
    pub(crate) domain: Arc<VerbsDomain>,
    pub(crate) pd: Arc<ProtectionDomain>,
    caps: Capabilities,
    device: DeviceFacts,
    lending: Arc<Lending>,
    rendezvous: Rendezvous,
    event_thread: Mutex<Option<EventThread>>,
    port: Port,
    rq_depth: u32,
    // Kept here (the CQs hold it too) so that it goes after the PD, as the last but one.
    channel: Arc<CompletionChannel>,
    // Dropped last: everything above was created on it.
    _context: Arc<Context>,
}

/// What a new lane is opened on: the device, its protection domain and port, and what the
/// connection's lanes share.
struct Connection {
    context: Arc<Context>,
    pd: Arc<ProtectionDomain>,
    domain: Arc<VerbsDomain>,
    facts: DeviceFacts,
    port: Port,
}

/// The port the QP uses and how this side is addressed on it.
#[derive(Debug, Clone, Copy)]
struct Port {
    number: u8,
    gid_index: i32,
    gid: [u8; 16],
    active_mtu: u8,
}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("device", &self.device.name)
            .field("port", &self.port.number)
            .finish()
    }
}

rdma_hint_oob::token_setters!(VerbsTransport, "QP number, rkeys");

impl VerbsTransport {
    /// Posts plain or gather writes as one chain: each request one WR, its pieces its SGEs
    /// (every piece checked first).
    fn post(&self, ops: &[impl Pieces]) -> Result<(), TransportError> {
        self.post_as(ops, false)
    }

    /// Posts `ops` as RDMA WRITEs, or (`read`) as RDMA READs of their ranges: `local` the
    /// destination, `remote` the peer's source, one SGE each.
    fn post_as(&self, ops: &[impl Pieces], read: bool) -> Result<(), TransportError> {
        if self.lane.control.get().is_none() {
            return Err(TransportError::NotConnected);
        }
        if self.broken() {
            return Err(self.gone());
        }
        self.caps.check_post(ops.len())?;
        if ops.is_empty() {
            return Ok(());
        }
        // The peer's regions first: a withdrawal of the peer's takes their write lock, so none
        // comes while this post reads them.
        let remote = self.lane.peer.view();
        let table = self.domain.regions();
        let mut posting = lock(&self.lane.posting);
        let room = self.caps.max_outstanding_wrs as usize - posting.in_flight;
        if ops.len() > room {
            return Err(TransportError::QueueFull { given: ops.len() as u32, max: room as u32 });
        }
        let max_inline = self.lane.qp.max_inline();
        let Posting { wrs, sges, .. } = &mut *posting;
        let (mut used_sges, mut firsts) = (0, [0usize; MAX_OPS_PER_POST]);
        for (index, request) in ops.iter().enumerate() {
            let op = request.head();
            firsts[index] = used_sges;
            let mut target_of_first = None;
            for piece in request.pieces() {
                let target = remote.get(piece.remote)?;
                let (local, target) =
                    table.check_write(&piece, Some(target), self.caps.facts.max_msg_bytes)?;
                // The SGE array holds `max_sges` per WR (a longer gather was refused).
                sges[used_sges] = ibv::ibv_sge {
                    addr: local.address(piece.local_offset),
                    length: piece.len as u32,
                    lkey: local.lkey(),
                };
                used_sges += 1;
                target_of_first.get_or_insert(target);
            }
            let target = target_of_first.expect("a request has a piece");
            let wr = &mut wrs[index];
            wr.wr_id = op.wr_id;
            wr.num_sge = (used_sges - firsts[index]) as i32;
            wr.opcode = match (read, op.imm.is_some()) {
                (true, _) => ibv::ibv_wr_opcode::IBV_WR_RDMA_READ,
                (false, true) => ibv::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                (false, false) => ibv::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            };
            let signalled = if op.signalled { ibv::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
            // Inline: the provider copies the bytes (of every SGE) into the WR during the post,
            // so the source is read before `ibv_post_send` returns (a later change cannot reach
            // the wire).
            // A read's bytes come the other way: nothing to inline.
            let inline = if !read && op.len <= u64::from(max_inline) {
                ibv::ibv_send_flags::IBV_SEND_INLINE.0
            } else {
                0
            };
            wr.send_flags = signalled | inline;
            wr.imm_data_invalidated_rkey_union.imm_data = op.imm.unwrap_or(0).to_be();
            wr.wr.rdma = ibv::rdma_t { remote_addr: target.address + op.remote_offset, rkey: target.rkey };
        }
        // Chain after filling: the vectors do not move while the lock is held.
        let count = ops.len();
        for index in 0..count {
            wrs[index].sg_list = &mut sges[firsts[index]];
            wrs[index].next = if index + 1 < count { &mut wrs[index + 1] } else { std::ptr::null_mut() };
        }
        // SAFETY: the chain of `count` WRs (the last one's `next` null) and their SGEs lives in
        // `posting`, locked for the call; every SGE lies inside a region registered in the QP's
        // PD (checked above), and the WRs are counted in flight below, so `deregister` refuses
        // their regions until their completions are polled.
        let posted = unsafe { self.lane.qp.post_send(&mut wrs[0]) };
        // What the provider took is in flight whether or not it refused the rest.
        let taken = match &posted {
            Ok(()) => count,
            Err((taken, _)) => *taken,
        };
        posting.in_flight += taken;
        posting.posted += taken as u64;
        for op in &ops[..taken] {
            posting.since_signal += 1;
            if op.head().signalled {
                let retired = posting.since_signal;
                posting.retires.push_back(retired);
                posting.since_signal = 0;
            }
        }
        posted.map_err(|(_, error)| match error.raw_os_error() {
            Some(libc::ENOMEM) => TransportError::QueueFull { given: count as u32, max: room as u32 },
            _ => TransportError::Io(error),
        })
    }

    /// Opens `device` (e.g. `rxe0`, `mlx5_0`; `None`: the first device) on its first active
    /// port: protection domain, send and receive CQs and an RC QP sized from the device caps.
    ///
    /// Without libibverbs or without a device this is [`TransportError::Unavailable`] saying so.
    pub fn open(device: Option<&str>) -> Result<VerbsTransport, TransportError> {
        let context = Arc::new(device::open(device)?);
        let (facts, port_attr) = device::facts(&context)?;
        let (gid_index, gid) = device::choose_gid(&context, facts.port, port_attr.gid_tbl_len)?;
        let port = Port { number: facts.port, gid_index, gid, active_mtu: port_attr.active_mtu as u8 };
        let pd = Arc::new(ProtectionDomain::alloc(&context)?);
        let paths = crate::region::caller_memory_paths(&pd);
        let source = VerbsMemory { pd: pd.clone() };
        let domain = Arc::new(DomainCore::new(MAX_REGIONS, source, paths));
        VerbsTransport::lane_of(Connection { context, pd, domain, facts, port }, Rendezvous::default())
    }

    /// Another lane of the same connection: a QP of its own (with its CQs, completion channel
    /// and event thread) in the same protection domain, over the same regions (same ids, same
    /// MRs and rkeys), with the same token and wait mode, to connect to the same peer's lane.
    /// An engine stripes one transfer's blocks over such lanes, as over the QPs of a NIC. A
    /// region registered or released on one lane is registered or released on all; it stays
    /// busy while a WR of any lane may read it or the peer of any lane may write it.
    ///
    /// ```no_run
    /// use rdma_hint_core::{MemoryKind, Transport};
    /// use rdma_hint_verbs::VerbsTransport;
    /// let first = VerbsTransport::open(Some("rxe0")).unwrap();
    /// let region = first.register(MemoryKind::Host, 4096).unwrap();
    /// first.write_region(region.id, 0, b"one memory").unwrap();
    /// let second = first.open_lane().unwrap();
    /// let mut seen = [0u8; 10];
    /// second.read_region(region.id, 0, &mut seen).unwrap();
    /// assert_eq!(&seen, b"one memory");
    /// ```
    pub fn open_lane(&self) -> Result<VerbsTransport, TransportError> {
        let connection = Connection {
            context: self._context.clone(),
            pd: self.pd.clone(),
            domain: self.domain.clone(),
            facts: self.device.clone(),
            port: self.port,
        };
        let lane = VerbsTransport::lane_of(connection, self.rendezvous.for_lane())?;
        lane.set_wait_mode(self.wait_mode());
        Ok(lane)
    }

    /// A lane of `connection`: its completion channel, CQs and RC QP, sized from the device caps.
    fn lane_of(connection: Connection, rendezvous: Rendezvous) -> Result<VerbsTransport, TransportError> {
        let Connection { context, pd, domain, facts, port } = connection;
        let sq_depth = SQ_DEPTH.min(facts.max_qp_wr);
        let rq_depth = RQ_DEPTH.min(facts.max_qp_wr);
        let events = Arc::new(Events::new()?);
        let channel = Arc::new(CompletionChannel::create(&context)?);
        // Both CQs report to `channel`; both are created (and armed) before the QP on them.
        let cqs = (
            CompletionQueue::create(&channel, sq_depth).map(Arc::new),
            CompletionQueue::create(&channel, rq_depth).map(Arc::new),
        );
        let qp = match &cqs {
            (Some(send_cq), Some(recv_cq)) if send_cq.arm().and(recv_cq.arm()).is_ok() => {
                QueuePair::create(&pd, send_cq, recv_cq, (sq_depth, rq_depth), SGES_WANTED.min(facts.max_sge))
            }
            _ => None,
        };
        let Some(qp) = qp else {
            // `errno` says why. What was created goes as this returns, in reverse order of the
            // bindings: the send CQ, the receive CQ (the tuple's order), the channel, and what
            // the connection's other lanes do not hold: the PD, the context.
            return Err(unavailable("ibv_create_cq / ibv_req_notify_cq / ibv_create_qp"));
        };
        let max_wrs_per_post = (MAX_OPS_PER_POST as u32).min(sq_depth);
        let caps = Capabilities {
            facts: facts.facts.clone(),
            max_outstanding_wrs: sq_depth,
            max_wrs_per_post,
            max_sges: qp.max_sges(),
            memory_kinds: vec![MemoryKind::Host],
            caller_memory: crate::region::caller_memory_paths(&pd),
            // `ibv_post_send` returns at once (ENOMEM on a full send queue), but the engine's
            // ring under its lock has not run over Soft-RoCE yet: not vouched for.
            posts_without_waiting: false,
        };
        // SAFETY: ibv_send_wr, ibv_sge and ibv_wc are plain C structs; all-zero is valid.
        let (wrs, sges, wcs) = unsafe {
            (
                (0..max_wrs_per_post).map(|_| std::mem::zeroed()).collect(),
                (0..max_wrs_per_post * qp.max_sges()).map(|_| std::mem::zeroed()).collect(),
                (0..64).map(|_| std::mem::zeroed()).collect(),
            )
        };
        let lane = Arc::new(Lane {
            qp: Arc::new(qp),
            posting: Mutex::new(Posting {
                wrs,
                sges,
                in_flight: 0,
                retires: VecDeque::with_capacity(sq_depth as usize),
                since_signal: 0,
                posted: 0,
                retired: 0,
            }),
            polling: Mutex::new(Polling { wcs, checked: Instant::now(), empty_polls: 0 }),
            events,
            exposure: Exposure::default(),
            peer: PeerRegions::default(),
            control: OnceLock::new(),
            withdrawals: Withdrawals::default(),
            serving: Mutex::new(()),
        });
        domain.lanes().join(&lane);
        Ok(VerbsTransport {
            lane,
            domain,
            pd,
            caps,
            device: facts,
            lending: Arc::new(Lending::default()),
            rendezvous,
            event_thread: Mutex::new(None),
            port,
            rq_depth,
            channel,
            _context: context,
        })
    }

    /// What `ibv_query_device` / `ibv_query_port` said about this device.
    pub fn device(&self) -> &DeviceFacts {
        &self.device
    }

    fn gone(&self) -> TransportError {
        self.lane.events.gone.error()
    }

    fn broken(&self) -> bool {
        self.lane.broken()
    }

    /// Whether an empty poll looks at the out-of-band socket now (at most every millisecond):
    /// EOF means the peer process is gone, whatever the QP still believes. The look itself
    /// ([`Lane::drive`]) comes after the poll let go of its lock.
    fn time_to_watch(&self, polling: &mut Polling) -> bool {
        polling.empty_polls = polling.empty_polls.wrapping_add(1);
        if !polling.empty_polls.is_multiple_of(POLLS_PER_CLOCK)
            || polling.checked.elapsed() < LIVENESS_EVERY
            || self.broken()
        {
            return false;
        }
        polling.checked = Instant::now();
        true
    }

    /// What an empty poll answers: nothing yet, or the loss; now and then it looks at the peer
    /// first, once the poll's lock is let go.
    fn empty_poll(&self, mut polling: MutexGuard<'_, Polling>) -> Result<usize, TransportError> {
        if self.time_to_watch(&mut polling) {
            drop(polling);
            self.lane.drive();
        }
        if self.broken() {
            return Err(self.gone());
        }
        Ok(0)
    }

    /// Waits for what `poll` takes off the send CQ (`send`) or the receive CQ, woken by that
    /// CQ's notifier; in `Adaptive` the CQ is armed before a sleep and polled once more, so
    /// that nothing that came meanwhile waits for a later event.
    async fn wait_cq<T>(
        &self,
        out: &mut [T],
        deadline: Instant,
        send: bool,
        what: &'static str,
        poll: impl Fn(&Self, &mut [T]) -> Result<usize, TransportError> + Unpin,
    ) -> Result<usize, TransportError> {
        if out.is_empty() {
            return Ok(0);
        }
        let mode = self.lane.events.wait_mode.get();
        let (cq, notifier) = match send {
            true => (self.lane.qp.send_cq(), &self.lane.events.completions),
            false => (self.lane.qp.recv_cq(), &self.lane.events.arrivals),
        };
        wait(notifier, mode, deadline, what, || match ready(poll(self, out))? {
            None if mode == WaitMode::Adaptive && self.lane.events.arm_before_sleep(cq, send)? => {
                ready(poll(self, out))
            }
            found => Ok(found),
        })
        .await
    }
}

impl VerbsTransport {
    /// `connect` after the checks: registration for remote write, the QP's transitions and the
    /// exchange.
    async fn finish_connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        let setup = Setup {
            lane: self.lane.clone(),
            pd: self.pd.clone(),
            domain: self.domain.clone(),
            expose: expose.to_vec(),
            port: self.port,
            rq_depth: self.rq_depth,
            reads_in_flight: self.device.max_reads_in_flight as u8,
            watched: Watched {
                channel: self.channel.clone(),
                send_cq: self.lane.qp.send_cq().clone(),
                recv_cq: self.lane.qp.recv_cq().clone(),
            },
            lending: self.lending.clone(),
        };
        // Memory registration, the QP's transitions and the event thread's start run on the
        // rendezvous thread with the exchange: on Soft-RoCE each is a slow kernel call, and
        // none may hold the awaiting task's thread. The loan is waited for in `Drop`.
        let lent = self.lending.lend(setup);
        let hello = move || {
            let (ours, psn) = lent.value.hello()?;
            Ok((ours.encode(), move |stream: &mut TcpStream, theirs: Hello| {
                lent.value.finish(stream, theirs, psn)
            }))
        };
        let decode = |mut stream: &mut dyn std::io::Read| Hello::decode(&mut stream);
        let (_, (theirs, thread, control)) = self.rendezvous.meet(peer, deadline, hello, decode).await?;
        *lock(&self.event_thread) = Some(thread);
        // Connected from here (not before: a handshake that ended past the deadline left no
        // lane that counts as connected).
        let _ = self.lane.control.set(control);
        Ok(theirs.regions.iter().map(|r| RemoteRegion { id: RegionId(r.id), len: r.len }).collect())
    }
}

#[async_trait]
impl Transport for VerbsTransport {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        self.rendezvous.bind(address)
    }

    fn set_wait_mode(&self, mode: WaitMode) {
        self.lane.events.wait_mode.set(mode);
    }

    fn wait_mode(&self) -> WaitMode {
        self.lane.events.wait_mode.get()
    }

    fn domain(&self) -> &dyn Domain {
        &*self.domain
    }

    async fn connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        if self.lane.control.get().is_some() {
            return Err(TransportError::AlreadyConnected);
        }
        self.lane.exposure.around_connect(expose, self.finish_connect(peer, expose, deadline)).await
    }

    async fn expose(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        self.expose_region(region, deadline).await
    }

    async fn withdraw(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        self.withdraw_region(region, deadline).await
    }

    fn peer_regions(&self) -> Vec<RemoteRegion> {
        self.lane.peer.list()
    }

    fn post_writes(&self, ops: &[WriteOp]) -> Result<(), TransportError> {
        self.post(ops)
    }

    fn post_reads(&self, ops: &[ReadOp]) -> Result<(), TransportError> {
        let mut ranges = [WriteOp::EMPTY; MAX_OPS_PER_POST];
        self.post_as(ReadOp::ranges_of(ops, &mut ranges)?, true)
    }

    fn post_gather_writes(&self, ops: &[GatherOp], entries: &[GatherEntry]) -> Result<(), TransportError> {
        gathered(ops, entries, &self.caps, |views| self.post(views))
    }

    fn poll_completions(&self, out: &mut [Completion]) -> Result<usize, TransportError> {
        let mut polling = lock(&self.lane.polling);
        let want = out.len().min(polling.wcs.len());
        let found = self.lane.qp.send_cq().poll(&mut polling.wcs[..want])?;
        if found > 0 {
            let mut posting = lock(&self.lane.posting);
            for (slot, wc) in out.iter_mut().zip(&polling.wcs[..found]) {
                let status = if wc.status == ibv::ibv_wc_status::IBV_WC_SUCCESS {
                    CompletionStatus::Success
                } else {
                    self.lane
                        .events
                        .fail(format!("work request {} failed with ibv_wc_status {}", wc.wr_id, wc.status));
                    CompletionStatus::Failed { code: wc.status }
                };
                *slot = Completion { wr_id: wc.wr_id, status };
                let retired = posting.retires.pop_front().unwrap_or(1);
                posting.in_flight = posting.in_flight.saturating_sub(retired);
                posting.retired += retired as u64;
            }
            drop((posting, polling));
            self.lane.answer_withdrawals();
            return Ok(found);
        }
        self.empty_poll(polling)
    }

    async fn wait_completions(
        &self,
        out: &mut [Completion],
        deadline: Instant,
    ) -> Result<usize, TransportError> {
        self.wait_cq(out, deadline, true, "verbs completions", |this, out| this.poll_completions(out)).await
    }

    fn poll_arrivals(&self, out: &mut [Arrival]) -> Result<usize, TransportError> {
        let mut polling = lock(&self.lane.polling);
        let want = out.len().min(polling.wcs.len());
        let found = self.lane.qp.recv_cq().poll(&mut polling.wcs[..want])?;
        // RDMA WRITE WITH IMM does not say which region it wrote: the one exposed, if one is.
        let region =
            if found > 0 { self.lane.exposure.only().unwrap_or(UNKNOWN_REGION) } else { UNKNOWN_REGION };
        let mut ready = 0;
        for index in 0..found {
            let wc = polling.wcs[index];
            if wc.status != ibv::ibv_wc_status::IBV_WC_SUCCESS {
                self.lane.events.fail(format!("receive failed with ibv_wc_status {}", wc.status));
                continue;
            }
            // SAFETY: the union holds the immediate for RECV_RDMA_WITH_IMM completions.
            let imm = u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
            out[ready] = Arrival { imm, region, len: u64::from(wc.byte_len) };
            ready += 1;
            self.lane.qp.post_receive()?;
        }
        match ready {
            0 => self.empty_poll(polling),
            ready => Ok(ready),
        }
    }

    async fn wait_arrivals(&self, out: &mut [Arrival], deadline: Instant) -> Result<usize, TransportError> {
        self.wait_cq(out, deadline, false, "verbs arrivals", |this, out| this.poll_arrivals(out)).await
    }
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        if let Some(control) = self.lane.control.get() {
            control.say_goodbye();
        }
        // The event thread uses the channel and CQs: it stops before they go.
        if let Some(mut thread) = lock(&self.event_thread).take() {
            thread.stop();
        }
        // A connect whose future was dropped may still run on its rendezvous thread with `Arc`s
        // of the QP, PD, regions, channel and CQs, or have left its event thread running: both
        // are waited for (bounded by the connect's deadline), so that the fields then release
        // the verbs objects here, in their declaration order. Dropping such a transport from
        // async code blocks that long.
        self.lending.wait_returned();
        // The lane guards its regions for other lanes until its QP can neither read nor be
        // written (ERR), and only then leaves the list.
        if let Err(error) = self.lane.qp.to_error() {
            tracing::debug!(%error, "verbs: cannot move the QP to ERR on drop");
        }
        self.domain.lanes().remove(&self.lane);
    }
}

/// What a connect's rendezvous thread needs: `Arc`s of the verbs objects and the shared state,
/// lent (see [`Lending`]).
struct Setup {
    lane: Arc<Lane>,
    pd: Arc<ProtectionDomain>,
    domain: Arc<VerbsDomain>,
    expose: Vec<RegionId>,
    port: Port,
    rq_depth: u32,
    reads_in_flight: u8,
    watched: Watched,
    lending: Arc<Lending>,
}

impl Setup {
    /// Exposes the regions (a second MR with remote write each; no peer can use one before it
    /// has the rkey, sent only after authentication) and builds this side's hello, with the
    /// starting PSN it carries.
    fn hello(&self) -> Result<(Hello, u32), TransportError> {
        let mut regions = Vec::with_capacity(self.expose.len());
        {
            let mut table = self.domain.regions_mut();
            for id in &self.expose {
                let region = table.get_mut(*id)?;
                let rkey = region.expose(&self.pd)?;
                regions.push(ExposedRegion { id: id.0, address: region.address(0), len: region.len(), rkey });
            }
        }
        let psn = crate::qp::initial_psn();
        let qpn = self.lane.qp.qp_num();
        let lid = 0; // RoCE: addressing is by GID.
        let (gid, mtu, reads_served) = (self.port.gid, self.port.active_mtu, self.reads_in_flight);
        Ok((Hello { lid, qpn, psn, gid, mtu, reads_served, regions }, psn))
    }

    /// INIT → (receive WRs posted) → RTR → RTS against the peer's hello. Each step is checked;
    /// the first that fails leaves the QP where it was and says which.
    fn bring_up(&self, peer: &Hello, psn: u32) -> Result<(), TransportError> {
        self.lane.qp.to_init(self.port.number)?;
        for _ in 0..self.rq_depth {
            self.lane.qp.post_receive()?;
        }
        self.lane.qp.to_rtr(&PeerPath {
            port: self.port.number,
            sgid_index: self.port.gid_index as u8,
            path_mtu: u32::from(self.port.active_mtu.min(peer.mtu)),
            dest_qpn: peer.qpn,
            rq_psn: peer.psn,
            dlid: peer.lid,
            dgid: peer.gid,
            reads_served: self.reads_in_flight,
        })?;
        // Never more of ours in flight than the peer serves at once (a responder short of
        // resources for a read fails it, and the QP with it).
        self.lane.qp.to_rts(psn, self.reads_in_flight.min(peer.reads_served))
    }

    /// After the hellos: brings the QP to RTS, confirms, loads the peer's regions and starts
    /// the event thread, which acts on the peer's control frames from then on. Returns the
    /// peer's hello, the thread and the control channel the out-of-band socket becomes.
    fn finish(
        &self,
        stream: &mut TcpStream,
        theirs: Hello,
        psn: u32,
    ) -> Result<(Hello, EventThread, Arc<ControlChannel>), TransportError> {
        self.bring_up(&theirs, psn)?;
        confirm(stream, READY)?;
        for region in &theirs.regions {
            // The hello's ids are checked distinct and few: none is refused.
            let _ = self.lane.peer.load(region.id, *region);
        }
        let control = Arc::new(ControlChannel::new(stream.try_clone()?, LIMITS)?);
        let oob = control.stream().map_or(-1, AsRawFd::as_raw_fd);
        let (lane, watched) = (self.lane.clone(), control.clone());
        let watch = move || lane.watch_control_on(&watched);
        let thread = EventThread::start(
            self.lane.events.clone(),
            self.watched.clone(),
            oob,
            watch,
            self.lending.lend(()),
        )?;
        Ok((theirs, thread, control))
    }
}
