//! A blocking API for callers without an async runtime: [`BlockingTransport`] adds
//! `*_blocking` twins of the async [`Transport`] methods, run on the calling thread by
//! [`block_on`], which parks the thread until the transport's event wakes it (no spinning
//! beyond the transport's own [`WaitMode`](rdma_hint_core::WaitMode)).

use rdma_hint_core::{Arrival, Completion, PeerEndpoint, RegionId, RemoteRegion, Transport, TransportError};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

struct Unparker(Thread);

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    /// One waker per thread, made on first use: later calls allocate nothing.
    static THREAD_WAKER: Waker = Waker::from(Arc::new(Unparker(std::thread::current())));
}

/// A waker that unparks the calling thread: for a thread that polls futures itself and parks
/// in between (the same one [`block_on`] uses; no allocation after the first call).
pub fn thread_waker() -> Waker {
    THREAD_WAKER.with(Waker::clone)
}

/// Runs `future` to completion on the calling thread, parking it while the future waits.
/// Allocates nothing after its first call on a thread.
///
/// Meant for blocking callers of rdma-hint's own futures; inside an async runtime, `.await`
/// them instead.
///
/// ```
/// let answer = rdma_hint_backend_core::blocking::block_on(async { 6 * 7 });
/// assert_eq!(answer, 42);
/// ```
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    // The thread's waker lent, not cloned: a clone and its drop are two locked instructions
    // on a path that may take well under a microsecond in all.
    THREAD_WAKER.with(|waker| {
        let mut context = Context::from_waker(waker);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
                return output;
            }
            // A wake that came before the park leaves its token: the park returns at once.
            std::thread::park();
        }
    })
}

/// Blocking twins of the async [`Transport`] methods, for every transport.
///
/// ```
/// use rdma_hint_backend_core::blocking::BlockingTransport;
/// use rdma_hint_core::{Completion, Transport};
/// use std::time::{Duration, Instant};
///
/// fn drain_one(transport: &dyn Transport) -> usize {
///     let mut out = [Completion::EMPTY; 16];
///     let deadline = Instant::now() + Duration::from_secs(1);
///     transport.wait_completions_blocking(&mut out, deadline).unwrap_or(0)
/// }
/// ```
pub trait BlockingTransport: Transport {
    /// [`Transport::connect`], blocking the calling thread.
    fn connect_blocking(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        block_on(self.connect(peer, expose, deadline))
    }

    /// [`Transport::expose`], blocking the calling thread.
    fn expose_blocking(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        block_on(self.expose(region, deadline))
    }

    /// [`Transport::withdraw`], blocking the calling thread.
    fn withdraw_blocking(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        block_on(self.withdraw(region, deadline))
    }

    /// [`Transport::wait_completions`], blocking the calling thread.
    fn wait_completions_blocking(
        &self,
        out: &mut [Completion],
        deadline: Instant,
    ) -> Result<usize, TransportError> {
        block_on(self.wait_completions(out, deadline))
    }

    /// [`Transport::wait_arrivals`], blocking the calling thread.
    fn wait_arrivals_blocking(
        &self,
        out: &mut [Arrival],
        deadline: Instant,
    ) -> Result<usize, TransportError> {
        block_on(self.wait_arrivals(out, deadline))
    }
}

impl<T: Transport + ?Sized> BlockingTransport for T {}
