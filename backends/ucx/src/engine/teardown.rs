//! Tearing a UCX connection down: a failure or goodbye fails what is outstanding and closes
//! the endpoint by force, an orderly shutdown flushes first; the peer's keys go after the
//! close has finished purging the puts that name them.

use super::Engine;
use crate::ring;
use crate::status::completion_code;
use rdma_hint_core::{Completion, CompletionStatus};
use rdma_hint_oob::PeerLoss;
use rdma_hint_ucx_sys as sys;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

impl Engine {
    /// Marks the connection gone: closes the endpoint by force, fails every signalled op not
    /// yet completed (nothing undelivered is reported delivered) and closes the arrival queue.
    pub(crate) fn fail(&mut self, why: String) {
        self.lost(PeerLoss::failure(why));
    }

    /// [`Engine::fail`] for `loss`, logged quietly when the peer said goodbye.
    pub(crate) fn lost(&mut self, loss: PeerLoss) {
        if self.signals.gone.is_gone() {
            return;
        }
        if loss.clean {
            tracing::debug!(why = %loss.why, "ucx: connection closed");
        } else {
            tracing::warn!(why = %loss.why, "ucx: connection lost");
        }
        self.signals.gone.set(loss.why);
        self.close();
        // This side writes no more: the peer reads it off its socket at once, and may let go of
        // the regions it exposed (it guards them until it sees this side stop). A goodbye is
        // answered with one (an EOF would read as a vanished process to a peer still looking);
        // a failure closes the socket's write half.
        if let Some(control) = &self.control {
            if loss.clean {
                control.say_goodbye();
            } else {
                if let Some(stream) = control.stream() {
                    let _ = stream.shutdown(std::net::Shutdown::Write);
                }
            }
        }
        // The forced close ends every put: none reads its source any more.
        self.unflushed = 0;
        while let Some(batch) = self.batches.pop_front() {
            if !batch.request.is_null() {
                // SAFETY: after the forced close UCX has completed or will complete the request;
                // freeing hands it back either way.
                unsafe { sys::ucp_request_free(batch.request) };
            }
            for _ in 0..batch.signalled {
                if let Some(wr_id) = self.signalled.pop_front() {
                    let code = completion_code(sys::UCS_ERR_CONNECTION_RESET);
                    let _ = self
                        .completions
                        .try_send(Completion { wr_id, status: CompletionStatus::Failed { code } });
                }
            }
        }
        // The peer's last notices on the ring are its last word too.
        for _ in 0..ring::RING_SLOTS / 64 {
            match self.signals.ring_to_queue(usize::MAX) {
                Ok(0) => break,
                Ok(_) => {}
                Err(why) => {
                    tracing::warn!(%why, "ucx: the peer's last notices are not taken");
                    break;
                }
            }
        }
        // Dropping the arrival sender wakes arrival waits; completion waits are woken here.
        self.signals.arrivals.lock().unwrap_or_else(PoisonError::into_inner).take();
        // Only now: a poll that sees `gone` (and so answers PeerGone on an empty queue) finds
        // every failed completion queued.
        self.signals.all_queued.store(true, Ordering::Release);
        self.completions.wake();
    }

    /// Closes the endpoint, then releases the peer's rkeys. Unless the connection failed,
    /// everything this side sent (the last notice included) is flushed to the peer first;
    /// the close itself is forced so it never waits on (or reconnects to) a peer that left.
    fn close(&mut self) {
        if self.ep.is_null() {
            return;
        }
        // Unflushed at the bound or not, the close below is forced: it ends every put.
        let _ = self.drain();
        // A flush that failed inside `drain` has closed the endpoint already (`fail`).
        if self.ep.is_null() {
            return;
        }
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
            flags: sys::UCP_EP_CLOSE_FLAG_FORCE,
            ..Default::default()
        };
        // SAFETY: `ep` is live and closed once (set to null right after).
        let request = unsafe { sys::ucp_ep_close_nbx(self.ep, &param) };
        self.ep = std::ptr::null_mut();
        // A forced close purges the endpoint's pending puts as it goes, and a purged put still
        // names its rkey: until the close has finished, no key may be destroyed. One that does
        // not finish in time (tcp with megabytes queued on a busy machine) leaves the keys to
        // the worker's teardown: destroying them under it corrupted the heap (loaded run 21).
        if self.ucp.finish(request, 10_000) == sys::UCS_INPROGRESS {
            tracing::warn!("ucx: endpoint close did not finish in time; the peer's keys go with the worker");
            self.keys_pinned = true;
        }
        while let Some(request) = self.notice_sends.pop_front() {
            // SAFETY: freeing hands the request back to UCX whether or not it finished.
            unsafe { sys::ucp_request_free(request) };
        }
        if let Some(direct) = self.direct.take() {
            // The ring's mappings went with `direct`: nothing copies any more.
            self.destroy_rkey(direct.ring_rkey);
        }
        self.drop_withdrawals();
        for entry in self.remote.drain() {
            self.destroy_rkey(entry.rkey);
        }
    }

    /// Destroys an rkey unpacked on this engine's endpoint that no put of it names any more
    /// (withdrawn, never loaded, or the endpoint closed) and nothing else refers to; unless a
    /// forced close is still purging puts, which may name it (`keys_pinned`).
    pub(crate) fn destroy_rkey(&self, rkey: sys::ucp_rkey_h) {
        if self.keys_pinned {
            return;
        }
        // SAFETY: unpacked once on this engine's endpoint and destroyed once (the caller gives
        // up its only copy); no live put names it and no purge is running (checked above).
        // Destroying it detaches a mapping it made.
        unsafe { sys::ucp_rkey_destroy(rkey) };
    }

    /// Orderly teardown: finish what is in flight (bounded), close the endpoint. The regions
    /// stay mapped until the last lane of the connection goes ([`crate::domain::UcxDomain`]).
    pub(crate) fn shutdown(&mut self) {
        for _ in 0..10_000 {
            if !self.busy() || self.signals.gone.is_gone() {
                break;
            }
            self.progress();
        }
        self.close();
    }
}
