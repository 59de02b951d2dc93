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

/// Loads the driver once (`cuInit`): no driver is [`TransportError::Unavailable`].
#[cfg(feature = "cuda")]
pub(crate) fn init_driver() -> Result<(), rdma_hint_core::TransportError> {
    Ok(rdma_hint_cuda::init_driver()?)
}

/// [`rdma_hint_cuda::driver_error`], as the transport error it converts to
/// ([`TransportError::Driver`](rdma_hint_core::TransportError::Driver) naming the call).
#[cfg(feature = "cuda")]
pub(crate) fn driver_error(
    call: &'static str,
) -> impl Fn(cudarc::driver::DriverError) -> rdma_hint_core::TransportError {
    let probe_error = rdma_hint_cuda::driver_error(call);
    move |err| probe_error(err).into()
}

/// A size or range the GPU path cannot take, as the transport error it converts to.
#[cfg(feature = "cuda")]
pub(crate) fn invalid(why: String) -> rdma_hint_core::TransportError {
    GpuProbeError::Invalid(why).into()
}
pub use rdma_hint_cuda::{probe_gpus, visible_ordinals, CudaGpu, GpuProbeError};
