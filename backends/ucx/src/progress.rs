//! The progress thread: drives UCX while work is in flight, sleeps on the worker's event fd
//! (and the out-of-band socket) when idle, and notices a peer that went away.

use crate::engine::Engine;
use crate::notices::Signals;
use rdma_hint_backend_core::lanes::Exposure;
use rdma_hint_backend_core::queue::EventQueue;
use rdma_hint_core::{Arrival, Completion};
use rdma_hint_oob::ControlChannel;
use rdma_hint_ucx_sys as sys;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// How long an idle progress thread sleeps at most before looking again: bounds how late a
/// missed wake-up or a dead peer on a transport without events is noticed.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// How long the progress thread sleeps at most while work is in flight, in case a transport
/// makes progress without signalling the event fd.
const BUSY_POLL: Duration = Duration::from_millis(1);

/// What the transport and its progress thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) engine: Mutex<Engine>,
    /// The regions this lane's connect exposed to its peer.
    pub(crate) exposure: Exposure,
    pub(crate) stop: AtomicBool,
    /// The out-of-band socket, kept open after the exchange: regions exposed and withdrawn
    /// later travel on it, and its EOF means the peer is gone.
    pub(crate) control: OnceLock<Arc<ControlChannel>>,
    /// Where this side's own regions lie, for the screen of a region the peer exposes later.
    pub(crate) own_memory: OnceLock<OwnMemory>,
    pub(crate) efd: RawFd,
    worker: usize,
    /// The transport's waits busy-poll (and drive progress themselves).
    pub(crate) busy_poll: AtomicBool,
    pub(crate) completions: EventQueue<Completion>,
    pub(crate) arrivals: EventQueue<Arrival>,
}

impl Shared {
    pub(crate) fn new(
        engine: Engine,
        completions: EventQueue<Completion>,
        arrivals: EventQueue<Arrival>,
    ) -> Shared {
        let efd = engine.ucp.efd;
        let worker = engine.ucp.worker as usize;
        Shared {
            engine: Mutex::new(engine),
            exposure: Exposure::default(),
            stop: AtomicBool::new(false),
            control: OnceLock::new(),
            own_memory: OnceLock::new(),
            efd,
            worker,
            busy_poll: AtomicBool::new(false),
            completions,
            arrivals,
        }
    }

    /// Whether a task sleeps on a completion or an arrival (the thread then looks more often,
    /// in case a transport makes progress without signalling the event fd).
    fn awaited(&self) -> bool {
        self.completions.notifier().has_waiters() || self.arrivals.notifier().has_waiters()
    }

    pub(crate) fn engine(&self) -> std::sync::MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The engine, unless another thread holds it: a poster (whose post progresses and
    /// harvests before it returns), the progress thread, or a wait driving progress. A look
    /// that finds it taken reads the queues instead of waiting behind, say, a put of 1 MiB
    /// that a shared-memory transport copies inside the call.
    pub(crate) fn try_engine(&self) -> Option<std::sync::MutexGuard<'_, Engine>> {
        match self.engine.try_lock() {
            Ok(engine) => Some(engine),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Whether the peer is seen to have stopped: it said goodbye (after flushing what it
    /// sent), or its socket closed. Stray bytes or a failing socket do not say so. Before the
    /// handshake has a socket, it has not.
    pub(crate) fn peer_stopped(&self) -> bool {
        self.control.get().is_some_and(|control| control.peer_left().is_some_and(|loss| loss.stopped))
    }

    /// Where this lane's domain's regions lie (address, length): this side's own memory.
    pub(crate) fn domain_memory(&self) -> Vec<(u64, u64)> {
        self.own_memory.get().map(|own| (own.0)()).unwrap_or_default()
    }

    /// Wakes the progress thread from its sleep on the event fd.
    pub(crate) fn wake(&self) {
        // SAFETY: ucp_worker_signal is safe from any thread in any thread mode (ucp.h); the
        // worker lives until the engine drops, after the progress thread has been joined.
        unsafe { sys::ucp_worker_signal(self.worker as sys::ucp_worker_h) };
    }
}

/// Lists this side's own regions (address, length): set at connect by the transport, which
/// knows the domain.
pub(crate) struct OwnMemory(pub(crate) Box<dyn Fn() -> Vec<(u64, u64)> + Send + Sync>);

impl std::fmt::Debug for OwnMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnMemory")
    }
}

/// The thread body. Returns when `shared.stop` is set.
///
/// It never spins: after each progress pass it arms the worker and sleeps on the event fd and
/// the out-of-band socket (UCX signals incoming data and transmit readiness there). Completions
/// and arrivals it harvests wake the tasks waiting for them; waits drive progress themselves
/// while they spin, so this thread carries the work once they sleep.
pub(crate) fn run(shared: Arc<Shared>) {
    let signals = shared.engine().signals.clone();
    let mut oob_fd = shared.control.get().and_then(|control| control.stream()).map_or(-1, AsRawFd::as_raw_fd);
    while !shared.stop.load(Ordering::Acquire) {
        if shared.busy_poll.load(Ordering::Relaxed) {
            // BusyPoll: the application's waits drive UCX. This thread does not sleep on the
            // event fd (it would wake, and take the worker lock, at every message); it watches
            // the peer and gives UCX a pass every IDLE_POLL, never waiting for the lock, so
            // nothing stalls for a side that only posts or only polls.
            sleep_on(-1, oob_fd, IDLE_POLL);
            if let Some(mut engine) = shared.try_engine() {
                engine.progress();
            }
            if check_liveness(&shared) {
                // The peer's last byte stays unread: polling the socket again would return at
                // once, and this thread would spin.
                oob_fd = -1;
            }
            continue;
        }
        let (busy, armed, gone) = {
            let mut engine = shared.engine();
            engine.progress();
            let gone = engine.gone().is_some();
            (engine.needs_progress(), !gone && engine.ucp.arm(), gone)
        };
        ring_to_queue(&shared, &signals);
        if gone {
            std::thread::park_timeout(IDLE_POLL);
        } else if armed {
            // A full arrival queue leaves notices on the ring: sleep without the mark rather
            // than spin on them, but only briefly (no writer wakes this thread once the
            // application's drain makes room).
            let full = shared.arrivals.room() == 0;
            let timeout = if busy || full || shared.awaited() { BUSY_POLL } else { IDLE_POLL };
            // A peer that writes this side's memory directly announces on the ring, which no
            // event fd watches: it sends a wake-up while the ring is marked.
            let ring = signals.ring.get();
            if ring.is_none_or(|ring| full || ring.prepare_sleep()) {
                sleep_on(shared.efd, oob_fd, timeout);
                if let Some(ring) = ring {
                    ring.woke();
                }
            }
            ring_to_queue(&shared, &signals);
            check_liveness(&shared);
        } else {
            // UCX has events pending: look again at once, and at the peer too, which a busy
            // worker would otherwise never get to.
            check_liveness(&shared);
            std::thread::yield_now();
        }
    }
}

/// Moves the notices on the ring into the arrival queue, for the tasks asleep on it; a broken
/// ring ends the connection.
fn ring_to_queue(shared: &Shared, signals: &Signals) {
    if let Err(why) = signals.ring_to_queue(shared.arrivals.room()) {
        shared.engine().fail(why);
        shared.arrivals.notifier().notify();
    }
}

/// Acts on the peer's requests; ends the connection when the peer is seen to have left, and
/// says whether it has.
fn check_liveness(shared: &Shared) -> bool {
    if let Some(loss) = shared.watch_control(true) {
        let mut engine = shared.engine();
        // Whatever the peer sent before leaving (a last notice) is taken in first.
        engine.progress();
        engine.lost(loss);
        drop(engine);
        shared.completions.notifier().notify();
        shared.arrivals.notifier().notify();
        return true;
    }
    false
}

fn sleep_on(efd: RawFd, oob_fd: RawFd, timeout: Duration) {
    let mut fds = [
        libc::pollfd { fd: efd, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: oob_fd, events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: `fds` holds 2 initialised pollfd entries for descriptors that stay open while
    // the thread runs (the worker and the socket outlive it); poll ignores negative fds.
    unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout.as_millis() as libc::c_int) };
}
