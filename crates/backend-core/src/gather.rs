//! Plain and gather writes seen alike: a request whole ([`Pieces::head`]) and piece by piece
//! ([`Pieces::pieces`]), so one posting path serves `post_writes` and `post_gather_writes`.

use rdma_hint_core::{
    Capabilities, GatherEntry, GatherOp, RegionId, TransportError, WriteOp, MAX_OPS_PER_POST,
};

/// A request seen whole and piece by piece.
pub trait Pieces {
    /// The whole request: tag, flags, remote range and total length (its local range is the
    /// first piece's).
    fn head(&self) -> WriteOp;

    /// Its local ranges in order, each as the write that lands it.
    fn pieces(&self) -> impl Iterator<Item = WriteOp> + '_;
}

impl Pieces for WriteOp {
    fn head(&self) -> WriteOp {
        *self
    }

    fn pieces(&self) -> impl Iterator<Item = WriteOp> + '_ {
        std::iter::once(*self)
    }
}

/// A gather op with its own entries, checked ([`GatherOp::entries`]) and summed.
///
/// ```
/// use rdma_hint_core::{Capabilities, GatherEntry, GatherOp, RegionId};
/// # use rdma_hint_core::{TransportFacts, TransportId, TransportKind};
/// use rdma_hint_backend_core::gather::{gathered, Pieces};
/// let entries = [GatherEntry { local: RegionId(0), offset: 4096, len: 100 },
///                GatherEntry { local: RegionId(0), offset: 0, len: 50 }];
/// let ops = [GatherOp { wr_id: 1, first: 0, count: 2, remote: RegionId(3), remote_offset: 8,
///                       signalled: true, imm: None }];
/// # let facts = TransportFacts { id: TransportId::Loopback, kind: TransportKind::Loopback,
/// #     wire_gbps: 10.0, nic_pcie: None, per_op_overhead_us: 0.05, mtu_bytes: None,
/// #     max_msg_bytes: 1 << 30, max_payload_bytes: None, queried_from_backend: true,
/// #     rate_note: None };
/// let caps = Capabilities { facts, max_outstanding_wrs: 64, max_wrs_per_post: 64, max_sges: 32,
///                           memory_kinds: vec![], caller_memory: vec![],
///                           posts_without_waiting: false };
/// let (len, pieces) = gathered(&ops, &entries, &caps, |views| {
///     Ok((views[0].head().len, views[0].pieces().count()))
/// }).unwrap();
/// assert_eq!((len, pieces), (150, 2));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Gathered<'a> {
    /// The op.
    pub op: GatherOp,
    /// Its entries (not the post's whole slice).
    pub entries: &'a [GatherEntry],
    /// Their total length, in bytes.
    pub len: u64,
}

impl Gathered<'_> {
    /// A placeholder to pre-fill arrays with.
    pub const EMPTY: Gathered<'static> = Gathered { op: GatherOp::EMPTY, entries: &[], len: 0 };
}

impl Pieces for Gathered<'_> {
    fn head(&self) -> WriteOp {
        let first = self.entries.first();
        WriteOp {
            wr_id: self.op.wr_id,
            local: first.map_or(RegionId(0), |entry| entry.local),
            local_offset: first.map_or(0, |entry| entry.offset),
            remote: self.op.remote,
            remote_offset: self.op.remote_offset,
            len: self.len,
            signalled: self.op.signalled,
            imm: self.op.imm,
        }
    }

    fn pieces(&self) -> impl Iterator<Item = WriteOp> + '_ {
        // `op.pieces` indexes the post's entry slice; these are the op's own already.
        GatherOp { first: 0, ..self.op }.pieces(self.entries)
    }
}

/// What a backend's `post_gather_writes` does first: `ops` checked (no more than
/// `caps.max_wrs_per_post`, else [`TransportError::QueueFull`]; each [`GatherOp::entries`]
/// against `caps.max_sges`, the slice and `caps.facts.max_msg_bytes`), then handed to `post`
/// as views. Allocates nothing.
pub fn gathered<R>(
    ops: &[GatherOp],
    entries: &[GatherEntry],
    caps: &Capabilities,
    post: impl FnOnce(&[Gathered<'_>]) -> Result<R, TransportError>,
) -> Result<R, TransportError> {
    caps.check_post(ops.len())?;
    let mut views = [Gathered::EMPTY; MAX_OPS_PER_POST];
    // A capability past the contract's bound takes no more than the contract.
    let too_many = TransportError::QueueFull { given: ops.len() as u32, max: MAX_OPS_PER_POST as u32 };
    let views = views.get_mut(..ops.len()).ok_or(too_many)?;
    for (slot, op) in views.iter_mut().zip(ops) {
        let (own, len) = op.entries(entries, caps.max_sges, caps.facts.max_msg_bytes)?;
        *slot = Gathered { op: *op, entries: own, len };
    }
    post(views)
}
