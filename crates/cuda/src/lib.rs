//! # rdma-hint-cuda
//!
//! The CUDA driver calls that tell rdma-hint which GPUs this machine has (feature `driver`,
//! through cudarc, `libcuda` loaded at run time). Without the feature, or on a machine without
//! `libcuda`, [`probe_gpus`] answers a [`GpuProbeError`] that says which. The staged backend's
//! GPU memory uses `init_driver` and `driver_error` (feature `driver`), so every driver call is
//! checked the same way.

use rdma_hint_core::{GpuFacts, TransportError};
use thiserror::Error;

/// Why no GPU facts are available.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GpuProbeError {
    /// Built without the `cuda` feature.
    #[error("built without the `cuda` feature: GPU facts come from sysfs only")]
    NotCompiled,
    /// `libcuda.so` is not on this machine.
    #[error("libcuda not found: no NVIDIA driver on this machine (host memory only)")]
    NoDriver,
    /// The driver answered with an error.
    #[error("CUDA driver call {call} failed: {detail}")]
    Driver {
        /// The call.
        call: &'static str,
        /// The driver's error.
        detail: String,
    },
    /// A size or range the GPU path cannot take.
    #[error("invalid GPU request: {0}")]
    Invalid(String),
}

impl From<GpuProbeError> for TransportError {
    /// The transport error an embedder handles: no driver or no `cuda` feature is
    /// `Unavailable`, a driver call's failure `Driver`, a bad size or range `InvalidArgument`.
    fn from(error: GpuProbeError) -> TransportError {
        match error {
            GpuProbeError::NotCompiled | GpuProbeError::NoDriver => {
                TransportError::Unavailable { backend: "cuda", reason: error.to_string() }
            }
            GpuProbeError::Driver { call, detail } => TransportError::Driver { call, detail },
            GpuProbeError::Invalid(why) => TransportError::InvalidArgument { what: "GPU request", why },
        }
    }
}

/// One GPU as the CUDA driver numbers it.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaGpu {
    /// CUDA ordinal.
    pub ordinal: u32,
    /// Facts (PCI address lower-case `dddd:bb:dd.f`).
    pub facts: GpuFacts,
}

/// Queries every GPU the CUDA driver sees.
///
/// ```
/// // On a machine without the driver (or without the feature) this is a typed error.
/// match rdma_hint_cuda::probe_gpus() {
///     Ok(gpus) => assert!(gpus.iter().all(|g| g.facts.pci.is_some())),
///     Err(err) => println!("no GPU facts: {err}"),
/// }
/// ```
pub fn probe_gpus() -> Result<Vec<CudaGpu>, GpuProbeError> {
    imp::probe_gpus()
}

/// CUDA ordinals of the GPUs the driver sees (none without the driver).
pub fn visible_ordinals() -> impl Iterator<Item = u32> {
    probe_gpus().unwrap_or_default().into_iter().map(|g| g.ordinal)
}

#[cfg(not(feature = "driver"))]
mod imp {
    use super::{CudaGpu, GpuProbeError};

    pub(super) fn probe_gpus() -> Result<Vec<CudaGpu>, GpuProbeError> {
        Err(GpuProbeError::NotCompiled)
    }
}

/// Maps a driver error to [`GpuProbeError::Driver`] naming the call.
#[cfg(feature = "driver")]
pub fn driver_error(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> GpuProbeError {
    move |err| GpuProbeError::Driver { call, detail: format!("{err:?}") }
}

/// Checks for `libcuda` before any driver call (cudarc panics on calls without it) and
/// initialises the driver.
#[cfg(feature = "driver")]
pub fn init_driver() -> Result<(), GpuProbeError> {
    // SAFETY: only tries to dlopen the driver library by its known names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuProbeError::NoDriver);
    }
    cudarc::driver::result::init().map_err(driver_error("cuInit"))
}

#[cfg(feature = "driver")]
mod imp {
    use super::driver_error;
    use super::{CudaGpu, GpuProbeError};
    use cudarc::driver::{result, sys};
    use rdma_hint_core::GpuFacts;
    use std::sync::OnceLock;

    pub(super) fn probe_gpus() -> Result<Vec<CudaGpu>, GpuProbeError> {
        // The driver answers the same for the life of the process; ask it once.
        static PROBED: OnceLock<Result<Vec<CudaGpu>, GpuProbeError>> = OnceLock::new();
        PROBED.get_or_init(probe_uncached).clone()
    }

    fn probe_uncached() -> Result<Vec<CudaGpu>, GpuProbeError> {
        super::init_driver()?;
        let mut version = 0;
        // SAFETY: `version` is a valid, writable c_int for the duration of the call.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(driver_error("cuDriverGetVersion"))?;
        let driver_version = format!("{}.{}", version / 1000, (version % 1000) / 10);
        let count = result::device::get_count().map_err(driver_error("cuDeviceGetCount"))?;
        (0..count)
            .map(|ordinal| {
                let device = result::device::get(ordinal).map_err(driver_error("cuDeviceGet"))?;
                let attribute = |attribute| {
                    // SAFETY: `device` is a valid handle from cuDeviceGet; the attribute is a
                    // plain enum value of the bindings.
                    unsafe { result::device::get_attribute(device, attribute) }
                        .map_err(driver_error("cuDeviceGetAttribute"))
                };
                use sys::CUdevice_attribute::*;
                let pci = format!(
                    "{:04x}:{:02x}:{:02x}.0",
                    attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                    attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                    attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
                );
                // SAFETY: valid device handle, as above.
                let memory =
                    unsafe { result::device::total_mem(device) }.map_err(driver_error("cuDeviceTotalMem"))?;
                Ok(CudaGpu {
                    ordinal: ordinal as u32,
                    facts: GpuFacts {
                        name: result::device::get_name(device).ok(),
                        pci: Some(pci),
                        memory_bytes: Some(memory as u64),
                        gpudirect_rdma: attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)
                            .ok()
                            .map(|v| v != 0),
                        dmabuf: attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED).ok().map(|v| v != 0),
                        vmm_granularity_bytes: vmm_granularity(ordinal).ok(),
                        driver_version: Some(driver_version.clone()),
                    },
                })
            })
            .collect()
    }

    fn vmm_granularity(ordinal: i32) -> Result<u64, GpuProbeError> {
        // SAFETY: CUmemAllocationProp is a plain C struct of integers and one pointer, for which
        // all-zero bytes are a valid (empty) value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = ordinal;
        let mut granularity = 0usize;
        // SAFETY: both pointers are valid for the call; the driver only reads `prop` and writes
        // `granularity`.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .map_err(driver_error("cuMemGetAllocationGranularity"))?;
        Ok(granularity as u64)
    }
}
