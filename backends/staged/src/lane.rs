//! What one staged lane shares with its domain and its link threads: the ops it has in flight,
//! the copies its code made, whether its peer is gone, and what its connect exposed.

use rdma_hint_backend_core::caller_memory::CopyMeter;
use rdma_hint_backend_core::lanes::{Exposure, Lane};
use rdma_hint_backend_core::PeerGone;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// One lane's state (see [`Lane`]). Posts count their ops in flight under the region table's
/// read lock, so the domain's write lock alone keeps them off.
#[derive(Debug, Default)]
pub(crate) struct StagedLane {
    /// The bytes this lane's code copies.
    pub(crate) copies: CopyMeter,
    /// Posted ops the sender thread has not finished with (their source regions are busy
    /// until then).
    pub(crate) in_flight: AtomicUsize,
    /// Why the link stopped; first reason wins.
    pub(crate) gone: PeerGone,
    /// Set when the sender thread ends: ops queued after that are never read.
    pub(crate) sender_done: AtomicBool,
    /// The regions this lane's connect exposed.
    pub(crate) exposure: Exposure,
}

impl Lane for StagedLane {
    type Quiet<'a> = ();

    fn quiet(&self) {}

    fn busy(&self, _: &mut ()) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0 && !self.sender_done.load(Ordering::Acquire)
    }

    fn exposure(&self) -> &Exposure {
        &self.exposure
    }

    /// From the start of its connect until its link breaks: the peer writes (over shm, into
    /// the mapping it holds) only while the link runs, and a broken link admits nothing more.
    fn peer_may_write(&self) -> bool {
        !self.gone.is_gone()
    }
}

/// Marks the sender thread done when it ends, however it ends.
pub(crate) struct SenderDone<'a>(pub(crate) &'a StagedLane);

impl Drop for SenderDone<'_> {
    fn drop(&mut self) {
        self.0.sender_done.store(true, Ordering::Release);
    }
}
