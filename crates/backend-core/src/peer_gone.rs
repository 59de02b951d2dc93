//! The one place a connection records that its peer is gone, and why.

use rdma_hint_core::TransportError;
use std::sync::OnceLock;

/// Why a connection ended, set once by whoever sees it first (a link thread, a poll, a failed
/// post) and read without a lock by every post and wait after that: a post refuses with
/// [`error`](PeerGone::error), and a wait that finds nothing left to drain ends with it.
///
/// Setting it publishes everything the setter queued before (release), so a waiter that reads
/// it before draining its queues and then finds them empty knows nothing more will come.
///
/// ```
/// use rdma_hint_core::TransportError;
/// use rdma_hint_backend_core::PeerGone;
/// let gone = PeerGone::default();
/// assert!(!gone.is_gone());
/// assert!(gone.set("the peer closed its socket"));
/// assert!(!gone.set("a later failure")); // the first reason stays
/// assert!(matches!(gone.error(), TransportError::PeerGone(why) if why == "the peer closed its socket"));
/// ```
#[derive(Debug, Default)]
pub struct PeerGone(OnceLock<String>);

impl PeerGone {
    /// Records why the connection ended; true if this was the first reason (the caller logs it).
    pub fn set(&self, why: impl Into<String>) -> bool {
        self.0.set(why.into()).is_ok()
    }

    /// Why the connection ended, if it has.
    pub fn why(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }

    /// Whether the connection has ended.
    pub fn is_gone(&self) -> bool {
        self.0.get().is_some()
    }

    /// The error a post or a drained wait answers once the connection has ended (before any
    /// reason is known: "the connection is closed").
    pub fn error(&self) -> TransportError {
        TransportError::PeerGone(self.why().unwrap_or("the connection is closed").to_string())
    }
}
