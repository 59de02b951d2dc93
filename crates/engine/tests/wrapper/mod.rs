//! A lane over the loopback that can be made to misbehave: stop answering, hold its posts at a
//! gate, break, find its queue full now and then, or record who polled it.

use rdma_hint_core::{Arrival, PeerEndpoint, RegionId, RemoteRegion, Transport};
use rdma_hint_engine::LoopbackTransport;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A lane over the loopback that passes its capabilities through (`max_sges` 32) but not its
/// gathers (the trait's default takes one-entry gathers only), as a careless wrapper would;
/// when `silent`, a lane whose peer stops answering: posts land (the loopback copies them)
/// but no completion ever comes back, as from a peer that stalls without closing.
pub(crate) struct Wrapper {
    pub(crate) inner: LoopbackTransport,
    pub(crate) silent: bool,
    pub(crate) gate: Option<Arc<Gate>>,
    pub(crate) pollers: Option<Arc<Pollers>>,
}

impl Wrapper {
    /// A fresh loopback lane whose posts wait at `gate`.
    pub(crate) fn gated(gate: &Arc<Gate>) -> Wrapper {
        Wrapper { inner: LoopbackTransport::new(256), silent: false, gate: Some(gate.clone()), pollers: None }
    }
}

/// Which threads polled a [`Wrapper`]'s completions while `recording`.
#[derive(Default)]
pub(crate) struct Pollers {
    pub(crate) recording: std::sync::atomic::AtomicBool,
    pub(crate) threads: std::sync::Mutex<Vec<std::thread::ThreadId>>,
}

/// Holds a [`Wrapper`]'s posts until opened, and breaks its completions on demand: a doorbell
/// still ringing outside the engine's lock while the lane fails.
#[derive(Default)]
pub(crate) struct Gate {
    /// Posts that pass before the gate closes.
    pub(crate) passes: std::sync::atomic::AtomicU32,
    pub(crate) open: std::sync::Mutex<bool>,
    pub(crate) opened: std::sync::Condvar,
    pub(crate) waiting: std::sync::atomic::AtomicBool,
    pub(crate) broken: std::sync::atomic::AtomicBool,
    /// Every this many posts answers `QueueFull` and moves nothing (0: none does), as a
    /// transport whose queue (or its peer's) is full now and then.
    pub(crate) full_every: std::sync::atomic::AtomicU32,
    pub(crate) posts: std::sync::atomic::AtomicU32,
}

impl Gate {
    pub(crate) fn pass(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.passes.fetch_update(SeqCst, SeqCst, |left| left.checked_sub(1)).is_ok() {
            return;
        }
        self.waiting.store(true, SeqCst);
        let open = self.open.lock().unwrap();
        let _open = self.opened.wait_timeout_while(open, Duration::from_secs(20), |open| !*open).unwrap();
    }

    /// Whether this post finds the queue full (see `full_every`).
    pub(crate) fn full_now(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let every = self.full_every.load(SeqCst);
        every > 0 && self.posts.fetch_add(1, SeqCst) % every == every - 1
    }

    pub(crate) fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

#[async_trait::async_trait]
impl Transport for Wrapper {
    fn domain(&self) -> &dyn rdma_hint_core::Domain {
        self.inner.domain()
    }
    fn capabilities(&self) -> &rdma_hint_core::Capabilities {
        self.inner.capabilities()
    }
    fn bind(
        &self,
        address: std::net::SocketAddr,
    ) -> Result<std::net::SocketAddr, rdma_hint_core::TransportError> {
        self.inner.bind(address)
    }
    fn set_wait_mode(&self, mode: rdma_hint_core::WaitMode) {
        self.inner.set_wait_mode(mode)
    }
    fn wait_mode(&self) -> rdma_hint_core::WaitMode {
        self.inner.wait_mode()
    }
    async fn connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, rdma_hint_core::TransportError> {
        self.inner.connect(peer, expose, deadline).await
    }
    async fn expose(
        &self,
        region: RegionId,
        deadline: Instant,
    ) -> Result<(), rdma_hint_core::TransportError> {
        self.inner.expose(region, deadline).await
    }
    async fn withdraw(
        &self,
        region: RegionId,
        deadline: Instant,
    ) -> Result<(), rdma_hint_core::TransportError> {
        self.inner.withdraw(region, deadline).await
    }
    fn peer_regions(&self) -> Vec<rdma_hint_core::RemoteRegion> {
        self.inner.peer_regions()
    }
    fn post_writes(&self, ops: &[rdma_hint_core::WriteOp]) -> Result<(), rdma_hint_core::TransportError> {
        if let Some(gate) = &self.gate {
            if gate.full_now() {
                return Err(rdma_hint_core::TransportError::QueueFull { given: ops.len() as u32, max: 0 });
            }
            gate.pass();
        }
        self.inner.post_writes(ops)
    }
    fn post_reads(&self, ops: &[rdma_hint_core::ReadOp]) -> Result<(), rdma_hint_core::TransportError> {
        self.inner.post_reads(ops)
    }
    fn poll_completions(
        &self,
        out: &mut [rdma_hint_core::Completion],
    ) -> Result<usize, rdma_hint_core::TransportError> {
        if let Some(pollers) =
            self.pollers.as_ref().filter(|p| p.recording.load(std::sync::atomic::Ordering::SeqCst))
        {
            pollers.threads.lock().unwrap().push(std::thread::current().id());
        }
        if self.silent {
            return Ok(0);
        }
        if self.gate.as_ref().is_some_and(|gate| gate.broken.load(std::sync::atomic::Ordering::SeqCst)) {
            return Err(rdma_hint_core::TransportError::PeerGone("the gate broke the lane".into()));
        }
        self.inner.poll_completions(out)
    }
    async fn wait_completions(
        &self,
        out: &mut [rdma_hint_core::Completion],
        deadline: Instant,
    ) -> Result<usize, rdma_hint_core::TransportError> {
        if !self.silent {
            return self.inner.wait_completions(out, deadline).await;
        }
        Err(rdma_hint_core::TransportError::DeadlineExceeded {
            what: "a completion",
            waited_ms: deadline.saturating_duration_since(Instant::now()).as_millis() as u64,
        })
    }
    fn poll_arrivals(&self, out: &mut [Arrival]) -> Result<usize, rdma_hint_core::TransportError> {
        self.inner.poll_arrivals(out)
    }
    async fn wait_arrivals(
        &self,
        out: &mut [Arrival],
        deadline: Instant,
    ) -> Result<usize, rdma_hint_core::TransportError> {
        self.inner.wait_arrivals(out, deadline).await
    }
}
