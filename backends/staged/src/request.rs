//! A work request on its way to the sender thread: a plain write, a gather of up to
//! [`MAX_SGES`] local ranges landing back to back in the peer's region, or a read, copied whole
//! into one fixed-size [`Request`] (posting allocates nothing). The posting paths read requests through
//! the backend core's [`Pieces`].

use crate::memory::PeerMapping;
pub(crate) use crate::memory::MAX_SGES;
pub(crate) use rdma_hint_backend_core::gather::Pieces;
use rdma_hint_core::{GatherEntry, GatherOp, ReadOp, WriteOp};
use std::sync::Arc;

/// A request copied for the sender thread.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// A write's head, or a read's ranges ([`ReadOp::ranges`]) when `read`.
    head: WriteOp,
    read: bool,
    /// Entries of a gather; 0 for a plain write (its range is the head's).
    count: u8,
    entries: [GatherEntry; MAX_SGES as usize],
    /// shm: the peer's region as it was when the request was posted (its mapping, and whether
    /// it wants every write announced). The peer may withdraw the region while the request
    /// waits in the queue; its withdrawal waits for the request, which keeps the mapping.
    target: Option<(Arc<PeerMapping>, bool)>,
}

impl Request {
    /// `request` copied; a gather of more than [`MAX_SGES`] entries was refused before.
    pub(crate) fn of(request: &impl Pieces) -> Request {
        let head = request.head();
        let mut copied = Request {
            head,
            read: false,
            count: 0,
            entries: [GatherEntry::EMPTY; MAX_SGES as usize],
            target: None,
        };
        let mut pieces = request.pieces().peekable();
        let plain = pieces.peek().is_some_and(|first| first.len == head.len);
        if !plain {
            debug_assert!(
                request.pieces().count() <= MAX_SGES as usize,
                "gathers are checked against MAX_SGES"
            );
            for (slot, piece) in copied.entries.iter_mut().zip(pieces) {
                *slot = GatherEntry { local: piece.local, offset: piece.local_offset, len: piece.len };
                copied.count += 1;
            }
        }
        copied
    }

    /// `read` copied.
    pub(crate) fn read(read: &ReadOp) -> Request {
        Request {
            head: read.ranges(),
            read: true,
            count: 0,
            entries: [GatherEntry::EMPTY; MAX_SGES as usize],
            target: None,
        }
    }

    /// The request toward the peer's region `mapping` (shm), which wants every write announced
    /// when `notify_each_write`.
    pub(crate) fn toward(self, mapping: Option<&Arc<PeerMapping>>, notify_each_write: bool) -> Request {
        Request { target: mapping.map(|mapping| (mapping.clone(), notify_each_write)), ..self }
    }

    /// shm: the peer's region's mapping as posted, and whether it wants every write announced.
    pub(crate) fn target(&self) -> Option<(&Arc<PeerMapping>, bool)> {
        self.target.as_ref().map(|(mapping, notify)| (mapping, *notify))
    }

    /// Whether this is a read (its head's `local` is the destination).
    pub(crate) fn is_read(&self) -> bool {
        self.read
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
    use rdma_hint_backend_core::gather::Gathered;
    use rdma_hint_core::RegionId;

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
