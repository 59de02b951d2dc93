//! # rdma-hint-discovery
//!
//! Facts about this machine that the model needs and cannot compute: the PCIe tree between each
//! memory source and each NIC, read from a sysfs tree ([`sysfs`], [`topology`]), and the GPUs
//! the CUDA driver sees ([`gpus`], feature `cuda`). Reads only; writes nothing.
//!
//! ```
//! use rdma_hint_discovery::Topology;
//!
//! // Any directory laid out like /sys works; a missing one is a typed error, not a panic.
//! match Topology::discover(std::path::Path::new("/nonexistent-sysfs")) {
//!     Ok(topology) => println!("{} NICs", topology.nics.len()),
//!     Err(err) => println!("no topology: {err}"),
//! }
//! ```
#![forbid(unsafe_code)]

pub mod sysfs;
pub mod topology;

pub use rdma_hint_cuda::{CudaGpu, GpuProbeError};
pub use topology::Topology;

/// Every GPU the CUDA driver sees, with its facts (PCI address lower-case `dddd:bb:dd.f`).
///
/// Without the `cuda` feature, or on a machine without `libcuda`, a [`GpuProbeError`] that says
/// which; the driver is asked once per process.
///
/// ```
/// match rdma_hint_discovery::gpus() {
///     Ok(gpus) => assert!(gpus.iter().all(|g| g.facts.pci.is_some())),
///     Err(err) => println!("no GPU facts: {err}"),
/// }
/// ```
pub fn gpus() -> Result<Vec<CudaGpu>, GpuProbeError> {
    rdma_hint_cuda::probe_gpus()
}
