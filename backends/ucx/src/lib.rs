//! # rdma-hint-ucx
//!
//! The UCX backend: [`UcxTransport`] moves blocks with UCP RMA (`ucp_put_nbx` per block, one
//! `ucp_ep_flush_nbx` per posted batch) over whatever transports UCX is allowed to use — shared
//! memory (`posix`, `sysv`, `cma`), `tcp`, or verbs where an RDMA NIC exists. Where UCX maps
//! the peer's memory into this process (shared memory, `ucp_rkey_ptr`), a write is a copy into
//! that mapping and its notice a slot on the peer's [`ring`], with no UCX call in between. It
//! links the system UCX through [`rdma_hint_ucx_sys`] (Debian 12: `libucx0` 1.13.1).
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

mod domain;
mod engine;
mod exposing;
mod mapping;
mod notices;
mod perf;
mod progress;
mod region;
pub mod ring;
mod status;
mod transport;
pub mod wire;
mod worker;

pub use perf::Estimate;
pub use rdma_hint_backend_core::MAX_REGION_BYTES;
pub use transport::UcxTransport;

/// Backend name used in transport ids (`ucx:<transports>`).
pub const BACKEND: &str = "ucx";

/// The version of the UCX library this process runs against (`ucp_get_version_string`).
///
/// ```
/// assert!(rdma_hint_ucx::version().starts_with('1'));
/// ```
pub fn version() -> String {
    version_string()
}

fn version_string() -> String {
    // SAFETY: returns a pointer to a static NUL-terminated string inside libucp.
    unsafe { std::ffi::CStr::from_ptr(rdma_hint_ucx_sys::ucp_get_version_string()) }
        .to_string_lossy()
        .into_owned()
}

/// What [`route_log_to_stderr`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogRoute {
    /// UCX's log now goes to stderr.
    Rerouted,
    /// Left as it was, and why (`UCX_LOG_FILE` set, an untested UCX version, UCX refused).
    Left(String),
}

/// UCX writes its own log (warnings such as "unused env variable", printed at exit) to stdout
/// by default, into the middle of a program's output (`rdma-hint calibrate --json`). This
/// reopens it on stderr, unless `UCX_LOG_FILE` chooses a destination.
///
/// It reaches into UCS's logging (`ucs_global_opts_set_value`, `ucs_log_cleanup`,
/// `ucs_log_init`), whose behaviour is known for UCX 1.13 only, so other versions are left
/// alone (set `UCX_LOG_FILE=stderr` there). Call it once, at the start of `main`, before any
/// thread (yours, UCX's or a library's) can log through UCX: the log stream is closed and
/// reopened. The `rdma-hint` command does; the library never does it on its own.
///
/// ```no_run
/// let route = rdma_hint_ucx::route_log_to_stderr();
/// println!("{route:?}");
/// ```
pub fn route_log_to_stderr() -> LogRoute {
    if std::env::var_os("UCX_LOG_FILE").is_some() {
        return LogRoute::Left("UCX_LOG_FILE is set".into());
    }
    let version = version_string();
    if !version.starts_with("1.13.") {
        return LogRoute::Left(format!("UCX {version} is not a version this was tested with (1.13)"));
    }
    // SAFETY: both strings are NUL-terminated constants that UCS copies; cleanup and init
    // reopen the log stream from the new option. The caller runs this before any thread can
    // log through UCX (documented above), so nothing writes to the stream while it is swapped.
    unsafe {
        if rdma_hint_ucx_sys::ucs_global_opts_set_value(c"LOG_FILE".as_ptr(), c"stderr".as_ptr())
            != rdma_hint_ucx_sys::UCS_OK
        {
            return LogRoute::Left("UCS refused LOG_FILE=stderr".into());
        }
        rdma_hint_ucx_sys::ucs_log_cleanup();
        rdma_hint_ucx_sys::ucs_log_init();
    }
    LogRoute::Rerouted
}
