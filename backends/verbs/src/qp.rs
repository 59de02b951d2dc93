//! The RC queue pair (`ibv_create_qp` / `ibv_destroy_qp`): its connection steps RESET → INIT →
//! RTR → RTS, each checked against the state the QP is in, and posting (a chain of send WRs,
//! receive WRs). It holds `Arc`s of its PD and CQs, so they are destroyed after it.

use crate::cq::CompletionQueue;
use crate::handle::Owned;
use crate::pd::ProtectionDomain;
use crate::status::check;
use rdma_hint_core::TransportError;
use rdma_mummy_sys as ibv;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

/// Where a queue pair is in its connection steps (as this side last moved it; an error the
/// device raises later, e.g. after a failed WR, is not tracked here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QpState {
    /// Created, nothing configured.
    Reset,
    /// Port, P_Key and access set; receive WRs may be posted.
    Init,
    /// Ready to receive: the peer's QP and address are set.
    Rtr,
    /// Ready to send.
    Rts,
    /// Flushed: every outstanding WR completes with a flush error and the device reads and
    /// writes no more memory for the QP. Reachable from any state.
    Error,
}

impl QpState {
    /// The state a transition to `self` starts from (`None` for RESET: no step leads there).
    fn comes_from(self) -> Option<QpState> {
        match self {
            QpState::Reset => None,
            QpState::Init => Some(QpState::Reset),
            QpState::Rtr => Some(QpState::Init),
            QpState::Rts => Some(QpState::Rtr),
            QpState::Error => None,
        }
    }

    /// Whether a QP in `self` may move to `to`; an [`OutOfOrder`] says why not.
    pub(crate) fn check_step(self, to: QpState) -> Result<(), OutOfOrder> {
        if to == QpState::Error {
            return Ok(());
        }
        match to.comes_from() {
            Some(from) if from == self => Ok(()),
            needs => Err(OutOfOrder { to, needs, is: self }),
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Error => "ERR",
        })
    }
}

/// A transition asked for out of order (e.g. to RTS before RTR); as a [`TransportError`] it is
/// `InvalidArgument { what: "queue pair transition", .. }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfOrder {
    /// The state asked for.
    pub(crate) to: QpState,
    /// The state that transition starts from (`None`: no transition leads there).
    pub(crate) needs: Option<QpState>,
    /// The state the QP is in.
    pub(crate) is: QpState,
}

impl From<OutOfOrder> for TransportError {
    fn from(step: OutOfOrder) -> TransportError {
        TransportError::InvalidArgument {
            what: "queue pair transition",
            why: match step.needs {
                Some(needs) => format!("{} needs the QP in {needs}; it is in {}", step.to, step.is),
                None => format!("no transition leads to {} (the QP is in {})", step.to, step.is),
            },
        }
    }
}

/// Where the RTR step points the QP: our port and GID entry, the peer's QP and address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerPath {
    /// Our port number.
    pub(crate) port: u8,
    /// Our GID table entry to send from.
    pub(crate) sgid_index: u8,
    /// Path MTU (`ibv_mtu`).
    pub(crate) path_mtu: u32,
    /// The peer's QP number.
    pub(crate) dest_qpn: u32,
    /// The peer's starting PSN (what we expect to receive first).
    pub(crate) rq_psn: u32,
    /// The peer's LID (0 on RoCE).
    pub(crate) dlid: u16,
    /// The peer's GID.
    pub(crate) dgid: [u8; 16],
    /// The peer's RDMA READs this side serves at once (see `DeviceFacts::max_reads_in_flight`).
    pub(crate) reads_served: u8,
}

/// What a QP was created on: its send CQ, receive CQ and PD, destroyed after it.
type QpParents = (Arc<CompletionQueue>, Arc<CompletionQueue>, Arc<ProtectionDomain>);

/// Inline bytes asked for per work request: a small write (a control message, a flag) then
/// costs no DMA read of its source, which is most of its latency.
pub(crate) const INLINE_WANTED: u32 = 256;

/// An RC queue pair, destroyed on drop; it keeps its CQs and PD alive.
#[derive(Debug)]
pub(crate) struct QueuePair {
    handle: Owned<ibv::ibv_qp, QpParents>,
    qp_num: u32,
    max_inline: u32,
    /// Scatter/gather entries a send WR may carry.
    max_sges: u32,
    /// The last state moved to; locked across each transition so steps cannot interleave.
    state: Mutex<QpState>,
}

impl QueuePair {
    /// Creates an RC QP in `pd` on `send_cq` and `recv_cq`, with `sq_depth` / `rq_depth` WRs,
    /// up to `send_sges` scatter/gather entries per send WR (one per receive), nothing
    /// signalled unless asked, and room for [`INLINE_WANTED`] bytes of inline data per WR where
    /// the provider has it. Asks for less (one SGE, then no inline data, then both) where the
    /// provider refuses; `None` when `ibv_create_qp` fails even so, with `errno` saying why.
    pub(crate) fn create(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        (sq_depth, rq_depth): (u32, u32),
        send_sges: u32,
    ) -> Option<QueuePair> {
        let depths = (sq_depth, rq_depth);
        Self::create_with(pd, send_cq, recv_cq, depths, (INLINE_WANTED, send_sges))
            .or_else(|| Self::create_with(pd, send_cq, recv_cq, depths, (INLINE_WANTED, 1)))
            .or_else(|| Self::create_with(pd, send_cq, recv_cq, depths, (0, send_sges)))
            .or_else(|| Self::create_with(pd, send_cq, recv_cq, depths, (0, 1)))
    }

    fn create_with(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        (sq_depth, rq_depth): (u32, u32),
        (inline_wanted, send_sges): (u32, u32),
    ) -> Option<QueuePair> {
        let mut init = ibv::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.raw(),
            recv_cq: recv_cq.raw(),
            srq: std::ptr::null_mut(),
            cap: ibv::ibv_qp_cap {
                max_send_wr: sq_depth,
                max_recv_wr: rq_depth,
                max_send_sge: send_sges.max(1),
                max_recv_sge: 1,
                max_inline_data: inline_wanted,
            },
            qp_type: ibv::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the PD and both CQs are live (held by the `Arc`s, which the QP keeps); `init`
        // is valid for the call.
        let raw = unsafe { ibv::ibv_create_qp(pd.raw(), &mut init) };
        // SAFETY: the QP is ours alone and nothing is created on a QP.
        let handle = unsafe { Owned::take(raw, (send_cq.clone(), recv_cq.clone(), pd.clone())) }?;
        // SAFETY: the QP was just created; qp_num is a plain field that never changes.
        let qp_num = unsafe { (*handle.raw()).qp_num };
        // `ibv_create_qp` wrote back what the QP actually holds (at least what was asked).
        let (max_inline, max_sges) = (init.cap.max_inline_data, init.cap.max_send_sge.max(1));
        Some(QueuePair { handle, qp_num, max_inline, max_sges, state: Mutex::new(QpState::Reset) })
    }

    /// The largest write the provider copies into the work request itself (`IBV_SEND_INLINE`):
    /// posting it reads the source at once and the NIC makes no DMA read of it.
    pub(crate) fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// Scatter/gather entries a send WR may carry (what `ibv_create_qp` granted).
    pub(crate) fn max_sges(&self) -> u32 {
        self.max_sges
    }

    /// The QP number the peer addresses.
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The CQ send completions arrive on.
    pub(crate) fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.handle.parent().0
    }

    /// The CQ receive completions (writes with immediate) arrive on.
    pub(crate) fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.handle.parent().1
    }

    /// Moves the QP to `to` with `attr` (whose `qp_state` it sets) and `mask`, if it is in the
    /// state that step starts from. A failing `ibv_modify_qp` leaves it where it was and says
    /// which step failed.
    fn transition(
        &self,
        to: QpState,
        attr: &mut ibv::ibv_qp_attr,
        mask: ibv::ibv_qp_attr_mask,
    ) -> Result<(), TransportError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.check_step(to)?;
        let (qp_state, step) = match to {
            QpState::Reset => (ibv::ibv_qp_state::IBV_QPS_RESET, "ibv_modify_qp(RESET)"),
            QpState::Init => (ibv::ibv_qp_state::IBV_QPS_INIT, "ibv_modify_qp(INIT)"),
            QpState::Rtr => (ibv::ibv_qp_state::IBV_QPS_RTR, "ibv_modify_qp(RTR)"),
            QpState::Rts => (ibv::ibv_qp_state::IBV_QPS_RTS, "ibv_modify_qp(RTS)"),
            QpState::Error => (ibv::ibv_qp_state::IBV_QPS_ERR, "ibv_modify_qp(ERR)"),
        };
        attr.qp_state = qp_state;
        let mask = (mask | ibv::ibv_qp_attr_mask::IBV_QP_STATE).0 as i32;
        // SAFETY: the QP is live; `attr` is valid for the call and `mask` names its set fields.
        check(unsafe { ibv::ibv_modify_qp(self.handle.raw(), attr, mask) }, step)?;
        *state = to;
        Ok(())
    }

    /// Any state → ERR: the device stops working on the QP and flushes its WRs (once the link
    /// is gone, so no WR reads memory the application takes back). Idempotent.
    pub(crate) fn to_error(&self) -> Result<(), TransportError> {
        if *self.state.lock().unwrap_or_else(PoisonError::into_inner) == QpState::Error {
            return Ok(());
        }
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
        let mut attr: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        self.transition(QpState::Error, &mut attr, ibv::ibv_qp_attr_mask(0))
    }

    /// RESET → INIT on `port`: P_Key 0, the peer may write and read (what it may reach is
    /// what its rkeys name: the exposed regions).
    pub(crate) fn to_init(&self, port: u8) -> Result<(), TransportError> {
        use ibv::ibv_qp_attr_mask as m;
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
        let mut attr: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.pkey_index = 0;
        attr.port_num = port;
        attr.qp_access_flags = ibv::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ibv::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        self.transition(
            QpState::Init,
            &mut attr,
            m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
        )
    }

    /// INIT → RTR towards `path` (a global route, hop limit 64; RNR timer 12; the peer's reads
    /// served `path.reads_served` at once).
    pub(crate) fn to_rtr(&self, path: &PeerPath) -> Result<(), TransportError> {
        use ibv::ibv_qp_attr_mask as m;
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
        let mut attr: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.path_mtu = path.path_mtu;
        attr.dest_qp_num = path.dest_qpn;
        attr.rq_psn = path.rq_psn;
        attr.max_dest_rd_atomic = path.reads_served;
        attr.min_rnr_timer = 12;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.dlid = path.dlid;
        attr.ah_attr.port_num = path.port;
        attr.ah_attr.grh.dgid.raw = path.dgid;
        attr.ah_attr.grh.sgid_index = path.sgid_index;
        attr.ah_attr.grh.hop_limit = 64;
        self.transition(
            QpState::Rtr,
            &mut attr,
            m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER,
        )
    }

    /// RTR → RTS sending from `sq_psn`; ACK timeout 14 (4.096 µs · 2^14 ≈ 67 ms per try) × 7
    /// retries, so a dead peer fails a WR in about half a second.
    pub(crate) fn to_rts(&self, sq_psn: u32, reads_in_flight: u8) -> Result<(), TransportError> {
        use ibv::ibv_qp_attr_mask as m;
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
        let mut attr: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.timeout = 14;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.sq_psn = sq_psn;
        attr.max_rd_atomic = reads_in_flight;
        self.transition(
            QpState::Rts,
            &mut attr,
            m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    /// Posts the chain of send WRs starting at `first` with one `ibv_post_send`. On failure,
    /// how many WRs of the chain the provider took before the one it refused (`bad_wr`), and
    /// the errno value it returned (`ENOMEM`: the send queue is full).
    ///
    /// # Safety
    ///
    /// Every WR of the chain (linked by `next`, ending in null) and the SGEs it points to must
    /// be valid for the call, and each SGE must lie in memory registered in this QP's PD that
    /// stays registered until that WR's completion (or a later signalled one) has been polled.
    pub(crate) unsafe fn post_send(
        &self,
        first: &mut ibv::ibv_send_wr,
    ) -> Result<(), (usize, std::io::Error)> {
        let mut bad: *mut ibv::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the chain is valid for the call (this function's contract).
        match unsafe { ibv::ibv_post_send(self.handle.raw(), first, &mut bad) } {
            0 => Ok(()),
            code => {
                // The WRs before `bad` were posted; walk the chain to count them.
                let mut posted = 0;
                let mut wr: *mut ibv::ibv_send_wr = first;
                while !wr.is_null() && wr != bad {
                    posted += 1;
                    // SAFETY: `wr` is a WR of the caller's chain, valid for the call.
                    wr = unsafe { (*wr).next };
                }
                Err((posted, std::io::Error::from_raw_os_error(code)))
            }
        }
    }

    /// Posts one zero-SGE receive WR, consumed by a write with immediate.
    pub(crate) fn post_receive(&self) -> Result<(), TransportError> {
        let mut wr = ibv::ibv_recv_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut ibv::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; `wr` is valid for the call (no SGEs, nothing to keep alive).
        check(unsafe { ibv::ibv_post_recv(self.handle.raw(), &mut wr, &mut bad) }, "ibv_post_recv")
    }
}

/// A starting PSN for a new QP: 24 bits that differ between processes and connections.
pub(crate) fn initial_psn() -> u32 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id().rotate_left(12)) & 0x00ff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_go_reset_init_rtr_rts_only() {
        use QpState::*;
        assert_eq!(Reset.check_step(Init), Ok(()));
        assert_eq!(Init.check_step(Rtr), Ok(()));
        assert_eq!(Rtr.check_step(Rts), Ok(()));
        assert_eq!(Init.check_step(Rts), Err(OutOfOrder { to: Rts, needs: Some(Rtr), is: Init }));
        assert_eq!(Reset.check_step(Rtr), Err(OutOfOrder { to: Rtr, needs: Some(Init), is: Reset }));
        assert_eq!(Rts.check_step(Init), Err(OutOfOrder { to: Init, needs: Some(Reset), is: Rts }));
        assert_eq!(Rts.check_step(Rts), Err(OutOfOrder { to: Rts, needs: Some(Rtr), is: Rts }));
        assert_eq!(Init.check_step(Reset), Err(OutOfOrder { to: Reset, needs: None, is: Init }));
    }

    #[test]
    fn an_out_of_order_step_is_a_typed_transport_error() {
        let error = TransportError::from(QpState::Init.check_step(QpState::Rts).unwrap_err());
        let TransportError::InvalidArgument { what, why } = &error else { panic!("{error:?}") };
        assert_eq!(*what, "queue pair transition");
        assert_eq!(why, "RTS needs the QP in RTR; it is in INIT");
    }
}
