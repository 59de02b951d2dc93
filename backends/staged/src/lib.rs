//! Host-staged fallback backend for rdma-hint: the path every machine has.
//!
//! Data goes source → pinned staging ring → shared memory or TCP → pinned staging ring →
//! destination. This crate already supplies the channel capabilities the hint model reads
//! ([`capabilities`]) and, with feature `cuda`, the GPU facts of the machine ([`gpu`]). The data
//! path itself is tracked in issue #6: [`StagedTransport::open`] says so through
//! [`TransportError::NotImplemented`].

pub mod channel;
pub mod gpu;

pub use channel::{capabilities, StagedChannel};

use rdma_hint_core::TransportError;

/// Backend name used in transport ids (`staged:shm`, `staged:tcp`).
pub const BACKEND: &str = "staged";

/// The staged transport over one channel.
#[derive(Debug)]
pub struct StagedTransport {
    _not_constructible: (),
}

impl StagedTransport {
    /// Opens a staged transport over `channel`.
    ///
    /// ```
    /// use rdma_hint_staged::{StagedChannel, StagedTransport};
    /// assert!(StagedTransport::open(StagedChannel::Tcp).is_err());
    /// ```
    pub fn open(_channel: StagedChannel) -> Result<StagedTransport, TransportError> {
        Err(TransportError::NotImplemented { backend: BACKEND, tracking: "issue #6" })
    }
}
