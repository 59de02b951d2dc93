//! The peer's regions as one link may post to them, by the peer's ids: those its hello named,
//! those it exposed since, and those it withdrew (kept as such, so a post that names one says
//! why it was refused), written once for every backend.

use crate::region_table::{RegionLen, MAX_REGIONS};
use rdma_hint_core::{RegionId, RemoteRegion, TransportError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard};

/// One id of the peer's.
#[derive(Debug)]
enum Slot<T> {
    Never,
    Loaded(T),
    Withdrawn,
}

/// The peer's regions of one link (`T`: what the backend needs to reach one: an rkey and
/// address, an unpacked UCX key, a mapping). Posts look regions up under the read lock
/// ([`PeerRegions::view`]), held for the whole post, so once [`withdraw`](PeerRegions::withdraw)
/// returns no post can name the region any more.
///
/// ```
/// use rdma_hint_core::{RegionId, TransportError};
/// use rdma_hint_backend_core::PeerRegions;
/// let peer = PeerRegions::default();
/// peer.load(3, 4096u64).unwrap();
/// assert_eq!(*peer.view().get(RegionId(3)).unwrap(), 4096);
/// assert!(peer.load(3, 1).is_err(), "an id is loaded once until withdrawn");
/// assert_eq!(peer.withdraw(3), Some(4096));
/// assert!(matches!(peer.view().get(RegionId(3)), Err(TransportError::RegionWithdrawn(RegionId(3)))));
/// assert!(matches!(peer.view().get(RegionId(4)), Err(TransportError::UnregisteredRegion(RegionId(4)))));
/// peer.load(3, 8192).unwrap(); // exposed again
/// ```
#[derive(Debug)]
pub struct PeerRegions<T> {
    slots: RwLock<Vec<Slot<T>>>,
}

impl<T> Default for PeerRegions<T> {
    fn default() -> Self {
        PeerRegions { slots: RwLock::new(Vec::new()) }
    }
}

/// Why the peer's region could not be loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotLoaded {
    /// A region of that id is loaded already.
    Taken,
    /// The peer has [`MAX_REGIONS`] loaded already.
    Full,
}

impl<T> PeerRegions<T> {
    /// The peer's regions named by its hello (ids already checked by the hello's decoder: in
    /// range, none twice, at most [`MAX_REGIONS`]).
    pub fn from_hello(regions: impl IntoIterator<Item = (u32, T)>) -> PeerRegions<T> {
        let peer = PeerRegions::default();
        for (id, region) in regions {
            // A hello's ids are distinct and few: nothing here can be refused.
            let _ = peer.load(id, region);
        }
        peer
    }

    /// Loads the peer's region `id` (an id its decoder checked to be in range: the table grows
    /// to it), refused if that id is loaded or the peer has [`MAX_REGIONS`] loaded; a refused
    /// region comes back (for the backend to release what it holds).
    pub fn load(&self, id: u32, region: T) -> Result<(), (NotLoaded, T)> {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        if slots.iter().filter(|slot| matches!(slot, Slot::Loaded(_))).count() >= MAX_REGIONS {
            return Err((NotLoaded::Full, region));
        }
        let index = id as usize;
        if slots.len() <= index {
            slots.resize_with(index + 1, || Slot::Never);
        }
        if matches!(slots[index], Slot::Loaded(_)) {
            return Err((NotLoaded::Taken, region));
        }
        slots[index] = Slot::Loaded(region);
        Ok(())
    }

    /// The peer withdrew `id`: posts naming it are refused from now on, and what reached it is
    /// handed back (for the backend to drop once what was posted to it has finished). `None`
    /// if it was not loaded.
    pub fn withdraw(&self, id: u32) -> Option<T> {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        let slot = slots.get_mut(id as usize)?;
        if !matches!(slot, Slot::Loaded(_)) {
            return None;
        }
        match std::mem::replace(slot, Slot::Withdrawn) {
            Slot::Loaded(region) => Some(region),
            _ => None,
        }
    }

    /// The regions, read-locked for a post.
    pub fn view(&self) -> PeerView<'_, T> {
        PeerView(Held::Locked(self.slots.read().unwrap_or_else(PoisonError::into_inner)))
    }

    /// The regions through exclusive access, no lock taken: for a backend whose posts hold a
    /// lock of their own around the table (UCX's engine), so withdrawals take that one too.
    pub fn view_owned(&mut self) -> PeerView<'_, T> {
        PeerView(Held::Owned(self.slots.get_mut().unwrap_or_else(PoisonError::into_inner)))
    }

    /// Takes every loaded region out, at the link's end.
    pub fn drain(&self) -> Vec<T> {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        slots
            .drain(..)
            .filter_map(|slot| match slot {
                Slot::Loaded(region) => Some(region),
                _ => None,
            })
            .collect()
    }
}

impl<T: RegionLen> PeerRegions<T> {
    /// The loaded regions, by id.
    pub fn list(&self) -> Vec<RemoteRegion> {
        let view = self.view();
        (view.slots().iter().enumerate())
            .filter_map(|(index, slot)| match slot {
                Slot::Loaded(region) => {
                    Some(RemoteRegion { id: RegionId(index as u32), len: region.region_len() })
                }
                _ => None,
            })
            .collect()
    }
}

/// The peer's regions, read-locked ([`PeerRegions::view`]) or held exclusively
/// ([`PeerRegions::view_owned`]).
pub struct PeerView<'a, T>(Held<'a, T>);

enum Held<'a, T> {
    Locked(RwLockReadGuard<'a, Vec<Slot<T>>>),
    Owned(&'a Vec<Slot<T>>),
}

impl<T> PeerView<'_, T> {
    fn slots(&self) -> &[Slot<T>] {
        match &self.0 {
            Held::Locked(slots) => slots,
            Held::Owned(slots) => slots,
        }
    }

    /// The peer's region `id`: [`TransportError::RegionWithdrawn`] if the peer withdrew it,
    /// [`TransportError::UnregisteredRegion`] if it never exposed it.
    pub fn get(&self, id: RegionId) -> Result<&T, TransportError> {
        match self.slots().get(id.0 as usize) {
            Some(Slot::Loaded(region)) => Ok(region),
            Some(Slot::Withdrawn) => Err(TransportError::RegionWithdrawn(id)),
            _ => Err(TransportError::UnregisteredRegion(id)),
        }
    }
}

/// The peer's withdrawals a link has yet to answer: each waits until every op the link had
/// posted when it came has retired (ops are counted as they are posted; `mark` is the count
/// then), holding what reached the region until then (an unpacked key the backend drops
/// after). A withdrawal of a region whose withdrawal still waits (the peer asked again, its
/// first ask having timed out) joins it: it is answered when the first is, never before.
///
/// ```
/// use rdma_hint_backend_core::peer_regions::Withdrawals;
/// let withdrawals = Withdrawals::default();
/// withdrawals.wait_for(3, 7, 10, "key");
/// assert!(withdrawals.join(3, 8), "region 3's withdrawal waits: the new ask joins it");
/// assert!(!withdrawals.join(4, 9));
/// let mut answered = Vec::new();
/// withdrawals.passed(9, |seqs, _| answered.extend_from_slice(seqs));
/// assert!(answered.is_empty(), "op 10 is still in flight");
/// withdrawals.passed(10, |seqs, _| answered.extend_from_slice(seqs));
/// assert_eq!(answered, [7, 8]);
/// ```
#[derive(Debug)]
pub struct Withdrawals<T> {
    waiting: Mutex<Vec<Waiting<T>>>,
    /// Whether any waits: the look a completion path takes costs one load when none does.
    any: AtomicBool,
}

impl<T> Default for Withdrawals<T> {
    fn default() -> Self {
        Withdrawals { waiting: Mutex::new(Vec::new()), any: AtomicBool::new(false) }
    }
}

#[derive(Debug)]
struct Waiting<T> {
    id: u32,
    /// The asks to answer: the first, and any that joined it.
    seqs: Vec<u32>,
    mark: u64,
    region: T,
}

/// Asks one waiting withdrawal answers at most: a peer that asks again and again for the same
/// region is refused past this.
pub const MAX_JOINED_ASKS: usize = 8;

impl<T> Withdrawals<T> {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<Waiting<T>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The peer's withdrawal `seq` of region `id` waits until `mark` ops have retired.
    pub fn wait_for(&self, id: u32, seq: u32, mark: u64, region: T) {
        self.waiting().push(Waiting { id, seqs: vec![seq], mark, region });
        self.any.store(true, Ordering::Release);
    }

    /// The peer asks again (`seq`) to withdraw region `id`: true if a withdrawal of it waits,
    /// which `seq` joins (at most [`MAX_JOINED_ASKS`] asks each).
    pub fn join(&self, id: u32, seq: u32) -> bool {
        let mut waiting = self.waiting();
        match waiting.iter_mut().find(|withdrawal| withdrawal.id == id) {
            Some(withdrawal) if withdrawal.seqs.len() < MAX_JOINED_ASKS => {
                withdrawal.seqs.push(seq);
                true
            }
            _ => false,
        }
    }

    /// Whether a withdrawal of region `id` waits.
    pub fn waits_for(&self, id: u32) -> bool {
        self.waiting().iter().any(|withdrawal| withdrawal.id == id)
    }

    /// Withdrawals waiting.
    pub fn len(&self) -> usize {
        self.waiting().len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Acquire)
    }

    /// Hands every withdrawal whose mark `retired` (the count of ops retired so far) reached
    /// to `answer`, with its asks and what it held.
    pub fn passed(&self, retired: u64, mut answer: impl FnMut(&[u32], T)) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let done: Vec<Waiting<T>> = {
            let mut waiting = self.waiting();
            let (done, still) = waiting.drain(..).partition(|withdrawal| withdrawal.mark <= retired);
            *waiting = still;
            self.any.store(!waiting.is_empty(), Ordering::Release);
            done
        };
        done.into_iter().for_each(|withdrawal| answer(&withdrawal.seqs, withdrawal.region));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_more_than_max_regions_are_loaded_at_once() {
        let peer = PeerRegions::default();
        for id in 0..MAX_REGIONS as u32 {
            peer.load(id * 2, ()).unwrap();
        }
        assert_eq!(peer.load(1, ()), Err((NotLoaded::Full, ())));
        assert!(peer.withdraw(0).is_some());
        assert_eq!(peer.load(1, ()), Ok(()), "a withdrawn region makes room");
    }

    #[test]
    fn a_withdrawal_of_what_was_never_loaded_changes_nothing() {
        let peer: PeerRegions<u64> = PeerRegions::from_hello([(0, 64)]);
        assert_eq!(peer.withdraw(5), None);
        assert!(matches!(peer.view().get(RegionId(5)), Err(TransportError::UnregisteredRegion(_))));
        assert_eq!(peer.withdraw(0), Some(64));
        assert_eq!(peer.withdraw(0), None, "withdrawn once");
        assert!(peer.drain().is_empty());
    }
}
