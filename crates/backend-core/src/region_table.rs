//! The table of registered regions every backend keeps: ids are slot indices, freed slots are
//! reused, and looking up an id that is not registered is a typed error.

use crate::region_holds::Holds;
use rdma_hint_core::{CallerMemory, Refused, RegionId, TransportError, WriteOp};

/// Regions one transport holds at once, and the most one side may expose to its peer (a
/// hello announcing more is malformed).
pub const MAX_REGIONS: usize = 1024;

/// The largest region a backend registers or accepts from a peer's hello, in bytes (1 TiB).
pub const MAX_REGION_BYTES: u64 = 1 << 40;

/// A region (local or the peer's) that knows its length in bytes, so ops can be checked
/// against it.
pub trait RegionLen {
    /// Length in bytes.
    fn region_len(&self) -> u64;
}

/// Registered regions of one transport, by [`RegionId`].
///
/// ```
/// use rdma_hint_core::{RegionId, TransportError};
/// use rdma_hint_backend_core::RegionTable;
/// let mut table = RegionTable::new(2);
/// let a = table.insert_with(4096, || Ok("a")).unwrap();
/// let b = table.insert_with(4096, || Ok("b")).unwrap();
/// assert!(table.insert_with(4096, || -> Result<&str, TransportError> { unreachable!() }).is_err()); // full
/// assert_eq!(table.remove(a).unwrap(), "a");
/// assert_eq!(table.insert_with(4096, || Ok("c")).unwrap(), a); // the freed id is reused
/// assert_eq!(*table.get(b).unwrap(), "b");
/// assert!(matches!(table.get(RegionId(7)), Err(TransportError::UnregisteredRegion(RegionId(7)))));
/// ```
#[derive(Debug)]
pub struct RegionTable<T> {
    /// Each live region with the bytes the transport allocated for it (0 for caller memory).
    slots: Vec<Option<Slot<T>>>,
    /// Per slot, whether a region lives there and how many transfers hold it.
    holds: Holds,
    max: usize,
    memory_cap: Option<u64>,
    held_bytes: u64,
}

/// One live region of a [`RegionTable`].
#[derive(Debug)]
struct Slot<T> {
    region: T,
    /// Bytes the transport allocated for it (0 for caller memory).
    held_bytes: u64,
}

impl<T> RegionTable<T> {
    /// An empty table holding at most `max` regions at once (at most [`MAX_REGIONS`]).
    pub fn new(max: usize) -> RegionTable<T> {
        let max = max.min(MAX_REGIONS);
        RegionTable { slots: Vec::new(), holds: Holds::new(max), max, memory_cap: None, held_bytes: 0 }
    }

    /// The table's hold words, for holding and letting go of regions without the table's lock
    /// (a transfer engine does so under its own lock, which must never wait for a post holding
    /// the table's read lock across a socket send).
    pub fn holds(&self) -> Holds {
        self.holds.clone()
    }

    /// Caps the bytes of memory the transport allocates for its live regions (caller memory
    /// does not count: the caller allocated it). `None`: only what the machine can spare.
    pub fn set_memory_cap(&mut self, cap_bytes: Option<u64>) {
        self.memory_cap = cap_bytes;
    }

    /// Bytes the transport allocated for its live regions.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Registers a region of `len` bytes the transport allocates, under the lowest free id.
    /// `make` (which allocates and registers the memory) only runs when the table has room and
    /// `len` fits the memory cap and what the machine can commit
    /// ([`memory_limit::check_commit`](crate::memory_limit::check_commit)), so a refusal costs
    /// nothing.
    ///
    /// ```
    /// use rdma_hint_core::TransportError;
    /// use rdma_hint_backend_core::RegionTable;
    /// let mut table = RegionTable::new(8);
    /// table.set_memory_cap(Some(8192));
    /// let first = table.insert_with(4096, || Ok(())).unwrap();
    /// table.insert_with(4096, || Ok(())).unwrap();
    /// let refused = table.insert_with(4096, || -> Result<(), TransportError> { unreachable!() });
    /// assert!(matches!(refused, Err(TransportError::OutOfMemory { available: 0, .. })));
    /// table.remove(first).unwrap(); // its bytes are free again
    /// assert!(table.insert_with(4096, || Ok(())).is_ok());
    /// ```
    pub fn insert_with(
        &mut self,
        len: u64,
        make: impl FnOnce() -> Result<T, TransportError>,
    ) -> Result<RegionId, TransportError> {
        if len == 0 || len > MAX_REGION_BYTES {
            let reason = format!("length must be 1 B … {MAX_REGION_BYTES} B");
            return Err(TransportError::Registration { len, reason });
        }
        self.check_room(len)?;
        crate::memory_limit::check_commit(len, self.memory_cap, self.held_bytes)?;
        let region = make()?;
        self.held_bytes += len;
        Ok(self.place(region, len))
    }

    /// `Ok` while the table has room for one more region (of `len` bytes, for the error).
    pub fn check_room(&self, len: u64) -> Result<(), TransportError> {
        if self.slots.iter().flatten().count() >= self.max {
            return Err(TransportError::Registration {
                len,
                reason: format!("at most {} regions", self.max),
            });
        }
        Ok(())
    }

    /// Registers caller memory under the lowest free id: `register` (the backend's own
    /// registration of it) runs only when the table has room, so a full table hands the memory
    /// back untouched, and a refusal of `register` comes back as it is.
    pub fn insert_caller(
        &mut self,
        memory: CallerMemory,
        register: impl FnOnce(CallerMemory) -> Result<T, Refused>,
    ) -> Result<RegionId, Refused> {
        if let Err(error) = self.check_room(memory.len()) {
            return Err(Refused { error, memory });
        }
        let region = register(memory)?;
        Ok(self.place(region, 0))
    }

    fn place(&mut self, region: T, held_bytes: u64) -> RegionId {
        let index = match self.slots.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[index] = Some(Slot { region, held_bytes });
        self.holds.open(index);
        RegionId(index as u32)
    }

    fn slot(&self, id: RegionId) -> Result<&Slot<T>, TransportError> {
        match self.slots.get(id.0 as usize) {
            Some(Some(slot)) => Ok(slot),
            _ => Err(TransportError::UnregisteredRegion(id)),
        }
    }

    fn slot_mut(&mut self, id: RegionId) -> Result<&mut Slot<T>, TransportError> {
        match self.slots.get_mut(id.0 as usize) {
            Some(Some(slot)) => Ok(slot),
            _ => Err(TransportError::UnregisteredRegion(id)),
        }
    }

    /// The region registered as `id`.
    #[inline]
    pub fn get(&self, id: RegionId) -> Result<&T, TransportError> {
        self.slot(id).map(|slot| &slot.region)
    }

    /// The region registered as `id`, mutably.
    pub fn get_mut(&mut self, id: RegionId) -> Result<&mut T, TransportError> {
        self.slot_mut(id).map(|slot| &mut slot.region)
    }

    /// `Ok` unless a queued transfer holds `id` ([`Holds::hold`]); an
    /// unregistered id is [`TransportError::UnregisteredRegion`].
    pub fn check_unheld(&self, id: RegionId) -> Result<(), TransportError> {
        self.slot(id)?;
        match self.holds.held(id) {
            false => Ok(()),
            true => Err(busy_held(id)),
        }
    }

    /// Unregisters `id` and hands its region back; [`TransportError::RegionBusy`] while a
    /// queued transfer holds it.
    pub fn remove(&mut self, id: RegionId) -> Result<T, TransportError> {
        self.slot(id)?;
        // One swap of the slot's word: a hold racing it either counted first (and this is
        // refused) or finds nothing living there.
        if !self.holds.close(id) {
            return Err(busy_held(id));
        }
        let slot = self.slots[id.0 as usize].take().ok_or(TransportError::UnregisteredRegion(id))?;
        self.held_bytes -= slot.held_bytes;
        Ok(slot.region)
    }

    /// The live regions with their ids, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (RegionId, &T)> + '_ {
        (self.slots.iter().enumerate())
            .filter_map(|(index, slot)| slot.as_ref().map(|slot| (RegionId(index as u32), &slot.region)))
    }

    /// Unregisters every region, with its id, in id order: at the domain's end, when no
    /// transfer holds any (their holds end with them: a hold's end after this, on an id placed
    /// again meanwhile, would end the new region's hold).
    pub fn drain(&mut self) -> impl Iterator<Item = (RegionId, T)> + '_ {
        self.held_bytes = 0;
        self.holds.close_all();
        (self.slots.drain(..).enumerate())
            .filter_map(|(index, slot)| slot.map(|slot| (RegionId(index as u32), slot.region)))
    }
}

/// `RegionBusy`: a queued or running transfer names `region`.
pub fn busy_held(region: RegionId) -> TransportError {
    TransportError::RegionBusy {
        region,
        why: "a transfer queued or in flight names it; wait for the transfer (or cancel it and wait) first",
    }
}

impl<T: RegionLen> RegionTable<T> {
    /// Looks up `op`'s local region here and checks `op` against it and the peer's region
    /// `remote` ([`WriteOp::check_lens`]): the one lookup and check an op gets on its way to the
    /// wire. Hands both regions back for posting.
    ///
    /// ```
    /// use rdma_hint_backend_core::region_table::RegionLen;
    /// use rdma_hint_core::{CallerMemory, Refused, RegionId, TransportError, WriteOp};
    /// use rdma_hint_backend_core::RegionTable;
    /// struct Bytes(u64);
    /// impl RegionLen for Bytes { fn region_len(&self) -> u64 { self.0 } }
    /// let mut table = RegionTable::new(4);
    /// let local = table.insert_with(8192, || Ok(Bytes(8192))).unwrap();
    /// let op = WriteOp { wr_id: 1, local, local_offset: 4096, remote: RegionId(0),
    ///                    remote_offset: 0, len: 4096, signalled: true, imm: None };
    /// assert!(table.check_write(&op, Some(&Bytes(4096)), 1 << 20).is_ok());
    /// assert!(matches!(table.check_write(&op, None::<&Bytes>, 1 << 20),
    ///                  Err(TransportError::UnregisteredRegion(RegionId(0)))));
    /// assert!(table.check_write(&WriteOp { len: 8192, ..op }, Some(&Bytes(8192)), 1 << 20).is_err());
    /// ```
    #[inline]
    pub fn check_write<'a, R: RegionLen>(
        &'a self,
        op: &WriteOp,
        remote: Option<&'a R>,
        max_msg_bytes: u64,
    ) -> Result<(&'a T, &'a R), TransportError> {
        let local = self.get(op.local)?;
        let Some(remote) = remote else {
            return Err(TransportError::UnregisteredRegion(op.remote));
        };
        op.check_lens(local.region_len(), remote.region_len(), max_msg_bytes)?;
        Ok((local, remote))
    }
}
