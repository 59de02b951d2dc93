//! What a backend says about its regions' memory, so that the [`Domain`](rdma_hint_core::Domain)
//! methods (register, release, lend, copy in and out) are written once, in
//! [`DomainCore`](crate::DomainCore): how one region's memory is copied, lent and handed back
//! ([`DomainRegion`]), and how the backend makes and unmakes it ([`MemorySource`]).

use crate::RegionTable;
use rdma_hint_core::{CallerMemory, MemoryKind, Refused, RegionId, TransportError};

/// One region's memory, as the backend keeps it.
pub trait DomainRegion: Send + Sync + Sized {
    /// What memory it is.
    fn kind(&self) -> MemoryKind;

    /// Whether it is caller memory (registered in place, handed back by `release`).
    fn is_caller(&self) -> bool;

    /// The caller's memory back, once the region is out of the table; `None` for memory the
    /// backend allocated (or caller memory something else still holds).
    fn into_caller(self) -> Option<CallerMemory>;

    /// Copies `data` in at `offset` (staging it for GPU memory).
    fn copy_in(&self, offset: u64, data: &[u8]) -> Result<(), TransportError>;

    /// Copies from `offset` into `out`.
    fn copy_out(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError>;

    /// Lends the region's bytes to `access` in place, under the `lease` the domain gives once
    /// no op may touch them; [`TransportError::UnsupportedMemory`] where the CPU cannot reach
    /// them (GPU memory).
    fn lend(&self, lease: &Lease, access: &mut dyn FnMut(&mut [u8])) -> Result<(), TransportError>;

    /// The `CUdeviceptr` of a GPU region's first byte; `None` for host memory.
    fn device_pointer(&self) -> Option<u64> {
        None
    }
}

/// How a backend makes and unmakes its regions' memory: a NIC's protection domain, a UCX
/// context, a shared-memory namespace.
pub trait MemorySource<M>: Send + Sync {
    /// Refuses a kind this backend never allocates, before anything else is looked at (the
    /// length, the table's room); the rest are `allocate`'s to refuse. Admits every kind by
    /// default.
    fn admit_kind(&self, kind: MemoryKind) -> Result<(), TransportError> {
        let _ = kind;
        Ok(())
    }

    /// Allocates and registers `len` bytes of `kind` (a length and room the table checked).
    fn allocate(&self, kind: MemoryKind, len: u64) -> Result<M, TransportError>;

    /// Registers caller memory in place (admitted before: a kind the backend registers in
    /// place, validated); a refusal hands it back.
    fn register_caller(&self, memory: CallerMemory) -> Result<M, Refused>;

    /// Whether registering must not run beside any lane's progress (a UCX context that does
    /// not lock its own calls): the domain then holds every lane quiet meanwhile.
    fn serialised(&self) -> bool {
        false
    }

    /// Takes `id` out of `table`, with every lane of the domain quiet (a backend that must
    /// unmap beside its lanes' progress does so here, one whose threads may still hold the
    /// memory a moment refuses here).
    fn remove(&self, table: &mut RegionTable<M>, id: RegionId) -> Result<M, TransportError> {
        table.remove(id)
    }
}

/// The domain's word that a region may be lent: no op of any lane may read or write it, none
/// can be posted meanwhile, and its peer does not write it (or the caller of
/// `access_region_unchecked` vouches for that). Only [`DomainCore`](crate::DomainCore) makes
/// one, so a backend's [`DomainRegion::lend`] can rely on it.
#[derive(Debug)]
pub struct Lease {
    _only_the_domain: (),
}

impl Lease {
    pub(crate) fn granted() -> Lease {
        Lease { _only_the_domain: () }
    }
}
