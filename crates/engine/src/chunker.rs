//! The engine's scheduler for one borrowed transport, driven by the caller's own task.

use crate::engine::scheduler::{Event, LaneConfig, LinkId, Poster, Scheduler};
use crate::engine::{Delivered, EngineConfig, TransferId, TransferRequest, MAX_TRANSFERS};
use crate::error::{PlanError, TransferError};
use crate::plan::BlockSpec;
use crate::policy::PostPolicy;
use rdma_hint_core::{
    Capabilities, Completion, MemoryKind, RegionId, Transport, TransportError, MAX_OPS_PER_POST,
};
use rdma_hint_core::{SizeHint, SourceId};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The engine for one transport the caller lends it for each transfer: the same scheduler,
/// request, result and error as [`Engine`](crate::Engine), with no thread and no peer to add.
///
/// A transfer is cut at the hint of its source (the one
/// [`TransferRequest::from_source`] names, else the local region's device: host regions take
/// the configured NUMA node's, CUDA regions their GPU's), posted `wrs_per_doorbell` work
/// requests a doorbell with at most `window` outstanding, and retired by its completions, all
/// inside [`transfer`](Chunker::transfer): the transfer runs while the caller awaits it. Writes and
/// reads, single or scattered, announced or not. Posting and polling allocate nothing.
pub struct Chunker {
    sched: Scheduler,
    policy: PostPolicy,
    /// Room for a window of completions, polled into.
    completions: Vec<Completion>,
    /// The specs as set, before the latency-first fraction shrinks them.
    hints: BTreeMap<SourceId, BlockSpec>,
    latency_first: Option<f64>,
    /// The transfer a `transfer` call runs, until it hands out its result: set still at the
    /// next call only if the caller dropped that call's future mid-way.
    running: Option<TransferId>,
}

impl std::fmt::Debug for Chunker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunker").field("policy", &self.policy).field("hints", &self.hints).finish()
    }
}

/// The chunker's one lane.
const LINK: LinkId = LinkId { peer: 0, lane: 0 };
/// How long a transfer runs without waiting before it yields to its executor once.
const YIELD_AFTER: Duration = Duration::from_micros(200);

impl Chunker {
    /// A chunker with no hints yet, posting with `policy` fitted to `caps` (the transport's
    /// it will be lent).
    pub fn new(policy: PostPolicy, caps: &Capabilities) -> Result<Chunker, TransferError> {
        policy.validate()?;
        let policy = policy.fitted_to(caps);
        policy.validate()?;
        // What the engine checks of its policy, after fitting: a transport may claim more.
        if policy.wrs_per_doorbell as usize > MAX_OPS_PER_POST || policy.window >= MAX_TRANSFERS {
            return Err(PlanError::InvalidPolicy(format!(
                "{} work requests per doorbell (at most {MAX_OPS_PER_POST}) and a window of {} (below {MAX_TRANSFERS})",
                policy.wrs_per_doorbell, policy.window
            ))
            .into());
        }
        let lanes = LaneConfig {
            policy,
            // The window alone bounds what is in flight: one transfer at a time has the lane.
            bytes_in_flight: u64::MAX,
            queue_time: Duration::MAX,
            gather_entries: crate::engine::scheduler::MAX_PIECES,
        };
        let now = Instant::now();
        // A slot per request the window holds, and one: a transfer that ended early (its
        // deadline) keeps its slot while its posted blocks retire, the next one still has one.
        // The engine's stall watch: requests the transport never answers (its connection was
        // replaced, say) cannot hold the window for ever; the lane is lost, and revived at the
        // next transfer.
        let stall = EngineConfig::default().lane_stall;
        let mut sched = Scheduler::new(policy.window + 1, lanes, stall, false, now);
        sched.add_peer(&[caps], &[], now).map_err(TransferError::Refused)?;
        let completions = vec![Completion::EMPTY; policy.window as usize];
        Ok(Chunker { sched, policy, completions, hints: BTreeMap::new(), latency_first: None, running: None })
    }

    /// Sets the block spec for one source.
    pub fn set_hint(&mut self, source: SourceId, spec: BlockSpec) {
        self.hints.insert(source, spec);
        self.sched.set_hint(source, None, self.shrunk(spec));
    }

    /// Sets the block spec of `hint.source` from the hint.
    pub fn set_size_hint(&mut self, hint: &SizeHint) -> Result<(), TransferError> {
        self.set_hint(hint.source, BlockSpec::from_hint(hint)?);
        Ok(())
    }

    /// Which NUMA node host regions belong to (node 0 unless set).
    pub fn set_host_node(&mut self, node: u32) {
        self.sched.set_host_node(node);
    }

    /// Latency-first traffic: shrink every block to `fraction` of its hint (see
    /// [`BlockSpec::shrunk`]); `None` takes the full hint.
    pub fn set_latency_first(&mut self, fraction: Option<f64>) {
        self.latency_first = fraction;
        for (source, spec) in &self.hints {
            self.sched.set_hint(*source, None, self.latency_first.map_or(*spec, |f| spec.shrunk(f)));
        }
    }

    fn shrunk(&self, spec: BlockSpec) -> BlockSpec {
        self.latency_first.map_or(spec, |fraction| spec.shrunk(fraction))
    }

    /// The posting policy in use (after fitting to the transport).
    pub fn policy(&self) -> PostPolicy {
        self.policy
    }

    /// Moves `request` over `transport` (the one whose capabilities the chunker was built
    /// for) and returns when every block is confirmed, or with the error that stopped it and
    /// the bytes confirmed before it. `request.remote` is any region the peer exposed.
    pub async fn transfer<T: Transport + ?Sized>(
        &mut self,
        transport: &T,
        mut request: TransferRequest,
        deadline: Instant,
    ) -> Result<Delivered, TransferError> {
        // A call whose future was dropped mid-way left its transfer queued: none of its
        // blocks is posted from here (its source is no longer held), and its slot frees as
        // those already posted retire.
        if let Some(abandoned) = self.running.take() {
            self.sched.cancel(abandoned);
            let _ = self.sched.collect(abandoned);
        }
        // A lane a failed completion took down lives again: the transport says at its next
        // post whether it still can.
        self.sched.revive_link(LINK);
        self.sched.set_remote(LINK.peer, std::slice::from_ref(&request.remote));
        let admitted = self.sched.admit(LINK.peer, &mut request)?;
        // Held until this returns or is dropped: the source can be neither released nor its
        // id reused for other memory while blocks of it are still to be posted.
        let _held = SourceHold::take(transport, request.local.id)
            .map_err(|source| TransferError::Transport { source, confirmed_bytes: 0 })?;
        let now = Instant::now();
        let id = self.sched.queue(admitted, request, deadline, now);
        self.running = Some(id);
        let mut slice_start = now;
        loop {
            let now = Instant::now();
            let mut worked = self.post(transport, now);
            worked |= self.poll(transport, now);
            self.sched.handle_timeout(now);
            // The call holds the source itself; ends and room concern no one else here.
            while let Some(Event::Ended { .. } | Event::Room | Event::Unhold { .. }) = self.sched.poll_event()
            {
            }
            if let Some(result) = self.sched.collect(id) {
                self.running = None;
                return result;
            }
            if worked {
                if now.duration_since(slice_start) >= YIELD_AFTER {
                    // A transport whose completions are always ready never waits: a long
                    // transfer does not starve the other tasks on its thread.
                    yield_now().await;
                    slice_start = Instant::now();
                }
                continue;
            }
            let until = self.sched.next_timeout().map_or(deadline, |at| at.min(deadline));
            let waited = transport.wait_completions(&mut self.completions, until).await;
            slice_start = Instant::now();
            match waited {
                Ok(ready) => {
                    self.sched.handle_completions(LINK, &self.completions[..ready], slice_start);
                }
                // The scheduler's timeout ends the transfer at its deadline.
                Err(TransportError::DeadlineExceeded { .. }) => {}
                Err(error) => self.sched.lose_link(LINK, error),
            }
        }
    }

    /// Rings every doorbell the lane has room for; whether any rang.
    fn post<T: Transport + ?Sized>(&mut self, transport: &T, now: Instant) -> bool {
        let mut rang = false;
        while let Some(mut doorbell) = self.sched.next_doorbell_for(LINK.peer, Poster::Driver, now) {
            let rung = doorbell.post_on(transport);
            self.sched.finish_doorbell(doorbell, rung);
            rang = true;
        }
        rang
    }

    /// Retires what completed; whether anything completed (a late completion of a transfer
    /// that ended early retires nothing of this one, and more may be ready behind it) or the
    /// lane failed.
    fn poll<T: Transport + ?Sized>(&mut self, transport: &T, now: Instant) -> bool {
        if !self.sched.has_in_flight(LINK) {
            return false;
        }
        match transport.poll_completions(&mut self.completions) {
            Ok(ready) => {
                self.sched.handle_completions(LINK, &self.completions[..ready], now);
                ready > 0
            }
            Err(error) => {
                self.sched.lose_link(LINK, error);
                true
            }
        }
    }

    /// [`transfer`](Chunker::transfer), blocking the calling thread (for callers without an async
    /// runtime; the thread parks while the transport waits).
    pub fn transfer_blocking<T: Transport + ?Sized>(
        &mut self,
        transport: &T,
        request: TransferRequest,
        deadline: Instant,
    ) -> Result<Delivered, TransferError> {
        rdma_hint_backend_core::blocking::block_on(self.transfer(transport, request, deadline))
    }

    /// The source a region of `kind` belongs to (`None` for dma-buf regions, whose device the
    /// chunker cannot know: name it with [`TransferRequest::from_source`]).
    pub fn source_of(&self, kind: MemoryKind) -> Option<SourceId> {
        match kind {
            MemoryKind::Host => Some(SourceId::Host(self.sched.host_node())),
            MemoryKind::CudaDevice { ordinal } => Some(SourceId::Gpu(ordinal)),
            MemoryKind::DmaBuf => None,
        }
    }
}

/// Returns `Pending` once (waking itself first), so the executor runs other tasks.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

/// A transfer's hold on its source region ([`Transport::hold`]), ended when dropped.
struct SourceHold<'t, T: Transport + ?Sized> {
    transport: &'t T,
    region: RegionId,
}

impl<'t, T: Transport + ?Sized> SourceHold<'t, T> {
    fn take(transport: &'t T, region: RegionId) -> Result<Self, TransportError> {
        transport.hold(region)?;
        Ok(SourceHold { transport, region })
    }
}

impl<T: Transport + ?Sized> Drop for SourceHold<'_, T> {
    fn drop(&mut self) {
        self.transport.unhold(self.region);
    }
}
