//! The RC queue pair's connection steps (INIT → RTR → RTS, receive WRs), as plain handles a
//! rendezvous thread can run while the transport's `connect` awaits it, and the guard that keeps
//! the verbs objects alive until every such thread is done with them.

use crate::status::check;
use crate::wire::Hello;
use rdma_hint_transport::TransportError;
use rdma_mummy_sys as ibv;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// What the QP's connection steps need: copies of raw handles and port facts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueuePair {
    pub(crate) raw: *mut ibv::ibv_qp,
    pub(crate) port: u8,
    pub(crate) gid_index: i32,
    pub(crate) active_mtu: u8,
    pub(crate) rq_depth: u32,
}

// SAFETY: libibverbs objects may be used from any thread. The QP is destroyed only in the
// transport's Drop, which first waits until every `Lent` (the only way a `QueuePair` leaves the
// transport's thread) has been returned.
unsafe impl Send for QueuePair {}

impl QueuePair {
    fn modify(&self, attr: &mut ibv::ibv_qp_attr, mask: u32, step: &str) -> Result<(), TransportError> {
        // SAFETY: `raw` is live (see `Send`); `attr` is valid for the call and `mask` names its
        // set fields.
        check(unsafe { ibv::ibv_modify_qp(self.raw, attr, mask as i32) }, step)
    }

    /// INIT → (receive WRs posted) → RTR → RTS against the peer's hello. Each step is checked;
    /// the first that fails leaves the QP where it was and says which.
    pub(crate) fn bring_up(&self, peer: &Hello, psn: u32) -> Result<(), TransportError> {
        use ibv::ibv_qp_attr_mask as m;
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
        let mut attr: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = self.port;
        attr.qp_access_flags = ibv::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        self.modify(
            &mut attr,
            (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS).0,
            "ibv_modify_qp(INIT)",
        )?;
        for _ in 0..self.rq_depth {
            self.post_receive()?;
        }
        // SAFETY: as above.
        let mut attr: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = u32::from(self.active_mtu.min(peer.mtu));
        attr.dest_qp_num = peer.qpn;
        attr.rq_psn = peer.psn;
        attr.max_dest_rd_atomic = 1;
        attr.min_rnr_timer = 12;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.dlid = peer.lid;
        attr.ah_attr.port_num = self.port;
        attr.ah_attr.grh.dgid.raw = peer.gid;
        attr.ah_attr.grh.sgid_index = self.gid_index as u8;
        attr.ah_attr.grh.hop_limit = 64;
        self.modify(
            &mut attr,
            (m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER)
                .0,
            "ibv_modify_qp(RTR)",
        )?;
        // SAFETY: as above.
        let mut attr: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv::ibv_qp_state::IBV_QPS_RTS;
        // 4.096 µs · 2^14 ≈ 67 ms per try, 7 tries: a dead peer fails a WR in about half a second.
        attr.timeout = 14;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.sq_psn = psn;
        attr.max_rd_atomic = 1;
        self.modify(
            &mut attr,
            (m::IBV_QP_STATE
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_MAX_QP_RD_ATOMIC)
                .0,
            "ibv_modify_qp(RTS)",
        )
    }

    /// One zero-SGE receive WR, consumed by a write with immediate.
    pub(crate) fn post_receive(&self) -> Result<(), TransportError> {
        let mut wr = ibv::ibv_recv_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut ibv::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: `raw` is live; `wr` is valid for the call (no SGEs, nothing to keep alive).
        check(unsafe { ibv::ibv_post_recv(self.raw, &mut wr, &mut bad) }, "ibv_post_recv")
    }
}

/// Counts the verbs handles lent to other threads; the transport's Drop waits for zero.
#[derive(Debug, Default)]
pub(crate) struct Lending {
    out: Mutex<usize>,
    returned: Condvar,
}

impl Lending {
    /// Lends `value` until the returned guard drops.
    pub(crate) fn lend<T>(self: &Arc<Self>, value: T) -> Lent<T> {
        *self.out.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Lent { value, lending: self.clone() }
    }

    /// Blocks until everything lent has been returned (a rendezvous thread ends by its deadline).
    pub(crate) fn wait_returned(&self) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        while *out > 0 {
            out = self.returned.wait(out).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A value holding verbs handles, lent out of the transport.
pub(crate) struct Lent<T> {
    pub(crate) value: T,
    lending: Arc<Lending>,
}

impl<T> Drop for Lent<T> {
    fn drop(&mut self) {
        let mut out = self.lending.out.lock().unwrap_or_else(PoisonError::into_inner);
        *out -= 1;
        self.lending.returned.notify_all();
    }
}
