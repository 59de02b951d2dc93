//! GPU contexts, device buffers and pinned host buffers.

use super::{driver_error, init_driver, GpuProbeError};
use cudarc::driver::{result, sys};
use std::ffi::c_void;
use std::sync::Arc;

/// One GPU's primary context, retained for the life of the value.
#[derive(Debug)]
pub struct Gpu {
    ordinal: u32,
    device: sys::CUdevice,
    context: sys::CUcontext,
}

// SAFETY: a CUDA primary context may be made current on any thread; the handle is an opaque
// pointer the driver synchronises internally.
unsafe impl Send for Gpu {}
// SAFETY: as above; every use binds the context to the calling thread first.
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Retains the primary context of GPU `ordinal`.
    pub fn open(ordinal: u32) -> Result<Arc<Gpu>, GpuProbeError> {
        init_driver()?;
        let device = result::device::get(ordinal as i32).map_err(driver_error("cuDeviceGet"))?;
        // SAFETY: `device` is a valid handle from cuDeviceGet.
        let context = unsafe { result::primary_ctx::retain(device) }
            .map_err(driver_error("cuDevicePrimaryCtxRetain"))?;
        let gpu = Arc::new(Gpu { ordinal, device, context });
        gpu.bind()?;
        Ok(gpu)
    }

    /// CUDA ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<(), GpuProbeError> {
        // SAFETY: `context` is a retained primary context, valid until drop.
        unsafe { result::ctx::set_current(self.context) }.map_err(driver_error("cuCtxSetCurrent"))
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: releases the reference `open` retained, once.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// Device memory on one GPU.
#[derive(Debug)]
pub struct DeviceBuffer {
    gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    /// Allocates `len` bytes on `gpu` (plain `cuMemAlloc`, never managed memory).
    pub fn new(gpu: &Arc<Gpu>, len: usize) -> Result<DeviceBuffer, GpuProbeError> {
        if len == 0 {
            return Err(GpuProbeError::Invalid("a device buffer has at least one byte".into()));
        }
        gpu.bind()?;
        // SAFETY: the context is current; the returned pointer is owned by this value.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(driver_error("cuMemAlloc"))?;
        Ok(DeviceBuffer { gpu: gpu.clone(), ptr, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The GPU the buffer lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Device address of byte `offset` (checked against the length).
    pub fn address(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, GpuProbeError> {
        offset.checked_add(len).filter(|end| *end <= self.len).map(|_| self.ptr + offset as u64).ok_or_else(
            || GpuProbeError::Invalid(format!("{offset}+{len} B outside a {} B device buffer", self.len)),
        )
    }

    /// Copies `data` in at `offset` (synchronous).
    pub fn upload(&self, offset: usize, data: &[u8]) -> Result<(), GpuProbeError> {
        let destination = self.address(offset, data.len())?;
        self.gpu.bind()?;
        // SAFETY: `destination..+len` is inside this allocation (checked); `data` is a live slice.
        unsafe { sys::cuMemcpyHtoD_v2(destination, data.as_ptr().cast::<c_void>(), data.len()) }
            .result()
            .map_err(driver_error("cuMemcpyHtoD"))
    }

    /// Copies out from `offset` into `out` (synchronous).
    pub fn download(&self, offset: usize, out: &mut [u8]) -> Result<(), GpuProbeError> {
        let source = self.address(offset, out.len())?;
        self.gpu.bind()?;
        // SAFETY: `source..+len` is inside this allocation (checked); `out` is a live slice.
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast::<c_void>(), source, out.len()) }
            .result()
            .map_err(driver_error("cuMemcpyDtoH"))
    }
}

impl DeviceBuffer {
    /// Copies out from `offset` into `len` bytes at `destination` (synchronous).
    ///
    /// # Safety
    /// `destination..destination + len` must be valid for writes for the duration of the call.
    pub(crate) unsafe fn download_raw(
        &self,
        offset: usize,
        destination: *mut u8,
        len: usize,
    ) -> Result<(), GpuProbeError> {
        let source = self.address(offset, len)?;
        self.gpu.bind()?;
        // SAFETY: `source..+len` is inside this allocation (checked); the destination is the
        // caller's obligation.
        unsafe { sys::cuMemcpyDtoH_v2(destination.cast::<c_void>(), source, len) }
            .result()
            .map_err(driver_error("cuMemcpyDtoH"))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: allocated by cuMemAlloc in `new`, freed once here.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Page-locked host memory the copy engines can reach directly (`cuMemHostAlloc`).
#[derive(Debug)]
pub struct PinnedBuffer {
    gpu: Arc<Gpu>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: an owned allocation; access goes through bounds-checked copies and device copies.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` bytes of portable pinned memory.
    pub fn new(gpu: &Arc<Gpu>, len: usize) -> Result<PinnedBuffer, GpuProbeError> {
        if len == 0 {
            return Err(GpuProbeError::Invalid("a pinned buffer has at least one byte".into()));
        }
        gpu.bind()?;
        // SAFETY: the context is current; the pointer is owned by this value.
        let ptr = unsafe { result::malloc_host(len, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(driver_error("cuMemHostAlloc"))?;
        Ok(PinnedBuffer { gpu: gpu.clone(), ptr: ptr.cast::<u8>(), len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Address of byte `offset` as the driver sees it (checked against the length).
    pub fn address(&self, offset: usize, len: usize) -> Result<*mut u8, GpuProbeError> {
        offset
            .checked_add(len)
            .filter(|end| *end <= self.len)
            // SAFETY: in bounds of the allocation (checked).
            .map(|_| unsafe { self.ptr.add(offset) })
            .ok_or_else(|| {
                GpuProbeError::Invalid(format!("{offset}+{len} B outside a {} B pinned buffer", self.len))
            })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once here.
        let _ = unsafe { result::free_host(self.ptr.cast::<c_void>()) };
    }
}
