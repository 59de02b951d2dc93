//! The protection domain (`ibv_alloc_pd` / `ibv_dealloc_pd`): the QP and every memory region
//! are created in it and hold an `Arc` of it, so it is deallocated after the last of them.

use crate::context::Context;
use crate::handle::Owned;
use crate::status::unavailable;
use rdma_hint_core::TransportError;
use rdma_mummy_sys as ibv;
use std::sync::Arc;

/// A protection domain, deallocated on drop; it keeps its context open.
#[derive(Debug)]
pub(crate) struct ProtectionDomain(Owned<ibv::ibv_pd, Arc<Context>>);

impl ProtectionDomain {
    /// Allocates a protection domain on `context`.
    pub(crate) fn alloc(context: &Arc<Context>) -> Result<ProtectionDomain, TransportError> {
        // SAFETY: the context is open (held by the `Arc`); the QP and every MR created in the
        // PD hold an `Arc` of it.
        let pd = unsafe { Owned::take(ibv::ibv_alloc_pd(context.raw()), context.clone()) };
        pd.map(ProtectionDomain).ok_or_else(|| unavailable("ibv_alloc_pd"))
    }

    /// The raw PD, for creating objects in it; valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut ibv::ibv_pd {
        self.0.raw()
    }
}
