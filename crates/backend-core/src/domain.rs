//! One memory domain (a NIC's protection domain, a UCX context, a shared-memory namespace):
//! its one region table and its lanes, with the rules for lending, holding and taking a region
//! back written once for every backend.

use crate::caller_memory::{busy_exposed, busy_in_flight};
use crate::lanes::{Lane, LaneGroup};
use crate::RegionTable;
use rdma_hint_core::{RegionId, TransportError};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A domain's regions (`M`: what the backend keeps per region) and the lanes (`L`) that post
/// from them and expose them.
///
/// The lock order, the same on every backend: the group's joins, each lane's
/// [`quiet`](Lane::quiet) guard in joining order, then the region table. Posts take the table's
/// read lock (after their own lane's quiet lock, where a backend has one), so while a rule below
/// holds the write lock no op can be posted or counted.
///
/// ```
/// use rdma_hint_core::{RegionId, TransportError};
/// use rdma_hint_backend_core::lanes::{Exposure, Lane};
/// use rdma_hint_backend_core::Domain;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// #[derive(Default)]
/// struct Counted { in_flight: AtomicUsize, exposure: Exposure }
/// impl Lane for Counted {
///     type Quiet<'a> = ();
///     fn quiet(&self) {}
///     fn busy(&self, _: &mut ()) -> bool { self.in_flight.load(Ordering::Acquire) > 0 }
///     fn exposure(&self) -> &Exposure { &self.exposure }
///     fn peer_may_write(&self) -> bool { true }
/// }
/// let domain: Domain<Vec<u8>, Counted> = Domain::new(8);
/// let lane = Arc::new(Counted::default());
/// domain.lanes().join(&lane);
/// let id = domain.regions_mut().insert_with(64, || Ok(vec![0u8; 64])).unwrap();
/// let keep = |_: &Vec<u8>| Ok(());
/// lane.in_flight.store(1, Ordering::Release);
/// assert!(matches!(domain.take(id, keep, |t, id| t.remove(id)), Err(TransportError::RegionBusy { .. })));
/// lane.in_flight.store(0, Ordering::Release);
/// lane.exposure.expose(&[id]);
/// assert!(domain.lend(id, false, |bytes| Ok(bytes.len())).is_err()); // the peer may write it
/// assert_eq!(domain.lend(id, true, |bytes| Ok(bytes.len())).unwrap(), 64);
/// lane.exposure.withdraw();
/// assert_eq!(domain.take(id, keep, |t, id| t.remove(id)).unwrap().len(), 64);
/// ```
#[derive(Debug)]
pub struct Domain<M, L> {
    regions: RwLock<RegionTable<M>>,
    lanes: LaneGroup<L>,
}

impl<M, L: Lane> Domain<M, L> {
    /// A domain of at most `max_regions` regions at once, with no lanes yet.
    pub fn new(max_regions: usize) -> Self {
        Domain { regions: RwLock::new(RegionTable::new(max_regions)), lanes: LaneGroup::default() }
    }

    /// The region table, read-locked (what a post checks its ops against).
    pub fn regions(&self) -> RwLockReadGuard<'_, RegionTable<M>> {
        self.regions.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The region table, write-locked (what registering takes).
    pub fn regions_mut(&self) -> RwLockWriteGuard<'_, RegionTable<M>> {
        self.regions.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The table itself, at the domain's end.
    pub fn regions_owned(&mut self) -> &mut RegionTable<M> {
        self.regions.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lanes over this domain's regions.
    pub fn lanes(&self) -> &LaneGroup<L> {
        &self.lanes
    }

    /// The lanes, at the domain's end.
    pub fn lanes_owned(&mut self) -> &mut LaneGroup<L> {
        &mut self.lanes
    }

    /// A queued transfer names `region`: it cannot be taken until [`unhold`](Domain::unhold).
    pub fn hold(&self, region: RegionId) -> Result<(), TransportError> {
        self.regions().hold(region)
    }

    /// The transfer that held `region` is collected.
    pub fn unhold(&self, region: RegionId) {
        self.regions().unhold(region);
    }

    /// Whether the peer of some lane may write `region`.
    pub fn peer_may_write(&self, region: RegionId) -> bool {
        self.lanes.members().peer_may_write(&self.lanes, region)
    }

    /// Lends `region` to `lend` with the table write-locked: refused while an op of any lane
    /// may read it, or (unless `exposed_too`: the caller vouches the peer does not write now)
    /// while the peer of a lane may write it. Nothing can be posted until `lend` returns, so
    /// `lend` must not call into the transport.
    pub fn lend<R>(
        &self,
        region: RegionId,
        exposed_too: bool,
        lend: impl FnOnce(&M) -> Result<R, TransportError>,
    ) -> Result<R, TransportError> {
        let members = self.lanes.members();
        if !exposed_too && members.peer_may_write(&self.lanes, region) {
            return Err(busy_exposed(region));
        }
        let mut quiet = members.quiet();
        let table = self.regions_mut();
        let entry = table.get(region)?;
        if quiet.busy() {
            return Err(busy_in_flight(region));
        }
        // The table's write lock alone keeps posts off from here on.
        drop(quiet);
        drop(members);
        lend(entry)
    }

    /// Takes `region` out of the table once `admit` accepts it (the kind of region the call
    /// is for): refused while a queued transfer holds it, the peer of a lane may write it, or an
    /// op of any lane may read it (unsignalled ops are settled first). `remove` takes it out
    /// with every lane still quiet (a backend that must unmap beside its lanes' progress does so
    /// there).
    pub fn take<T>(
        &self,
        region: RegionId,
        admit: impl Fn(&M) -> Result<(), TransportError>,
        remove: impl FnOnce(&mut RegionTable<M>, RegionId) -> Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        {
            // The cheap refusals first, before anything waits on a lane.
            let table = self.regions();
            admit(table.get(region)?)?;
            table.check_unheld(region)?;
        }
        let members = self.lanes.members();
        if members.peer_may_write(&self.lanes, region) {
            return Err(busy_exposed(region));
        }
        let mut quiet = members.quiet();
        quiet.settle();
        let mut table = self.regions_mut();
        // Looked at again under the write lock: another thread may have taken or held it.
        admit(table.get(region)?)?;
        table.check_unheld(region)?;
        if quiet.busy() {
            return Err(busy_in_flight(region));
        }
        let taken = remove(&mut table, region);
        drop(table);
        drop(quiet);
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::{Exposure, LeftLane};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, MutexGuard};

    /// A lane whose posts take a lock of its own (as UCX's engine), with its settle recorded.
    #[derive(Default)]
    struct Locking {
        posting: Mutex<usize>,
        exposure: Exposure,
        stopped: AtomicBool,
        settled: AtomicBool,
    }

    impl Lane for Locking {
        type Quiet<'a> = MutexGuard<'a, usize>;
        fn quiet(&self) -> MutexGuard<'_, usize> {
            self.posting.lock().unwrap()
        }
        fn busy(&self, in_flight: &mut MutexGuard<'_, usize>) -> bool {
            **in_flight > 0
        }
        fn settle(&self, in_flight: &mut MutexGuard<'_, usize>) {
            // Unsignalled ops flushed out.
            **in_flight = 0;
            self.settled.store(true, Ordering::Release);
        }
        fn exposure(&self) -> &Exposure {
            &self.exposure
        }
        fn peer_may_write(&self) -> bool {
            !self.stopped.load(Ordering::Acquire)
        }
    }

    fn domain_with_region() -> (Domain<u64, Locking>, Arc<Locking>, RegionId) {
        let domain = Domain::new(4);
        let lane = Arc::new(Locking::default());
        domain.lanes().join(&lane);
        let id = domain.regions_mut().insert_with(64, || Ok(7u64)).unwrap();
        (domain, lane, id)
    }

    fn remove(table: &mut RegionTable<u64>, id: RegionId) -> Result<u64, TransportError> {
        table.remove(id)
    }

    #[test]
    fn a_take_settles_unsignalled_ops_before_it_asks_whether_the_lanes_are_busy() {
        let (domain, lane, id) = domain_with_region();
        *lane.posting.lock().unwrap() = 3;
        assert_eq!(domain.take(id, |_| Ok(()), remove).unwrap(), 7);
        assert!(lane.settled.load(Ordering::Acquire));
    }

    #[test]
    fn a_lend_does_not_settle_and_refuses_while_ops_are_in_flight() {
        let (domain, lane, id) = domain_with_region();
        *lane.posting.lock().unwrap() = 1;
        let lent = domain.lend(id, true, |_| Ok(()));
        assert!(matches!(lent, Err(TransportError::RegionBusy { why, .. }) if why.contains("in flight")));
        assert!(!lane.settled.load(Ordering::Acquire));
    }

    #[test]
    fn a_held_region_is_refused_before_any_lane_is_waited_on() {
        let (domain, lane, id) = domain_with_region();
        domain.hold(id).unwrap();
        // The lane's lock is taken elsewhere: a take that waited on it would hang here.
        let posting = lane.posting.lock().unwrap();
        assert!(matches!(domain.take(id, |_| Ok(()), remove), Err(TransportError::RegionBusy { .. })));
        drop(posting);
        domain.unhold(id);
        assert!(domain.take(id, |_| Ok(()), remove).is_ok());
    }

    #[test]
    fn admit_refuses_first_and_the_region_stays() {
        let (domain, _lane, id) = domain_with_region();
        let refuse = |_: &u64| {
            Err(TransportError::InvalidArgument { what: "region", why: "not caller memory".into() })
        };
        assert!(matches!(domain.take(id, refuse, remove), Err(TransportError::InvalidArgument { .. })));
        assert_eq!(*domain.regions().get(id).unwrap(), 7);
    }

    #[test]
    fn a_closed_lanes_peer_guards_what_it_was_handed_until_it_stops() {
        let (domain, lane, id) = domain_with_region();
        lane.exposure.expose(&[id]);
        let stopped = Arc::new(AtomicBool::new(false));
        let seen = stopped.clone();
        domain.lanes().leave(LeftLane::new(vec![id], move || !seen.load(Ordering::Acquire), None));
        drop(lane);
        assert!(
            matches!(domain.take(id, |_| Ok(()), remove), Err(TransportError::RegionBusy { why, .. }) if why.contains("exposed"))
        );
        stopped.store(true, Ordering::Release);
        assert_eq!(domain.take(id, |_| Ok(()), remove).unwrap(), 7);
    }

    #[test]
    fn settle_left_names_what_a_peer_that_never_stopped_may_still_write() {
        let (mut domain, _lane, id) = domain_with_region();
        domain.lanes().leave(LeftLane::new(vec![id], || true, Some(Box::new(vec![1u8; 8]))));
        let still = domain.lanes_owned().settle_left(std::time::Duration::from_millis(5));
        assert_eq!(still.regions, vec![id]);
        assert_eq!(still.kept.len(), 1);
    }

    #[test]
    fn a_stopped_peer_no_longer_makes_its_exposure_busy() {
        let (domain, lane, id) = domain_with_region();
        lane.exposure.expose(&[id]);
        assert!(domain.peer_may_write(id));
        lane.stopped.store(true, Ordering::Release);
        assert!(!domain.peer_may_write(id));
        assert_eq!(domain.lend(id, false, |value| Ok(*value)).unwrap(), 7);
    }
}
