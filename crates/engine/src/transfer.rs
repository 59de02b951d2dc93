//! What one transfer moves: a range of a local region into a range of the peer's.

use rdma_hint_core::{LocalRegion, RemoteRegion, SourceId};

/// One RDMA-WRITE-style transfer: `len` bytes from `local[local_offset..]` to
/// `remote[remote_offset..]`, optionally announced to the receiver with an immediate value.
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'a> {
    /// Source region.
    pub local: &'a LocalRegion,
    /// Start in the source region, in bytes (a multiple of the alignment).
    pub local_offset: u64,
    /// Destination region (from `connect`).
    pub remote: &'a RemoteRegion,
    /// Start in the destination region, in bytes (a multiple of the alignment).
    pub remote_offset: u64,
    /// Payload bytes.
    pub len: u64,
    /// Immediate value delivered with the last block: the receiver's `poll_arrivals` /
    /// `wait_arrivals` sees it once every byte of the transfer has landed.
    pub notify: Option<u32>,
    /// Whose hint cuts the blocks; `None`: the local region's device.
    pub source: Option<SourceId>,
}

impl<'a> Transfer<'a> {
    /// `len` bytes from the start of `local` to the start of `remote`, no notification.
    pub fn new(local: &'a LocalRegion, remote: &'a RemoteRegion, len: u64) -> Transfer<'a> {
        Transfer { local, local_offset: 0, remote, remote_offset: 0, len, notify: None, source: None }
    }

    /// The same transfer at other offsets.
    pub fn at(self, local_offset: u64, remote_offset: u64) -> Transfer<'a> {
        Transfer { local_offset, remote_offset, ..self }
    }

    /// The same transfer, announced to the receiver with `imm`.
    pub fn notify(self, imm: u32) -> Transfer<'a> {
        Transfer { notify: Some(imm), ..self }
    }

    /// The same transfer in blocks of `source`'s hint, whatever memory the local region is
    /// (a dma-buf region, or a host region measured as another NUMA node's).
    pub fn from_source(self, source: SourceId) -> Transfer<'a> {
        Transfer { source: Some(source), ..self }
    }
}
