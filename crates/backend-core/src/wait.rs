//! Honest async waits for backends: a pending wait stores its [`Waker`] in a [`Notifier`] and
//! sleeps until the thread that produces the event (a link thread, UCX's progress thread, the
//! verbs completion-channel thread) calls [`Notifier::notify`], or until its deadline (the
//! [`timer`](crate::timer)). No async runtime is involved: the same futures run under tokio,
//! smol or [`block_on`](crate::blocking::block_on).
//!
//! [`WaitMode`] picks how a wait spends the time before the event: [`WaitMode::Adaptive`]
//! spins briefly and then sleeps; [`WaitMode::BusyPoll`] never sleeps.

use crate::timer::DeadlineTimer;
use rdma_hint_core::{TransportError, WaitMode};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long an [`WaitMode::Adaptive`] wait polls before it sleeps on the event: covers a
/// hand-off between two threads on one host, so short waits cost no wake-up.
pub const ADAPTIVE_SPIN: Duration = Duration::from_micros(5);
/// How long one poll of a [`WaitMode::BusyPoll`] wait spins before it yields to the executor
/// (and is polled again at once): other tasks on the thread still run.
pub const BUSY_POLL_SLICE: Duration = Duration::from_micros(200);

/// Attempts between two clock reads while a wait spins.
const CLOCK_EVERY: u32 = 16;

/// A [`WaitMode`] a transport can change through `&self`.
#[derive(Debug, Default)]
pub struct WaitModeCell(AtomicU8);

impl WaitModeCell {
    /// The mode now.
    pub fn get(&self) -> WaitMode {
        match self.0.load(Ordering::Relaxed) {
            1 => WaitMode::BusyPoll,
            _ => WaitMode::Adaptive,
        }
    }

    /// Changes the mode for waits that start afterwards.
    pub fn set(&self, mode: WaitMode) {
        self.0.store(u8::from(mode == WaitMode::BusyPoll), Ordering::Relaxed);
    }
}

/// Wakers of the waits sleeping on one event source.
///
/// The producer calls [`notify`](Notifier::notify) after it made an item visible; a waiter
/// registers, then looks once more, so no event falls between its look and its sleep. When
/// nobody sleeps, `notify` is one fence and one load.
///
/// ```
/// use rdma_hint_backend_core::wait::Notifier;
/// let notifier = Notifier::default();
/// notifier.register(std::task::Waker::noop());
/// assert!(notifier.has_waiters());
/// notifier.notify();
/// assert!(!notifier.has_waiters());
/// ```
#[derive(Debug, Default)]
pub struct Notifier {
    waiting: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
}

/// Wakers kept per notifier before all are woken at once (stale ones of dropped waits go too).
const MAX_WAKERS: usize = 64;

impl Notifier {
    /// Adds `waker` to those woken by the next [`notify`](Notifier::notify).
    pub fn register(&self, waker: &Waker) {
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        let mut overflow = Vec::new();
        if !wakers.iter().any(|w| w.will_wake(waker)) {
            if wakers.len() >= MAX_WAKERS {
                overflow = std::mem::take(&mut *wakers);
            }
            wakers.push(waker.clone());
        }
        self.waiting.store(true, Ordering::SeqCst);
        drop(wakers);
        // Woken without the lock: a woken task may register again at once.
        overflow.into_iter().for_each(Waker::wake);
        // Pairs with the fence in `notify`: either the producer sees `waiting`, or the
        // waiter's next look sees the producer's item.
        fence(Ordering::SeqCst);
    }

    /// Wakes every registered waiter.
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        if !self.waiting.load(Ordering::Relaxed) {
            return;
        }
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        self.waiting.store(false, Ordering::Relaxed);
        let woken: Vec<Waker> = std::mem::take(&mut *wakers);
        drop(wakers);
        woken.into_iter().for_each(Waker::wake);
    }

    /// Whether a wait sleeps on this notifier now (a progress thread may poll faster then).
    pub fn has_waiters(&self) -> bool {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// What one look at the event source found: `Some(value)` ends the wait.
pub type Attempt<R> = Result<Option<R>, TransportError>;

/// A poll's count as a wait attempt: nothing yet is `None`.
pub fn ready(found: Result<usize, TransportError>) -> Attempt<usize> {
    found.map(|n| (n > 0).then_some(n))
}

/// Waits until `attempt` yields, `deadline` passes or `attempt` fails, sleeping on `notifier`
/// in between (see [`WaitMode`]).
///
/// `attempt` must not block; it is called again after every wake-up. A passed deadline is
/// [`TransportError::DeadlineExceeded`] naming `what`.
///
/// ```
/// use rdma_hint_backend_core::blocking::block_on;
/// use rdma_hint_backend_core::wait::{wait, Notifier};
/// use rdma_hint_core::{TransportError, WaitMode};
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
///
/// let notifier = Arc::new(Notifier::default());
/// let value = Arc::new(AtomicU32::new(0));
/// let (n, v) = (notifier.clone(), value.clone());
/// let producer = std::thread::spawn(move || {
///     std::thread::sleep(Duration::from_millis(10));
///     v.store(7, Ordering::SeqCst);
///     n.notify();
/// });
/// let deadline = Instant::now() + Duration::from_secs(5);
/// let got = block_on(wait(&notifier, WaitMode::Adaptive, deadline, "a value", || {
///     Ok(Some(value.load(Ordering::SeqCst)).filter(|v| *v != 0))
/// }));
/// assert_eq!(got.unwrap(), 7);
/// producer.join().unwrap();
///
/// // Nothing ever comes: the deadline ends the wait.
/// let soon = Instant::now() + Duration::from_millis(20);
/// let never = block_on(wait(&notifier, WaitMode::Adaptive, soon, "nothing", || Ok(None::<u32>)));
/// assert!(matches!(never, Err(TransportError::DeadlineExceeded { .. })));
/// ```
pub fn wait<'a, R, F>(
    notifier: &'a Notifier,
    mode: WaitMode,
    deadline: Instant,
    what: &'static str,
    attempt: F,
) -> Wait<'a, F>
where
    F: FnMut() -> Attempt<R> + Unpin,
{
    Wait { notifier, mode, deadline, what, attempt, started: None, timer: None }
}

/// The future [`wait`] returns.
#[must_use = "a wait does nothing unless awaited"]
pub struct Wait<'a, F> {
    notifier: &'a Notifier,
    mode: WaitMode,
    deadline: Instant,
    what: &'static str,
    attempt: F,
    started: Option<Instant>,
    timer: Option<DeadlineTimer>,
}

impl<F> std::fmt::Debug for Wait<'_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait").field("what", &self.what).field("mode", &self.mode).finish()
    }
}

impl<R, F> Future for Wait<'_, F>
where
    F: FnMut() -> Attempt<R> + Unpin,
{
    type Output = Result<R, TransportError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // The first look comes before the first clock read: what is already there is taken
        // without one (a clock read cost as much as a look at a CQ in the emulated guest).
        if this.started.is_none() {
            if let Some(value) = (this.attempt)()? {
                return Poll::Ready(Ok(value));
            }
        }
        // One clock read for both on the first poll: a wait that finds nothing at once must
        // look again soon, and a clock read costs as much as a look.
        let slice_start = Instant::now();
        let started = *this.started.get_or_insert(slice_start);
        let spin = match this.mode {
            WaitMode::Adaptive if slice_start.saturating_duration_since(started) < ADAPTIVE_SPIN => {
                ADAPTIVE_SPIN
            }
            WaitMode::Adaptive => Duration::ZERO,
            WaitMode::BusyPoll => BUSY_POLL_SLICE,
        };
        let mut attempts: u32 = 0;
        loop {
            if let Some(value) = (this.attempt)()? {
                return Poll::Ready(Ok(value));
            }
            // The clock is read every few attempts only: between two looks at a CQ or worker,
            // it would be most of a busy-poll's cost.
            attempts = attempts.wrapping_add(1);
            if spin > Duration::ZERO && !attempts.is_multiple_of(CLOCK_EVERY) {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if now >= this.deadline {
                return Poll::Ready(Err(TransportError::DeadlineExceeded {
                    what: this.what,
                    waited_ms: now.saturating_duration_since(started).as_millis() as u64,
                }));
            }
            if now.saturating_duration_since(slice_start) >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        if this.mode == WaitMode::BusyPoll {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.notifier.register(cx.waker());
        match &mut this.timer {
            Some(timer) => timer.update(cx.waker()),
            None => this.timer = Some(DeadlineTimer::new(this.deadline, cx.waker())),
        }
        // The look after registering: an event that came just before is not slept through.
        if let Some(value) = (this.attempt)()? {
            return Poll::Ready(Ok(value));
        }
        Poll::Pending
    }
}

/// How long past its deadline an [`off_thread`] wait gives the work to answer for itself (its
/// own error says more than "deadline passed") before the wait ends without it.
pub const OFF_THREAD_GRACE: Duration = Duration::from_millis(250);

/// Runs blocking work on a thread of its own and lets a task await its result without
/// blocking the task's thread (used for the out-of-band exchange of `connect`).
///
/// The wait has a timer of its own: work that is stuck in a system call past `deadline` (plus
/// [`OFF_THREAD_GRACE`]) ends the wait with [`TransportError::DeadlineExceeded`] naming
/// `what`; the thread is left to finish (its result is dropped).
///
/// ```
/// use rdma_hint_core::TransportError;
/// use rdma_hint_backend_core::blocking::block_on;
/// use rdma_hint_backend_core::wait::off_thread;
/// use std::time::{Duration, Instant};
/// let soon = Instant::now() + Duration::from_secs(5);
/// let answer = block_on(off_thread("example", "an answer", soon, || 6 * 7)).unwrap();
/// assert_eq!(answer, 42);
/// let stuck = off_thread("stuck", "the stuck work", Instant::now(), || std::thread::sleep(Duration::from_secs(2)));
/// assert!(matches!(block_on(stuck), Err(TransportError::DeadlineExceeded { what: "the stuck work", .. })));
/// ```
pub fn off_thread<R, F>(name: &str, what: &'static str, deadline: Instant, work: F) -> OffThread<R>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let shared = Arc::new(Handoff { result: Mutex::new(None), notifier: Notifier::default() });
    let done = shared.clone();
    let spawned = std::thread::Builder::new().name(format!("rdma-hint-{name}")).spawn(move || {
        // A panic in the work still ends the wait (as an error), it never leaves it pending.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|_| ());
        *done.result.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
        done.notifier.notify();
    });
    let (started, timer) = (Instant::now(), None);
    OffThread {
        shared,
        spawn_error: spawned.err(),
        what,
        deadline: deadline.checked_add(OFF_THREAD_GRACE).unwrap_or(deadline),
        started,
        timer,
    }
}

struct Handoff<R> {
    /// `Err(())`: the work panicked.
    result: Mutex<Option<Result<R, ()>>>,
    notifier: Notifier,
}

/// The future [`off_thread`] returns: the work's result, or the error that kept the thread
/// from starting.
#[must_use = "the work runs anyway; await it for the result"]
pub struct OffThread<R> {
    shared: Arc<Handoff<R>>,
    spawn_error: Option<std::io::Error>,
    what: &'static str,
    /// The work's deadline and its grace: the wait ends here with or without the work.
    deadline: Instant,
    started: Instant,
    timer: Option<DeadlineTimer>,
}

impl<R> std::fmt::Debug for OffThread<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffThread").finish_non_exhaustive()
    }
}

impl<R> Future for OffThread<R> {
    type Output = Result<R, TransportError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(error) = this.spawn_error.take() {
            return Poll::Ready(Err(TransportError::Io(error)));
        }
        let take = |shared: &Handoff<R>| {
            shared.result.lock().unwrap_or_else(PoisonError::into_inner).take().map(|result| {
                result
                    .map_err(|()| TransportError::Io(std::io::Error::other("the background thread panicked")))
            })
        };
        if let Some(result) = take(&this.shared) {
            return Poll::Ready(result);
        }
        if Instant::now() >= this.deadline {
            let waited_ms = u64::try_from(this.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            return Poll::Ready(Err(TransportError::DeadlineExceeded { what: this.what, waited_ms }));
        }
        this.shared.notifier.register(cx.waker());
        match &mut this.timer {
            Some(timer) => timer.update(cx.waker()),
            None => this.timer = Some(DeadlineTimer::new(this.deadline, cx.waker())),
        }
        match take(&this.shared) {
            Some(result) => Poll::Ready(result),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::block_on;

    #[test]
    fn busy_poll_never_registers_and_still_honours_the_deadline() {
        let notifier = Notifier::default();
        let deadline = Instant::now() + Duration::from_millis(5);
        let result = block_on(wait(&notifier, WaitMode::BusyPoll, deadline, "nothing", || Ok(None::<()>)));
        assert!(matches!(result, Err(TransportError::DeadlineExceeded { what: "nothing", .. })));
        assert!(!notifier.has_waiters());
    }

    #[test]
    fn an_attempt_error_ends_the_wait() {
        let notifier = Notifier::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        let result = block_on(wait(&notifier, WaitMode::Adaptive, deadline, "x", || {
            Err::<Option<()>, _>(TransportError::PeerGone("gone".into()))
        }));
        assert!(matches!(result, Err(TransportError::PeerGone(_))));
    }

    #[test]
    fn a_panic_off_thread_is_an_error_not_a_hang() {
        let result =
            block_on(off_thread("panics", "x", Instant::now() + Duration::from_secs(5), || -> u32 {
                panic!("boom")
            }));
        assert!(matches!(result, Err(TransportError::Io(_))), "{result:?}");
    }

    #[test]
    fn mode_cell_round_trips() {
        let cell = WaitModeCell::default();
        assert_eq!(cell.get(), WaitMode::Adaptive);
        cell.set(WaitMode::BusyPoll);
        assert_eq!(cell.get(), WaitMode::BusyPoll);
        assert!("spin".parse::<WaitMode>().is_err());
    }
}
