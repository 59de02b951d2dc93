//! UCX UCP backend for rdma-hint.
//!
//! Not implemented yet: [`UcxTransport::open`] answers [`TransportError::NotImplemented`]. The
//! bindgen `-sys` crate over the system UCX headers, RMA put + flush and the shm/tcp tests are
//! tracked in issue #5.

use rdma_hint_core::TransportError;

/// Backend name used in transport ids (`ucx:<transports>`).
pub const BACKEND: &str = "ucx";

/// A UCP worker with one endpoint.
#[derive(Debug)]
pub struct UcxTransport {
    _not_constructible: (),
}

impl UcxTransport {
    /// Opens a UCP context restricted to `tls` (as `UCX_TLS`, e.g. `shm,self`).
    ///
    /// ```
    /// use rdma_hint_ucx::UcxTransport;
    /// assert!(UcxTransport::open("shm,self").is_err());
    /// ```
    pub fn open(_tls: &str) -> Result<UcxTransport, TransportError> {
        Err(TransportError::NotImplemented { backend: BACKEND, tracking: "issue #5" })
    }
}
