//! Raw ibverbs RC backend for rdma-hint.
//!
//! Not implemented yet: [`VerbsTransport::open`] answers [`TransportError::NotImplemented`] so
//! embedders and the CLI can say why verbs hints come from sysfs facts only. The RC queue pairs,
//! run-time loading of libibverbs and the Soft-RoCE harness are tracked in issue #4.

use rdma_hint_core::TransportError;

/// Backend name used in transport ids (`verbs:<device>`).
pub const BACKEND: &str = "verbs";

/// An RC queue-pair transport on one RDMA device.
#[derive(Debug)]
pub struct VerbsTransport {
    _not_constructible: (),
}

impl VerbsTransport {
    /// Opens `device` (e.g. `mlx5_0`, `rxe0`).
    ///
    /// ```
    /// use rdma_hint_verbs::VerbsTransport;
    /// assert!(VerbsTransport::open("rxe0").is_err());
    /// ```
    pub fn open(_device: &str) -> Result<VerbsTransport, TransportError> {
        Err(TransportError::NotImplemented { backend: BACKEND, tracking: "issue #4" })
    }
}
