//! # rdma-hint-core
//!
//! The pure core of rdma-hint: the size/alignment computation and the [`Transport`] contract
//! every backend implements, with the plain data it moves ([`WriteOp`], [`Completion`],
//! [`Arrival`], regions). The backend core that helps backends meet the contract (region tables,
//! queues, deadline waits) is `rdma-hint-backend-core`.
//!
//! The model answers, from facts about one data path, *which transfer block size sits in the sweet spot*
//! (near-peak bandwidth without per-message latency blowing up) and *what alignment the path
//! needs*. Pure computation: no I/O, no FFI, no `unsafe`
//! operation (the only `unsafe` is the contract of [`CallerMemory`]'s by-address constructors). The facts come from
//! `rdma-hint-discovery` (sysfs, the CUDA driver) and the backends' capabilities; measured
//! curves come back in through [`fit`].
//!
//! ```text
//! PathProfile ──► model::compute_hint ──► SizeHint
//!  (profile)        (model, policy)        (validated)
//! ```
//!
//! Units used everywhere: sizes in bytes, bandwidth in GB/s (10⁹ bytes per second), latency and
//! fixed costs in µs.
//!
//! ```
//! use rdma_hint_core::{compute_hint, HintPolicy, PathProfile};
//!
//! // A host buffer on NUMA node 0 next to a 200 Gb/s NIC behind one PCIe switch.
//! let profile = PathProfile::example_host_nic();
//! let hint = compute_hint(&profile, &HintPolicy::default()).unwrap();
//! assert!(hint.block_bytes > 0);
//! assert_eq!(hint.block_bytes % hint.align_bytes, 0);
//! for reason in &hint.reasons {
//!     println!("{reason}");
//! }
//! ```
// `deny`, not `forbid`: `caller_memory` declares the `unsafe` constructors of caller memory
// (contracts only; it runs no unsafe operation) and allows itself that much.
#![deny(unsafe_code)]

pub mod admission;
pub mod caller_memory;
pub mod deepep;
pub mod domain;
pub mod error;
pub mod error_kind;
pub mod fit;
pub mod model;
pub mod pcie;
pub mod profile;
pub mod region;
pub mod transport;
pub mod transport_error;
pub mod transport_id;
pub mod validate;
pub mod wait_mode;

pub use admission::Refused;
pub use caller_memory::{CallerMemory, CallerMemoryPath, CopiedBytes, ForeignMemory};
pub use domain::Domain;
pub use error::HintError;
pub use error_kind::ErrorKind;
pub use model::{compute_hint, HintPolicy, Origin, Reason, SizeHint};
pub use pcie::PcieLink;
pub use profile::{
    DriverVersions, GpuFacts, PathClass, PathProfile, SourceFacts, SourceId, SourceKind, TransportFacts,
    TransportKind,
};
pub use region::{LocalRegion, MemoryKind, RegionId, RemoteRegion};
pub use transport::{
    Arrival, Capabilities, Completion, CompletionStatus, GatherEntry, GatherOp, PeerEndpoint, ReadOp,
    Transport, WriteOp, MAX_OPS_PER_POST,
};
pub use transport_error::TransportError;
pub use transport_id::{StagedChannelId, TransportId};
pub use validate::{validate_hint, HintLimits};
pub use wait_mode::WaitMode;

/// One kibibyte (1024 bytes).
pub const KIB: u64 = 1024;
/// One mebibyte (1024² bytes).
pub const MIB: u64 = 1024 * 1024;
/// One gibibyte (1024³ bytes).
pub const GIB: u64 = 1024 * 1024 * 1024;
