//! Plain and gather writes seen alike: a request whole ([`Pieces::head`]) and piece by piece
//! ([`Pieces::pieces`]), so one posting path serves `post_writes` and `post_gather_writes`.

use rdma_hint_core::{GatherEntry, GatherOp, RegionId, TransportError, WriteOp};

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
/// use rdma_hint_core::{GatherEntry, GatherOp, RegionId};
/// use rdma_hint_backend_core::gather::{gathered, Gathered, Pieces};
/// let entries = [GatherEntry { local: RegionId(0), offset: 4096, len: 100 },
///                GatherEntry { local: RegionId(0), offset: 0, len: 50 }];
/// let ops = [GatherOp { wr_id: 1, first: 0, count: 2, remote: RegionId(3), remote_offset: 8,
///                       signalled: true, imm: None }];
/// let mut out = [Gathered::EMPTY; 4];
/// let views = gathered(&ops, &entries, 32, 1 << 30, &mut out).unwrap();
/// assert_eq!((views[0].head().len, views[0].pieces().count()), (150, 2));
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

/// `ops` checked ([`GatherOp::entries`]: `max_sges`, the slice, `max_msg_bytes`) and viewed
/// in `out`, which must hold them all ([`TransportError::QueueFull`] otherwise): what a
/// backend's `post_gather_writes` hands its posting path. Allocates nothing.
pub fn gathered<'a, 'o>(
    ops: &[GatherOp],
    entries: &'a [GatherEntry],
    max_sges: u32,
    max_msg_bytes: u64,
    out: &'o mut [Gathered<'a>],
) -> Result<&'o [Gathered<'a>], TransportError> {
    if ops.len() > out.len() {
        return Err(TransportError::QueueFull { given: ops.len() as u32, max: out.len() as u32 });
    }
    for (slot, op) in out.iter_mut().zip(ops) {
        let (own, len) = op.entries(entries, max_sges, max_msg_bytes)?;
        *slot = Gathered { op: *op, entries: own, len };
    }
    Ok(&out[..ops.len()])
}
