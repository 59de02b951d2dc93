//! GPU facts and GPU staging through the CUDA driver (feature `cuda`), loaded at run time.
//!
//! Without the feature, or on a machine without `libcuda`, [`probe_gpus`] answers a
//! [`GpuProbeError`] that says which, and everything else keeps working on host memory.
//! With it, `Gpu`, `DeviceBuffer`, `PinnedBuffer` and `StagingPipeline` (present only with
//! `cuda`) move GPU memory through pinned host memory on the copy engines.

#[cfg(feature = "cuda")]
mod buffers;
#[cfg(feature = "cuda")]
mod peer_copy;
#[cfg(feature = "cuda")]
mod pipeline;
#[cfg(feature = "cuda")]
mod staging;

#[cfg(feature = "cuda")]
pub(crate) use buffers::HostRegistration;
#[cfg(feature = "cuda")]
pub use buffers::{cuda_slice_memory, DeviceBuffer, Gpu, PinnedBuffer};
#[cfg(feature = "cuda")]
pub(crate) use peer_copy::PeerCopier;
#[cfg(feature = "cuda")]
pub use pipeline::{CopyDirection, StagingPipeline};
#[cfg(feature = "cuda")]
pub use staging::{SocketStaging, STAGING_HALF_BYTES};

#[cfg(feature = "cuda")]
pub(crate) use rdma_hint_cuda::{driver_error, init_driver};
pub use rdma_hint_cuda::{probe_gpus, visible_ordinals, CudaGpu, GpuProbeError};
