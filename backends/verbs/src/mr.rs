//! Memory regions (`ibv_reg_mr` / `ibv_dereg_mr`): a registration of memory the caller owns,
//! holding its protection domain so the PD is deallocated after it.

use crate::pd::ProtectionDomain;
use crate::status::unavailable;
use rdma_hint_transport::TransportError;
use rdma_mummy_sys as ibv;
use std::ptr::NonNull;
use std::sync::Arc;

/// A registered memory region, deregistered on drop.
#[derive(Debug)]
pub(crate) struct MemoryRegion {
    raw: NonNull<ibv::ibv_mr>,
    lkey: u32,
    rkey: u32,
    // Dropped after the MR is deregistered (`Drop` runs before the fields drop).
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: an ibv_mr may be used and deregistered from any thread (libibverbs is thread-safe);
// it is deregistered once, on drop, and only its keys are read meanwhile (copied at
// registration).
unsafe impl Send for MemoryRegion {}
// SAFETY: see `Send`.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `len` bytes at `base` in `pd` with `access` (`ibv_access_flags`). A failure is
    /// [`TransportError::Registration`].
    ///
    /// # Safety
    ///
    /// `base..base + len` must be memory the caller owns that stays mapped until this region
    /// has been dropped (the device may write it meanwhile, as the access allows).
    pub(crate) unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        base: *mut u8,
        len: u64,
        access: u32,
    ) -> Result<MemoryRegion, TransportError> {
        // SAFETY: the PD is live (held by the `Arc`); the range is mapped and outlives the MR
        // (this function's contract).
        let raw = unsafe { ibv::ibv_reg_mr(pd.raw(), base.cast(), len as usize, access as i32) };
        let Some(raw) = NonNull::new(raw) else {
            return Err(TransportError::Registration { len, reason: unavailable("ibv_reg_mr").to_string() });
        };
        // SAFETY: `raw` is the MR just registered; its keys are plain fields that never change.
        let (lkey, rkey) = unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey) };
        Ok(MemoryRegion { raw, lkey, rkey, _pd: pd.clone() })
    }

    /// The local key, for scatter/gather entries.
    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key, for a peer's RDMA WRITE (meaningful with remote access).
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once, while the memory is still mapped
        // (`register`'s contract) and before the PD goes (`_pd` drops after this body).
        unsafe { ibv::ibv_dereg_mr(self.raw.as_ptr()) };
    }
}
