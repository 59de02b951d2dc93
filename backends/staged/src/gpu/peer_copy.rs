//! GPU memory into a same-host peer's mapped region (the shm channel): each peer mapping is
//! page-locked once (`cuMemHostRegister`) so the copy engine writes it directly, copies are
//! queued on one stream, and the link waits for them only where RDMA semantics need the bytes
//! to have landed (a signalled completion, a notification, an idle link). A synchronous copy
//! into pageable memory goes through the driver's own bounce buffer, one block at a time
//! (15 GB/s and a knee at 8 MiB on an H200); queued into pinned memory it is the copy engine's.

use super::buffers::{DeviceBuffer, Gpu};
use super::{driver_error, invalid};
use cudarc::driver::{result, sys};
use rdma_hint_core::TransportError;
use std::ffi::c_void;
use std::sync::Arc;

/// One peer mapping as the driver knows it.
#[derive(Debug)]
struct Mapping {
    base: usize,
    len: usize,
    /// `cuMemHostRegister` succeeded: copies into it may be queued.
    pinned: bool,
}

/// Copies from GPU buffers into peer mappings, for one link thread.
#[derive(Debug)]
pub(crate) struct PeerCopier {
    gpu: Arc<Gpu>,
    stream: sys::CUstream,
    mappings: Vec<Mapping>,
    queued: bool,
}

// SAFETY: the stream is an owned handle used by the one thread holding `&mut self`; the mapping
// addresses are only handed to the driver.
unsafe impl Send for PeerCopier {}

impl PeerCopier {
    /// A copier for `gpu`, with its own stream.
    pub(crate) fn new(gpu: &Arc<Gpu>) -> Result<PeerCopier, TransportError> {
        gpu.bind()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(driver_error("cuStreamCreate"))?;
        Ok(PeerCopier { gpu: gpu.clone(), stream, mappings: Vec::new(), queued: false })
    }

    /// The GPU this copier serves.
    pub(crate) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Whether the mapping `base..base + len` is page-locked, registering it on first sight.
    fn pinned(&mut self, base: *mut u8, len: usize) -> bool {
        let base_address = base as usize;
        let _ = self.gpu.bind();
        if let Some(known) = self.mappings.iter().find(|m| m.base == base_address && m.len == len) {
            return known.pinned;
        }
        // SAFETY: `base..base + len` is a live mapping of the peer's region that outlives this
        // copier (the link keeps it until its threads, and so this copier, are gone); the driver
        // only locks its pages.
        let registered = unsafe {
            sys::cuMemHostRegister_v2(base.cast::<c_void>(), len, sys::CU_MEMHOSTREGISTER_PORTABLE)
        }
        .result();
        if let Err(error) = &registered {
            tracing::debug!(%error, len, "staged: the peer's mapping cannot be page-locked; copying synchronously");
        }
        self.mappings.push(Mapping { base: base_address, len, pinned: registered.is_ok() });
        registered.is_ok()
    }

    /// Copies `buffer[offset..offset + len]` to `destination`, which lies inside the peer
    /// mapping `mapping` (its base and length; checked). Into a page-locked mapping the copy is
    /// queued (call [`PeerCopier::wait`] before anyone may rely on the bytes); otherwise it is
    /// done on return, after every queued copy (so copies land in the order they were made).
    ///
    /// # Safety
    /// `mapping` must stay mapped for the life of this copier, and `buffer` must stay allocated
    /// until the next [`PeerCopier::wait`] returns (the caller keeps it alive).
    pub(crate) unsafe fn copy(
        &mut self,
        buffer: &DeviceBuffer,
        offset: usize,
        (destination, len): (*mut u8, usize),
        mapping: (*mut u8, usize),
    ) -> Result<(), TransportError> {
        let (start, base) = (destination as usize, mapping.0 as usize);
        if start < base || start.checked_add(len).is_none_or(|end| end > base + mapping.1) {
            return Err(invalid("a copy outside the peer's mapping".into()));
        }
        if !self.pinned(mapping.0, mapping.1) {
            self.wait()?;
            // SAFETY: inside the live mapping (checked above).
            return unsafe { buffer.download_raw(offset, destination, len) };
        }
        let source = buffer.address(offset, len)?;
        self.gpu.bind()?;
        // SAFETY: the source range was checked against its allocation, which the caller keeps
        // until `wait`; the destination lies in the page-locked mapping (checked), which
        // outlives this copier.
        unsafe { sys::cuMemcpyDtoHAsync_v2(destination.cast::<c_void>(), source, len, self.stream) }
            .result()
            .map_err(driver_error("cuMemcpyDtoHAsync"))?;
        self.queued = true;
        Ok(())
    }

    /// Forgets the mapping `base..base + len` (unpinned if it was pinned), which is about to be
    /// unmapped.
    ///
    /// # Safety
    /// No copy into the mapping may be queued (call [`PeerCopier::wait`] first), and it must
    /// still be mapped.
    pub(crate) unsafe fn forget(&mut self, base: *mut u8, len: usize) {
        let base_address = base as usize;
        let Some(at) = self.mappings.iter().position(|m| m.base == base_address && m.len == len) else {
            return;
        };
        if self.mappings.swap_remove(at).pinned {
            let _ = self.gpu.bind();
            // SAFETY: registered by `pinned`, unregistered once here (it left the list), still
            // mapped and written by no queued copy (the caller's word).
            let _ = unsafe { sys::cuMemHostUnregister(base.cast::<c_void>()) };
        }
    }

    /// Whether copies are queued that [`PeerCopier::wait`] has not seen land.
    pub(crate) fn is_queued(&self) -> bool {
        self.queued
    }

    /// Returns once every queued copy has landed.
    pub(crate) fn wait(&mut self) -> Result<(), TransportError> {
        if !self.queued {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: a live stream of this copier.
        unsafe { result::stream::synchronize(self.stream) }.map_err(driver_error("cuStreamSynchronize"))?;
        self.queued = false;
        Ok(())
    }
}

impl Drop for PeerCopier {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: a live stream; nothing may still write a mapping once it is unregistered.
        let _ = unsafe { result::stream::synchronize(self.stream) };
        for mapping in self.mappings.iter().filter(|m| m.pinned) {
            // SAFETY: registered by `pinned` above, unregistered once here, still mapped.
            let _ = unsafe { sys::cuMemHostUnregister(mapping.base as *mut c_void) };
        }
        // SAFETY: created in `new`, destroyed once here.
        let _ = unsafe { result::stream::destroy(self.stream) };
    }
}
