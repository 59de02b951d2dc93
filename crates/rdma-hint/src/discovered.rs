//! The machine as discovery found it, once per process, for sync and async callers alike.
//!
//! Discovery (sysfs, and with `cuda` the CUDA driver's initialisation) takes ~30 ms without a
//! GPU driver and ~0.2 s with one (an H200 host). A sync caller runs it on its own thread; an async caller
//! ([`inventory`]) never does: the first one starts it on a thread of its own and every waiter
//! is woken when it ends. The lock is only ever held for a few field updates, never while
//! discovering, so no caller, sync or async, waits on it for long.

use crate::error::Error;
use crate::probe::{Inventory, ProbeOptions};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

struct Live {
    inventory: Option<Arc<Inventory>>,
    /// A discovery is running (on a sync caller's thread or a thread of its own).
    discovering: bool,
    /// Async callers waiting for it.
    waiters: Vec<Waker>,
    /// How the last discovery failed, for the first waiter to report (the others start again).
    failure: Option<Error>,
}

static LIVE: Mutex<Live> =
    Mutex::new(Live { inventory: None, discovering: false, waiters: Vec::new(), failure: None });
static DISCOVERED: Condvar = Condvar::new();

fn live() -> MutexGuard<'static, Live> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Publishes a discovery's outcome (the machine, or a failure for the waiters to report) and
/// wakes everyone who waits for it.
fn finish(inventory: Option<Arc<Inventory>>, failure: Option<Error>) {
    let waiters = {
        let mut live = live();
        live.discovering = false;
        live.inventory = inventory;
        live.failure = failure;
        std::mem::take(&mut live.waiters)
    };
    DISCOVERED.notify_all();
    for waiter in waiters {
        waiter.wake();
    }
}

/// Discovers the machine on this thread and publishes it; the caller reports a failure.
fn discover_here() -> Result<Arc<Inventory>, Error> {
    let outcome = Inventory::discover(&ProbeOptions::default()).map(Arc::new);
    finish(outcome.as_ref().ok().cloned(), None);
    outcome
}

/// Discovers the machine for the async waiters, who report a failure.
fn discover_for_waiters() {
    match Inventory::discover(&ProbeOptions::default()) {
        Ok(inventory) => finish(Some(Arc::new(inventory)), None),
        Err(error) => finish(None, Some(error)),
    }
}

/// The discovered machine, discovering it on this thread first if nobody has (blocks for as
/// long as discovery takes, or waits for the discovery another caller started).
pub(crate) fn inventory_blocking() -> Result<Arc<Inventory>, Error> {
    let mut live = live();
    loop {
        if let Some(inventory) = &live.inventory {
            return Ok(inventory.clone());
        }
        if !live.discovering {
            break;
        }
        live = DISCOVERED.wait(live).unwrap_or_else(PoisonError::into_inner);
    }
    live.discovering = true;
    drop(live);
    discover_here()
}

/// The discovered machine, without blocking the awaiting thread: discovery runs on a thread of
/// its own (started by the first caller) and wakes every waiter when it ends.
pub(crate) fn inventory() -> impl Future<Output = Result<Arc<Inventory>, Error>> {
    Discovered { waited: false }
}

struct Discovered {
    /// This future waited for a discovery (whose failure it may report).
    waited: bool,
}

impl Future for Discovered {
    type Output = Result<Arc<Inventory>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut live = live();
        if let Some(inventory) = &live.inventory {
            return Poll::Ready(Ok(inventory.clone()));
        }
        if !live.discovering {
            if self.waited {
                if let Some(failure) = live.failure.take() {
                    return Poll::Ready(Err(failure));
                }
            }
            live.discovering = true;
            live.failure = None;
            let started =
                std::thread::Builder::new().name("rdma-hint-discovery".into()).spawn(discover_for_waiters);
            if let Err(error) = started {
                live.discovering = false;
                return Poll::Ready(Err(Error::Transport(error.into())));
            }
        }
        if !live.waiters.iter().any(|waiter| waiter.will_wake(cx.waker())) {
            live.waiters.push(cx.waker().clone());
        }
        self.waited = true;
        Poll::Pending
    }
}

/// Forgets the discovered machine (the next caller discovers it again).
pub(crate) fn forget() {
    let mut live = live();
    live.inventory = None;
    live.failure = None;
}
