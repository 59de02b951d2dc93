//! One verbs lane as its domain sees it: its QP, the send queue's accounting and the
//! completion array, the link's state and what its connect exposed.

use crate::events::Events;
use crate::qp::QueuePair;
use crate::region::Region;
use crate::wire::ExposedRegion;
use rdma_hint_backend_core::lanes::Exposure;
use rdma_hint_backend_core::peer_regions::{PeerRegions, Withdrawals};
use rdma_hint_backend_core::DomainCore;
use rdma_hint_oob::ControlChannel;
use rdma_mummy_sys as ibv;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The pre-sized work requests one post fills and chains (nothing allocates per post), and the
/// send queue's accounting.
pub(crate) struct Posting {
    pub(crate) wrs: Vec<ibv::ibv_send_wr>,
    pub(crate) sges: Vec<ibv::ibv_sge>,
    /// Work requests posted and not yet retired by a signalled completion.
    pub(crate) in_flight: usize,
    /// For each signalled WR in posting order: how many WRs its completion retires.
    pub(crate) retires: VecDeque<usize>,
    pub(crate) since_signal: usize,
    /// WRs posted so far, and retired so far: a withdrawal of the peer's waits until the
    /// second reaches what the first was when it came.
    pub(crate) posted: u64,
    pub(crate) retired: u64,
}

// SAFETY: the only pointers are the chain links (`sg_list`, `next`) into `wrs` and `sges`
// themselves; they are set and handed to `ibv_post_send` only while the `posting` lock is
// held, and are never read otherwise.
unsafe impl Send for Posting {}

/// The completion array polls fill, and when the out-of-band socket was last looked at.
pub(crate) struct Polling {
    pub(crate) wcs: Vec<ibv::ibv_wc>,
    pub(crate) checked: Instant,
    pub(crate) empty_polls: u32,
}

/// What is one lane's own: its QP (and CQs), the send queue's accounting, the completion
/// array, the link's state, what it exposed and what the peer exposed to it.
pub(crate) struct Lane {
    pub(crate) qp: Arc<QueuePair>,
    pub(crate) posting: Mutex<Posting>,
    pub(crate) polling: Mutex<Polling>,
    pub(crate) events: Arc<Events>,
    pub(crate) exposure: Exposure,
    /// The peer's regions this lane posts to: its hello's, then those of its control frames.
    pub(crate) peer: PeerRegions<ExposedRegion>,
    /// The out-of-band socket, set once connected (the event thread holds it from the end of
    /// the handshake).
    pub(crate) control: OnceLock<Arc<ControlChannel>>,
    /// The peer's withdrawals waiting for this lane's WRs to retire.
    pub(crate) withdrawals: Withdrawals<ExposedRegion>,
    /// Held while the peer's requests are acted on, so they are acted on in order.
    pub(crate) serving: Mutex<()>,
}

impl Lane {
    pub(crate) fn broken(&self) -> bool {
        self.events.gone.is_gone()
    }

    /// Once the link is gone, WRs that were never signalled can never be retired by a
    /// completion: moves the QP to ERR (the device reads no more memory for it), drains the
    /// send CQ of its flush completions and counts nothing in flight. False if the QP cannot
    /// be moved.
    fn flushed_after_loss(&self) -> bool {
        if let Err(error) = self.qp.to_error() {
            tracing::debug!(%error, "verbs: cannot move the QP to ERR");
            return false;
        }
        let mut polling = lock(&self.polling);
        while self.qp.send_cq().poll(&mut polling.wcs).is_ok_and(|found| found > 0) {}
        let mut posting = lock(&self.posting);
        posting.in_flight = 0;
        posting.retired = posting.posted;
        posting.retires.clear();
        posting.since_signal = 0;
        drop((posting, polling));
        // The QP is in ERR: none of its WRs reaches the peer's memory any more.
        self.answer_withdrawals();
        true
    }
}

impl rdma_hint_backend_core::lanes::Lane for Lane {
    // Posts count their WRs under the region table's read lock (then the posting lock).
    type Quiet<'a> = ();

    fn quiet(&self) {}

    /// Whether work requests of this lane are in flight (their regions may still be read).
    fn busy(&self, _: &mut ()) -> bool {
        lock(&self.posting).in_flight > 0 && !(self.broken() && self.flushed_after_loss())
    }

    fn exposure(&self) -> &Exposure {
        &self.exposure
    }

    /// Once the link is gone, the QP is (or is being) moved to ERR: the peer's writes are
    /// refused by this side's NIC.
    fn peer_may_write(&self) -> bool {
        !self.broken()
    }
}

/// The domain the lanes of one connection share: one protection domain's regions.
pub(crate) type VerbsDomain = DomainCore<Region, Lane>;
