//! This side's regions: what the domain keeps per region (the memory, and on the shm channel
//! the bounce in front of memory the peer cannot map), and how the staged backend makes and
//! takes back region memory for the one domain of its lanes.

use crate::lane::StagedLane;
use crate::memory::Memory;
use crate::region::RegionMemory;
use rdma_hint_backend_core::region_memory::{DomainRegion, Lease, MemorySource};
use rdma_hint_backend_core::{DomainCore, RegionTable};
use rdma_hint_core::{CallerMemory, MemoryKind, Refused, RegionId, TransportError};
use std::sync::Arc;

/// A registered local region.
#[derive(Debug, Clone)]
pub(crate) struct LocalEntry {
    pub(crate) memory: Arc<RegionMemory>,
    /// shm channel, a region the peer cannot map (caller host memory, GPU memory) exposed to
    /// it: the shared mapping the peer writes instead, whose bytes the reader copies on into
    /// `memory` as each write is announced.
    pub(crate) bounce: Option<Arc<Bounce>>,
}

/// A shared mapping in front of a region the peer cannot map; page-locked when the region is
/// GPU memory, so the copy on is the copy engine's.
#[derive(Debug)]
pub(crate) struct Bounce {
    // Unregistered before the mapping goes (field order).
    #[cfg(feature = "cuda")]
    _pinned: Option<crate::gpu::HostRegistration>,
    pub(crate) memory: Memory,
}

impl Bounce {
    /// A new shared mapping for `region`.
    pub(crate) fn new(region: &RegionMemory) -> Result<Bounce, TransportError> {
        // Allocated behind the region table's back: checked against the machine here.
        rdma_hint_backend_core::memory_limit::check_commit(region.len(), None, 0)?;
        let memory = Memory::shared(region.len())?;
        #[cfg(feature = "cuda")]
        if let RegionMemory::Gpu(buffer, _) = region {
            let (base, len) = memory.mapping();
            // SAFETY: the mapping lives in this value and outlives the registration (field order).
            let pinned = unsafe { crate::gpu::HostRegistration::new(buffer.gpu(), base, len) };
            if let Err(error) = &pinned {
                tracing::debug!(%error, "staged: the bounce cannot be page-locked; copying through the driver");
            }
            return Ok(Bounce { _pinned: pinned.ok(), memory });
        }
        Ok(Bounce {
            #[cfg(feature = "cuda")]
            _pinned: None,
            memory,
        })
    }
}

impl LocalEntry {
    /// A newly registered region: no bounce.
    pub(crate) fn new(memory: RegionMemory) -> LocalEntry {
        LocalEntry { memory: Arc::new(memory), bounce: None }
    }

    /// The descriptor the peer maps on the shm channel: the bounce's, or the region's own.
    pub(crate) fn shm_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match &self.bounce {
            Some(bounce) => bounce.memory.shm_fd(),
            None => self.memory.host().and_then(Memory::shm_fd),
        }
    }
}

/// The local regions and the lanes over them, shared with the link threads.
pub(crate) type LocalRegions = Arc<DomainCore<LocalEntry, StagedLane>>;

/// The entry of region `id`, if registered (a clone: the table's lock is not held meanwhile).
pub(crate) fn local(regions: &LocalRegions, id: RegionId) -> Option<LocalEntry> {
    regions.regions().get(id).ok().cloned()
}

impl DomainRegion for LocalEntry {
    fn kind(&self) -> MemoryKind {
        self.memory.kind()
    }

    fn is_caller(&self) -> bool {
        self.memory.is_caller()
    }

    /// Out of the table, a region no link thread holds any more (see
    /// [`StagedMemory::remove`]) is the entry's alone.
    fn into_caller(self) -> Option<CallerMemory> {
        Arc::try_unwrap(self.memory).ok()?.into_caller().ok()
    }

    fn copy_in(&self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        self.memory.copy_in(offset, data)
    }

    fn copy_out(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        self.memory.copy_out(offset, out)
    }

    fn lend(&self, _lease: &Lease, access: &mut dyn FnMut(&mut [u8])) -> Result<(), TransportError> {
        let Some(host) = self.memory.host() else {
            return Err(TransportError::UnsupportedMemory { kind: self.memory.kind() });
        };
        // SAFETY: the lease is the domain's word that no op of any lane is in flight, none can
        // be posted while it lasts (the table is write-locked), and the peer does not write the
        // region (not exposed to a live link, or the caller of `access_region_unchecked`
        // vouches that it does not).
        unsafe { host.lend(access) };
        Ok(())
    }

    fn device_pointer(&self) -> Option<u64> {
        self.memory.device_pointer()
    }
}

/// How the staged backend makes region memory: page-aligned host buffers, or on the shm
/// channel (`shared`) sealed memfds the peer can map; GPU memory with feature `cuda`.
#[derive(Debug)]
pub(crate) struct StagedMemory {
    pub(crate) shared: bool,
}

impl MemorySource<LocalEntry> for StagedMemory {
    fn allocate(&self, kind: MemoryKind, len: u64) -> Result<LocalEntry, TransportError> {
        RegionMemory::allocate(kind, len, self.shared).map(LocalEntry::new)
    }

    fn register_caller(&self, memory: CallerMemory) -> Result<LocalEntry, Refused> {
        RegionMemory::from_caller(memory).map(LocalEntry::new)
    }

    /// Refused while a link thread that was placing or sending still holds the memory (a
    /// queued GPU copy until it lands): new holders take it under the table's read lock,
    /// which the write lock held here keeps out, so a count of one stays one.
    fn remove(
        &self,
        table: &mut RegionTable<LocalEntry>,
        id: RegionId,
    ) -> Result<LocalEntry, TransportError> {
        if Arc::strong_count(&table.get(id)?.memory) > 1 {
            return Err(TransportError::RegionBusy {
                region: id,
                why: "a link thread still holds it; try again",
            });
        }
        table.remove(id)
    }
}
