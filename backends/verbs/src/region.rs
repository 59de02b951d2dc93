//! Host memory the transport allocates and registers with `ibv_reg_mr`.

use crate::status::unavailable;
use crate::wire::ExposedRegion;
use memmap2::MmapMut;
use rdma_hint_transport::region_table::RegionLen;
use rdma_hint_transport::transport::check_range;
use rdma_hint_transport::TransportError;
use rdma_mummy_sys as ibv;

/// Largest region one registration may ask for, in bytes (1 TiB).
pub const MAX_REGION_BYTES: u64 = 1 << 40;

/// An anonymous mapping registered for local access; exposing it to the peer registers it a
/// second time with remote write (so regions never exposed have no remote key at all).
#[derive(Debug)]
pub(crate) struct Region {
    _mapping: MmapMut,
    base: *mut u8,
    len: u64,
    local: *mut ibv::ibv_mr,
    remote: Option<*mut ibv::ibv_mr>,
}

// SAFETY: `base` points into `_mapping`, owned by the region; the MRs are only deregistered on
// drop. Every access copies bytes through raw pointers after a bounds check; concurrent writes
// by the NIC are the RDMA contract.
unsafe impl Send for Region {}
// SAFETY: see `Send`.
unsafe impl Sync for Region {}

fn register(
    pd: *mut ibv::ibv_pd,
    base: *mut u8,
    len: u64,
    access: u32,
) -> Result<*mut ibv::ibv_mr, TransportError> {
    // SAFETY: `pd` is live; `base..base+len` is a mapping owned by the region being built.
    let mr = unsafe { ibv::ibv_reg_mr(pd, base.cast(), len as usize, access as i32) };
    if mr.is_null() {
        Err(TransportError::Registration { len, reason: unavailable("ibv_reg_mr").to_string() })
    } else {
        Ok(mr)
    }
}

impl Region {
    /// Allocates `len` zeroed bytes and registers them for local write.
    pub(crate) fn register(pd: *mut ibv::ibv_pd, len: u64) -> Result<Region, TransportError> {
        if len == 0 || len > MAX_REGION_BYTES {
            return Err(TransportError::Registration {
                len,
                reason: format!("length must be 1 B … {MAX_REGION_BYTES} B"),
            });
        }
        let mut mapping = MmapMut::map_anon(len as usize)
            .map_err(|e| TransportError::Registration { len, reason: format!("mmap: {e}") })?;
        let base = mapping.as_mut_ptr();
        let local = register(pd, base, len, ibv::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0)?;
        Ok(Region { _mapping: mapping, base, len, local, remote: None })
    }

    /// Registers the region for remote write (no remote read) and returns the rkey to send.
    pub(crate) fn expose(&mut self, pd: *mut ibv::ibv_pd) -> Result<u32, TransportError> {
        let mr = match self.remote {
            Some(mr) => mr,
            None => {
                let access = ibv::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
                    | ibv::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
                let mr = register(pd, self.base, self.len, access)?;
                self.remote = Some(mr);
                mr
            }
        };
        // SAFETY: `mr` is a live MR of this region.
        Ok(unsafe { (*mr).rkey })
    }

    /// The lkey for work requests.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: `local` is live until drop.
        unsafe { (*self.local).lkey }
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

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: both MRs were registered by this region and are deregistered once, before the
        // mapping goes (fields drop after this body).
        unsafe {
            if let Some(mr) = self.remote {
                ibv::ibv_dereg_mr(mr);
            }
            ibv::ibv_dereg_mr(self.local);
        }
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
