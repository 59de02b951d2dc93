//! # rdma-hint-ucx
//!
//! The UCX backend: [`UcxTransport`] moves blocks with UCP RMA (`ucp_put_nbx` per block, one
//! `ucp_ep_flush_nbx` per posted batch) over whatever transports UCX is allowed to use — shared
//! memory (`posix`, `sysv`, `cma`), `tcp`, or verbs where an RDMA NIC exists. It links the
//! system UCX through [`rdma_hint_ucx_sys`] (Debian 12: `libucx0` 1.13.1).
//!
//! Its capabilities are UCX's own performance estimate for the scope (`ucp_ep_evaluate_perf`
//! at two message sizes gives the `o + s/B` terms the hint model reads), so
//! `rdma-hint probe` shows UCX hints with UCX's numbers.
//!
//! ```no_run
//! use rdma_hint_core::Transport;
//! use rdma_hint_ucx::UcxTransport;
//!
//! let transport = UcxTransport::open(Some("shm,self")).unwrap();
//! let facts = &transport.capabilities().facts;
//! println!("{}: {:.1} GB/s, {:.2} µs per message; lanes {}", facts.id, facts.wire_gbps,
//!          facts.per_op_overhead_us, transport.estimate().lanes);
//! ```

mod engine;
mod perf;
mod progress;
mod region;
mod status;
mod transport;
pub mod wire;
mod worker;

pub use perf::Estimate;
pub use region::MAX_REGION_BYTES;
pub use transport::{transport_id, UcxTransport};

/// Backend name used in transport ids (`ucx:<transports>`).
pub const BACKEND: &str = "ucx";

/// The version of the UCX library this process runs against (`ucp_get_version_string`).
///
/// ```
/// assert!(rdma_hint_ucx::version().starts_with('1'));
/// ```
pub fn version() -> String {
    // SAFETY: returns a pointer to a static NUL-terminated string inside libucp.
    unsafe { std::ffi::CStr::from_ptr(rdma_hint_ucx_sys::ucp_get_version_string()) }
        .to_string_lossy()
        .into_owned()
}
