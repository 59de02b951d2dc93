//! A work request on its way through a link: a plain write, or a gather of up to [`MAX_SGES`]
//! local ranges landing back to back in the peer's region. The posting paths read any of them
//! through [`Pieces`]; the sender thread's queue holds [`Request`]s, of one fixed size, so
//! posting allocates nothing.

use rdma_hint_core::{GatherEntry, GatherOp, RegionId, WriteOp};

/// Local ranges one gather write takes, at most.
pub(crate) const MAX_SGES: u32 = 32;

/// A request seen whole and piece by piece.
pub(crate) trait Pieces {
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

/// A gather op with its entries, checked ([`GatherOp::entries`]) and summed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gathered<'a> {
    pub(crate) op: GatherOp,
    pub(crate) entries: &'a [GatherEntry],
    pub(crate) len: u64,
}

impl Gathered<'_> {
    pub(crate) const EMPTY: Gathered<'static> = Gathered {
        op: GatherOp {
            wr_id: 0,
            first: 0,
            count: 0,
            remote: RegionId(0),
            remote_offset: 0,
            signalled: false,
            imm: None,
        },
        entries: &[],
        len: 0,
    };
}

fn head_of(op: &GatherOp, first: &GatherEntry, len: u64) -> WriteOp {
    WriteOp {
        wr_id: op.wr_id,
        local: first.local,
        local_offset: first.offset,
        remote: op.remote,
        remote_offset: op.remote_offset,
        len,
        signalled: op.signalled,
        imm: op.imm,
    }
}

impl Pieces for Gathered<'_> {
    fn head(&self) -> WriteOp {
        let first =
            self.entries.first().copied().unwrap_or(GatherEntry { local: RegionId(0), offset: 0, len: 0 });
        head_of(&self.op, &first, self.len)
    }

    fn pieces(&self) -> impl Iterator<Item = WriteOp> + '_ {
        // `op.pieces` indexes the post's entry slice; these are the op's own already.
        GatherOp { first: 0, ..self.op }.pieces(self.entries)
    }
}

/// A request copied for the sender thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    head: WriteOp,
    /// Entries of a gather; 0 for a plain write (its range is the head's).
    count: u8,
    entries: [GatherEntry; MAX_SGES as usize],
}

const NO_ENTRY: GatherEntry = GatherEntry { local: RegionId(0), offset: 0, len: 0 };

impl Request {
    /// `request` copied; a gather of more than [`MAX_SGES`] entries was refused before.
    pub(crate) fn of(request: &impl Pieces) -> Request {
        let head = request.head();
        let mut copied = Request { head, count: 0, entries: [NO_ENTRY; MAX_SGES as usize] };
        let mut pieces = request.pieces().peekable();
        let plain = pieces.peek().is_some_and(|first| first.len == head.len);
        if !plain {
            for (slot, piece) in copied.entries.iter_mut().zip(pieces) {
                *slot = GatherEntry { local: piece.local, offset: piece.local_offset, len: piece.len };
                copied.count += 1;
            }
        }
        copied
    }
}

impl Pieces for Request {
    fn head(&self) -> WriteOp {
        self.head
    }

    fn pieces(&self) -> impl Iterator<Item = WriteOp> + '_ {
        let plain = (self.count == 0).then_some(self.head);
        let op = GatherOp {
            wr_id: self.head.wr_id,
            first: 0,
            count: u32::from(self.count),
            remote: self.head.remote,
            remote_offset: self.head.remote_offset,
            signalled: self.head.signalled,
            imm: self.head.imm,
        };
        plain.into_iter().chain(op.pieces(&self.entries[..usize::from(self.count)]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copied_gather_keeps_its_pieces_and_a_plain_write_stays_one() {
        let entries = [
            GatherEntry { local: RegionId(1), offset: 8192, len: 4096 },
            GatherEntry { local: RegionId(2), offset: 0, len: 100 },
        ];
        let op = GatherOp {
            wr_id: 9,
            first: 0,
            count: 2,
            remote: RegionId(3),
            remote_offset: 64,
            signalled: true,
            imm: Some(5),
        };
        let gathered = Gathered { op, entries: &entries, len: 4196 };
        let copied = Request::of(&gathered);
        assert_eq!(copied.head(), gathered.head());
        assert_eq!(copied.head().len, 4196);
        let pieces: Vec<WriteOp> = copied.pieces().collect();
        assert_eq!(pieces, gathered.pieces().collect::<Vec<_>>());
        assert_eq!((pieces[1].local, pieces[1].remote_offset, pieces[1].len), (RegionId(2), 64 + 4096, 100));
        let write = WriteOp { len: 4096, ..gathered.head() };
        assert_eq!(Request::of(&write).pieces().collect::<Vec<_>>(), vec![write]);
    }
}
