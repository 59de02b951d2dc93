//! # rdma-hint-backend-core
//!
//! What rdma-hint backends share to meet the [`Transport`](rdma_hint_core::Transport) contract
//! (which lives, with its plain types, in `rdma-hint-core`), written once: a memory
//! [`DomainCore`] (its bounds-checked [`RegionTable`], its [`lanes`], and the rules for lending,
//! holding and taking a region back), the [`PeerGone`] state,
//! the event [`queue`], [`wait`]s that always have a deadline and never block an async
//! runtime's thread, the deadline [`timer`] they sleep on, the [`blocking`] adapters, and the checks and copy
//! counter of [`caller_memory`], and the [`memory_limit`] every allocation is checked against.
//!
//! ```
//! use rdma_hint_core::{RegionId, TransportError, WriteOp};
//! use rdma_hint_backend_core::{region_table::RegionLen, RegionTable};
//! struct Bytes(u64);
//! impl RegionLen for Bytes { fn region_len(&self) -> u64 { self.0 } }
//! // The one lookup and length check an op gets on its way to the wire.
//! let mut table = RegionTable::new(4);
//! let local = table.insert_with(8192, || Ok(Bytes(8192))).unwrap();
//! let op = WriteOp { wr_id: 1, local, local_offset: 4096, remote: RegionId(3),
//!                    remote_offset: 0, len: 4096, signalled: true, imm: None };
//! assert!(table.check_write(&op, Some(&Bytes(4096)), 1 << 20).is_ok());
//! assert!(table.check_write(&op, Some(&Bytes(2048)), 1 << 20).is_err()); // past the peer's end
//! assert!(matches!(table.check_write(&op, None::<&Bytes>, 1 << 20),
//!                  Err(TransportError::UnregisteredRegion(RegionId(3)))));
//! ```
// `deny`, not `forbid`: the one domain implements `access_region_unchecked`, the contract's
// `unsafe` method, and allows itself that declaration (it runs no unsafe operation).
#![deny(unsafe_code)]

pub mod blocking;
pub mod caller_memory;
pub mod domain;
pub mod gather;
pub mod lanes;
pub mod memory_limit;
pub mod peer_gone;
pub mod peer_regions;
pub mod queue;
pub mod region_holds;
pub mod region_memory;
pub mod region_table;
pub mod ring;
pub mod timer;
pub mod wait;

pub use blocking::BlockingTransport;
pub use domain::DomainCore;
pub use peer_gone::PeerGone;
pub use peer_regions::PeerRegions;
pub use region_table::{RegionTable, MAX_REGIONS, MAX_REGION_BYTES};
