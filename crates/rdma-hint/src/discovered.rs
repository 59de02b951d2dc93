//! The machine as discovery found it, once per process, for sync and async callers alike.
//!
//! Discovery (sysfs, and with `cuda` the CUDA driver's initialisation) takes ~30 ms without a
//! GPU driver and ~0.2 s with one (an H200 host). A sync caller runs it on its own thread; an
//! async caller ([`inventory`]) never does: the first one starts it on a thread of its own and
//! every waiter is woken when it ends. The lock is only ever held for a few field updates, never
//! while discovering, so no caller, sync or async, waits on it for long.
//!
//! Each discovery belongs to a generation: a [`forget`] (`rdma_hint::probing::refresh`) starts a new one,
//! so a discovery that began before it is not published after it; a discovery that fails (or
//! panics) tells every caller that waited for it, not only the first.

use crate::error::Error;
use crate::probe::{Inventory, ProbeOptions};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long a blocking caller waits for a discovery another caller started (one takes ~0.2 s
/// at most on the machines measured) before it answers an error instead.
const DISCOVERY_WAIT: Duration = Duration::from_secs(60);

struct Live {
    inventory: Option<Arc<Inventory>>,
    /// Bumped by every discovery started and every refresh.
    generation: u64,
    /// A discovery of the current generation is running.
    discovering: bool,
    /// Async callers waiting for it.
    waiters: Vec<Waker>,
    /// How the discovery of a generation failed, for everyone who waited for it.
    failure: Option<(u64, String)>,
}

static LIVE: Mutex<Live> = Mutex::new(Live {
    inventory: None,
    generation: 0,
    discovering: false,
    waiters: Vec::new(),
    failure: None,
});
static DISCOVERED: Condvar = Condvar::new();

fn live() -> MutexGuard<'static, Live> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Live {
    /// Marks a discovery started; returns its generation.
    fn start(&mut self) -> u64 {
        self.generation += 1;
        self.discovering = true;
        self.failure = None;
        self.generation
    }

    /// The failure of the discovery `waited_on`, if that one failed.
    fn failure_of(&self, waited_on: Option<u64>) -> Option<Error> {
        match (&self.failure, waited_on) {
            (Some((failed, why)), Some(waited)) if *failed == waited => {
                Some(Error::DiscoveryFailed { why: why.clone() })
            }
            _ => None,
        }
    }
}

/// Wakes every waiter (they look at the state again).
fn wake_all(waiters: Vec<Waker>) {
    DISCOVERED.notify_all();
    for waiter in waiters {
        waiter.wake();
    }
}

/// Publishes the outcome of the discovery of `generation` (unless a refresh came since) and
/// wakes everyone who waits.
fn finish(generation: u64, outcome: Result<Arc<Inventory>, String>) {
    let waiters = {
        let mut live = live();
        if live.generation == generation {
            live.discovering = false;
            match outcome {
                Ok(inventory) => live.inventory = Some(inventory),
                Err(why) => live.failure = Some((generation, why)),
            }
        }
        std::mem::take(&mut live.waiters)
    };
    wake_all(waiters);
}

/// Publishes a failure if the discovery of `generation` unwinds before it finished, so nobody
/// waits for it forever.
struct Unfinished(Option<u64>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(generation) = self.0.take() {
            finish(generation, Err("discovery panicked".into()));
        }
    }
}

/// Runs the discovery of `generation` on this thread and publishes it; returns its own outcome.
fn discover(generation: u64) -> Result<Arc<Inventory>, Error> {
    let mut unfinished = Unfinished(Some(generation));
    let outcome = Inventory::discover(&ProbeOptions::default()).map(Arc::new);
    unfinished.0 = None;
    finish(generation, outcome.as_ref().map(Arc::clone).map_err(|error| error.to_string()));
    outcome
}

/// The discovered machine, discovering it on this thread first if nobody has (blocks for as
/// long as discovery takes), or waiting at most [`DISCOVERY_WAIT`] for the discovery another
/// caller started.
pub(crate) fn inventory_blocking() -> Result<Arc<Inventory>, Error> {
    let started = Instant::now();
    let mut live = live();
    let mut waited_on = None;
    loop {
        if let Some(inventory) = &live.inventory {
            return Ok(inventory.clone());
        }
        if let Some(failure) = live.failure_of(waited_on) {
            return Err(failure);
        }
        if !live.discovering {
            break;
        }
        waited_on = Some(live.generation);
        let waited = started.elapsed();
        if waited >= DISCOVERY_WAIT {
            return Err(Error::DiscoveryFailed {
                why: format!("another caller's discovery did not finish within {} s", waited.as_secs()),
            });
        }
        live =
            DISCOVERED.wait_timeout(live, DISCOVERY_WAIT - waited).unwrap_or_else(PoisonError::into_inner).0;
    }
    let generation = live.start();
    drop(live);
    discover(generation)
}

/// The discovered machine, without blocking the awaiting thread: discovery runs on a thread of
/// its own (started by the first caller) and wakes every waiter when it ends.
pub(crate) fn inventory() -> impl Future<Output = Result<Arc<Inventory>, Error>> {
    Discovered { waited_on: None }
}

struct Discovered {
    /// The generation of the discovery this future waits for.
    waited_on: Option<u64>,
}

impl Future for Discovered {
    type Output = Result<Arc<Inventory>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut live = live();
        if let Some(inventory) = &live.inventory {
            return Poll::Ready(Ok(inventory.clone()));
        }
        if let Some(failure) = live.failure_of(self.waited_on) {
            return Poll::Ready(Err(failure));
        }
        if !live.discovering {
            let generation = live.start();
            let started = std::thread::Builder::new().name("rdma-hint-discovery".into()).spawn(move || {
                let _ = discover(generation);
            });
            if let Err(error) = started {
                live.discovering = false;
                return Poll::Ready(Err(Error::Transport(error.into())));
            }
        }
        if !live.waiters.iter().any(|waiter| waiter.will_wake(cx.waker())) {
            live.waiters.push(cx.waker().clone());
        }
        self.waited_on = Some(live.generation);
        Poll::Pending
    }
}

/// Forgets the discovered machine: the next caller discovers it again, and a discovery still
/// running (which read the machine before this) is not published.
pub(crate) fn forget() {
    let waiters = {
        let mut live = live();
        live.generation += 1;
        live.inventory = None;
        live.discovering = false;
        live.failure = None;
        std::mem::take(&mut live.waiters)
    };
    wake_all(waiters);
}

/// Forgets the discovered machine so the next call reads sysfs and the drivers again (after a
/// driver or firmware update, hot-plug). Cached hints whose versions changed are recomputed.
pub fn refresh() {
    forget();
}
