//! Errors of the facade.

use rdma_hint_core::TransportError;
use rdma_hint_core::{ErrorKind, HintError, SourceId, TransportId};
use rdma_hint_discovery::sysfs::DiscoveryError;
use thiserror::Error;

/// Why a hint, a probe or [`open`](crate::open) failed.
#[derive(Debug, Error)]
#[non_exhaustive]
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
        transport: TransportId,
        /// The transports that exist.
        available: String,
    },
    /// A pair whose path cannot be modelled (NIC position unknown, port without a rate).
    #[error("no path from {device} to {transport}: {why}")]
    NoPath {
        /// The device.
        device: SourceId,
        /// The transport.
        transport: TransportId,
        /// Why.
        why: String,
    },
    /// No transport has a hint for the device (what [`TransportSelector::Auto`](crate::TransportSelector::Auto) answers
    /// then).
    #[error("no transport has a hint for {device}: {why}")]
    NoTransport {
        /// The device.
        device: SourceId,
        /// Why, and what exists.
        why: String,
    },
    /// A transport id that does not parse.
    #[error("invalid transport id `{id}`: {why}")]
    InvalidTransportId {
        /// The text given.
        id: String,
        /// What is wrong and what is accepted.
        why: String,
    },
    /// The transport's backend is not compiled into this build.
    #[error("{transport} needs the `{feature}` backend, which this build lacks: enable the cargo feature `{feature}` of rdma-hint")]
    FeatureMissing {
        /// The transport asked for.
        transport: TransportId,
        /// The cargo feature that provides it.
        feature: &'static str,
    },
    /// Discovering the machine failed (for a caller that waited for a discovery another one
    /// started; the one that ran it gets the discovery's own error).
    #[error("discovering this machine failed: {why}")]
    DiscoveryFailed {
        /// The discovery's error, as text.
        why: String,
    },
    /// The hint cache cannot be written (no cache directory, or the file system refused): the
    /// measurement that was to be stored is still valid.
    #[error("cannot store in the hint cache: {why}")]
    Cache {
        /// Which file, and what refused it.
        why: String,
    },
    /// No calibration of this pair is stored under the current driver versions (or only one
    /// from before calibrations had margins), so no time can be estimated with bounds.
    #[error("no calibration of {transport} from {device} with margins is stored: run `rdma-hint calibrate` for it first")]
    NotCalibrated {
        /// Memory source.
        device: crate::Device,
        /// The transport asked for.
        transport: TransportId,
    },
    /// [`open_lanes`](crate::open_lanes) cannot open this many lanes of this transport.
    #[error("cannot open {lanes} lanes of {transport}: {why}")]
    Lanes {
        /// The transport asked for.
        transport: TransportId,
        /// Lanes asked for.
        lanes: usize,
        /// Why, and what to do instead.
        why: String,
    },
    /// The backend is compiled in but cannot run here (library or device missing).
    #[error("{transport} is unavailable here: {source}")]
    Unavailable {
        /// The transport asked for.
        transport: TransportId,
        /// The backend's reason.
        #[source]
        source: TransportError,
    },
    /// DeepEP refuses these sizes (see [`deepep`](crate::deepep)).
    #[error(transparent)]
    DeepEp(#[from] rdma_hint_core::deepep::DeepEpError),
    /// A transport operation failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A chunked transfer failed (with the bytes confirmed before it did).
    #[error(transparent)]
    Transfer(#[from] rdma_hint_engine::TransferError),
    /// A transfer could not be planned (sizes, alignment, regions, policy).
    #[error(transparent)]
    Plan(#[from] rdma_hint_engine::PlanError),
}

impl Error {
    /// What kind of failure this is: what the caller can do about it (a transport's or a
    /// transfer's own kind, through them).
    ///
    /// ```
    /// use rdma_hint::{get_low_latency_rdma_size_hint_with, Device, ErrorKind, TransportSelector};
    /// let nowhere = TransportSelector::Id("verbs:nonexistent".parse()?);
    /// // No such device here, or no verbs backend in this build: either way, not here.
    /// let error = get_low_latency_rdma_size_hint_with(Device::Host(0), &nowhere).unwrap_err();
    /// assert!(matches!(error.kind(), ErrorKind::Unsupported | ErrorKind::InvalidInput), "{error}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Discovery(_) | Error::DiscoveryFailed { .. } | Error::Cache { .. } => ErrorKind::System,
            Error::Hint(_)
            | Error::UnknownDevice { .. }
            | Error::UnknownTransport { .. }
            | Error::InvalidTransportId { .. }
            | Error::DeepEp(_)
            | Error::Lanes { .. } => ErrorKind::InvalidInput,
            Error::NoPath { .. }
            | Error::NoTransport { .. }
            | Error::FeatureMissing { .. }
            | Error::NotCalibrated { .. }
            | Error::Unavailable { .. } => ErrorKind::Unsupported,
            Error::Transport(error) => error.kind(),
            Error::Transfer(error) => error.kind(),
            Error::Plan(error) => error.kind(),
        }
    }
}
