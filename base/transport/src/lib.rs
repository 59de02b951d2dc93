//! # rdma-hint-transport
//!
//! The contract every rdma-hint backend implements — the [`Transport`] trait, the plain data it
//! moves ([`WriteOp`], [`Completion`], [`Arrival`], regions) — and the toolkit backends share to
//! meet it: a bounds-checked [`RegionTable`], the event [`queue`], and [`wait`]s that always
//! have a deadline and never block an async runtime's thread.
//!
//! ```
//! use rdma_hint_transport::{RegionId, WriteOp};
//! // Block 1 of a 4 KiB-block transfer into the peer's region 3, asking for a completion.
//! let op = WriteOp { wr_id: 1, local: RegionId(0), local_offset: 4096, remote: RegionId(3),
//!                    remote_offset: 4096, len: 4096, signalled: true, imm: None };
//! assert!(op.check_lens(8192, 8192, 1 << 30).is_ok());
//! assert!(op.check_lens(8192, 4096, 1 << 30).is_err()); // past the end of the peer's region
//! ```
#![forbid(unsafe_code)]

pub mod blocking;
pub mod queue;
pub mod region_table;
pub mod timer;
pub mod transport;
pub mod wait;

pub use blocking::BlockingTransport;
pub use region_table::{RegionTable, MAX_REGIONS, MAX_REGION_BYTES};
pub use transport::{
    Arrival, Capabilities, Completion, CompletionStatus, LocalRegion, MemoryKind, PeerEndpoint, RegionId,
    RemoteRegion, Transport, TransportError, WriteOp,
};
pub use wait::WaitMode;
