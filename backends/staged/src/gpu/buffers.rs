//! GPU contexts, device buffers and pinned host buffers.

use super::{driver_error, init_driver, invalid};
use cudarc::driver::{result, sys};
use rdma_hint_core::TransportError;
use rdma_hint_core::{CallerMemory, ForeignMemory};
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
    pub fn open(ordinal: u32) -> Result<Arc<Gpu>, TransportError> {
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
    pub fn bind(&self) -> Result<(), TransportError> {
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

/// Device memory on one GPU: allocated here, or the caller's, used in place.
#[derive(Debug)]
pub struct DeviceBuffer {
    gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
    len: usize,
    owner: Owner,
}

/// Who frees a device buffer's memory.
#[derive(Debug)]
enum Owner {
    /// This value (`cuMemFree` on drop).
    Driver,
    /// The caller (`None` once handed back).
    Caller(Option<CallerMemory>),
}

/// Reads one pointer attribute of `ptr` into a `T`.
fn pointer_attribute<T: Default>(
    ptr: sys::CUdeviceptr,
    attribute: sys::CUpointer_attribute,
) -> Result<T, TransportError> {
    let mut value = T::default();
    // SAFETY: `value` is a live `T` of the size the attribute writes (an int for the ordinal,
    // a CUdeviceptr or size_t for the range, as the driver documents); the driver only reads
    // its own bookkeeping for `ptr` and fails for an address it does not know.
    unsafe { sys::cuPointerGetAttribute((&mut value as *mut T).cast::<c_void>(), attribute, ptr) }
        .result()
        .map_err(driver_error("cuPointerGetAttribute"))?;
    Ok(value)
}

impl DeviceBuffer {
    /// Allocates `len` bytes on `gpu` (plain `cuMemAlloc`, never managed memory).
    pub fn new(gpu: &Arc<Gpu>, len: usize) -> Result<DeviceBuffer, TransportError> {
        if len == 0 {
            return Err(invalid("a device buffer has at least one byte".into()));
        }
        gpu.bind()?;
        // SAFETY: the context is current; the returned pointer is owned by this value.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(driver_error("cuMemAlloc"))?;
        Ok(DeviceBuffer { gpu: gpu.clone(), ptr, len, owner: Owner::Driver })
    }

    /// The caller's device memory on `gpu`, used in place, after the driver confirms that
    /// `device_ptr..+len` lies inside one allocation of that GPU (an address the driver does
    /// not know, another GPU's memory or a range past the allocation's end is refused).
    pub(crate) fn caller(
        gpu: &Arc<Gpu>,
        memory: CallerMemory,
    ) -> Result<DeviceBuffer, (TransportError, CallerMemory)> {
        let ForeignMemory::CudaDevice { ordinal, device_ptr, len } = memory.memory() else {
            return Err((invalid("not CUDA device memory".into()), memory));
        };
        let checked = (|| {
            let size = usize::try_from(len).map_err(|_| invalid(format!("{len} B")))?;
            gpu.bind()?;
            let owner: i32 =
                pointer_attribute(device_ptr, sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)?;
            if u32::try_from(owner).ok() != Some(ordinal) || ordinal != gpu.ordinal() {
                return Err(invalid(format!(
                    "device pointer {device_ptr:#x} is memory of GPU {owner}, not GPU {ordinal}"
                )));
            }
            let start: sys::CUdeviceptr = pointer_attribute(
                device_ptr,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            )?;
            let span: usize =
                pointer_attribute(device_ptr, sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE)?;
            let end = start.checked_add(span as u64);
            if device_ptr.checked_add(len).zip(end).is_none_or(|(want, have)| want > have) {
                return Err(invalid(format!(
                    "{device_ptr:#x}+{len} B runs past its allocation ({start:#x}+{span} B)"
                )));
            }
            Ok(size)
        })();
        match checked {
            Ok(size) => Ok(DeviceBuffer {
                gpu: gpu.clone(),
                ptr: device_ptr,
                len: size,
                owner: Owner::Caller(Some(memory)),
            }),
            Err(error) => Err((error, memory)),
        }
    }

    /// Hands the caller's memory back (`Err(self)` for memory allocated here).
    pub(crate) fn into_caller(mut self) -> Result<CallerMemory, DeviceBuffer> {
        match &mut self.owner {
            Owner::Caller(memory) => memory.take().ok_or(self),
            Owner::Driver => Err(self),
        }
    }

    /// Whether the memory is the caller's.
    pub(crate) fn is_caller(&self) -> bool {
        matches!(self.owner, Owner::Caller(_))
    }

    /// The `CUdeviceptr` of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
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
    pub fn address(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, TransportError> {
        offset
            .checked_add(len)
            .filter(|end| *end <= self.len)
            .map(|_| self.ptr + offset as u64)
            .ok_or_else(|| invalid(format!("{offset}+{len} B outside a {} B device buffer", self.len)))
    }

    /// Copies `data` in at `offset` (synchronous).
    pub fn upload(&self, offset: usize, data: &[u8]) -> Result<(), TransportError> {
        let destination = self.address(offset, data.len())?;
        self.gpu.bind()?;
        // SAFETY: `destination..+len` is inside this allocation (checked); `data` is a live slice.
        unsafe { sys::cuMemcpyHtoD_v2(destination, data.as_ptr().cast::<c_void>(), data.len()) }
            .result()
            .map_err(driver_error("cuMemcpyHtoD"))
    }

    /// Copies out from `offset` into `out` (synchronous).
    pub fn download(&self, offset: usize, out: &mut [u8]) -> Result<(), TransportError> {
        let source = self.address(offset, out.len())?;
        self.gpu.bind()?;
        // SAFETY: `source..+len` is inside this allocation (checked); `out` is a live slice.
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast::<c_void>(), source, out.len()) }
            .result()
            .map_err(driver_error("cuMemcpyDtoH"))
    }
}

impl DeviceBuffer {
    /// Copies `len` bytes at `source` in at `offset` (synchronous).
    ///
    /// # Safety
    /// `source..source + len` must be valid for reads for the duration of the call.
    pub(crate) unsafe fn upload_raw(
        &self,
        offset: usize,
        source: *const u8,
        len: usize,
    ) -> Result<(), TransportError> {
        let destination = self.address(offset, len)?;
        self.gpu.bind()?;
        // SAFETY: `destination..+len` is inside this allocation (checked); the source is the
        // caller's obligation.
        unsafe { sys::cuMemcpyHtoD_v2(destination, source.cast::<c_void>(), len) }
            .result()
            .map_err(driver_error("cuMemcpyHtoD"))
    }

    /// Copies out from `offset` into `len` bytes at `destination` (synchronous).
    ///
    /// # Safety
    /// `destination..destination + len` must be valid for writes for the duration of the call.
    pub(crate) unsafe fn download_raw(
        &self,
        offset: usize,
        destination: *mut u8,
        len: usize,
    ) -> Result<(), TransportError> {
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
        if let Owner::Caller(_) = self.owner {
            return; // the caller's owner (if any) frees it, after the transport is done
        }
        let _ = self.gpu.bind();
        // SAFETY: allocated by cuMemAlloc in `new`, freed once here.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Host memory this process mapped, page-locked for the copy engines (`cuMemHostRegister`)
/// until dropped.
#[derive(Debug)]
pub(crate) struct HostRegistration {
    gpu: Arc<Gpu>,
    base: *mut u8,
}

// SAFETY: only the address is kept, to hand back to the driver on drop.
unsafe impl Send for HostRegistration {}
// SAFETY: as above: no access through the address.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Page-locks `base..base + len`.
    ///
    /// # Safety
    /// The range must be a live mapping that outlives the registration.
    pub(crate) unsafe fn new(
        gpu: &Arc<Gpu>,
        base: *mut u8,
        len: usize,
    ) -> Result<HostRegistration, TransportError> {
        gpu.bind()?;
        // SAFETY: a live mapping for the registration's life (this function's contract); the
        // driver only locks its pages.
        unsafe { sys::cuMemHostRegister_v2(base.cast::<c_void>(), len, sys::CU_MEMHOSTREGISTER_PORTABLE) }
            .result()
            .map_err(driver_error("cuMemHostRegister"))?;
        Ok(HostRegistration { gpu: gpu.clone(), base })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: registered in `new`, unregistered once here, still mapped (its contract).
        let _ = unsafe { sys::cuMemHostUnregister(self.base.cast::<c_void>()) };
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
    pub fn new(gpu: &Arc<Gpu>, len: usize) -> Result<PinnedBuffer, TransportError> {
        if len == 0 {
            return Err(invalid("a pinned buffer has at least one byte".into()));
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
    pub fn address(&self, offset: usize, len: usize) -> Result<*mut u8, TransportError> {
        offset
            .checked_add(len)
            .filter(|end| *end <= self.len)
            // SAFETY: in bounds of the allocation (checked).
            .map(|_| unsafe { self.ptr.add(offset) })
            .ok_or_else(|| invalid(format!("{offset}+{len} B outside a {} B pinned buffer", self.len)))
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once here.
        let _ = unsafe { result::free_host(self.ptr.cast::<c_void>()) };
    }
}

/// A cudarc `CudaSlice<u8>` as caller memory, registered in place and handed back by
/// `release` (take it with `CallerMemory::take::<CudaSlice<u8>>()`). The slice's stream is
/// synchronised first, so a kernel that filled it has finished before any op reads it.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use cudarc::driver::CudaContext;
/// let stream = CudaContext::new(0)?.default_stream();
/// let slice = stream.alloc_zeros::<u8>(1 << 20)?;
/// let memory = rdma_hint_staged::gpu::cuda_slice_memory(slice)?;
/// assert_eq!(memory.len(), 1 << 20);
/// # Ok(()) }
/// ```
pub fn cuda_slice_memory(slice: cudarc::driver::CudaSlice<u8>) -> Result<CallerMemory, TransportError> {
    use cudarc::driver::DevicePtr;
    slice.stream().synchronize().map_err(driver_error("cuStreamSynchronize"))?;
    let (device_ptr, recorded) = slice.device_ptr(slice.stream());
    let memory =
        ForeignMemory::CudaDevice { ordinal: slice.ordinal() as u32, device_ptr, len: slice.len() as u64 };
    drop(recorded);
    // SAFETY: `device_ptr..+len` is the slice's own allocation; the slice moves into the owner
    // box, which keeps it (and so the allocation, at a fixed address) alive until `take`.
    Ok(unsafe { CallerMemory::owned(memory, Box::new(slice)) })
}
