//! One memory domain (a NIC's protection domain, a UCX context, a shared-memory namespace):
//! its one region table and its lanes, with the rules for lending, holding and taking a region
//! back, and the [`Domain`](rdma_hint_core::Domain) methods on them, written once for every
//! backend.

use crate::caller_memory::{admit, busy_exposed, busy_in_flight, not_caller_memory, CopyMeter};
use crate::lanes::{Lane, LaneGroup};
use crate::region_holds::Holds;
use crate::region_memory::{DomainRegion, Lease, MemorySource};
use crate::RegionTable;
use rdma_hint_core::{
    CallerMemory, CallerMemoryPath, CopiedBytes, LocalRegion, MemoryKind, Refused, RegionId, TransportError,
};
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
/// use rdma_hint_backend_core::DomainCore;
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
/// let domain: DomainCore<Vec<u8>, Counted> = DomainCore::bare(8);
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
pub struct DomainCore<M, L> {
    regions: RwLock<RegionTable<M>>,
    /// The table's hold words, counted without its lock.
    holds: Holds,
    lanes: LaneGroup<L>,
    /// How the backend makes and unmakes region memory.
    source: Box<dyn MemorySource<M>>,
    /// The caller memory `register_memory` takes in place.
    caller_paths: Vec<CallerMemoryPath>,
    /// The payload bytes the domain's and its lanes' code copied.
    copies: CopyMeter,
}

impl<M, L> std::fmt::Debug for DomainCore<M, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainCore")
            .field("lanes", &self.lanes)
            .field("caller_paths", &self.caller_paths)
            .finish_non_exhaustive()
    }
}

/// The source of a domain whose regions are placed in its table directly (see
/// [`DomainCore::bare`]): it makes nothing.
struct NoSource;

impl<M> MemorySource<M> for NoSource {
    fn allocate(&self, kind: MemoryKind, _: u64) -> Result<M, TransportError> {
        Err(TransportError::UnsupportedMemory { kind })
    }

    fn register_caller(&self, memory: CallerMemory) -> Result<M, Refused> {
        Err(Refused { error: TransportError::UnsupportedMemory { kind: memory.kind() }, memory })
    }
}

impl<M: 'static, L: Lane> DomainCore<M, L> {
    /// A domain of at most `max_regions` regions at once, with no lanes yet, whose memory
    /// `source` makes; `register_memory` takes the caller memory `caller_memory` lists (its
    /// links' [`Capabilities::caller_memory`](rdma_hint_core::Capabilities::caller_memory)).
    pub fn new(
        max_regions: usize,
        source: impl MemorySource<M> + 'static,
        caller_memory: Vec<CallerMemoryPath>,
    ) -> Self {
        let table = RegionTable::new(max_regions);
        DomainCore {
            holds: table.holds(),
            regions: RwLock::new(table),
            lanes: LaneGroup::default(),
            source: Box::new(source),
            caller_paths: caller_memory,
            copies: CopyMeter::default(),
        }
    }

    /// A domain that allocates nothing (its regions go into [`regions_mut`](Self::regions_mut)
    /// directly): the rules alone, for tests of them.
    pub fn bare(max_regions: usize) -> Self {
        let table = RegionTable::new(max_regions);
        DomainCore {
            holds: table.holds(),
            regions: RwLock::new(table),
            lanes: LaneGroup::default(),
            source: Box::new(NoSource),
            caller_paths: Vec::new(),
            copies: CopyMeter::default(),
        }
    }

    /// The count of payload bytes copied, where a lane's code counts its own copies.
    pub fn copies(&self) -> &CopyMeter {
        &self.copies
    }

    /// The region table, read-locked (what a post checks its ops against).
    pub fn regions(&self) -> RwLockReadGuard<'_, RegionTable<M>> {
        self.regions.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The region table, write-locked (what registering takes). Change what it holds, never
    /// the table itself: its hold words are shared with the domain, which holds regions
    /// without the lock.
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

    /// A queued transfer names `region`: it cannot be taken until [`unhold`](DomainCore::unhold).
    pub fn hold(&self, region: RegionId) -> Result<(), TransportError> {
        self.holds.hold(region)
    }

    /// The transfer that held `region` is collected.
    pub fn unhold(&self, region: RegionId) {
        self.holds.unhold(region);
    }

    /// Whether the peer of some lane may write `region`.
    pub fn peer_may_write(&self, region: RegionId) -> bool {
        self.lanes.members().peer_may_write(&self.lanes, region)
    }

    /// Runs `act` on `region` once no peer of any lane may write it (exposed nowhere, or only
    /// to peers that stopped), with the table write-locked and the look under the same locks:
    /// a lane that exposes the region meanwhile does so either before the look (and `act` does
    /// not run) or after `act` (and describes it afresh). What a backend drops then: a remote
    /// registration, whose key is void from then on.
    pub fn unreached(&self, region: RegionId, act: impl FnOnce(&mut M)) {
        let members = self.lanes.members();
        let mut table = self.regions_mut();
        if members.peer_may_write(&self.lanes, region) {
            return;
        }
        if let Ok(entry) = table.get_mut(region) {
            act(entry);
        }
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

/// The domain methods of every backend, on its regions' memory.
impl<M: DomainRegion + 'static, L: Lane> rdma_hint_core::Domain for DomainCore<M, L> {
    fn cap_memory(&self, cap_bytes: u64) -> Result<(), TransportError> {
        self.regions_mut().set_memory_cap(Some(cap_bytes));
        Ok(())
    }

    fn register(&self, kind: MemoryKind, len: u64) -> Result<LocalRegion, TransportError> {
        self.source.admit_kind(kind)?;
        let members = self.source.serialised().then(|| self.lanes.members());
        let _quiet = members.as_ref().map(|members| members.quiet());
        let id = self.regions_mut().insert_with(len, || self.source.allocate(kind, len))?;
        Ok(LocalRegion { id, kind, len })
    }

    fn deregister(&self, region: RegionId) -> Result<(), TransportError> {
        self.take(region, |_| Ok(()), |table, id| self.source.remove(table, id)).map(drop)
    }

    fn register_memory(&self, memory: CallerMemory) -> Result<LocalRegion, TransportError> {
        let memory = admit(memory, &self.caller_paths)?;
        let (kind, len) = (memory.kind(), memory.len());
        let members = self.source.serialised().then(|| self.lanes.members());
        let _quiet = members.as_ref().map(|members| members.quiet());
        let id = self.regions_mut().insert_caller(memory, |memory| self.source.register_caller(memory))?;
        Ok(LocalRegion { id, kind, len })
    }

    fn release(&self, region: RegionId) -> Result<CallerMemory, TransportError> {
        let caller_only = |memory: &M| if memory.is_caller() { Ok(()) } else { Err(not_caller_memory()) };
        let taken = self.take(region, caller_only, |table, id| self.source.remove(table, id))?;
        taken.into_caller().ok_or_else(not_caller_memory)
    }

    fn hold(&self, region: RegionId) -> Result<(), TransportError> {
        DomainCore::hold(self, region)
    }

    fn unhold(&self, region: RegionId) {
        DomainCore::unhold(self, region);
    }

    fn access_region(
        &self,
        region: RegionId,
        access: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), TransportError> {
        self.lend(region, false, |memory| memory.lend(&Lease::granted(), access))
    }

    /// No `unsafe` operation: the caller's word that the peer does not write stands in for
    /// the exposure check.
    #[allow(unsafe_code)] // implements the trait's unsafe contract; runs nothing unsafe
    unsafe fn access_region_unchecked(
        &self,
        region: RegionId,
        access: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), TransportError> {
        self.lend(region, true, |memory| memory.lend(&Lease::granted(), access))
    }

    fn device_pointer(&self, region: RegionId) -> Result<u64, TransportError> {
        let table = self.regions();
        let memory = table.get(region)?;
        memory.device_pointer().ok_or(TransportError::UnsupportedMemory { kind: memory.kind() })
    }

    fn copied_bytes(&self) -> CopiedBytes {
        self.copies.copied()
    }

    fn write_region(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        self.regions().get(region)?.copy_in(offset, data)?;
        self.copies.write_region(data.len());
        Ok(())
    }

    fn read_region(&self, region: RegionId, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        self.regions().get(region)?.copy_out(offset, out)?;
        self.copies.read_region(out.len());
        Ok(())
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

    fn domain_with_region() -> (DomainCore<u64, Locking>, Arc<Locking>, RegionId) {
        let domain = DomainCore::bare(4);
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

    /// A backend's region as plain heap bytes, or caller memory held as given: enough to drive
    /// the shared `Domain` methods.
    struct Heap {
        bytes: Mutex<Vec<u8>>,
        caller: Option<CallerMemory>,
    }

    impl DomainRegion for Heap {
        fn kind(&self) -> MemoryKind {
            MemoryKind::Host
        }
        fn is_caller(&self) -> bool {
            self.caller.is_some()
        }
        fn into_caller(self) -> Option<CallerMemory> {
            self.caller
        }
        fn copy_in(&self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
            let mut bytes = self.bytes.lock().unwrap();
            rdma_hint_core::transport::check_range("local", offset, data.len() as u64, bytes.len() as u64)?;
            bytes[offset as usize..][..data.len()].copy_from_slice(data);
            Ok(())
        }
        fn copy_out(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
            let bytes = self.bytes.lock().unwrap();
            rdma_hint_core::transport::check_range("local", offset, out.len() as u64, bytes.len() as u64)?;
            out.copy_from_slice(&bytes[offset as usize..][..out.len()]);
            Ok(())
        }
        fn lend(&self, _: &Lease, access: &mut dyn FnMut(&mut [u8])) -> Result<(), TransportError> {
            access(&mut self.bytes.lock().unwrap());
            Ok(())
        }
    }

    /// Allocates heap bytes; `serialised` as a UCX context without its own lock.
    struct HeapSource {
        serialised: bool,
    }

    impl MemorySource<Heap> for HeapSource {
        fn admit_kind(&self, kind: MemoryKind) -> Result<(), TransportError> {
            match kind {
                MemoryKind::Host => Ok(()),
                other => Err(TransportError::UnsupportedMemory { kind: other }),
            }
        }
        fn allocate(&self, _: MemoryKind, len: u64) -> Result<Heap, TransportError> {
            Ok(Heap { bytes: Mutex::new(vec![0; len as usize]), caller: None })
        }
        fn register_caller(&self, memory: CallerMemory) -> Result<Heap, Refused> {
            Ok(Heap { bytes: Mutex::new(Vec::new()), caller: Some(memory) })
        }
        fn serialised(&self) -> bool {
            self.serialised
        }
    }

    fn heap_domain(serialised: bool) -> (DomainCore<Heap, Locking>, Arc<Locking>) {
        let host = CallerMemoryPath {
            kind: MemoryKind::Host,
            send_copies: 0,
            receive_copies: Some(0),
            medium_copies: 0,
        };
        let domain = DomainCore::new(4, HeapSource { serialised }, vec![host]);
        let lane = Arc::new(Locking::default());
        domain.lanes().join(&lane);
        (domain, lane)
    }

    #[test]
    fn the_shared_methods_register_copy_lend_and_take_back() {
        use rdma_hint_core::Domain as _;
        let (domain, _lane) = heap_domain(false);
        assert!(
            matches!(
                domain.register(MemoryKind::CudaDevice { ordinal: 0 }, 0),
                Err(TransportError::UnsupportedMemory { .. })
            ),
            "a kind the source never allocates is refused before the length is looked at"
        );
        let region = domain.register(MemoryKind::Host, 64).unwrap();
        domain.write_region(region.id, 8, b"abc").unwrap();
        let mut back = [0u8; 3];
        domain.read_region(region.id, 8, &mut back).unwrap();
        assert_eq!(&back, b"abc");
        assert!(domain.write_region(region.id, 62, b"abc").is_err(), "past the region's end");
        let copied = domain.copied_bytes();
        assert_eq!((copied.write_region, copied.read_region), (3, 3));
        let mut seen = 0;
        domain.access_region(region.id, &mut |bytes| seen = bytes.len()).unwrap();
        assert_eq!(seen, 64);
        assert!(matches!(domain.device_pointer(region.id), Err(TransportError::UnsupportedMemory { .. })));
        assert!(matches!(domain.release(region.id), Err(TransportError::InvalidArgument { .. })));
        domain.write_region(region.id, 0, b"still here").unwrap();
        domain.deregister(region.id).unwrap();
        assert!(matches!(
            domain.write_region(region.id, 0, b"x"),
            Err(TransportError::UnregisteredRegion(_))
        ));
    }

    #[test]
    fn caller_memory_is_busy_while_exposed_and_comes_back_as_given() {
        use rdma_hint_core::Domain as _;
        let (domain, lane) = heap_domain(false);
        let given = vec![7u8; 4096];
        let at = given.as_ptr() as usize;
        let region = domain.register_memory(CallerMemory::from(given)).unwrap();
        lane.exposure.expose(&[region.id]);
        assert!(matches!(domain.release(region.id), Err(TransportError::RegionBusy { .. })));
        assert!(matches!(
            domain.access_region(region.id, &mut |_| ()),
            Err(TransportError::RegionBusy { .. })
        ));
        // SAFETY: nothing writes the region: its "peer" is this test.
        #[allow(unsafe_code)]
        let lent = unsafe { domain.access_region_unchecked(region.id, &mut |_| ()) };
        assert!(lent.is_ok(), "the caller vouches the peer does not write");
        lane.exposure.withdraw();
        let back: Vec<u8> = domain.release(region.id).unwrap().take().unwrap();
        assert_eq!((back.as_ptr() as usize, back.len()), (at, 4096), "handed back without a copy");
    }

    #[test]
    fn a_serialised_source_registers_only_while_every_lane_is_quiet() {
        use rdma_hint_core::Domain as _;
        let (domain, lane) = heap_domain(true);
        let domain = Arc::new(domain);
        let posting = lane.posting.lock().unwrap();
        let registering = {
            let domain = domain.clone();
            std::thread::spawn(move || domain.register(MemoryKind::Host, 64))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!registering.is_finished(), "registered beside a lane's progress");
        drop(posting);
        assert!(registering.join().unwrap().is_ok());
    }
}
