//! The lanes of one connection: workers of one context over one domain's regions.

use crate::engine::Engine;
use crate::notices::NoticeRing;
use crate::progress::Shared;
use crate::region::Region;
use crate::wire::MAX_REGIONS;
use crate::worker::Context;
use rdma_hint_backend_core::lanes::{Exposure, Lane, LeftLane};
use rdma_hint_backend_core::region_memory::MemorySource;
use rdma_hint_backend_core::{DomainCore, RegionTable};
use rdma_hint_core::{CallerMemory, Capabilities, MemoryKind, Refused, RegionId, TransportError};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

/// How long the last lane's drop waits for the peers of closed lanes to be seen to stop
/// before it leaks what they may still write rather than free it under them. A peer answers
/// a goodbye when its progress thread next looks at its socket, or once its own closing
/// lane's final flush is done (bounded at 2 s): longer than that.
const PEER_STOP_WAIT: Duration = Duration::from_secs(3);

impl Lane for Shared {
    /// The lane's engine: its posts take it before the region table's read lock.
    type Quiet<'a> = MutexGuard<'a, Engine>;

    fn quiet(&self) -> MutexGuard<'_, Engine> {
        self.engine()
    }

    /// A put or notice still in flight.
    fn busy(&self, engine: &mut MutexGuard<'_, Engine>) -> bool {
        engine.busy()
    }

    /// Unsignalled puts have no request to watch: flushed out (bounded) before an unmap.
    fn settle(&self, engine: &mut MutexGuard<'_, Engine>) {
        if let Err(e) = engine.flush_unsignalled() {
            tracing::debug!(error = %e, "ucx: flush before releasing a region failed");
        }
    }

    fn exposure(&self) -> &Exposure {
        &self.exposure
    }

    /// Until the peer is seen to stop: a lane whose own side failed still counts, since its
    /// endpoint is closed but a peer over shared memory writes without it.
    fn peer_may_write(&self) -> bool {
        !self.peer_stopped()
    }
}

/// The domain of one connection's lanes: the context their workers belong to and the regions
/// mapped in it (one id, one memory handle, one packed rkey on every lane). A lane that closed
/// while its peer was live leaves its exposure behind: over shared memory the peer writes the
/// regions directly, and keeps doing so until it has seen the goodbye.
#[derive(Debug)]
pub(crate) struct UcxDomain {
    pub(crate) core: DomainCore<Region, Shared>,
    /// The scope may carry shared memory, where a peer writes our regions itself; over TCP
    /// alone its puts land only through our worker, so a closed lane guards nothing.
    peer_writes_directly: bool,
    context: Arc<Context>,
}

impl UcxDomain {
    pub(crate) fn new(context: Arc<Context>, peer_writes_directly: bool, caps: &Capabilities) -> UcxDomain {
        let source = UcxMemory { context: context.clone() };
        let core = DomainCore::new(MAX_REGIONS, source, caps.caller_memory.clone());
        UcxDomain { core, peer_writes_directly, context }
    }

    /// Where its regions lie (address, length): this side's own memory, which the screen of a
    /// direct mapping refuses to take for the peer's.
    pub(crate) fn memory(&self) -> Vec<(u64, u64)> {
        self.core.regions().iter().map(|(_, region)| (region.address(0), region.len())).collect()
    }

    /// The context, for what must outlive a lane's transport (its notice ring).
    pub(crate) fn context_arc(&self) -> &Arc<Context> {
        &self.context
    }

    /// Whether UCX locks the context's own calls (memory maps, rkey packing); without it the
    /// group has one lane, whose engine lock serialises them with its worker's progress.
    pub(crate) fn thread_safe(&self) -> bool {
        self.context.thread_safe
    }

    /// `lane` closes: unless its peer has stopped already, the regions it exposed (and its
    /// notice ring, `ring`) stay guarded until the peer is seen to stop (its goodbye, or its
    /// socket closing).
    pub(crate) fn leave(&self, lane: &Shared, ring: Option<Arc<NoticeRing>>) {
        let exposed = lane.exposure.regions();
        // Until the lane is gone its worker may still land the peer's puts: it stays among
        // the open lanes (and guards its exposure there) while its transport drops.
        if !self.peer_writes_directly || exposed.is_empty() || lane.peer_stopped() {
            return;
        }
        let control = lane.control.get().cloned();
        // Nobody acts on the peer's requests any more: the channel reads on for its end.
        if let Some(control) = &control {
            control.stop_serving();
        }
        // Without the socket the regions stay guarded while the group lives, and are leaked,
        // not freed, when it goes.
        let still_writes = move || {
            control.as_ref().is_none_or(|control| !control.peer_left().is_some_and(|loss| loss.stopped))
        };
        let ring = ring.map(|ring| Box::new(ring) as Box<dyn Send>);
        self.core.lanes().leave(LeftLane::new(exposed, still_writes, ring));
    }
}

/// How the UCX backend makes region memory: `ucp_mem_map` in the lanes' context (host memory:
/// Debian's UCX is built without CUDA, GPU memory goes through the staged backend).
#[derive(Debug)]
struct UcxMemory {
    context: Arc<Context>,
}

impl MemorySource<Region> for UcxMemory {
    fn admit_kind(&self, kind: MemoryKind) -> Result<(), TransportError> {
        match kind {
            MemoryKind::Host => Ok(()),
            other => Err(TransportError::UnsupportedMemory { kind: other }),
        }
    }

    fn allocate(&self, _kind: MemoryKind, len: u64) -> Result<Region, TransportError> {
        Region::map(self.context.handle, len)
    }

    fn register_caller(&self, memory: CallerMemory) -> Result<Region, Refused> {
        Region::map_caller(self.context.handle, memory)
    }

    /// Without UCX's own lock on the context, its calls are serialised with the one lane's
    /// worker progress by that lane's engine lock.
    fn serialised(&self) -> bool {
        !self.context.thread_safe
    }

    /// Unmapped with every engine still held: on a context UCX does not lock, its only lane's
    /// progress must not run beside the unmap.
    fn remove(&self, table: &mut RegionTable<Region>, id: RegionId) -> Result<Region, TransportError> {
        let taken = table.remove(id)?;
        taken.unmap(self.context.handle);
        Ok(taken)
    }
}

impl Drop for UcxDomain {
    fn drop(&mut self) {
        // The last lane is gone: no put of ours reads a region any more, but the peer of a lane
        // that closed may still write what that lane exposed until it has seen the goodbye.
        let still = self.core.lanes_owned().settle_left(PEER_STOP_WAIT);
        // Its peer may still write a kept notice ring: freeing it would be heap corruption
        // where UCX allocated it from the heap.
        let mut leaked = still.kept.len();
        still.kept.into_iter().for_each(std::mem::forget);
        for (id, region) in self.core.regions_owned().drain() {
            if still.regions.contains(&id) {
                // Freed memory the peer still writes would be heap corruption; leaked memory is
                // bounded by the regions exposed to a peer that never said it stopped.
                leaked += 1;
                std::mem::forget(region);
            } else {
                region.unmap(self.context.handle);
            }
        }
        if leaked > 0 {
            tracing::warn!(
                regions = leaked,
                "ucx: a peer never said it stopped writing what was exposed to it; those regions are leaked, not freed"
            );
            // Cleaning the context up would free its memory maps under the peer as well.
            std::mem::forget(self.context.clone());
        }
    }
}
