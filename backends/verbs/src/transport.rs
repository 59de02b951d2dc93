//! `VerbsTransport`: one RC queue pair, the `Transport` implementation.

use crate::device::{self, Context, DeviceFacts};
use crate::events::{arm, CompletionChannel, EventThread, Events, Watched};
use crate::qp::{Lending, QueuePair};
use crate::region::Region;
use crate::status::unavailable;
use crate::wire::{ExposedRegion, Hello, MAX_REGIONS, READY};
use async_trait::async_trait;
use rdma_hint_oob::{confirm, peer_left, say_goodbye, Rendezvous};
use rdma_hint_transport::wait::{wait, WaitModeCell};
use rdma_hint_transport::{
    Arrival, Capabilities, Completion, CompletionStatus, LocalRegion, MemoryKind, PeerEndpoint, RegionId,
    RegionTable, RemoteRegion, Transport, TransportError, WaitMode, WriteOp,
};
use rdma_mummy_sys as ibv;
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Send-queue depth asked for (bounded by the device's `max_qp_wr`).
const SQ_DEPTH: u32 = 1024;
/// Receive WRs kept posted for writes with immediate (each consumes one).
const RQ_DEPTH: u32 = 256;
/// Work requests chained into one `ibv_post_send`.
const MAX_WRS_PER_POST: u32 = 64;
/// How often polls look at the out-of-band socket for a peer that went away (the event
/// thread also watches it).
const LIVENESS_EVERY: Duration = Duration::from_millis(1);
/// `Arrival::region` when the receiver exposed several regions: RDMA WRITE WITH IMM does not
/// say which one was written.
pub const UNKNOWN_REGION: RegionId = RegionId(u32::MAX);

struct Posting {
    wrs: Vec<ibv::ibv_send_wr>,
    sges: Vec<ibv::ibv_sge>,
    /// Work requests posted and not yet retired by a signalled completion.
    in_flight: usize,
    /// For each signalled WR in posting order: how many WRs its completion retires.
    retires: VecDeque<usize>,
    since_signal: usize,
}

struct Polling {
    wcs: Vec<ibv::ibv_wc>,
    checked: Instant,
}

/// Raw ibverbs RC transport over one device port.
///
/// `register` maps and registers host memory for local access; `connect` exchanges QP numbers,
/// PSNs, GIDs, MTU and, for each exposed region, address, length and the rkey of a second
/// registration with remote write (regions never exposed have no rkey), then moves the QP
/// INIT → RTR → RTS. `post_writes` chains one `ibv_send_wr` per op (RDMA WRITE, or WRITE WITH
/// IMM) into a single `ibv_post_send`; only ops marked signalled produce completions. Both CQs
/// report to one completion channel (`ibv_req_notify_cq`, re-armed after every event); a thread
/// sleeps on its fd and the out-of-band socket and wakes the waiting tasks, so a wait polls the
/// CQ, spins briefly and then sleeps ([`WaitMode::Adaptive`]) or polls it until the deadline
/// ([`WaitMode::BusyPoll`]). A peer that dies is `PeerGone` at once, before RC retries run out.
///
/// ```no_run
/// use rdma_hint_transport::{BlockingTransport, MemoryKind, PeerEndpoint, Transport};
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
    caps: Capabilities,
    device: DeviceFacts,
    regions: Arc<RwLock<RegionTable<Region>>>,
    lending: Arc<Lending>,
    remote: OnceLock<Vec<Option<ExposedRegion>>>,
    exposed: OnceLock<Vec<u32>>,
    posting: Mutex<Posting>,
    polling: Mutex<Polling>,
    rendezvous: Rendezvous,
    oob: OnceLock<TcpStream>,
    events: Arc<Events>,
    event_thread: Mutex<Option<EventThread>>,
    wait_mode: WaitModeCell,
    gid_index: i32,
    gid: [u8; 16],
    port: u8,
    active_mtu: u8,
    rq_depth: u32,
    qp: *mut ibv::ibv_qp,
    send_cq: *mut ibv::ibv_cq,
    recv_cq: *mut ibv::ibv_cq,
    pd: *mut ibv::ibv_pd,
    // Dropped after the CQs (destroyed in `Drop`), before the context.
    channel: CompletionChannel,
    // Dropped last: everything above was created on it.
    _context: Context,
}

// SAFETY: libibverbs objects may be used from any thread; posting is serialized by `posting`,
// CQ polling and receive re-posting by `polling`, region changes by `regions`' lock. The raw
// handles are destroyed once, in `Drop`.
unsafe impl Send for VerbsTransport {}
// SAFETY: see `Send`.
unsafe impl Sync for VerbsTransport {}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport").field("device", &self.device.name).field("port", &self.port).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Picks the GID to address this port by: `RDMA_HINT_GID_INDEX` if set, else the first
/// IPv4-mapped RoCE v2 entry (what rdma_cm and perftest's `-x` usually pick), else the first
/// IPv4-mapped one, else the first non-zero one.
fn choose_gid(context: &Context, port: u8, table_len: i32) -> Result<(i32, [u8; 16]), TransportError> {
    let query = |index: i32| -> Option<[u8; 16]> {
        // SAFETY: ibv_gid is plain bytes; zero is valid.
        let mut gid: ibv::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: `context` is open, `index` is within the table, `gid` a valid out-pointer.
        let status = unsafe { ibv::ibv_query_gid(context.raw, port, index, &mut gid) };
        // SAFETY: every bit pattern of the union is valid bytes.
        let raw = unsafe { gid.raw };
        (status == 0).then_some(raw)
    };
    if let Some(index) = std::env::var("RDMA_HINT_GID_INDEX").ok().and_then(|v| v.parse::<i32>().ok()) {
        let gid = query(index).ok_or_else(|| unavailable("ibv_query_gid (RDMA_HINT_GID_INDEX)"))?;
        return Ok((index, gid));
    }
    let roce_v2 = |index: i32| {
        std::fs::read_to_string(format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
            context.name
        ))
        .is_ok_and(|kind| kind.trim().eq_ignore_ascii_case("RoCE v2"))
    };
    let ipv4_mapped =
        |gid: &[u8; 16]| gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    let table: Vec<(i32, [u8; 16])> = (0..table_len.clamp(0, 256))
        .filter_map(|i| query(i).map(|g| (i, g)))
        .filter(|(_, g)| g.iter().any(|b| *b != 0))
        .collect();
    table
        .iter()
        .find(|(i, g)| ipv4_mapped(g) && roce_v2(*i))
        .or_else(|| table.iter().find(|(_, g)| ipv4_mapped(g)))
        .or_else(|| table.first())
        .copied()
        .ok_or_else(|| TransportError::Unavailable {
            backend: crate::BACKEND,
            reason: format!(
                "{}: port {port} has no usable GID (is an IP address configured on its netdev?)",
                context.name
            ),
        })
}

fn initial_psn() -> u32 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id().rotate_left(12)) & 0x00ff_ffff
}

rdma_hint_oob::token_setters!(VerbsTransport, "QP number, rkeys");

impl VerbsTransport {
    /// Opens `device` (e.g. `rxe0`, `mlx5_0`; `None`: the first device) on its first active
    /// port: protection domain, send and receive CQs and an RC QP sized from the device caps.
    ///
    /// Without libibverbs or without a device this is [`TransportError::Unavailable`] saying so.
    pub fn open(device: Option<&str>) -> Result<VerbsTransport, TransportError> {
        let context = device::open(device)?;
        let (facts, port_attr) = device::facts(&context)?;
        let port = facts.port;
        let (gid_index, gid) = choose_gid(&context, port, port_attr.gid_tbl_len)?;
        let sq_depth = SQ_DEPTH.min(facts.max_qp_wr);
        let rq_depth = RQ_DEPTH.min(facts.max_qp_wr);
        let events = Arc::new(Events::new()?);
        let channel = CompletionChannel::create(context.raw)?;
        // SAFETY: `context` is open; each object is checked for null and destroyed in `Drop`
        // (or below when a later step fails).
        let pd = unsafe { ibv::ibv_alloc_pd(context.raw) };
        if pd.is_null() {
            return Err(unavailable("ibv_alloc_pd"));
        }
        // SAFETY: as above; both CQs report to `channel`, which outlives them.
        let send_cq =
            unsafe { ibv::ibv_create_cq(context.raw, sq_depth as i32, std::ptr::null_mut(), channel.raw, 0) };
        // SAFETY: as above.
        let recv_cq =
            unsafe { ibv::ibv_create_cq(context.raw, rq_depth as i32, std::ptr::null_mut(), channel.raw, 0) };
        let mut init = ibv::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq,
            recv_cq,
            srq: std::ptr::null_mut(),
            cap: ibv::ibv_qp_cap {
                max_send_wr: sq_depth,
                max_recv_wr: rq_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ibv::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        let armed = !send_cq.is_null() && !recv_cq.is_null() && arm(send_cq).and(arm(recv_cq)).is_ok();
        let qp = if !armed {
            std::ptr::null_mut()
        } else {
            // SAFETY: `pd` and both CQs are live; `init` is valid for the call.
            unsafe { ibv::ibv_create_qp(pd, &mut init) }
        };
        if qp.is_null() {
            let error = unavailable("ibv_create_cq / ibv_req_notify_cq / ibv_create_qp");
            // SAFETY: undo what was created above, each once.
            unsafe {
                if !send_cq.is_null() {
                    ibv::ibv_destroy_cq(send_cq);
                }
                if !recv_cq.is_null() {
                    ibv::ibv_destroy_cq(recv_cq);
                }
                ibv::ibv_dealloc_pd(pd);
            }
            return Err(error);
        }
        let max_wrs_per_post = MAX_WRS_PER_POST.min(sq_depth);
        let caps = Capabilities {
            facts: facts.facts.clone(),
            max_outstanding_wrs: sq_depth,
            max_wrs_per_post,
            max_sges: 1,
            memory_kinds: vec![MemoryKind::Host],
        };
        // SAFETY: ibv_send_wr, ibv_sge and ibv_wc are plain C structs; all-zero is valid.
        let (wrs, sges, wcs) = unsafe {
            (
                (0..max_wrs_per_post).map(|_| std::mem::zeroed()).collect(),
                (0..max_wrs_per_post).map(|_| std::mem::zeroed()).collect(),
                (0..64).map(|_| std::mem::zeroed()).collect(),
            )
        };
        Ok(VerbsTransport {
            caps,
            device: facts,
            regions: Arc::new(RwLock::new(RegionTable::new(MAX_REGIONS))),
            lending: Arc::new(Lending::default()),
            remote: OnceLock::new(),
            exposed: OnceLock::new(),
            posting: Mutex::new(Posting {
                wrs,
                sges,
                in_flight: 0,
                retires: VecDeque::with_capacity(sq_depth as usize),
                since_signal: 0,
            }),
            polling: Mutex::new(Polling { wcs, checked: Instant::now() }),
            rendezvous: Rendezvous::default(),
            oob: OnceLock::new(),
            events,
            event_thread: Mutex::new(None),
            wait_mode: WaitModeCell::default(),
            gid_index,
            gid,
            port,
            active_mtu: port_attr.active_mtu as u8,
            rq_depth,
            qp,
            send_cq,
            recv_cq,
            pd,
            channel,
            _context: context,
        })
    }

    /// What `ibv_query_device` / `ibv_query_port` said about this device.
    pub fn device(&self) -> &DeviceFacts {
        &self.device
    }

    /// The QP's handle and port facts, for its connection steps.
    fn queue_pair(&self) -> QueuePair {
        QueuePair {
            raw: self.qp,
            port: self.port,
            gid_index: self.gid_index,
            active_mtu: self.active_mtu,
            rq_depth: self.rq_depth,
        }
    }

    fn gone(&self) -> TransportError {
        TransportError::PeerGone(
            self.events.broken.get().cloned().unwrap_or_else(|| "the connection is closed".into()),
        )
    }

    fn broken(&self) -> bool {
        self.events.broken.get().is_some()
    }

    /// Looks at the out-of-band socket (at most every millisecond): EOF means the peer process
    /// is gone, whatever the QP still believes.
    fn watch_peer(&self, polling: &mut Polling) {
        if polling.checked.elapsed() < LIVENESS_EVERY || self.broken() {
            return;
        }
        polling.checked = Instant::now();
        if let Some(loss) = self.oob.get().and_then(peer_left) {
            self.events.lost(loss);
        }
    }
}

/// A poll's count as a wait attempt: nothing yet is `None`.
fn ready(found: Result<usize, TransportError>) -> Result<Option<usize>, TransportError> {
    found.map(|n| (n > 0).then_some(n))
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
        self.wait_mode.set(mode);
    }

    fn wait_mode(&self) -> WaitMode {
        self.wait_mode.get()
    }

    fn register(&self, kind: MemoryKind, len: u64) -> Result<LocalRegion, TransportError> {
        if kind != MemoryKind::Host {
            // GPU memory would go through ibv_reg_dmabuf_mr; not implemented (no NIC here to test it on).
            return Err(TransportError::UnsupportedMemory { kind });
        }
        let mut table = self.regions.write().unwrap_or_else(PoisonError::into_inner);
        let id = table.insert_with(len, || Region::register(self.pd, len))?;
        Ok(LocalRegion { id, kind, len })
    }

    fn deregister(&self, region: RegionId) -> Result<(), TransportError> {
        if self.exposed.get().is_some_and(|e| e.contains(&region.0)) && !self.broken() {
            return Err(TransportError::RegionBusy {
                region,
                why: "exposed to the connected peer; drop the transport to release it",
            });
        }
        // The table's write lock first: no post can start (posts hold its read lock, then the
        // posting lock) between the in-flight check and the removal.
        let mut table = self.regions.write().unwrap_or_else(PoisonError::into_inner);
        if lock(&self.posting).in_flight > 0 {
            return Err(TransportError::RegionBusy {
                region,
                why: "writes are in flight; wait for their completions first",
            });
        }
        table.remove(region).map(drop)
    }

    fn write_region(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        self.regions.read().unwrap_or_else(PoisonError::into_inner).get(region)?.copy_in(offset, data)
    }

    fn read_region(&self, region: RegionId, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        self.regions.read().unwrap_or_else(PoisonError::into_inner).get(region)?.copy_out(offset, out)
    }

    async fn connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        if self.remote.get().is_some() {
            return Err(TransportError::AlreadyConnected);
        }
        if expose.len() > MAX_REGIONS {
            return Err(TransportError::Handshake(format!("at most {MAX_REGIONS} regions can be exposed")));
        }
        let setup = Setup {
            queue_pair: self.queue_pair(),
            pd: self.pd,
            regions: self.regions.clone(),
            expose: expose.to_vec(),
            gid: self.gid,
            events: self.events.clone(),
            watched: Watched { channel: self.channel.raw, send_cq: self.send_cq, recv_cq: self.recv_cq },
            lending: self.lending.clone(),
        };
        // Memory registration, the QP's transitions and the event thread's start run on the
        // rendezvous thread with the exchange: on Soft-RoCE each is a slow kernel call, and
        // none may hold the awaiting task's thread. The lent handles outlive it (see `Drop`).
        let lent = self.lending.lend(setup);
        let hello = move || {
            let (ours, psn) = lent.value.hello()?;
            Ok((ours.encode(), move |stream: &mut TcpStream, theirs: Hello| {
                lent.value.finish(stream, theirs, psn)
            }))
        };
        let decode = |mut stream: &mut dyn std::io::Read| Hello::decode(&mut stream);
        let (_, (theirs, thread, stream)) = self.rendezvous.meet(peer, deadline, hello, decode).await?;
        *lock(&self.event_thread) = Some(thread);
        let _ = self.oob.set(stream);
        let mut remote: Vec<Option<ExposedRegion>> = Vec::new();
        for region in &theirs.regions {
            let index = region.id as usize;
            if remote.len() <= index {
                remote.resize(index + 1, None);
            }
            remote[index] = Some(*region);
        }
        let _ = self.exposed.set(expose.iter().map(|id| id.0).collect());
        let _ = self.remote.set(remote);
        Ok(theirs.regions.iter().map(|r| RemoteRegion { id: RegionId(r.id), len: r.len }).collect())
    }

    fn post_writes(&self, ops: &[WriteOp]) -> Result<(), TransportError> {
        let remote = self.remote.get().ok_or(TransportError::NotConnected)?;
        if self.broken() {
            return Err(self.gone());
        }
        if ops.len() > self.caps.max_wrs_per_post as usize {
            return Err(TransportError::QueueFull {
                given: ops.len() as u32,
                max: self.caps.max_wrs_per_post,
            });
        }
        if ops.is_empty() {
            return Ok(());
        }
        let table = self.regions.read().unwrap_or_else(PoisonError::into_inner);
        let mut posting = lock(&self.posting);
        let room = self.caps.max_outstanding_wrs as usize - posting.in_flight;
        if ops.len() > room {
            return Err(TransportError::QueueFull { given: ops.len() as u32, max: room as u32 });
        }
        let Posting { wrs, sges, .. } = &mut *posting;
        for (index, op) in ops.iter().enumerate() {
            let target = remote.get(op.remote.0 as usize).and_then(Option::as_ref);
            let (local, target) = table.check_write(op, target, self.caps.facts.max_msg_bytes)?;
            sges[index] = ibv::ibv_sge {
                addr: local.address(op.local_offset),
                length: op.len as u32,
                lkey: local.lkey(),
            };
            let wr = &mut wrs[index];
            wr.wr_id = op.wr_id;
            wr.num_sge = 1;
            wr.opcode = if op.imm.is_some() {
                ibv::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                ibv::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            };
            wr.send_flags = if op.signalled { ibv::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
            wr.imm_data_invalidated_rkey_union.imm_data = op.imm.unwrap_or(0).to_be();
            wr.wr.rdma = ibv::rdma_t { remote_addr: target.address + op.remote_offset, rkey: target.rkey };
        }
        // Chain after filling: the vectors do not move while the lock is held.
        let count = ops.len();
        for index in 0..count {
            wrs[index].sg_list = &mut sges[index];
            wrs[index].next = if index + 1 < count { &mut wrs[index + 1] } else { std::ptr::null_mut() };
        }
        let mut bad: *mut ibv::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `qp` is live; the chain of `count` WRs and their SGEs lives in `posting`,
        // locked for the call; every SGE lies inside a registered region (checked above).
        let code = unsafe { ibv::ibv_post_send(self.qp, &mut wrs[0], &mut bad) };
        if code != 0 {
            return Err(match code {
                libc::ENOMEM => TransportError::QueueFull { given: count as u32, max: room as u32 },
                _ => TransportError::Io(std::io::Error::from_raw_os_error(code)),
            });
        }
        posting.in_flight += count;
        for op in ops {
            posting.since_signal += 1;
            if op.signalled {
                let retired = posting.since_signal;
                posting.retires.push_back(retired);
                posting.since_signal = 0;
            }
        }
        Ok(())
    }

    fn poll_completions(&self, out: &mut [Completion]) -> Result<usize, TransportError> {
        let mut polling = lock(&self.polling);
        let want = out.len().min(polling.wcs.len()) as i32;
        // SAFETY: `send_cq` is live; `wcs` holds at least `want` entries.
        let found = unsafe { ibv::ibv_poll_cq(self.send_cq, want, polling.wcs.as_mut_ptr()) };
        if found < 0 {
            return Err(unavailable("ibv_poll_cq"));
        }
        let found = found as usize;
        if found > 0 {
            let mut posting = lock(&self.posting);
            for (slot, wc) in out.iter_mut().zip(&polling.wcs[..found]) {
                let status = if wc.status == ibv::ibv_wc_status::IBV_WC_SUCCESS {
                    CompletionStatus::Success
                } else {
                    self.events
                        .fail(format!("work request {} failed with ibv_wc_status {}", wc.wr_id, wc.status));
                    CompletionStatus::Failed { code: wc.status }
                };
                *slot = Completion { wr_id: wc.wr_id, status };
                let retired = posting.retires.pop_front().unwrap_or(1);
                posting.in_flight = posting.in_flight.saturating_sub(retired);
            }
            return Ok(found);
        }
        self.watch_peer(&mut polling);
        if self.broken() {
            return Err(self.gone());
        }
        Ok(0)
    }

    async fn wait_completions(
        &self,
        out: &mut [Completion],
        deadline: Instant,
    ) -> Result<usize, TransportError> {
        if out.is_empty() {
            return Ok(0);
        }
        let mode = self.wait_mode.get();
        wait(&self.events.completions, mode, deadline, "verbs completions", || {
            ready(self.poll_completions(out))
        })
        .await
    }

    fn poll_arrivals(&self, out: &mut [Arrival]) -> Result<usize, TransportError> {
        let mut polling = lock(&self.polling);
        let want = out.len().min(polling.wcs.len()) as i32;
        // SAFETY: `recv_cq` is live; `wcs` holds at least `want` entries.
        let found = unsafe { ibv::ibv_poll_cq(self.recv_cq, want, polling.wcs.as_mut_ptr()) };
        if found < 0 {
            return Err(unavailable("ibv_poll_cq"));
        }
        let region = match self.exposed.get().map(Vec::as_slice) {
            Some([only]) => RegionId(*only),
            _ => UNKNOWN_REGION,
        };
        let mut ready = 0;
        for index in 0..found as usize {
            let wc = polling.wcs[index];
            if wc.status != ibv::ibv_wc_status::IBV_WC_SUCCESS {
                self.events.fail(format!("receive failed with ibv_wc_status {}", wc.status));
                continue;
            }
            // SAFETY: the union holds the immediate for RECV_RDMA_WITH_IMM completions.
            let imm = u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
            out[ready] = Arrival { imm, region, len: u64::from(wc.byte_len) };
            ready += 1;
            self.queue_pair().post_receive()?;
        }
        if ready == 0 {
            self.watch_peer(&mut polling);
            if self.broken() {
                return Err(self.gone());
            }
        }
        Ok(ready)
    }

    async fn wait_arrivals(&self, out: &mut [Arrival], deadline: Instant) -> Result<usize, TransportError> {
        if out.is_empty() {
            return Ok(0);
        }
        let mode = self.wait_mode.get();
        wait(&self.events.arrivals, mode, deadline, "verbs arrivals", || ready(self.poll_arrivals(out))).await
    }
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        if let Some(stream) = self.oob.get() {
            say_goodbye(stream);
        }
        // The event thread touches the channel and CQs: it stops before they go.
        if let Some(mut thread) = lock(&self.event_thread).take() {
            thread.stop();
        }
        // A connect whose future was dropped may still run on its rendezvous thread with the
        // QP, PD and channel, or have left its event thread running: they stay until both are
        // done (bounded by the connect's deadline). Dropping such a transport from async code
        // blocks that long.
        self.lending.wait_returned();
        // SAFETY: each object is destroyed once, QP before its CQs, MRs (regions) before the
        // PD; every CQ event taken was acknowledged; the channel and then the context close
        // afterwards as the last fields.
        unsafe {
            ibv::ibv_destroy_qp(self.qp);
            ibv::ibv_destroy_cq(self.send_cq);
            ibv::ibv_destroy_cq(self.recv_cq);
        }
        self.regions.write().unwrap_or_else(PoisonError::into_inner).drain().for_each(drop);
        // SAFETY: no MR or QP refers to the PD any more.
        unsafe { ibv::ibv_dealloc_pd(self.pd) };
    }
}

/// What a connect's rendezvous thread needs: copies of the verbs handles (lent, see
/// [`Lending`]) and the shared state.
struct Setup {
    queue_pair: QueuePair,
    pd: *mut ibv::ibv_pd,
    regions: Arc<RwLock<RegionTable<Region>>>,
    expose: Vec<RegionId>,
    gid: [u8; 16],
    events: Arc<Events>,
    watched: Watched,
    lending: Arc<Lending>,
}

// SAFETY: the raw handles are libibverbs objects usable from any thread; they are destroyed
// only in `VerbsTransport::drop`, which first waits until the `Lent` holding this is returned.
unsafe impl Send for Setup {}

impl Setup {
    /// Exposes the regions (a second MR with remote write each; no peer can use one before it
    /// has the rkey, sent only after authentication) and builds this side's hello, with the
    /// starting PSN it carries.
    fn hello(&self) -> Result<(Hello, u32), TransportError> {
        let mut regions = Vec::with_capacity(self.expose.len());
        {
            let mut table = self.regions.write().unwrap_or_else(PoisonError::into_inner);
            for id in &self.expose {
                let region = table.get_mut(*id)?;
                let rkey = region.expose(self.pd)?;
                regions.push(ExposedRegion { id: id.0, address: region.address(0), len: region.len(), rkey });
            }
        }
        let psn = initial_psn();
        // SAFETY: the QP is live (lent); qp_num is a plain field.
        let qpn = unsafe { (*self.queue_pair.raw).qp_num };
        let lid = 0; // RoCE: addressing is by GID.
        Ok((Hello { lid, qpn, psn, gid: self.gid, mtu: self.queue_pair.active_mtu, regions }, psn))
    }

    /// After the hellos: brings the QP to RTS, confirms, and starts the event thread. Returns
    /// the peer's hello, the thread and the out-of-band socket (non-blocking) to keep.
    fn finish(
        &self,
        stream: &mut TcpStream,
        theirs: Hello,
        psn: u32,
    ) -> Result<(Hello, EventThread, TcpStream), TransportError> {
        self.queue_pair.bring_up(&theirs, psn)?;
        confirm(stream, READY)?;
        let oob = stream.try_clone()?;
        oob.set_nonblocking(true)?;
        let thread =
            EventThread::start(self.events.clone(), self.watched, oob.try_clone()?, self.lending.lend(()))?;
        Ok((theirs, thread, oob))
    }
}
