//! Deadline wake-ups without an async runtime: one lazily started thread sleeps until the
//! earliest registered deadline and wakes the task that registered it.
//!
//! Waits in rdma-hint register their deadline here when they go to sleep, so a wait that
//! nothing completes still returns [`DeadlineExceeded`](rdma_hint_core::TransportError::DeadlineExceeded)
//! on time under any executor (tokio, smol, [`block_on`](crate::blocking::block_on)).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::task::Waker;
use std::time::Instant;

type Key = (Instant, u64);

#[derive(Default)]
struct Timers {
    pending: Mutex<BTreeMap<Key, Waker>>,
    changed: Condvar,
    next_id: AtomicU64,
}

fn timers() -> &'static Timers {
    static TIMERS: OnceLock<&'static Timers> = OnceLock::new();
    TIMERS.get_or_init(|| {
        let timers: &'static Timers = Box::leak(Box::default());
        // Without the thread a sleeping wait would only see its deadline when something else
        // wakes it: say so loudly (spawning a thread failing means the process is in trouble).
        if let Err(e) = std::thread::Builder::new().name("rdma-hint-timer".into()).spawn(move || run(timers))
        {
            tracing::error!(error = %e, "rdma-hint: cannot start the deadline timer thread");
        }
        timers
    })
}

fn run(timers: &Timers) {
    let mut due: Vec<Waker> = Vec::new();
    let mut pending = timers.pending.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let now = Instant::now();
        while let Some(entry) = pending.first_entry() {
            if entry.key().0 > now {
                break;
            }
            due.push(entry.remove());
        }
        if !due.is_empty() {
            // Woken (and possibly dropped) without the lock: a task that drops a wait inside its
            // waker must be able to cancel its own timer.
            drop(pending);
            due.drain(..).for_each(Waker::wake);
            pending = timers.pending.lock().unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        pending = match pending.first_key_value().map(|(key, _)| key.0) {
            Some(at) => {
                let timeout = at.saturating_duration_since(Instant::now());
                timers.changed.wait_timeout(pending, timeout).unwrap_or_else(PoisonError::into_inner).0
            }
            None => timers.changed.wait(pending).unwrap_or_else(PoisonError::into_inner),
        };
    }
}

/// Starts the process's timer thread now if no wait has yet (it starts on first use and then
/// lives as long as the process; one thread, whatever the number of transports).
pub fn ensure_started() {
    timers();
}

/// A registered deadline wake-up; dropping it cancels the wake-up.
///
/// ```
/// use rdma_hint_backend_core::timer::DeadlineTimer;
/// use std::time::{Duration, Instant};
///
/// let deadline = Instant::now() + Duration::from_millis(20);
/// let timer = DeadlineTimer::new(deadline, std::task::Waker::noop());
/// drop(timer); // cancelled: nothing is woken
/// ```
#[derive(Debug)]
pub struct DeadlineTimer {
    key: Key,
}

impl DeadlineTimer {
    /// Wakes `waker` once `deadline` has passed (at once if it already has).
    pub fn new(deadline: Instant, waker: &Waker) -> DeadlineTimer {
        let timers = timers();
        let key = (deadline, timers.next_id.fetch_add(1, Ordering::Relaxed));
        let mut pending = timers.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let earliest = pending.first_key_value().is_none_or(|(first, _)| key < *first);
        pending.insert(key, waker.clone());
        drop(pending);
        if earliest {
            timers.changed.notify_one();
        }
        DeadlineTimer { key }
    }

    /// Replaces the waker to wake (a task moved to another executor thread).
    pub fn update(&mut self, waker: &Waker) {
        let mut pending = timers().pending.lock().unwrap_or_else(PoisonError::into_inner);
        let replaced = match pending.get_mut(&self.key) {
            Some(registered) if registered.will_wake(waker) => None,
            Some(registered) => Some(std::mem::replace(registered, waker.clone())),
            // Already fired: arm again so the new waker is not lost.
            None => pending.insert(self.key, waker.clone()),
        };
        drop(pending);
        // Dropped without the lock (see `run`).
        drop(replaced);
    }
}

impl Drop for DeadlineTimer {
    fn drop(&mut self) {
        let removed = timers().pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.key);
        // Dropped without the lock (see `run`).
        drop(removed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn fires_after_the_deadline_and_not_when_cancelled() {
        let fired = Arc::new(Flag(false.into()));
        let cancelled = Arc::new(Flag(false.into()));
        let deadline = Instant::now() + Duration::from_millis(30);
        let _armed = DeadlineTimer::new(deadline, &Waker::from(fired.clone()));
        drop(DeadlineTimer::new(deadline, &Waker::from(cancelled.clone())));
        assert!(!fired.0.load(Ordering::SeqCst));
        let started = Instant::now();
        while !fired.0.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(fired.0.load(Ordering::SeqCst), "the timer never fired");
        assert!(Instant::now() >= deadline);
        assert!(!cancelled.0.load(Ordering::SeqCst), "a cancelled timer fired");
    }
}
