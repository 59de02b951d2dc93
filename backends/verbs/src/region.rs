//! Host memory the transport allocates (an anonymous mapping) and its registrations
//! ([`MemoryRegion`]s): one for local access, and one with remote write once exposed.

use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::wire::ExposedRegion;
use memmap2::MmapMut;
use rdma_hint_core::transport::check_range;
use rdma_hint_core::TransportError;
use rdma_hint_toolkit::region_table::RegionLen;
use rdma_hint_toolkit::MAX_REGION_BYTES;
use rdma_mummy_sys as ibv;
use std::sync::Arc;

/// An anonymous mapping registered for local access; exposing it to the peer registers it a
/// second time with remote write (so regions never exposed have no remote key at all).
#[derive(Debug)]
pub(crate) struct Region {
    // Fields drop in declaration order: the remote registration, then the local one, then the
    // mapping they cover (never unmapped while registered).
    remote: Option<MemoryRegion>,
    local: MemoryRegion,
    _mapping: MmapMut,
    base: *mut u8,
    len: u64,
}

// SAFETY: `base` points into `_mapping`, owned by the region; the MRs are only deregistered on
// drop. Every access copies bytes through raw pointers after a bounds check and no Rust
// reference to the memory is ever formed, so concurrent writers (the NIC, or two threads'
// `write_region` on overlapping ranges) can only leave mixed bytes, as on any RDMA target:
// the transport does not order local copies against each other or against the peer.
unsafe impl Send for Region {}
// SAFETY: see `Send`.
unsafe impl Sync for Region {}

impl Region {
    /// Allocates `len` zeroed bytes and registers them for local write.
    pub(crate) fn register(pd: &Arc<ProtectionDomain>, len: u64) -> Result<Region, TransportError> {
        if len == 0 || len > MAX_REGION_BYTES {
            return Err(TransportError::Registration {
                len,
                reason: format!("length must be 1 B … {MAX_REGION_BYTES} B"),
            });
        }
        let mut mapping = MmapMut::map_anon(len as usize)
            .map_err(|e| TransportError::Registration { len, reason: format!("mmap: {e}") })?;
        let base = mapping.as_mut_ptr();
        let access = ibv::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        // SAFETY: `base..base+len` is `mapping`, which the region owns and unmaps only after
        // its registrations are gone (field order).
        let local = unsafe { MemoryRegion::register(pd, base, len, access)? };
        Ok(Region { remote: None, local, _mapping: mapping, base, len })
    }

    /// Registers the region for remote write (no remote read) and returns the rkey to send.
    pub(crate) fn expose(&mut self, pd: &Arc<ProtectionDomain>) -> Result<u32, TransportError> {
        if let Some(mr) = &self.remote {
            return Ok(mr.rkey());
        }
        let access = ibv::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ibv::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        // SAFETY: as in `register`: the mapping outlives the registration (field order).
        let mr = unsafe { MemoryRegion::register(pd, self.base, self.len, access)? };
        Ok(self.remote.insert(mr).rkey())
    }

    /// The lkey for work requests.
    pub(crate) fn lkey(&self) -> u32 {
        self.local.lkey()
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Address of byte `offset` (bound-checked by the caller).
    pub(crate) fn address(&self, offset: u64) -> u64 {
        self.base as u64 + offset
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), TransportError> {
        check_range("local", offset, len as u64, self.len)
    }

    pub(crate) fn copy_in(&self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        self.check(offset, data.len())?;
        // SAFETY: bounds checked; `data` is caller memory, not part of the mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset as usize), data.len()) };
        Ok(())
    }

    pub(crate) fn copy_out(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        self.check(offset, out.len())?;
        // SAFETY: bounds checked; `out` is caller memory, not part of the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset as usize), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

impl RegionLen for Region {
    fn region_len(&self) -> u64 {
        self.len
    }
}

impl RegionLen for ExposedRegion {
    fn region_len(&self) -> u64 {
        self.len
    }
}
