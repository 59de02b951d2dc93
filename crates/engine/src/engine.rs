//! The transfer engine: many transfers in flight over connections to many peers (see
//! [`Engine`]).

mod connect;
mod driver;
mod hints;
mod request;
pub(crate) mod scheduler;

pub use request::{validate_segments, Class, RequestError, Segment, TransferRequest, MAX_SEGMENTS};
pub use scheduler::{LaneStats, TransferStatus, MAX_LANES, MAX_PEERS};

use crate::error::{PlanError, TransferError};
use crate::events::{ArrivalsTaken, Subscriber};
use crate::plan::BlockSpec;
use crate::policy::PostPolicy;
use driver::{Core, Refusal, Shared};
use rdma_hint_backend_core::timer::DeadlineTimer;
use rdma_hint_backend_core::wait::ADAPTIVE_SPIN;
use rdma_hint_core::{
    Arrival, RemoteRegion, SizeHint, SourceId, Transport, TransportError, MAX_OPS_PER_POST,
};
use scheduler::{LaneConfig, Scheduler};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::task::{Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How an engine posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Per lane: work requests per doorbell and outstanding at most (signalling is per
    /// doorbell: its last request, and each transfer's last block, ask for a completion).
    pub policy: PostPolicy,
    /// Transfers tracked at once (submitted and not yet collected by `wait`), 1 to 65 536.
    pub max_transfers: u32,
    /// Payload bytes in flight per lane (the last block posted may run past it, and one
    /// block always goes out), in bytes: what a transfer submitted now queues behind. Enough to keep a link
    /// busy for a few blocks; more only adds waiting for small transfers.
    pub lane_bytes_in_flight: u64,
    /// How long the bytes in flight on a lane may take to drain at the rate the lane has been
    /// delivering: the cap follows the rate (never below two of the lane's largest blocks, never
    /// above `lane_bytes_in_flight`), so a transfer submitted now waits about this long behind
    /// bulk on a slow lane as on a fast one.
    pub lane_queue_time: Duration,
    /// How long a lane may leave its oldest request unanswered before the engine fails it
    /// (and the transfers with blocks on it): a peer that stalls without closing.
    pub lane_stall: Duration,
    /// Local ranges one packed work request gathers at most, 1 to 64 (and no more than the
    /// lane's `max_sges`): segments that land back to back remotely share a request of the
    /// hinted size. 1 posts one request per segment.
    pub gather_entries: u32,
    /// A peer of two lanes or more keeps its last lane for `latency_first()` transfers (while
    /// that lane lives), and bulk stripes over the others: a small transfer then waits for no
    /// bulk byte, where on a shared lane (a TCP socket above all) it waits for every byte in
    /// flight before it. Costs bulk one lane.
    pub control_lane: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            policy: PostPolicy::default(),
            max_transfers: 4096,
            lane_bytes_in_flight: 2 << 20,
            lane_queue_time: Duration::from_micros(200),
            lane_stall: Duration::from_secs(10),
            gather_entries: scheduler::MAX_PIECES,
            control_lane: false,
        }
    }
}

/// The most transfers one engine tracks.
pub const MAX_TRANSFERS: u32 = 1 << 16;

/// The longest a waiter polls a latency-first transfer before it sleeps: a path whose small
/// transfers take longer than this has nothing to gain over two thread wake-ups.
const LATENCY_FIRST_POLL: Duration = Duration::from_micros(100);

/// A connection of an [`Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerId(u32);

impl PeerId {
    /// The connection's number in its engine: 0 for the first peer added, then 1, 2, …
    /// (a label for metrics and logs).
    pub fn index(self) -> u32 {
        self.0
    }
}

/// A submitted transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransferId {
    slot: u32,
    generation: u64,
}

/// What a finished transfer moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// Payload bytes, confirmed delivered.
    pub bytes: u64,
    /// Blocks (work requests) posted.
    pub blocks: u64,
}

/// The transfer engine: many transfers in flight over connections to many peers, each
/// connection one or more lanes (transports opened together), every transfer cut at the hint
/// of its source.
///
/// [`Engine::submit`] never waits: it checks the request, takes a transfer slot and queues the
/// transfer. A driver thread posts blocks one per transfer per turn (so a small transfer is not
/// queued behind a large one; [`TransferRequest::latency_first`] ones go first), stripes them
/// over a connection's lanes by fewest outstanding bytes, and routes each completion back to its
/// transfer by the lane's sequence number in `wr_id`. [`Engine::wait`] is woken by that
/// thread; [`Engine::wait_blocking`] is its twin for callers without a runtime.
///
/// ```
/// use rdma_hint_engine::{BlockSpec, Engine, EngineConfig, LoopbackTransport, TransferRequest};
/// use rdma_hint_core::{MemoryKind, PeerEndpoint, SourceId, Transport};
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
///
/// let transport = Arc::new(LoopbackTransport::new(64));
/// let src = transport.register(MemoryKind::Host, 1 << 20).unwrap();
/// let dst = transport.register(MemoryKind::Host, 1 << 20).unwrap();
/// transport.write_region(src.id, 0, &[7u8; 300_000]).unwrap();
/// let deadline = Instant::now() + Duration::from_secs(5);
/// let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
/// let remote = rdma_hint_backend_core::blocking::block_on(transport.connect(listen, &[dst.id], deadline)).unwrap();
///
/// let engine = Engine::new(EngineConfig::default()).unwrap();
/// engine.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, 4096).unwrap());
/// let peer = engine.add_peer(vec![transport.clone()], &remote).unwrap();
/// let id = engine.submit(peer, TransferRequest::single(&src, 0, &remote[0], 0, 300_000), deadline).unwrap();
/// let delivered = engine.wait_blocking(id, deadline).unwrap();
/// assert_eq!((delivered.bytes, delivered.blocks), (300_000, 5));
/// let mut arrived = vec![0u8; 300_000];
/// transport.read_region(dst.id, 0, &mut arrived).unwrap();
/// assert!(arrived.iter().all(|b| *b == 7));
/// ```
pub struct Engine {
    shared: Arc<Shared>,
    driver: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("peers", &self.shared.lock().sched.peers()).finish()
    }
}

impl Engine {
    /// An engine with no peers and no hints; starts its driver thread.
    pub fn new(config: EngineConfig) -> Result<Engine, TransferError> {
        config.policy.validate()?;
        if config.policy.wrs_per_doorbell as usize > MAX_OPS_PER_POST {
            return Err(PlanError::InvalidPolicy(format!(
                "wrs_per_doorbell {} exceeds the engine's {}",
                config.policy.wrs_per_doorbell, MAX_OPS_PER_POST
            ))
            .into());
        }
        if config.gather_entries == 0 || config.gather_entries > scheduler::MAX_PIECES {
            return Err(PlanError::InvalidPolicy(format!(
                "gather_entries {} is outside 1..={}",
                config.gather_entries,
                scheduler::MAX_PIECES
            ))
            .into());
        }
        if config.max_transfers == 0 || config.max_transfers > MAX_TRANSFERS {
            return Err(PlanError::InvalidPolicy(format!(
                "max_transfers {} is outside 1..={MAX_TRANSFERS}",
                config.max_transfers
            ))
            .into());
        }
        let lanes = LaneConfig {
            policy: config.policy,
            bytes_in_flight: config.lane_bytes_in_flight.max(1),
            queue_time: config.lane_queue_time,
            gather_entries: config.gather_entries,
        };
        let now = Instant::now();
        let sched = Scheduler::new(config.max_transfers, lanes, config.lane_stall, config.control_lane, now);
        let shared = Arc::new(Shared::new(Core::new(sched)));
        let for_driver = shared.clone();
        let driver = std::thread::Builder::new()
            .name("rdma-hint-engine".into())
            .spawn(move || driver::drive(&for_driver))
            .map_err(|error| {
                PlanError::InvalidPolicy(format!("cannot start the engine's thread: {error}"))
            })?;
        let _ = shared.driver.set(driver.thread().clone());
        Ok(Engine { shared, driver: Some(driver) })
    }

    /// Sets the block spec transfers from `source` are cut with, over lanes of every transport
    /// (it replaces the specs [`set_size_hint`](Engine::set_size_hint) set per transport).
    pub fn set_hint(&self, source: SourceId, spec: BlockSpec) {
        self.shared.lock().sched.set_hint(source, None, spec);
    }

    /// Sets the block spec of `hint.source` from the hint, for lanes of the transport it was
    /// computed for (`hint.transport`): a peer over another transport takes its own hint, and
    /// a transfer to one with none is refused with
    /// [`RequestError::HintForAnotherTransport`] rather than cut at a block that is not its.
    pub fn set_size_hint(&self, hint: &SizeHint) -> Result<(), TransferError> {
        self.shared.lock().sched.set_hint(
            hint.source,
            Some(hint.transport.clone()),
            BlockSpec::from_hint(hint)?,
        );
        Ok(())
    }

    /// Has `subscriber` take the engine's events from now on (see [`events`](crate::events)):
    /// doorbells, completions with their post-to-completion time, transfers' ends, lost lanes,
    /// arrivals handed out. Subscribers add up; none is removed, but one that panics (see
    /// [`events`](crate::events)).
    pub fn subscribe(&self, subscriber: Arc<dyn Subscriber>) {
        let mut core = self.shared.lock();
        core.subscribers.push(subscriber);
        core.sched.observe();
        self.shared.observed.store(true, Ordering::Release);
    }

    /// Which NUMA node's hint host regions take (node 0 unless set).
    pub fn set_host_node(&self, node: u32) {
        self.shared.lock().sched.set_host_node(node);
    }

    /// Adds a connection of `lanes` (1 to [`MAX_LANES`] connected transports to one peer)
    /// whose peer exposed `remote`.
    ///
    /// Every lane must address the same memory by the same region ids on both sides (lanes
    /// opened together by a backend, e.g. `StagedTransport::open_lane`), since a transfer's
    /// blocks go over whichever lane has the fewest bytes outstanding. Over several lanes, an
    /// announced transfer's last block waits for the others to complete, so its arrival still
    /// means every byte landed.
    pub fn add_peer(
        &self,
        lanes: Vec<Arc<dyn Transport>>,
        remote: &[RemoteRegion],
    ) -> Result<PeerId, TransportError> {
        self.shared
            .add_peer(lanes, remote)
            .map(PeerId)
            .map_err(|error| TransportError::InvalidArgument { what: "lanes", why: error.to_string() })
    }

    /// Checks `request` and queues it for `peer`; it must finish by `deadline`. Never waits
    /// for a slot or a completion. A refusal is [`TransferError::Refused`] with the
    /// [`RequestError`] that says why, and nothing is posted: the one error type of a
    /// transfer, from its submit to its end. With every slot taken it answers
    /// `Refused(`[`RequestError::Full`]`)` (see
    /// [`submit_when_ready`](Engine::submit_when_ready)). It rings one doorbell at most, on
    /// the calling thread, which takes what the transport's `post_writes` takes (the staged shm
    /// channel copies the blocks there): none on a lane's first requests (the driver's), and a
    /// latency-first submit rings latency-first blocks only. What is left is the driver's.
    pub fn submit(
        &self,
        peer: PeerId,
        request: TransferRequest,
        deadline: Instant,
    ) -> Result<TransferId, TransferError> {
        match self.try_submit(peer, request, deadline) {
            Ok(id) => Ok(id),
            // The peer may have exposed it since it was added: look again, once.
            Err((RequestError::UnknownRemoteRegion { .. }, request)) if self.reload_remote(peer) => {
                self.try_submit(peer, *request, deadline).map_err(|(error, _)| TransferError::Refused(error))
            }
            Err((error, _)) => Err(TransferError::Refused(error)),
        }
    }

    fn try_submit(
        &self,
        peer: PeerId,
        request: TransferRequest,
        deadline: Instant,
    ) -> Result<TransferId, Refusal> {
        let mut core = self.shared.lock();
        let (id, doorbell) = match core.submit(peer.0, request, deadline) {
            Ok(submitted) => submitted,
            Err(refusal) => {
                drop(core);
                if matches!(refusal, (RequestError::Full { .. }, _)) {
                    // Slots may be waiting for blocks to retire that nobody polls yet.
                    self.shared.kick_if_pending();
                }
                return Err(refusal);
            }
        };
        let queued = match doorbell {
            // One lock round trip fewer on the latency path, where the post cannot hold it long.
            Some(mut doorbell) if core.rings_under_lock(&doorbell) => {
                let rung = self.shared.ring(&mut doorbell);
                let queued = core.finish(doorbell, rung);
                drop(core);
                queued
            }
            Some(mut doorbell) => {
                drop(core);
                let rung = self.shared.ring(&mut doorbell);
                self.shared.lock().finish(doorbell, rung)
            }
            None => {
                drop(core);
                true
            }
        };
        // Blocks left to post are the driver's; a transfer posted whole here is retired by its
        // waiter, and the driver is woken only once someone waits for it to (a wake-up is a
        // system call and a thread contending for the lock on the latency path).
        if queued {
            self.shared.kick();
        } else {
            self.shared.kick_later();
        }
        Ok(id)
    }

    /// [`submit`](Engine::submit), waiting (without blocking the thread) for a free slot until
    /// `deadline` instead of answering [`RequestError::Full`].
    pub async fn submit_when_ready(
        &self,
        peer: PeerId,
        request: TransferRequest,
        deadline: Instant,
    ) -> Result<TransferId, TransferError> {
        self.submit_when_ready_or_refused(peer, request, deadline).await.map_err(TransferError::Refused)
    }

    async fn submit_when_ready_or_refused(
        &self,
        peer: PeerId,
        request: TransferRequest,
        deadline: Instant,
    ) -> Result<TransferId, RequestError> {
        let mut pending = Some(request);
        let mut timer: Option<DeadlineTimer> = None;
        std::future::poll_fn(|cx| {
            let Some(request) = pending.take() else { return Poll::Ready(Err(RequestError::Stopped)) };
            match self.try_submit(peer, request, deadline) {
                Ok(id) => Poll::Ready(Ok(id)),
                Err((RequestError::Full { max_transfers }, request)) => {
                    if Instant::now() >= deadline {
                        return Poll::Ready(Err(RequestError::Full { max_transfers }));
                    }
                    self.shared.lock().wake_on_room(cx.waker());
                    // A slot freed between the refusal and the registration is seen now.
                    match self.try_submit(peer, *request, deadline) {
                        Ok(id) => Poll::Ready(Ok(id)),
                        Err((RequestError::Full { .. }, request)) => {
                            self.shared.kick_if_pending();
                            pending = Some(*request);
                            arm(&mut timer, deadline, cx.waker());
                            Poll::Pending
                        }
                        Err((error, _)) => Poll::Ready(Err(error)),
                    }
                }
                Err((error, _)) => Poll::Ready(Err(error)),
            }
        })
        .await
    }

    /// Where a transfer stands, without waiting.
    pub fn status(&self, id: TransferId) -> TransferStatus {
        self.shared.kick_if_pending();
        self.shared.lock().sched.status(id)
    }

    /// What each lane of `peer`'s connection has carried, in lane order (`None`: no such
    /// peer).
    pub fn lane_stats(&self, peer: PeerId) -> Option<Vec<LaneStats>> {
        self.shared.kick_if_pending();
        self.shared.lock().sched.lane_stats(peer.0)
    }

    /// Stops posting a transfer's blocks; its wait ends in [`TransferError::Cancelled`]. `false`
    /// if it had already ended or is unknown.
    pub fn cancel(&self, id: TransferId) -> bool {
        let mut core = self.shared.lock();
        let cancelled = core.sched.cancel(id);
        core.settle();
        drop(core);
        // Its blocks in flight still retire: the driver polls for them.
        self.shared.kick_if_pending();
        cancelled
    }

    /// Waits until the transfer ends or `deadline` passes ([`TransferError::WaitDeadline`]: the
    /// transfer goes on). An ended transfer's result is handed out once; its slot is freed
    /// then, or when its last posted block retires.
    ///
    /// Each look polls the lanes that have carried the transfer's blocks (only those: another
    /// lane's bulk is the driver's) and retires what has completed there itself, so a
    /// transfer whose completion is already there ends without a thread hop; it polls for
    /// [`ADAPTIVE_SPIN`] before it sleeps, woken by whoever ends the transfer. A latency-first
    /// transfer is polled for up to twice as long as its peer's latest ones took (at most 100 µs
    /// more), yielding the thread's core between looks past the first [`ADAPTIVE_SPIN`]: a
    /// path slower than a wake-up (a socket) then ends in its waiter too, without two thread
    /// hops.
    pub async fn wait(&self, id: TransferId, deadline: Instant) -> Result<Delivered, TransferError> {
        let mut timer: Option<DeadlineTimer> = None;
        let mut spin_until: Option<Instant> = None;
        let mut poll_until: Option<Instant> = None;
        std::future::poll_fn(|cx| loop {
            let now = Instant::now();
            let mut state = match self.look(id, now) {
                Look::Ended(result) => return Poll::Ready(result),
                Look::Running(state) => state,
            };
            if now >= deadline {
                return Poll::Ready(Err(TransferError::WaitDeadline));
            }
            if now < *spin_until.get_or_insert(now + ADAPTIVE_SPIN) {
                drop(state);
                std::hint::spin_loop();
                continue;
            }
            let poll_until = *poll_until.get_or_insert_with(|| {
                let expected = state.sched.expected_latency(id);
                now + expected.map_or(Duration::ZERO, |took| (took * 2).min(LATENCY_FIRST_POLL))
            });
            if now < poll_until {
                drop(state);
                std::thread::yield_now();
                continue;
            }
            if !state.wake_when_done(id, cx.waker()) {
                continue; // ended meanwhile: collect it
            }
            drop(state);
            // Someone must retire the completion while this task sleeps: the driver.
            self.shared.kick_if_pending();
            arm(&mut timer, deadline, cx.waker());
            return Poll::Pending;
        })
        .await
    }

    /// [`wait`](Engine::wait), parking the calling thread.
    pub fn wait_blocking(&self, id: TransferId, deadline: Instant) -> Result<Delivered, TransferError> {
        // A transfer already done (a lone one on a channel that completes inside its post) is
        // collected without setting up a future (its waker and state were about 110 of the
        // engine's 2400 instructions for such a transfer).
        match self.look(id, Instant::now()) {
            Look::Ended(result) => result,
            Look::Running(state) => {
                drop(state);
                rdma_hint_backend_core::blocking::block_on(self.wait(id, deadline))
            }
        }
    }

    /// One look at transfer `id`: polls its lanes and collects it if it ended (waking the
    /// driver for blocks a result handed out early left in flight).
    fn look(&self, id: TransferId, now: Instant) -> Look<'_> {
        let mut state = self.shared.lock();
        state.poll_lanes_of(id, now);
        let collected = state.sched.collect(id);
        state.settle();
        let Some(result) = collected else { return Look::Running(state) };
        let holds_blocks = state.sched.holds_blocks(id);
        drop(state);
        // A result handed out with blocks still in flight (cancelled, past its deadline): the
        // driver retires them and frees the slot and the source.
        if holds_blocks {
            self.shared.kick_if_pending();
        }
        Look::Ended(result)
    }

    /// Receiver side: writes-with-immediate that arrived from `peer` on any of its lanes, at
    /// least one, or [`TransportError::DeadlineExceeded`].
    pub async fn wait_arrivals(
        &self,
        peer: PeerId,
        out: &mut [Arrival],
        deadline: Instant,
    ) -> Result<usize, TransportError> {
        let Some(lanes) = self.shared.transports(peer.0) else { return Err(TransportError::NotConnected) };
        // What is there already is taken without a wait's future (a transport's async call is
        // a boxed future: an allocation per call).
        for lane in lanes {
            match lane.poll_arrivals(&mut *out)? {
                0 => {}
                got => return Ok(self.arrived(peer, got)),
            }
        }
        if let [only] = lanes {
            return only.wait_arrivals(out, deadline).await.map(|got| self.arrived(peer, got));
        }
        // Each poll gives every lane's wait one look (registering this task's waker with each);
        // whichever lane hears first wakes the task.
        std::future::poll_fn(|cx| {
            let mut expired = 0;
            for lane in lanes {
                let polled = lane.wait_arrivals(&mut *out, deadline).as_mut().poll(cx);
                match polled {
                    Poll::Ready(Err(TransportError::DeadlineExceeded { .. })) => expired += 1,
                    Poll::Ready(result) => return Poll::Ready(result),
                    Poll::Pending => {}
                }
            }
            if expired == lanes.len() {
                return Poll::Ready(Err(TransportError::DeadlineExceeded {
                    what: "an arrival on any lane",
                    waited_ms: 0,
                }));
            }
            Poll::Pending
        })
        .await
        .map(|got| self.arrived(peer, got))
    }

    /// Tells the subscribers, if any, that a wait handed out `count` arrivals of `peer`.
    #[inline]
    fn arrived(&self, peer: PeerId, count: usize) -> usize {
        if self.shared.observed.load(Ordering::Relaxed) {
            let event = ArrivalsTaken { peer, count: count as u32 };
            self.shared.lock().tell(|subscriber| subscriber.arrivals_taken(&event));
        }
        count
    }
}

/// What one look at a transfer found.
enum Look<'a> {
    Ended(Result<Delivered, TransferError>),
    /// Still running: the lock, held on for the waiter's next step.
    Running(MutexGuard<'a, Core>),
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.kick();
        if let Some(driver) = self.driver.take() {
            let _ = driver.join();
        }
        let mut core = self.shared.lock();
        core.sched.stop_all();
        core.settle();
    }
}

/// Has `waker` woken at `deadline` (once per wait; a later poll's waker replaces it).
fn arm(timer: &mut Option<DeadlineTimer>, deadline: Instant, waker: &Waker) {
    match timer {
        Some(timer) => timer.update(waker),
        None => *timer = Some(DeadlineTimer::new(deadline, waker)),
    }
}
