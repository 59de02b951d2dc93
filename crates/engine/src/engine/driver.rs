//! The engine's I/O around its [`Scheduler`]: the lanes' transports, the waiters' wakers, the
//! driver thread. Everything here acts on what the scheduler decides: it rings the doorbells
//! the scheduler builds, feeds it each lane's completions (one place:
//! [`Scheduler::take_polled`]), and carries out its events.

use super::request::{RequestError, TransferRequest};
use super::scheduler::{Doorbell, Event, LinkId, Scheduler, MAX_PEERS};
use super::{PeerId, TransferId};
use crate::events::{BlockTiming, BlocksCompleted, DoorbellRung, LaneLost, Subscriber};
use rdma_hint_core::{Completion, RegionId, RemoteRegion, Transport, TransportError};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The largest doorbell a caller rings holding the engine's lock (where the lane's posts never
/// wait): a 16 KiB copy takes a couple of microseconds at most.
const RING_UNDER_LOCK_BYTES: u64 = 16 << 10;

/// A refused request, with the request handed back (boxed: refusals are rare, the `Ok` path
/// stays small).
pub(super) type Refusal = (RequestError, Box<TransferRequest>);

/// The scheduler and what it needs the world for, under one lock.
pub(super) struct Core {
    pub(super) sched: Scheduler,
    /// Per peer, its lanes.
    links: Vec<Vec<LinkIo>>,
    /// Per transfer slot, the task waiting for it.
    wakers: Vec<Option<Waker>>,
    room_waiters: Vec<Waker>,
    /// Who takes the engine's events (none: no event is built).
    pub(super) subscribers: Vec<Arc<dyn Subscriber>>,
}

struct LinkIo {
    transport: Arc<dyn Transport>,
    /// Its transport's [`posts_without_waiting`](rdma_hint_core::Capabilities::posts_without_waiting).
    posts_without_waiting: bool,
    /// Room for a window of completions, polled into.
    completions: Vec<Completion>,
}

impl Core {
    pub(super) fn new(sched: Scheduler) -> Core {
        let wakers = (0..sched.max_transfers()).map(|_| None).collect();
        Core { sched, links: Vec::new(), wakers, room_waiters: Vec::new(), subscribers: Vec::new() }
    }

    pub(super) fn add_peer(
        &mut self,
        lanes: Vec<Arc<dyn Transport>>,
        remote: &[RemoteRegion],
    ) -> Result<u32, RequestError> {
        let known = self.links.iter().flatten().map(|link| &link.transport);
        for (index, lane) in lanes.iter().enumerate() {
            let same = |other: &Arc<dyn Transport>| std::ptr::addr_eq(Arc::as_ptr(other), Arc::as_ptr(lane));
            if lanes[..index].iter().any(same) || known.clone().any(same) {
                return Err(RequestError::InvalidPeer(
                    "a transport is already a lane of this engine: each lane's completions must be the engine's alone".into(),
                ));
            }
        }
        let caps: Vec<_> = lanes.iter().map(|lane| lane.capabilities()).collect();
        let peer = self.sched.add_peer(&caps, remote, Instant::now())?;
        let links = lanes.into_iter().enumerate().map(|(lane, transport)| {
            let window = self.sched.window(LinkId { peer, lane: lane as u32 });
            let posts_without_waiting = transport.capabilities().posts_without_waiting;
            LinkIo { transport, posts_without_waiting, completions: vec![Completion::EMPTY; window] }
        });
        self.links.push(links.collect());
        Ok(peer)
    }

    /// Checks the request, holds its source on every lane of the peer (from here until the
    /// scheduler's `Unhold`: the source can be neither released nor its id reused for other
    /// memory while a block of it may still be posted), queues it, and builds the doorbell
    /// the caller rings at once, if its lanes have room.
    pub(super) fn submit(
        &mut self,
        peer: u32,
        mut request: TransferRequest,
        deadline: Instant,
    ) -> Result<(TransferId, Option<Doorbell>), Refusal> {
        let admitted = match self.sched.admit(peer, &mut request) {
            Ok(admitted) => admitted,
            Err(error) => return Err((error, Box::new(request))),
        };
        if let Err(error) = self.hold_source(peer, request.local.id) {
            let (id, why) = (request.local.id, error.to_string());
            return Err((RequestError::LocalRegion { id, why }, Box::new(request)));
        }
        let now = Instant::now();
        let class = request.class;
        let id = self.sched.queue(admitted, request, deadline, now);
        let doorbell = self.sched.next_doorbell_for(peer, super::scheduler::Poster::Caller(class), now);
        self.settle();
        Ok((id, doorbell))
    }

    /// Holds `region` on every lane of `peer` (lanes may share one region table, or not:
    /// holds are counted either way); all or none.
    fn hold_source(&self, peer: u32, region: RegionId) -> Result<(), TransportError> {
        let links = &self.links[peer as usize];
        for (index, link) in links.iter().enumerate() {
            if let Err(error) = link.transport.hold(region) {
                links[..index].iter().for_each(|link| link.transport.unhold(region));
                return Err(error);
            }
        }
        Ok(())
    }

    /// Whether the caller that built `doorbell` rings it holding the lock: its lane's posts
    /// never wait, and it is small enough that the post (a copy, on the staged shm channel)
    /// keeps the lock from others no longer than a lock round trip would cost them.
    pub(super) fn rings_under_lock(&self, doorbell: &Doorbell) -> bool {
        let link = doorbell.link;
        doorbell.bytes() <= RING_UNDER_LOCK_BYTES
            && self.links[link.peer as usize][link.lane as usize].posts_without_waiting
    }

    /// Records how ringing a doorbell went; whether blocks of its peer are left to post.
    pub(super) fn finish(&mut self, doorbell: Doorbell, rung: Result<(), TransportError>) -> bool {
        let peer = doorbell.link.peer;
        // Told once the scheduler has the doorbell back (a subscriber's panic cannot leave the
        // lane ringing for ever).
        let event = (!self.subscribers.is_empty()).then(|| DoorbellRung {
            peer: PeerId(peer),
            lane: doorbell.link.lane,
            requests: doorbell.requests(),
            bytes: doorbell.bytes(),
            reads: doorbell.reads(),
            refused: rung.as_ref().err().map(TransportError::kind),
        });
        self.sched.finish_doorbell(doorbell, rung);
        if let Some(event) = event {
            self.tell(|subscriber| subscriber.doorbell_rung(&event));
        }
        self.settle();
        self.sched.peer_queued(peer)
    }

    /// Calls every subscriber; one that panics is dropped (and said so at `ERROR`), so a bug
    /// in it can neither end the driver's thread nor leave the engine half-way through a step.
    pub(super) fn tell(&mut self, call: impl Fn(&dyn Subscriber)) {
        self.subscribers.retain(|subscriber| {
            let told = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(&**subscriber)));
            if told.is_err() {
                tracing::error!(target: "rdma_hint::engine", "a subscriber panicked: it is dropped");
            }
            told.is_ok()
        });
    }

    /// Polls every lane with requests in flight; whether anything was retired or failed.
    pub(super) fn poll_all(&mut self, now: Instant) -> bool {
        let mut worked = false;
        for peer in 0..self.links.len() as u32 {
            for lane in 0..self.links[peer as usize].len() as u32 {
                worked |= self.poll_link(LinkId { peer, lane }, now);
            }
        }
        worked
    }

    /// Polls the lanes that have carried a block of transfer `id` (none once it ended, or while
    /// nothing of it is posted: the driver posts and polls then); whether anything was
    /// retired or failed. A waiter polls these alone: polling a lane does that lane's work on
    /// the polling thread (UCX progresses its puts, staged tcp pumps its socket), which a
    /// latency-first transfer must not wait behind.
    pub(super) fn poll_lanes_of(&mut self, id: TransferId, now: Instant) -> bool {
        let Some((peer, mut lanes)) = self.sched.lanes_of(id) else { return false };
        let mut worked = false;
        while lanes != 0 {
            let lane = lanes.trailing_zeros();
            lanes &= lanes - 1;
            worked |= self.poll_link(LinkId { peer, lane }, now);
        }
        worked
    }

    fn poll_link(&mut self, link: LinkId, now: Instant) -> bool {
        if !self.sched.has_in_flight(link) {
            return false;
        }
        let io = &mut self.links[link.peer as usize][link.lane as usize];
        let polled = io.transport.poll_completions(&mut io.completions);
        let worked = self.sched.take_polled(link, polled.map(|ready| &io.completions[..ready]), now);
        self.settle();
        worked
    }

    /// What a wait on `link` answered (see [`Scheduler::take_polled`]); whether anything was
    /// retired or failed.
    pub(super) fn completed(
        &mut self,
        link: LinkId,
        polled: Result<&[Completion], TransportError>,
        now: Instant,
    ) -> bool {
        let worked = self.sched.take_polled(link, polled, now);
        self.settle();
        worked
    }

    /// The lanes with requests in flight and their transports, for the driver to sleep on.
    fn busy_links(&self, out: &mut Vec<(LinkId, Arc<dyn Transport>)>) {
        out.clear();
        for (peer, links) in self.links.iter().enumerate() {
            for (lane, io) in links.iter().enumerate() {
                let link = LinkId { peer: peer as u32, lane: lane as u32 };
                if self.sched.has_in_flight(link) {
                    out.push((link, io.transport.clone()));
                }
            }
        }
    }

    /// Carries out what the scheduler asked for: wake waiters, end holds.
    #[inline]
    pub(super) fn settle(&mut self) {
        if self.sched.has_events() {
            self.settle_events();
        }
    }

    fn settle_events(&mut self) {
        while let Some(done) = self.sched.poll_completed() {
            let (peer, lane, requests, bytes) =
                (PeerId(done.link.peer), done.link.lane, done.requests, done.bytes);
            let timing = done.timed.map(|(took, bytes_ahead)| BlockTiming { took, bytes_ahead });
            let event = BlocksCompleted { peer, lane, requests, bytes, reads: done.reads, timing };
            self.tell(|subscriber| subscriber.blocks_completed(&event));
        }
        while let Some(event) = self.sched.poll_event() {
            match event {
                Event::Ended { slot } => {
                    if let Some(waker) = self.wakers[slot as usize].take() {
                        waker.wake();
                    }
                    if let Some(ended) =
                        self.subscribers.first().and_then(|_| self.sched.ended(slot, Instant::now()))
                    {
                        self.tell(|subscriber| subscriber.transfer_ended(&ended));
                    }
                }
                Event::Room => self.room_waiters.drain(..).for_each(Waker::wake),
                Event::Unhold { peer, region } => {
                    self.links[peer as usize].iter().for_each(|link| link.transport.unhold(region));
                }
                Event::LaneLost { link, error } => {
                    let event = LaneLost { peer: PeerId(link.peer), lane: link.lane, error };
                    self.tell(|subscriber| subscriber.lane_lost(&event));
                }
            }
        }
    }

    /// Has `waker` woken when `id` ends (`false`: it already has, or is unknown).
    pub(super) fn wake_when_done(&mut self, id: TransferId, waker: &Waker) -> bool {
        if !self.sched.is_running(id) {
            return false;
        }
        let stored = &mut self.wakers[id.slot as usize];
        if !stored.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *stored = Some(waker.clone());
        }
        true
    }

    /// Has `waker` woken when a slot comes free.
    pub(super) fn wake_on_room(&mut self, waker: &Waker) {
        self.sched.want_room();
        if !self.room_waiters.iter().any(|w| w.will_wake(waker)) {
            self.room_waiters.push(waker.clone());
        }
    }
}

/// A peer's lanes' transports, in lane order.
type LaneTransports = Box<[Arc<dyn Transport>]>;

pub(super) struct Shared {
    core: Mutex<Core>,
    /// Per peer, its lanes' transports: set once, when the peer is added (before its id is
    /// handed out), and never changed, so a doorbell rings on its lane without the lock and
    /// without taking a count on the transport (two locked instructions a doorbell).
    lanes: Box<[OnceLock<LaneTransports>]>,
    /// API calls waiting for the lock: the driver yields to them between doorbells.
    contenders: AtomicUsize,
    /// A submit posted a whole transfer without waking the driver: the next look that needs
    /// it (a waiter going to sleep, `status`, a submitter waiting for room) wakes it.
    kick_pending: AtomicBool,
    /// A subscriber was registered: arrivals handed out are events too.
    pub(super) observed: AtomicBool,
    pub(super) stop: AtomicBool,
    pub(super) driver: OnceLock<Thread>,
}

impl Shared {
    pub(super) fn new(core: Core) -> Shared {
        Shared {
            core: Mutex::new(core),
            lanes: (0..MAX_PEERS).map(|_| OnceLock::new()).collect(),
            contenders: AtomicUsize::new(0),
            kick_pending: AtomicBool::new(false),
            observed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            driver: OnceLock::new(),
        }
    }

    /// Adds a connection of `lanes` (see [`Core::add_peer`]); its id.
    pub(super) fn add_peer(
        &self,
        lanes: Vec<Arc<dyn Transport>>,
        remote: &[RemoteRegion],
    ) -> Result<u32, RequestError> {
        let mut core = self.lock();
        let peer = core.add_peer(lanes.clone(), remote)?;
        // Under the lock that numbered it: no doorbell of the peer is built before this.
        let fresh = self.lanes[peer as usize].set(lanes.into_boxed_slice()).is_ok();
        debug_assert!(fresh, "a peer's number is handed out once");
        Ok(peer)
    }

    /// `peer`'s lanes' transports, without the lock and without a copy (`None`: no such peer).
    pub(super) fn transports(&self, peer: u32) -> Option<&[Arc<dyn Transport>]> {
        self.lanes.get(peer as usize)?.get().map(|lanes| &lanes[..])
    }

    /// Posts a doorbell's requests on its lane's transport with one call (without the lock:
    /// the staged shm channel copies the blocks inside the post, and a post may wait).
    pub(super) fn ring(&self, doorbell: &mut Doorbell) -> Result<(), TransportError> {
        let link = doorbell.link;
        let lanes = self.lanes[link.peer as usize]
            .get()
            .expect("a peer's lanes are set before its number is handed out");
        doorbell.post_on(&*lanes[link.lane as usize])
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Core> {
        // A free lock is taken at once; only a caller that has to wait counts as a contender
        // (two locked instructions the uncontended path does without).
        match self.core.try_lock() {
            Ok(core) => return core,
            Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {}
        }
        self.contenders.fetch_add(1, Ordering::SeqCst);
        let core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        self.contenders.fetch_sub(1, Ordering::SeqCst);
        core
    }

    /// The driver's lock, which does not count as a contender.
    fn lock_for_driver(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the driver: blocks are left to post, or completions to retire.
    pub(super) fn kick(&self) {
        self.kick_pending.store(false, Ordering::SeqCst);
        if let Some(driver) = self.driver.get() {
            driver.unpark();
        }
    }

    /// Leaves the driver asleep for now: what was posted is in flight, and its waiter retires
    /// it (see `kick_pending`).
    pub(super) fn kick_later(&self) {
        // Mostly set already (only a kick clears it): a load spares the locked store.
        if !self.kick_pending.load(Ordering::SeqCst) {
            self.kick_pending.store(true, Ordering::SeqCst);
        }
    }

    /// Wakes the driver if a submit left it asleep with blocks in flight.
    pub(super) fn kick_if_pending(&self) {
        if self.kick_pending.swap(false, Ordering::SeqCst) {
            self.kick();
        }
    }
}

/// How long the driver polls with nothing completing before it sleeps on the lanes' events.
const SPIN: Duration = Duration::from_micros(50);
/// The longest the driver waits for callers queued for the lock before it takes it again.
const HANDOFF: Duration = Duration::from_micros(200);
/// The longest the driver sleeps between two looks at the transfers.
const NAP: Duration = Duration::from_millis(1);

/// The driver thread: turns until nothing is left, then sleeps on the lanes' completion
/// events (and on `submit`'s unpark).
pub(super) fn drive(shared: &Shared) {
    let waker = rdma_hint_backend_core::blocking::thread_waker();
    let mut cx = Context::from_waker(&waker);
    let mut busy = Vec::new();
    let mut scratch = vec![Completion::EMPTY; 1024];
    let mut idle_since: Option<Instant> = None;
    while !shared.stop.load(Ordering::SeqCst) {
        let (now, doorbell, mut worked, in_flight, running) = {
            let mut core = shared.lock_for_driver();
            // Read under the lock: a doorbell built now is stamped with it, and the wait for
            // the lock is no part of its post-to-completion time.
            let now = Instant::now();
            let doorbell = core.sched.next_doorbell(now);
            let mut worked = core.poll_all(now);
            worked |= core.sched.handle_timeout(now);
            core.settle();
            let in_flight = core.sched.in_flight();
            (now, doorbell, worked, in_flight, in_flight || core.sched.queued())
        };
        // Rung without the lock: the staged shm channel copies the blocks inside the post, and
        // a post may wait (UCX for room on the peer's notice ring, staged tcp for its socket).
        if let Some(mut doorbell) = doorbell {
            let rung = shared.ring(&mut doorbell);
            shared.lock_for_driver().finish(doorbell, rung);
            worked = true;
        }
        if worked {
            idle_since = None;
            // A std Mutex is not fair: the driver would take it again before a woken caller
            // runs. It waits (briefly) until the callers queued for it have had their turn.
            let handoff = Instant::now();
            while shared.contenders.load(Ordering::SeqCst) > 0 && handoff.elapsed() < HANDOFF {
                std::thread::yield_now();
            }
            continue;
        }
        if !running {
            // Nothing to watch: `submit` and `Drop` unpark.
            idle_since = None;
            std::thread::park();
            continue;
        }
        if !in_flight {
            let nap = nap(shared, now);
            idle_since = None;
            std::thread::park_timeout(nap);
            continue;
        }
        let since = *idle_since.get_or_insert(now);
        if now.duration_since(since) < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let until = now + nap(shared, now);
        sleep_on_lanes(shared, &mut cx, &mut busy, &mut scratch, until);
        idle_since = None;
    }
}

/// How long the driver may sleep: until the scheduler's next timeout, at most [`NAP`].
fn nap(shared: &Shared, now: Instant) -> Duration {
    let next = shared.lock_for_driver().sched.next_timeout();
    next.map_or(NAP, |at| at.saturating_duration_since(now).min(NAP))
}

/// Registers the driver's waker with every lane that has requests in flight (taking what
/// completed meanwhile), and parks until one wakes it or `until`.
fn sleep_on_lanes(
    shared: &Shared,
    cx: &mut Context<'_>,
    busy: &mut Vec<(LinkId, Arc<dyn Transport>)>,
    scratch: &mut [Completion],
    until: Instant,
) {
    shared.lock_for_driver().busy_links(busy);
    let mut heard = false;
    for (link, transport) in busy.iter() {
        let ready = {
            let mut sleep = transport.wait_completions(scratch, until);
            match Pin::as_mut(&mut sleep).poll(cx) {
                Poll::Ready(Ok(ready)) => ready,
                Poll::Ready(Err(_)) | Poll::Pending => 0,
            }
        };
        if ready > 0 {
            shared.lock_for_driver().completed(*link, Ok(&scratch[..ready]), Instant::now());
            heard = true;
        }
    }
    busy.clear();
    if !heard {
        std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
    }
}
