//! The protection domain (`ibv_alloc_pd` / `ibv_dealloc_pd`): the QP and every memory region
//! are created in it and hold an `Arc` of it, so it is deallocated after the last of them.

use crate::context::Context;
use crate::status::unavailable;
use rdma_hint_transport::TransportError;
use rdma_mummy_sys as ibv;
use std::ptr::NonNull;
use std::sync::Arc;

/// A protection domain, deallocated on drop; it keeps its context open.
#[derive(Debug)]
pub(crate) struct ProtectionDomain {
    raw: NonNull<ibv::ibv_pd>,
    // Dropped after the PD is deallocated (`Drop` runs before the fields drop).
    _context: Arc<Context>,
}

// SAFETY: an ibv_pd may be used from any thread (libibverbs is thread-safe); it is deallocated
// once, on drop.
unsafe impl Send for ProtectionDomain {}
// SAFETY: see `Send`.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on `context`.
    pub(crate) fn alloc(context: &Arc<Context>) -> Result<ProtectionDomain, TransportError> {
        // SAFETY: the context is open (held by the `Arc`).
        let raw = unsafe { ibv::ibv_alloc_pd(context.raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| unavailable("ibv_alloc_pd"))?;
        Ok(ProtectionDomain { raw, _context: context.clone() })
    }

    /// The raw PD, for creating objects in it; valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut ibv::ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd, deallocated once; the QP and the MRs created in it
        // each hold an `Arc` of it, so none is left when the last `Arc` drops.
        unsafe { ibv::ibv_dealloc_pd(self.raw()) };
    }
}
