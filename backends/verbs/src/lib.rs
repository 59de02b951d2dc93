//! # rdma-hint-verbs
//!
//! The raw ibverbs backend: [`VerbsTransport`] moves blocks with RDMA WRITE (and WRITE WITH
//! IMMEDIATE for the receiver's arrival) on one RC queue pair, chained work-request lists posted
//! with one `ibv_post_send`, selective signalling, CQ polling with deadlines. libibverbs is
//! loaded at run time (through `rdma-mummy-sys`), so a binary built with this backend starts on
//! a machine without rdma-core and [`devices`] answers why there is nothing to use.
//!
//! ```no_run
//! use rdma_hint_core::Transport;
//! use rdma_hint_verbs::VerbsTransport;
//!
//! let transport = VerbsTransport::open(Some("rxe0")).unwrap();
//! let facts = &transport.capabilities().facts;
//! println!("{}: {:.1} GB/s, MTU {:?} B, max message {} B", facts.id, facts.wire_gbps,
//!          facts.mtu_bytes, facts.max_msg_bytes);
//! ```

// The verbs objects, one file each, behind RAII handles: each holds an `Arc` of what it was
// created on (PD, channel → context; CQ → channel; QP → PD and CQs; MR → PD), so nothing is
// destroyed before what uses it.
mod context;
mod control;
mod cq;
mod device;
mod device_list;
mod events;
mod handle;
mod lane;
mod lending;
mod mr;
mod pd;
mod qp;
mod region;
mod status;
mod transport;
pub mod wire;

pub use device::{devices, DeviceFacts};
pub use device_list::library_loaded;
pub use rdma_hint_backend_core::MAX_REGION_BYTES;
pub use transport::{VerbsTransport, UNKNOWN_REGION};

/// Backend name used in transport ids (`verbs:<device>`).
pub const BACKEND: &str = "verbs";
