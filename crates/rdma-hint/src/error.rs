//! Errors of the facade.

use rdma_hint_core::sysfs::DiscoveryError;
use rdma_hint_core::{HintError, SourceId};
use thiserror::Error;

/// Why a hint or a probe could not be produced.
#[derive(Debug, Error)]
pub enum Error {
    /// The sysfs tree could not be read.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// The model refused the path or its inputs.
    #[error(transparent)]
    Hint(#[from] HintError),
    /// No such GPU or host node on this machine.
    #[error("unknown device {device}; this machine has: {available}")]
    UnknownDevice {
        /// The device asked for.
        device: SourceId,
        /// The devices that exist.
        available: String,
    },
    /// No such transport on this machine or in this build.
    #[error("unknown transport `{transport}`; available: {available}")]
    UnknownTransport {
        /// The transport asked for.
        transport: String,
        /// The transports that exist.
        available: String,
    },
    /// A pair whose path cannot be modelled (NIC position unknown, port without a rate).
    #[error("no path from {device} to {transport}: {why}")]
    NoPath {
        /// The device.
        device: SourceId,
        /// The transport.
        transport: String,
        /// Why.
        why: String,
    },
}
