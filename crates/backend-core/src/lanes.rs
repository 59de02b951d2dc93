//! The lanes of one connection: links that address the same regions by the same ids, and what
//! each exposed to its peer.
//!
//! A region is busy while an op of any lane may still read it, or the peer of any lane (open,
//! or closed while its peer may still write) was handed it. The rules that follow from that
//! live in [`DomainCore`](crate::DomainCore), written once; a backend says only what is its own
//! through [`Lane`]: what keeps its posts off, what is in flight, whether its peer may still
//! write.

use crate::MAX_REGIONS;
use rdma_hint_core::{RegionId, TransportError};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

/// One lane as its domain sees it.
pub trait Lane: Send + Sync {
    /// What keeps this lane from posting while a region is lent or taken: a lock its posts
    /// take before the region table's read lock, or `()` where posts count their ops under
    /// that read lock (the domain's write lock then keeps them off).
    type Quiet<'a>
    where
        Self: 'a;

    /// Holds this lane's posts off (see [`Lane::Quiet`]).
    fn quiet(&self) -> Self::Quiet<'_>;

    /// Whether an op of this lane may still read a region. Asked with the region table
    /// write-locked and the lane quiet.
    fn busy(&self, quiet: &mut Self::Quiet<'_>) -> bool;

    /// Brings ops that have no completion to watch (unsignalled ones) to an end, bounded,
    /// before a region is taken. Nothing by default.
    fn settle(&self, quiet: &mut Self::Quiet<'_>) {
        let _ = quiet;
    }

    /// What this lane's connect (and later exposures) handed its peer.
    fn exposure(&self) -> &Exposure;

    /// Whether this lane's peer may still write what it was handed: it has not been seen to
    /// stop (a backend whose peer writes only through this side's own thread or NIC says no
    /// once that path is shut).
    fn peer_may_write(&self) -> bool;
}

/// The regions one lane exposes (or is exposing) to its peer, from the start of `connect`: the
/// hello names them before the handshake ends, so from then on the peer may learn their keys
/// and write them, and none may be released or lent until the peer has gone.
///
/// ```
/// use rdma_hint_core::RegionId;
/// use rdma_hint_backend_core::lanes::Exposure;
/// let exposure = Exposure::default();
/// exposure.expose(&[RegionId(2)]);
/// assert!(exposure.contains(RegionId(2)) && !exposure.contains(RegionId(0)));
/// exposure.withdraw(); // the connect failed: nothing was exposed after all
/// assert!(!exposure.contains(RegionId(2)));
/// ```
#[derive(Debug, Default)]
pub struct Exposure(Mutex<Vec<RegionId>>);

impl Exposure {
    /// `regions` are being exposed (called before the hello is built).
    pub fn expose(&self, regions: &[RegionId]) {
        let mut exposed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        exposed.clear();
        exposed.extend_from_slice(regions);
    }

    /// `region` is exposed after connect too; false (and nothing changes) if it is already:
    /// the look and the entry are one step, so two exposures of one region cannot both pass.
    pub fn add(&self, region: RegionId) -> bool {
        let mut exposed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if exposed.contains(&region) {
            return false;
        }
        exposed.push(region);
        true
    }

    /// `region` is exposed no more (the peer answered its withdrawal).
    pub fn remove(&self, region: RegionId) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).retain(|exposed| *exposed != region);
    }

    /// The region exposed, when exactly one is (what an arrival that does not say names).
    pub fn only(&self) -> Option<RegionId> {
        match self.0.lock().unwrap_or_else(PoisonError::into_inner)[..] {
            [only] => Some(only),
            _ => None,
        }
    }

    /// The connect that exposed them failed.
    pub fn withdraw(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Runs a backend's `connect` with `regions` exposed from its start (the hello names them,
    /// and the peer may write them as soon as the link runs, which may be before `connect`
    /// returns), and exposed no more if it fails. More than [`MAX_REGIONS`] are refused first.
    pub async fn around_connect<T>(
        &self,
        regions: &[RegionId],
        connect: impl Future<Output = Result<T, TransportError>>,
    ) -> Result<T, TransportError> {
        if regions.len() > MAX_REGIONS {
            return Err(TransportError::Handshake(format!("at most {MAX_REGIONS} regions can be exposed")));
        }
        self.expose(regions);
        let connected = connect.await;
        if connected.is_err() {
            self.withdraw();
        }
        connected
    }

    /// Whether `region` is exposed.
    pub fn contains(&self, region: RegionId) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).contains(&region)
    }

    /// The regions exposed, in the order the connect named them.
    pub fn regions(&self) -> Vec<RegionId> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The length of each region a lane exposed, by id, for the checks of the peer's notices on a
/// path that takes no lock (a notice must name a region exposed to the peer, and a length
/// within it). An id keeps the largest length it was exposed with: a notice the peer published
/// before a withdrawal may be taken after it, even once the id names a smaller region.
///
/// ```
/// use rdma_hint_core::RegionId;
/// use rdma_hint_backend_core::lanes::ExposedLens;
/// let lens = ExposedLens::default();
/// lens.set(RegionId(3), 4096);
/// assert!(lens.admits(3, 4096) && !lens.admits(3, 4097) && !lens.admits(2, 1));
/// assert!(!lens.admits(u32::MAX, 1));
/// ```
#[derive(Debug)]
pub struct ExposedLens(Box<[AtomicU64]>);

impl Default for ExposedLens {
    fn default() -> Self {
        ExposedLens((0..crate::MAX_REGIONS).map(|_| AtomicU64::new(0)).collect())
    }
}

impl ExposedLens {
    /// `region`, of `len` bytes, is exposed (ids past [`MAX_REGIONS`],
    /// which no table hands out, are ignored).
    pub fn set(&self, region: RegionId, len: u64) {
        if let Some(slot) = self.0.get(region.0 as usize) {
            slot.fetch_max(len, Ordering::AcqRel);
        }
    }

    /// Whether a notice of `len` bytes for region `id` names a region exposed that large.
    pub fn admits(&self, id: u32, len: u64) -> bool {
        self.0.get(id as usize).is_some_and(|slot| {
            let exposed = slot.load(Ordering::Acquire);
            exposed > 0 && len <= exposed
        })
    }
}

/// What a lane that closed while its peer could still write leaves behind: what it exposed,
/// how to tell the peer has stopped, and anything else the peer may still write (freed once
/// it stopped, leaked if it never does).
pub struct LeftLane {
    exposed: Vec<RegionId>,
    still_writes: Box<dyn Fn() -> bool + Send>,
    kept: Option<Box<dyn Send>>,
}

impl std::fmt::Debug for LeftLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeftLane").field("exposed", &self.exposed).finish_non_exhaustive()
    }
}

impl LeftLane {
    /// A closed lane whose peer may write `exposed` (and `kept`) while `still_writes` says so.
    pub fn new(
        exposed: Vec<RegionId>,
        still_writes: impl Fn() -> bool + Send + 'static,
        kept: Option<Box<dyn Send>>,
    ) -> LeftLane {
        LeftLane { exposed, still_writes: Box::new(still_writes), kept }
    }
}

/// What the peers of closed lanes may still write when the group ends (see
/// [`LaneGroup::settle_left`]): the backend must not free these.
#[derive(Default)]
pub struct StillWritten {
    /// Regions a peer may still write.
    pub regions: Vec<RegionId>,
    /// Other memory a peer may still write, to leak.
    pub kept: Vec<Box<dyn Send>>,
}

/// The lanes of one connection: each open lane (weakly: a dropped lane no longer counts), and
/// the closed ones whose peers may still write.
///
/// ```
/// use rdma_hint_core::RegionId;
/// use rdma_hint_backend_core::lanes::{Exposure, Lane, LaneGroup};
/// use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
/// use std::sync::Arc;
/// #[derive(Default)]
/// struct Counted { in_flight: AtomicUsize, exposure: Exposure, gone: AtomicBool }
/// impl Lane for Counted {
///     type Quiet<'a> = ();
///     fn quiet(&self) {}
///     fn busy(&self, _: &mut ()) -> bool { self.in_flight.load(Ordering::Acquire) > 0 }
///     fn exposure(&self) -> &Exposure { &self.exposure }
///     fn peer_may_write(&self) -> bool { !self.gone.load(Ordering::Acquire) }
/// }
/// let group = LaneGroup::default();
/// let (first, second) = (Arc::new(Counted::default()), Arc::new(Counted::default()));
/// group.join(&first);
/// group.join(&second);
/// second.exposure.expose(&[RegionId(0)]);
/// assert!(group.members().peer_may_write(&group, RegionId(0)));
/// second.gone.store(true, Ordering::Release);
/// assert!(!group.members().peer_may_write(&group, RegionId(0)));
/// first.in_flight.store(1, Ordering::Release);
/// assert!(group.members().quiet().busy());
/// drop(first); // a dropped lane no longer counts
/// assert!(!group.members().quiet().busy());
/// ```
pub struct LaneGroup<L> {
    joined: Mutex<Vec<Weak<L>>>,
    left: Mutex<Vec<LeftLane>>,
}

impl<L> Default for LaneGroup<L> {
    fn default() -> Self {
        LaneGroup { joined: Mutex::default(), left: Mutex::default() }
    }
}

impl<L> std::fmt::Debug for LaneGroup<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let joined = self.joined.lock().unwrap_or_else(PoisonError::into_inner);
        let open = joined.iter().filter(|lane| lane.strong_count() > 0).count();
        f.debug_struct("LaneGroup").field("open", &open).finish_non_exhaustive()
    }
}

impl<L: Lane> LaneGroup<L> {
    /// Enters `lane` in the group.
    pub fn join(&self, lane: &Arc<L>) {
        let mut joined = self.joined.lock().unwrap_or_else(PoisonError::into_inner);
        joined.retain(|open| open.strong_count() > 0);
        joined.push(Arc::downgrade(lane));
    }

    /// `lane` leaves the group before it is dropped: after this returns no other thread holds
    /// it through the group (a look at the members holds its lanes only under the group's
    /// lock), so its last owner drops it, in the order it chooses.
    pub fn remove(&self, lane: &Arc<L>) {
        let mut joined = self.joined.lock().unwrap_or_else(PoisonError::into_inner);
        joined.retain(|open| !std::ptr::eq(open.as_ptr(), Arc::as_ptr(lane)));
    }

    /// The lanes still open, in the order they joined (the order their [`Lane::quiet`] guards
    /// are taken in, so two threads taking regions at once cannot deadlock), with joins held
    /// off until the members are dropped.
    pub fn members(&self) -> Members<'_, L> {
        let joins = self.joined.lock().unwrap_or_else(PoisonError::into_inner);
        let lanes = joins.iter().filter_map(Weak::upgrade).collect();
        Members { lanes, _joins: joins }
    }

    /// A lane closes while its peer may still write what it exposed: that stays guarded until
    /// `left.still_writes` says the peer stopped.
    pub fn leave(&self, left: LeftLane) {
        self.left.lock().unwrap_or_else(PoisonError::into_inner).push(left);
    }

    /// Whether the peer of a closed lane may still write `region`.
    pub fn left_peer_may_write(&self, region: RegionId) -> bool {
        let mut left = self.left.lock().unwrap_or_else(PoisonError::into_inner);
        left.retain(|lane| (lane.still_writes)());
        left.iter().any(|lane| lane.exposed.contains(&region))
    }

    /// At the group's end: waits up to `wait` for the peers of closed lanes to stop, and
    /// answers what they may still write (the backend leaks it rather than free it under them).
    pub fn settle_left(&mut self, wait: Duration) -> StillWritten {
        let left = self.left.get_mut().unwrap_or_else(PoisonError::into_inner);
        let until = Instant::now() + wait;
        loop {
            left.retain(|lane| (lane.still_writes)());
            if left.is_empty() || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut still = StillWritten::default();
        for lane in left.drain(..) {
            still.regions.extend(lane.exposed);
            still.kept.extend(lane.kept);
        }
        still
    }
}

/// The open lanes of a group at one moment, with joins held off while this lives.
pub struct Members<'a, L> {
    // Declared first, dropped first: a lane whose last owner let go meanwhile ends here,
    // while joins (and a dropping lane's own look at the group) still wait.
    lanes: Vec<Arc<L>>,
    _joins: MutexGuard<'a, Vec<Weak<L>>>,
}

impl<L: Lane> Members<'_, L> {
    /// The open lanes, in the order they joined.
    pub fn lanes(&self) -> &[Arc<L>] {
        &self.lanes
    }

    /// Whether the peer of some lane, open or closed, may write `region`: the lane exposed it
    /// and its peer has not been seen to stop.
    pub fn peer_may_write(&self, group: &LaneGroup<L>, region: RegionId) -> bool {
        self.lanes.iter().any(|lane| lane.exposure().contains(region) && lane.peer_may_write())
            || group.left_peer_may_write(region)
    }

    /// Every lane quiet, in the order they joined.
    pub fn quiet(&self) -> Quiet<'_, L> {
        Quiet { lanes: &self.lanes, guards: self.lanes.iter().map(|lane| lane.quiet()).collect() }
    }
}

/// Every lane of a group held quiet (see [`Lane::Quiet`]).
pub struct Quiet<'a, L: Lane> {
    lanes: &'a [Arc<L>],
    guards: Vec<L::Quiet<'a>>,
}

impl<'a, L: Lane + 'a> Quiet<'a, L> {
    /// Brings every lane's unsignalled ops to an end ([`Lane::settle`]).
    pub fn settle(&mut self) {
        for (lane, guard) in self.lanes.iter().zip(&mut self.guards) {
            lane.settle(guard);
        }
    }

    /// Whether an op of some lane may still read a region.
    pub fn busy(&mut self) -> bool {
        self.lanes.iter().zip(&mut self.guards).any(|(lane, guard)| lane.busy(guard))
    }
}
