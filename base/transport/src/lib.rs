//! # rdma-hint-transport
//!
//! The contract every rdma-hint backend implements — the [`Transport`] trait, the plain data it
//! moves ([`WriteOp`], [`Completion`], [`Arrival`], regions) — and the toolkit backends share to
//! meet it: a bounds-checked [`RegionTable`], the event [`queue`], and [`wait`]s that always
//! have a deadline and never block an async runtime's thread.
//!
//! ```
//! use rdma_hint_transport::{LocalRegion, MemoryKind, RegionId, RemoteRegion, WriteOp};
//! let local = LocalRegion { id: RegionId(0), kind: MemoryKind::Host, len: 8192 };
//! let remote = RemoteRegion { id: RegionId(0), len: 8192 };
//! let op = WriteOp { wr_id: 1, local: local.id, local_offset: 0, remote: remote.id,
//!                    remote_offset: 4096, len: 4096, signalled: true, imm: None };
//! assert!(op.check(&local, &remote, 1 << 30).is_ok());
//! ```
#![forbid(unsafe_code)]

pub mod blocking;
pub mod queue;
pub mod region_table;
pub mod timer;
pub mod transport;
pub mod wait;

pub use blocking::BlockingTransport;
pub use region_table::RegionTable;
pub use transport::{
    Arrival, Capabilities, Completion, CompletionStatus, LocalRegion, MemoryKind, PeerEndpoint, RegionId,
    RemoteRegion, Transport, TransportError, WriteOp,
};
pub use wait::WaitMode;
