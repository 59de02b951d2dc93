//! `UcxTransport`: the `Transport` implementation.

use crate::domain::UcxDomain;
use crate::engine::{Direction, Engine, RemoteEntry};
use crate::mapping::{map_peer, Screen};
use crate::notices::{on_endpoint_error, on_notice, on_wake, Direct, NoticeRing, Signals};
use crate::perf::{self, capabilities, tcp_only, Estimate};
use crate::progress::{self, OwnMemory, Shared};
use crate::wire::{screen_worker_address, ExposedRing, Hello, LIMITS, READY, RING_BYTES};
use crate::worker::{detects_peer_failure, Ucp, NOTICE_AM_ID, WAKE_AM_ID};
use async_trait::async_trait;
use rdma_hint_backend_core::gather::{gathered, Pieces};
use rdma_hint_backend_core::peer_regions::PeerRegions;
use rdma_hint_backend_core::queue::{event_queue, EventQueue};
use rdma_hint_backend_core::wait::{wait, WaitModeCell};
use rdma_hint_core::TransportId;
use rdma_hint_core::{
    Arrival, Capabilities, Completion, Domain, GatherEntry, GatherOp, PeerEndpoint, ReadOp, RegionId,
    RemoteRegion, Transport, TransportError, WaitMode, WriteOp, MAX_OPS_PER_POST,
};
use rdma_hint_oob::{confirm, ControlChannel, RegionDescriptor, Rendezvous};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

/// Signalled writes (and notices, and batches) that may be in flight at once.
const MAX_OUTSTANDING: usize = 1024;

/// UCX UCP transport: one context and worker per instance, one endpoint to one peer.
///
/// Writes are `ucp_put_nbx` calls (one per [`WriteOp`], with the source's memory handle so
/// UCX skips the registration lookup) and one `ucp_ep_flush_nbx` per posted batch; a signalled
/// op completes when its batch's flush completes, i.e. when its bytes are in the peer's memory.
/// Writes with immediate data are followed by a 16-byte active message the peer turns into an
/// [`Arrival`]. Where UCX maps all of the peer's exposed memory and its notice ring into this
/// process (shared memory), a write is instead a copy into that mapping, its notice a slot on
/// the ring ([`crate::ring`]), and a signalled write completes as its copy ends. A progress thread drives UCX while work is in flight and sleeps on the
/// worker's event fd when idle; what it harvests wakes the waiting tasks. Waits drive progress
/// themselves while they spin ([`WaitMode`]) and never block the calling thread.
///
/// The transports UCX may use are the scope given to [`UcxTransport::open`] (`UCX_TLS`
/// syntax), or `UCX_TLS` from the environment when none is given.
///
/// ```no_run
/// use rdma_hint_core::{MemoryKind, PeerEndpoint, Transport};
/// use rdma_hint_backend_core::BlockingTransport;
/// use rdma_hint_ucx::UcxTransport;
/// use std::time::{Duration, Instant};
///
/// let transport = UcxTransport::open(Some("tcp,self")).unwrap();
/// let region = transport.register(MemoryKind::Host, 1 << 20).unwrap();
/// let deadline = Instant::now() + Duration::from_secs(10);
/// let peer = PeerEndpoint::Dial("10.0.0.2:7000".parse().unwrap());
/// let remote = transport.connect_blocking(peer, &[region.id], deadline).unwrap();
/// ```
#[derive(Debug)]
pub struct UcxTransport {
    caps: Capabilities,
    estimate: Estimate,
    pub(crate) shared: Arc<Shared>,
    pub(crate) signals: Arc<Signals>,
    pub(crate) wait_mode: WaitModeCell,
    rendezvous: Rendezvous,
    progress: Mutex<Option<JoinHandle<()>>>,
    connected_lanes: Mutex<Option<String>>,
    pub(crate) domain: Arc<UcxDomain>,
}

rdma_hint_oob::token_setters!(UcxTransport, "worker address, rkeys");

impl UcxTransport {
    /// Posts plain or gather writes (see [`Engine::post`](crate::engine::Engine::post)).
    fn post(&self, ops: &[impl Pieces]) -> Result<(), TransportError> {
        self.post_as(ops, Direction::Write)
    }

    /// Posts `ops` as writes, or (`Direction::Read`) as reads of their ranges: `local` the
    /// destination, `remote` the peer's source.
    fn post_as(&self, ops: &[impl Pieces], direction: Direction) -> Result<(), TransportError> {
        self.caps.check_post(ops.len())?;
        let mut engine = self.shared.engine();
        if !engine.is_connected() {
            return Err(TransportError::NotConnected);
        }
        if let Some(why) = engine.gone() {
            return Err(TransportError::PeerGone(why.to_string()));
        }
        let table = self.domain.core.regions();
        // A full notice ring on the peer answers `QueueFull` at once (nothing moved): the
        // caller tries again later (the engine backs off), as a NIC retries a receiver not
        // ready, and no post waits for the peer.
        let copied = engine.post(
            ops,
            direction,
            &table,
            self.caps.facts.max_msg_bytes,
            self.shared.completions.len(),
        )?;
        if copied > 0 {
            self.domain.core.copies().in_transit(copied);
        }
        if engine.busy() {
            self.shared.wake();
        }
        Ok(())
    }

    /// Opens a UCP context and worker restricted to `tls` (`UCX_TLS` syntax, e.g. `shm,self`
    /// or `tcp`; `None` lets UCX read `UCX_TLS` from the environment) and asks UCX for its
    /// performance estimate of that scope.
    ///
    /// Fails with [`TransportError::Unavailable`] when UCX refuses the scope or none of its
    /// transports can reach a peer on this host.
    pub fn open(tls: Option<&str>) -> Result<UcxTransport, TransportError> {
        let env_tls = std::env::var("UCX_TLS").ok();
        let scope = tls.or(env_tls.as_deref());
        let ucp = Ucp::open(tls, detects_peer_failure(scope))?;
        let estimate = perf::self_estimate(&ucp)?;
        let id = TransportId::ucx_for_tls(scope)
            .map_err(|e| TransportError::InvalidArgument { what: "UCX_TLS", why: e.to_string() })?;
        let caps = capabilities(id, &estimate, MAX_OUTSTANDING as u32);
        let domain = Arc::new(UcxDomain::new(ucp.context.clone(), !tcp_only(&caps.facts.id), &caps));
        let transport = UcxTransport::lane(ucp, caps, estimate, domain, Rendezvous::default())?;
        tracing::debug!(id = %transport.caps.facts.id, lanes = %transport.estimate.lanes, "ucx: opened");
        Ok(transport)
    }

    /// Another lane of the same connection: a worker of the same UCX context (its own
    /// endpoint, progress thread and queues) over the same regions, with the same token and
    /// wait mode, to connect to the same peer's lane. An engine stripes one transfer's blocks
    /// over such lanes; on `tcp` each lane is a socket of its own. A region registered or
    /// released on one lane is registered or released on all; it stays busy while a put of
    /// any lane may read it or the peer of any lane may write it.
    ///
    /// ```no_run
    /// use rdma_hint_core::{MemoryKind, Transport};
    /// use rdma_hint_ucx::UcxTransport;
    /// let first = UcxTransport::open(Some("tcp,self")).unwrap();
    /// let region = first.register(MemoryKind::Host, 4096).unwrap();
    /// first.write_region(region.id, 0, b"one memory").unwrap();
    /// let second = first.open_lane().unwrap();
    /// let mut seen = [0u8; 10];
    /// second.read_region(region.id, 0, &mut seen).unwrap();
    /// assert_eq!(&seen, b"one memory");
    /// ```
    pub fn open_lane(&self) -> Result<UcxTransport, TransportError> {
        let ucp = self.shared.engine().ucp.another()?;
        let lane = UcxTransport::lane(
            ucp,
            self.caps.clone(),
            self.estimate.clone(),
            self.domain.clone(),
            self.rendezvous.for_lane(),
        )?;
        lane.set_wait_mode(self.wait_mode.get());
        Ok(lane)
    }

    /// A transport over `ucp`'s worker in `domain`, not connected.
    fn lane(
        ucp: Ucp,
        caps: Capabilities,
        estimate: Estimate,
        domain: Arc<UcxDomain>,
        rendezvous: Rendezvous,
    ) -> Result<UcxTransport, TransportError> {
        let (completion_tx, completions) = event_queue(MAX_OUTSTANDING);
        let (arrival_tx, arrivals) = event_queue(MAX_OUTSTANDING * 4);
        let signals = Arc::new(Signals::default());
        *signals.arrivals.lock().unwrap_or_else(PoisonError::into_inner) = Some(arrival_tx);
        let signals_arg = Arc::as_ptr(&signals).cast_mut().cast();
        ucp.set_am_handler(NOTICE_AM_ID, Some(on_notice), signals_arg)?;
        ucp.set_am_handler(WAKE_AM_ID, Some(on_wake), signals_arg)?;
        let engine = Engine::new(ucp, completion_tx, MAX_OUTSTANDING, signals.clone());
        let shared = Arc::new(Shared::new(engine, completions, arrivals));
        let own = Arc::downgrade(&domain);
        let _ = shared
            .own_memory
            .set(OwnMemory(Box::new(move || own.upgrade().map(|d| d.memory()).unwrap_or_default())));
        domain.core.lanes().join(&shared);
        Ok(UcxTransport {
            caps,
            estimate,
            shared,
            signals,
            wait_mode: WaitModeCell::default(),
            rendezvous,
            progress: Mutex::new(None),
            connected_lanes: Mutex::new(None),
            domain,
        })
    }

    /// UCX's estimate for this scope (loopback endpoint, before any peer).
    pub fn estimate(&self) -> &Estimate {
        &self.estimate
    }

    /// The lanes UCX selected for the endpoint to the peer, once connected.
    pub fn connected_lanes(&self) -> Option<String> {
        self.connected_lanes.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Waits for the first item of `queue` until `deadline`: drains it, drives progress when
    /// the progress thread is not already doing so, and sleeps on the queue's notifier
    /// ([`WaitMode`]). A peer that goes away is [`TransportError::PeerGone`] at once, not at the
    /// deadline.
    /// `look` takes what else may be ready before UCX is driven (the notice ring).
    async fn wait_on<T>(
        &self,
        queue: &EventQueue<T>,
        out: &mut [T],
        deadline: Instant,
        what: &'static str,
        look: impl Fn(&mut [T]) -> Result<usize, TransportError>,
    ) -> Result<usize, TransportError> {
        if out.is_empty() {
            return Ok(0);
        }
        wait(queue.notifier(), self.wait_mode.get(), deadline, what, || {
            let ready = queue.try_drain(out).unwrap_or(0);
            if ready > 0 {
                return Ok(Some(ready));
            }
            let ready = look(out)?;
            if ready > 0 {
                return Ok(Some(ready));
            }
            // The progress thread may hold the engine; then it is making progress for us.
            if let Some(mut engine) = self.shared.try_engine() {
                engine.progress_once();
            }
            // Read before the drain: once it is set, everything the connection will ever
            // deliver is queued (see `Signals::all_queued`).
            let gone = self.signals.all_queued.load(Ordering::Acquire);
            match queue.try_drain(out) {
                Ok(0) if gone => Err(self.gone_error()),
                Ok(0) => Ok(None),
                Ok(ready) => Ok(Some(ready)),
                Err(_) => Err(self.gone_error()),
            }
        })
        .await
    }

    /// What is in `queue` now, after one pass of progress unless another thread is driving
    /// UCX (see `Shared::try_engine`): a poll never waits behind another thread's put.
    fn poll_on<T>(&self, queue: &EventQueue<T>, out: &mut [T]) -> Result<usize, TransportError> {
        let ready = queue.try_drain(out).unwrap_or(0);
        if ready > 0 {
            return Ok(ready);
        }
        if let Some(mut engine) = self.shared.try_engine() {
            engine.progress();
        }
        // Read before the drain: once it is set, everything is queued (`Signals::all_queued`).
        let gone = self.signals.all_queued.load(Ordering::Acquire);
        let ready = queue.try_drain(out).unwrap_or(0);
        if ready == 0 && gone {
            return Err(self.gone_error());
        }
        Ok(ready)
    }

    /// The lane's engine when UCX does not lock the context's own calls (a memory map, an
    /// rkey pack): holding it keeps the lane's worker from progressing beside them. With
    /// locking, `None`: lanes register while others progress.
    fn serialise_context_calls(&self) -> Option<std::sync::MutexGuard<'_, Engine>> {
        (!self.domain.thread_safe()).then(|| self.shared.engine())
    }

    /// Takes the notices on this side's ring (see [`crate::ring`]), or older ones the progress
    /// thread queued meanwhile, into `out`; a broken ring ends the connection.
    fn take_ring(&self, out: &mut [Arrival]) -> Result<usize, TransportError> {
        let queued = |out: &mut [Arrival]| self.shared.arrivals.try_drain(out).unwrap_or(0);
        self.signals.take_ring(out, queued).map_err(|why| {
            self.shared.engine().fail(why.clone());
            TransportError::PeerGone(why)
        })
    }

    /// This side's notice ring for a connect that exposes `expose`: offered where the peer
    /// may reach this side's memory directly (not over TCP alone) and has regions to write.
    fn notice_ring(&self, expose: &[RegionId]) -> Result<Option<ExposedRing>, TransportError> {
        if expose.is_empty() || tcp_only(&self.caps.facts.id) {
            return Ok(None);
        }
        if self.signals.ring.get().is_none() {
            let _serial = self.serialise_context_calls();
            if let Some(ring) = NoticeRing::new(self.domain.context_arc())? {
                let _ = self.signals.ring.set(Arc::new(ring));
            }
        }
        Ok(self.signals.ring.get().map(|ring| ring.exposed()))
    }

    fn gone_error(&self) -> TransportError {
        self.signals.gone.error()
    }

    /// This side's hello: the worker address and the exposed regions with packed rkeys.
    fn hello(&self, expose: &[RegionId]) -> Result<Hello, TransportError> {
        let worker_address = self.shared.engine().ucp.address()?;
        let mut regions = Vec::with_capacity(expose.len());
        {
            let table = self.domain.core.regions();
            for id in expose {
                let region = table.get(*id)?;
                let (address, len, key) = (region.address(0), region.len(), region.packed_rkey.clone());
                regions.push(RegionDescriptor { id: id.0, len, address, flags: 0, key });
            }
        }
        let ring = self.notice_ring(expose)?;
        Ok(Hello { worker_address, regions, ring })
    }
}

impl UcxTransport {
    /// `connect` after the checks: the hello, the handshake, the endpoint and progress thread.
    async fn finish_connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        let ours = self.hello(expose)?;
        let our_address = ours.worker_address.clone();
        let (shared, signals, exposed) = (self.shared.clone(), self.signals.clone(), expose.to_vec());
        let domain = self.domain.clone();
        // The whole set-up (endpoint creation, rkey unpacking, the ready exchange, the progress
        // thread) runs on the rendezvous thread, not on the awaiting task's.
        let connected = move |stream: &mut std::net::TcpStream, hello: Hello| {
            let lanes = attach(&shared, &domain, &signals, &hello, &exposed)?;
            if let Err(why) = confirm(stream, READY) {
                shared.engine().fail(why.to_string());
                return Err(why);
            }
            // Both sides are past the confirmation and progress their workers in this flush,
            // so the wire-up completes now rather than behind a later failure.
            // A peer that leaves right after its own flush fails ours: that is for the first
            // operation to report (as `PeerGone`), not the handshake that succeeded.
            let wired = shared.engine().complete_wireup();
            if let Err(e) = wired {
                tracing::debug!(error = %e, "ucx: the wire-up flush failed; the peer may have left");
            }
            let control = Arc::new(ControlChannel::new(stream.try_clone()?, LIMITS)?);
            shared.engine().watch(control.clone());
            let _ = shared.control.set(control);
            let progress_shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name("rdma-hint-ucx-progress".into())
                .spawn(move || progress::run(progress_shared))?;
            Ok((hello, lanes, handle))
        };
        let (_, (hello, lanes, handle)) = self
            .rendezvous
            .meet(
                peer,
                deadline,
                move || Ok((ours.encode(), connected)),
                move |mut stream: &mut dyn std::io::Read| {
                    // A listener drops a candidate whose address fails the screen and keeps
                    // listening; the screen runs again right before `ucp_ep_create`.
                    let theirs = Hello::decode(&mut stream)?;
                    screen_worker_address(&theirs.worker_address, &our_address)?;
                    Ok(theirs)
                },
            )
            .await?;
        *self.connected_lanes.lock().unwrap_or_else(PoisonError::into_inner) = Some(lanes);
        *self.progress.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
        Ok(hello.regions.iter().map(|r| RemoteRegion { id: RegionId(r.id), len: r.len }).collect())
    }
}

#[async_trait]
impl Transport for UcxTransport {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        self.rendezvous.bind(address)
    }

    fn set_wait_mode(&self, mode: WaitMode) {
        self.wait_mode.set(mode);
        self.shared.busy_poll.store(mode == WaitMode::BusyPoll, Ordering::Relaxed);
        self.shared.wake();
    }

    fn wait_mode(&self) -> WaitMode {
        self.wait_mode.get()
    }

    fn domain(&self) -> &dyn Domain {
        &self.domain.core
    }

    async fn connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        if self.shared.engine().is_connected() {
            return Err(TransportError::AlreadyConnected);
        }
        if !self.rendezvous.has_token() {
            return Err(TransportError::InvalidArgument {
                what: "token",
                why: "the UCX backend hands the peer's worker address to UCX, whose parser trusts it: set a token (OpenOptions::token through the facade, UcxTransport::with_token here; the CLI's --token-file or $RDMA_HINT_TOKEN) so only an authenticated peer can send one".into(),
            });
        }
        self.shared.exposure.around_connect(expose, self.finish_connect(peer, expose, deadline)).await
    }

    async fn expose(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        self.expose_region(region, deadline).await
    }

    async fn withdraw(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        self.withdraw_region(region, deadline).await
    }

    fn peer_regions(&self) -> Vec<RemoteRegion> {
        self.shared.engine().remote.list()
    }

    fn post_writes(&self, ops: &[WriteOp]) -> Result<(), TransportError> {
        self.post(ops)
    }

    fn post_reads(&self, ops: &[ReadOp]) -> Result<(), TransportError> {
        let mut ranges = [WriteOp::EMPTY; MAX_OPS_PER_POST];
        self.post_as(ReadOp::ranges_of(ops, &mut ranges)?, Direction::Read)
    }

    fn post_gather_writes(&self, ops: &[GatherOp], entries: &[GatherEntry]) -> Result<(), TransportError> {
        gathered(ops, entries, &self.caps, |views| self.post(views))
    }

    fn poll_completions(&self, out: &mut [Completion]) -> Result<usize, TransportError> {
        self.poll_on(&self.shared.completions, out)
    }

    async fn wait_completions(
        &self,
        out: &mut [Completion],
        deadline: Instant,
    ) -> Result<usize, TransportError> {
        self.wait_on(&self.shared.completions, out, deadline, "ucx completions", |_| Ok(0)).await
    }

    fn poll_arrivals(&self, out: &mut [Arrival]) -> Result<usize, TransportError> {
        // Queued arrivals are older than what is on the ring.
        let ready = self.shared.arrivals.try_drain(out).unwrap_or(0);
        if ready > 0 {
            return Ok(ready);
        }
        let ready = self.take_ring(out)?;
        if ready > 0 {
            return Ok(ready);
        }
        self.poll_on(&self.shared.arrivals, out)
    }

    async fn wait_arrivals(&self, out: &mut [Arrival], deadline: Instant) -> Result<usize, TransportError> {
        self.wait_on(&self.shared.arrivals, out, deadline, "ucx arrivals", |out| self.take_ring(out)).await
    }
}

impl Drop for UcxTransport {
    fn drop(&mut self) {
        // The other lanes (and the domain's drop) keep guarding what this one exposed until its
        // peer has stopped.
        self.domain.leave(&self.shared, self.signals.ring.get().cloned());
        // Everything sent reaches the peer first, then the goodbye that says it ends here: a
        // goodbye promises the peer that nothing of ours lands any more. A flush that does not
        // finish closes the endpoint by force instead (its puts end), and the peer reads a
        // failure. A peer's goodbye is answered the same way.
        if let Some(control) = self.shared.control.get() {
            // A vanished peer gets nothing, and is not closed by force here: UCX 1.13 can crash
            // closing a TCP endpoint by force while its last bytes are still coming in; the
            // close below takes them in first.
            let goodbye = control.peer_left().is_none_or(|loss| loss.clean);
            let mut engine = self.shared.engine();
            if goodbye && engine.drain() {
                control.say_goodbye();
            } else if goodbye {
                engine.fail("the final flush did not finish in time".into());
            }
        }
        self.shared.stop.store(true, Ordering::Release);
        if let Some(handle) = self.progress.lock().unwrap_or_else(PoisonError::into_inner).take() {
            self.shared.wake();
            handle.thread().unpark();
            let _ = handle.join();
        }
        self.shared.engine().shutdown();
        // Whatever the progress thread saw or missed before it stopped, the peer now reads this
        // side's end (after any goodbye) even while a closed lane keeps the socket open.
        if let Some(stream) = self.shared.control.get().and_then(|control| control.stream()) {
            let _ = stream.shutdown(std::net::Shutdown::Write);
        }
    }
}

/// Creates the endpoint and unpacks every rkey; on any failure nothing stays attached.
fn attach(
    shared: &Shared,
    domain: &UcxDomain,
    signals: &Arc<Signals>,
    hello: &Hello,
    expose: &[RegionId],
) -> Result<String, TransportError> {
    let mut engine = shared.engine();
    let signals_arg = Arc::as_ptr(signals).cast_mut().cast();
    let ep = engine.ucp.connect(&hello.worker_address, Some(on_endpoint_error), signals_arg)?;
    let table = domain.core.regions();
    // What was mapped before any of the peer's keys is unpacked: a range the peer may have
    // written directly must lie in a mapping its keys made.
    let screen = (hello.ring.is_some())
        .then(|| {
            let mut own: Vec<(u64, u64)> =
                table.iter().map(|(_, region)| (region.address(0), region.len())).collect();
            own.extend(signals.ring.get().map(|ring| ring.range()));
            Screen::before_unpacking(&own)
        })
        .transpose();
    let mut remote: Vec<(u32, RemoteEntry)> = Vec::with_capacity(hello.regions.len());
    let unpacked = screen.and_then(|screen| {
        for region in &hello.regions {
            let rkey = Engine::unpack_rkey(ep, &region.key)?;
            remote.push((
                region.id,
                RemoteEntry { address: region.address, len: region.len, rkey, mapped: None },
            ));
        }
        match (&screen, &hello.ring) {
            (Some(screen), Some(ring)) => map_directly(ep, ring, &mut remote, screen),
            _ => Ok(None),
        }
    });
    let remote = PeerRegions::from_hello(remote);
    let direct = match unpacked {
        Ok(direct) => direct,
        Err(e) => {
            engine.attach(ep, remote, None);
            engine.fail(format!("handshake rejected: {e}"));
            return Err(e);
        }
    };
    let lanes = perf::lanes(ep);
    let lanes = if direct.is_some() {
        format!("{lanes}; writes: copies into the peer's mapped memory")
    } else {
        lanes
    };
    engine.attach(ep, remote, direct);
    for id in expose {
        if let Ok(region) = table.get(*id) {
            signals.exposed.set(*id, region.len());
        }
    }
    Ok(lanes)
}

/// The peer's ring and every region it exposed, mapped here by UCX and screened (see
/// [`crate::mapping`]), each region's mapping kept in its entry; `None` unless all of them may
/// be written directly (the writes then go through UCX, and no entry keeps a mapping). A range
/// a lying peer advertised is a handshake error.
fn map_directly(
    ep: rdma_hint_ucx_sys::ucp_ep_h,
    ring: &ExposedRing,
    remote: &mut [(u32, RemoteEntry)],
    screen: &Screen,
) -> Result<Option<Direct>, TransportError> {
    if remote.is_empty() {
        return Ok(None);
    }
    let ring_rkey = Engine::unpack_rkey(ep, &ring.rkey)?;
    let mapped = (|| {
        let Some(ring_at) = map_peer(ring_rkey, ring.address, "the peer's notice ring") else {
            return Ok(None);
        };
        for (_, entry) in remote.iter_mut() {
            entry.mapped = map_peer(entry.rkey, entry.address, "a region of the peer");
            if entry.mapped.is_none() {
                return Ok(None);
            }
        }
        // Every attachment is made by now: what is new since the screen's first look is the
        // peer's.
        let after = screen.after_unpacking()?;
        let mut direct = after.check(ring_at, RING_BYTES, "the peer's notice ring")?
            && (ring_at as usize).is_multiple_of(64);
        for (_, entry) in remote.iter() {
            if let Some(at) = entry.mapped {
                direct &= after.check(at, entry.len, "a region of the peer")?;
            }
        }
        Ok(direct.then_some(ring_at))
    })();
    match mapped {
        Ok(Some(ring_at)) => Ok(Some(Direct::new(ring_at, ring_rkey))),
        other => {
            remote.iter_mut().for_each(|(_, entry)| entry.mapped = None);
            // SAFETY: unpacked just above on the live endpoint; nothing refers to it.
            unsafe { rdma_hint_ucx_sys::ucp_rkey_destroy(ring_rkey) };
            other.map(|_| None)
        }
    }
}

#[cfg(test)]
mod attacks;
#[cfg(test)]
mod tests;
