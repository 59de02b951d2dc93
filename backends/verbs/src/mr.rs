//! Memory regions (`ibv_reg_mr` / `ibv_dereg_mr`): a registration of memory the caller owns,
//! holding its protection domain so the PD is deallocated after it.

use crate::handle::Owned;
use crate::pd::ProtectionDomain;
use crate::status::unavailable;
use rdma_hint_core::{MemoryKind, TransportError};
use rdma_mummy_sys as ibv;
use std::sync::Arc;

/// A registered memory region, deregistered on drop (while its memory is still mapped: the
/// caller of [`MemoryRegion::register`] guarantees that).
#[derive(Debug)]
pub(crate) struct MemoryRegion {
    // Held for its drop: deregisters the MR.
    _handle: Owned<ibv::ibv_mr, Arc<ProtectionDomain>>,
    lkey: u32,
    rkey: u32,
}

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
        // (this function's contract); nothing is created on an MR.
        let handle = unsafe {
            Owned::take(ibv::ibv_reg_mr(pd.raw(), base.cast(), len as usize, access as i32), pd.clone())
        };
        let Some(handle) = handle else {
            return Err(TransportError::Registration { len, reason: unavailable("ibv_reg_mr").to_string() });
        };
        // SAFETY: the MR was just registered; its keys are plain fields that never change.
        let (lkey, rkey) = unsafe { ((*handle.raw()).lkey, (*handle.raw()).rkey) };
        Ok(MemoryRegion { _handle: handle, lkey, rkey })
    }

    /// Registers `len` bytes at `offset` into the dma-buf `fd` in `pd` with `access`, addressed
    /// by work requests from `iova` (`ibv_reg_dmabuf_mr`). A provider without dma-buf support
    /// (rxe) is [`TransportError::UnsupportedMemory`]; any other failure
    /// [`TransportError::Registration`].
    ///
    /// # Safety
    ///
    /// `fd` must stay open, and its buffer's pages exported, until this region has been
    /// dropped (the device may write them meanwhile, as the access allows).
    pub(crate) unsafe fn register_dmabuf(
        pd: &Arc<ProtectionDomain>,
        (fd, offset): (i32, u64),
        len: u64,
        iova: u64,
        access: u32,
    ) -> Result<MemoryRegion, TransportError> {
        // SAFETY: the PD is live (held by the `Arc`); the kernel validates the descriptor and
        // the range and pins the pages for the MR's life (this function's contract keeps the
        // descriptor valid).
        let handle = unsafe {
            Owned::take(
                ibv::ibv_reg_dmabuf_mr(pd.raw(), offset, len as usize, iova, fd, access as i32),
                pd.clone(),
            )
        };
        let Some(handle) = handle else {
            let error = std::io::Error::last_os_error();
            return Err(match error.raw_os_error() {
                Some(libc::EOPNOTSUPP) => TransportError::UnsupportedMemory { kind: MemoryKind::DmaBuf },
                _ => {
                    TransportError::Registration { len, reason: format!("ibv_reg_dmabuf_mr failed: {error}") }
                }
            });
        };
        // SAFETY: the MR was just registered; its keys are plain fields that never change.
        let (lkey, rkey) = unsafe { ((*handle.raw()).lkey, (*handle.raw()).rkey) };
        Ok(MemoryRegion { _handle: handle, lkey, rkey })
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
