//! # rdma-hint-core
//!
//! Answers, from facts about one data path, *which transfer block size sits in the sweet spot*
//! (near-peak bandwidth without per-message latency blowing up) and *what alignment the path
//! needs*. Pure Rust: no FFI, no `unsafe`, no I/O except reading a sysfs tree you point it at.
//!
//! The data flow is one direction:
//!
//! ```text
//! sysfs + backend caps + GPU facts ──► PathProfile ──► model::compute_hint ──► SizeHint
//!        (discovery, topology)          (profile)        (model, policy)      (cached)
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
#![forbid(unsafe_code)]

pub mod blocking;
pub mod cache;
pub mod deepep;
pub mod error;
pub mod fit;
pub mod model;
pub mod pcie;
pub mod profile;
pub mod queue;
pub mod region_table;
pub mod sysfs;
pub mod timer;
pub mod topology;
pub mod transport;
pub mod validate;
pub mod wait;

pub use blocking::BlockingTransport;
pub use cache::{HintCache, HintKey};
pub use error::HintError;
pub use model::{compute_hint, HintPolicy, Origin, Reason, SizeHint};
pub use pcie::PcieLink;
pub use profile::{
    DriverVersions, GpuFacts, PathClass, PathProfile, SourceFacts, SourceId, SourceKind, TransportFacts,
    TransportKind,
};
pub use region_table::RegionTable;
pub use topology::Topology;
pub use transport::{
    Arrival, Capabilities, Completion, CompletionStatus, LocalRegion, MemoryKind, PeerEndpoint, RegionId,
    RemoteRegion, Transport, TransportError, WriteOp,
};
pub use validate::{validate_hint, HintLimits};
pub use wait::WaitMode;

/// One kibibyte (1024 bytes).
pub const KIB: u64 = 1024;
/// One mebibyte (1024² bytes).
pub const MIB: u64 = 1024 * 1024;
/// One gibibyte (1024³ bytes).
pub const GIB: u64 = 1024 * 1024 * 1024;
