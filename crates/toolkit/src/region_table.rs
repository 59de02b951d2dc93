//! The table of registered regions every backend keeps: ids are slot indices, freed slots are
//! reused, and looking up an id that is not registered is a typed error.

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
/// use rdma_hint_toolkit::RegionTable;
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
    slots: Vec<Option<T>>,
    max: usize,
}

impl<T> RegionTable<T> {
    /// An empty table holding at most `max` regions at once.
    pub fn new(max: usize) -> RegionTable<T> {
        RegionTable { slots: Vec::new(), max }
    }

    /// Registers a region of `len` bytes under the lowest free id. `make` (which allocates and
    /// registers the memory) only runs when the table has room, so a full table costs nothing.
    pub fn insert_with(
        &mut self,
        len: u64,
        make: impl FnOnce() -> Result<T, TransportError>,
    ) -> Result<RegionId, TransportError> {
        self.check_room(len)?;
        let region = make()?;
        Ok(self.place(region))
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
        Ok(self.place(region))
    }

    fn place(&mut self, region: T) -> RegionId {
        let index = match self.slots.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[index] = Some(region);
        RegionId(index as u32)
    }

    /// The region registered as `id`.
    #[inline]
    pub fn get(&self, id: RegionId) -> Result<&T, TransportError> {
        self.slots.get(id.0 as usize).and_then(Option::as_ref).ok_or(TransportError::UnregisteredRegion(id))
    }

    /// The region registered as `id`, mutably.
    pub fn get_mut(&mut self, id: RegionId) -> Result<&mut T, TransportError> {
        self.slots
            .get_mut(id.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(TransportError::UnregisteredRegion(id))
    }

    /// Unregisters `id` and hands its region back.
    pub fn remove(&mut self, id: RegionId) -> Result<T, TransportError> {
        self.slots.get_mut(id.0 as usize).and_then(Option::take).ok_or(TransportError::UnregisteredRegion(id))
    }

    /// Unregisters every region, in id order.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.slots.drain(..).flatten()
    }
}

impl<T: RegionLen> RegionTable<T> {
    /// Looks up `op`'s local region here and checks `op` against it and the peer's region
    /// `remote` ([`WriteOp::check_lens`]): the one lookup and check an op gets on its way to the
    /// wire. Hands both regions back for posting.
    ///
    /// ```
    /// use rdma_hint_toolkit::region_table::RegionLen;
    /// use rdma_hint_core::{CallerMemory, Refused, RegionId, TransportError, WriteOp};
    /// use rdma_hint_toolkit::RegionTable;
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
        let remote = remote.ok_or(TransportError::UnregisteredRegion(op.remote))?;
        op.check_lens(local.region_len(), remote.region_len(), max_msg_bytes)?;
        Ok((local, remote))
    }
}
