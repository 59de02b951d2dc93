//! What one staged lane shares with its domain and its link threads: the ops it has in flight,
//! whether its peer is gone, and what its connect exposed.

use rdma_hint_backend_core::lanes::{Exposure, Lane};
use rdma_hint_backend_core::PeerGone;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// One lane's state (see [`Lane`]). Posts count their ops in flight under the region table's
/// read lock, so the domain's write lock alone keeps them off.
#[derive(Debug, Default)]
pub(crate) struct StagedLane {
    /// Posted ops the sender thread has not finished with (their source regions are busy
    /// until then).
    pub(crate) in_flight: AtomicUsize,
    /// Ops ever queued for the sender thread, and of those the ones it finished with (sent,
    /// copied or flushed): a withdrawal the peer asks for waits until `retired` reaches the
    /// count `queued` had when it came.
    pub(crate) queued: AtomicU64,
    pub(crate) retired: AtomicU64,
    /// Why the link stopped; first reason wins.
    pub(crate) gone: PeerGone,
    /// Set when the sender thread ends: ops queued after that are never read.
    pub(crate) sender_done: AtomicBool,
    /// Set when the reader thread ends: no read's answer is placed after that.
    pub(crate) reader_done: AtomicBool,
    /// The regions this lane's connect exposed.
    pub(crate) exposure: Exposure,
}

impl Lane for StagedLane {
    type Quiet<'a> = ();

    fn quiet(&self) {}

    /// Ops in flight keep their regions busy until both link threads have ended: the sender
    /// reads the sources of writes, the reader places the answers of reads (an op queued after
    /// the sender ended stays counted, and nothing touches it once both are gone).
    fn busy(&self, _: &mut ()) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
            && !(self.sender_done.load(Ordering::Acquire) && self.reader_done.load(Ordering::Acquire))
    }

    fn exposure(&self) -> &Exposure {
        &self.exposure
    }

    /// From the start of its connect until its link has broken and its reader thread ended:
    /// over TCP the peer's writes land through that thread (which may be placing one when the
    /// link breaks); over shm the peer writes the mapping it holds while the link runs, and
    /// the watcher of its socket ends once the break is on the wire.
    fn peer_may_write(&self) -> bool {
        !(self.gone.is_gone() && self.reader_done.load(Ordering::Acquire))
    }
}

/// Marks a link thread done (its flag in [`StagedLane`]) when it ends, however it ends.
pub(crate) struct ThreadDone<'a>(pub(crate) &'a AtomicBool);

impl Drop for ThreadDone<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}
