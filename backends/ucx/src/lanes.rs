//! The lanes of one connection: workers of one context over one region table.

use crate::engine::{Engine, NoticeRing};
use crate::progress::Shared;
use crate::region::Region;
use crate::wire::MAX_REGIONS;
use crate::worker::Context;
use rdma_hint_core::RegionId;
use rdma_hint_oob::peer_left;
use rdma_hint_backend_core::RegionTable;
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

/// How long the last lane's drop waits for the peers of closed lanes to be seen to stop
/// before it leaks what they may still write rather than free it under them. A peer answers
/// a goodbye when its progress thread next looks at its socket, or once its own closing
/// lane's final flush is done (bounded at 2 s): longer than that.
const PEER_STOP_WAIT: Duration = Duration::from_secs(3);

/// What the lanes of one connection share: the context their workers belong to, the regions
/// mapped in it (one id, one memory handle, one packed rkey on every lane) and a view of each
/// live lane, so a region is busy while a put of any lane may read it or the peer of any lane
/// may write it. A lane that closed while its peer was live leaves its exposure behind: over
/// shared memory the peer writes the regions directly, and keeps doing so until it has seen
/// the goodbye.
#[derive(Debug)]
pub(crate) struct LaneGroup {
    pub(crate) regions: RwLock<RegionTable<Region>>,
    lanes: Mutex<Vec<Weak<Shared>>>,
    left: Mutex<Vec<LeftLane>>,
    /// The scope may carry shared memory, where a peer writes our regions itself; over TCP
    /// alone its puts land only through our worker, so a closed lane guards nothing.
    peer_writes_directly: bool,
    context: Arc<Context>,
}

/// What a closed lane leaves behind while its peer may still write: the regions its connect
/// exposed, its notice ring, and its out-of-band socket, which tells when that peer has
/// stopped.
#[derive(Debug)]
struct LeftLane {
    exposed: Vec<RegionId>,
    /// Freed (unmapped) with the lane once its peer stopped; leaked with the regions if never.
    ring: Option<Arc<NoticeRing>>,
    /// `None` when the socket could not be kept: the regions then stay guarded while the
    /// group lives, and are leaked, not freed, when it goes.
    oob: Option<TcpStream>,
}

impl LeftLane {
    fn peer_may_write(&self) -> bool {
        self.oob.as_ref().is_none_or(|oob| !peer_left(oob).is_some_and(|loss| loss.stopped))
    }
}

/// The lanes of a group at one moment, with the group's membership held: no lane joins (and
/// so none exposes a region or posts a put) until this is dropped.
pub(crate) struct Members<'a> {
    _joins: MutexGuard<'a, Vec<Weak<Shared>>>,
    lanes: Vec<Arc<Shared>>,
}

impl LaneGroup {
    pub(crate) fn new(context: Arc<Context>, peer_writes_directly: bool) -> LaneGroup {
        LaneGroup {
            regions: RwLock::new(RegionTable::new(MAX_REGIONS)),
            lanes: Mutex::default(),
            left: Mutex::default(),
            peer_writes_directly,
            context,
        }
    }

    /// The context every lane's worker and every region belongs to.
    pub(crate) fn context(&self) -> rdma_hint_ucx_sys::ucp_context_h {
        self.context.handle
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

    /// Enters `lane` in the group.
    pub(crate) fn join(&self, lane: &Arc<Shared>) {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        lanes.retain(|open| open.strong_count() > 0);
        lanes.push(Arc::downgrade(lane));
    }

    /// The lanes still open, in the order they joined (the order their engines are locked in,
    /// so two lanes releasing regions at once cannot deadlock), with joins held off.
    pub(crate) fn members(&self) -> Members<'_> {
        let joins = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        let lanes = joins.iter().filter_map(Weak::upgrade).collect();
        Members { _joins: joins, lanes }
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
        let oob = lane.oob.get().and_then(|stream| match stream.try_clone() {
            Ok(oob) => Some(oob),
            Err(e) => {
                tracing::warn!(error = %e, "ucx: a closing lane's regions stay guarded until the connection ends");
                None
            }
        });
        self.left.lock().unwrap_or_else(PoisonError::into_inner).push(LeftLane { exposed, ring, oob });
    }

    /// Whether the peer of a closed lane may still write `region`.
    fn left_peer_may_write(&self, region: RegionId) -> bool {
        let mut left = self.left.lock().unwrap_or_else(PoisonError::into_inner);
        left.retain(LeftLane::peer_may_write);
        left.iter().any(|lane| lane.exposed.contains(&region))
    }
}

/// Every lane's engine, locked in the group's order; nothing posts while they are held, and
/// no lane joins while the [`Members`] they come from live.
pub(crate) struct Locked<'a> {
    group: &'a LaneGroup,
    lanes: &'a [Arc<Shared>],
    engines: Vec<MutexGuard<'a, Engine>>,
}

impl<'a> Locked<'a> {
    pub(crate) fn lock(group: &'a LaneGroup, members: &'a Members<'a>) -> Locked<'a> {
        let lanes = members.lanes.as_slice();
        Locked { group, lanes, engines: lanes.iter().map(|lane| lane.engine()).collect() }
    }

    /// Whether the peer of some lane, open or closed, may write `region`: its connect exposed
    /// it and the peer has not been seen to stop. A lane whose own side failed still counts
    /// until then: its endpoint is closed, but a peer over shared memory writes without it.
    pub(crate) fn peer_may_write(&self, region: RegionId) -> bool {
        self.lanes.iter().any(|lane| lane.exposure.contains(region) && !lane.peer_stopped())
            || self.group.left_peer_may_write(region)
    }

    /// Flushes every lane's unsignalled puts out (bounded), so none reads a source any more.
    pub(crate) fn flush_unsignalled(&mut self) {
        for engine in &mut self.engines {
            if let Err(e) = engine.flush_unsignalled() {
                tracing::debug!(error = %e, "ucx: flush before releasing a region failed");
            }
        }
    }

    /// Whether a put or notice of some lane is still in flight.
    pub(crate) fn busy(&self) -> bool {
        self.engines.iter().any(|engine| engine.busy())
    }
}

impl Drop for LaneGroup {
    fn drop(&mut self) {
        // The last lane is gone: no put of ours reads a region any more, but the peer of a lane
        // that closed may still write what that lane exposed until it has seen the goodbye.
        let left = self.left.get_mut().unwrap_or_else(PoisonError::into_inner);
        let until = Instant::now() + PEER_STOP_WAIT;
        loop {
            left.retain(LeftLane::peer_may_write);
            if left.is_empty() || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let still_written: Vec<RegionId> =
            left.iter().flat_map(|lane| lane.exposed.iter().copied()).collect();
        let table = self.regions.get_mut().unwrap_or_else(PoisonError::into_inner);
        let mut leaked = 0usize;
        for ring in left.iter_mut().filter_map(|lane| lane.ring.take()) {
            // Its peer may still write it: freeing it would be heap corruption where UCX
            // allocated it from the heap.
            leaked += 1;
            std::mem::forget(ring);
        }
        for (id, region) in table.drain() {
            if still_written.contains(&id) {
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
