//! A UCP context and its workers (one per lane): creation, teardown and the calls made on a worker.

use crate::status::{setup, status_text, unavailable};
use rdma_hint_core::TransportError;
use rdma_hint_ucx_sys as sys;
use std::ffi::{c_void, CString};
use std::os::fd::RawFd;
use std::sync::Arc;

/// Active-message id of the write-with-immediate notice.
pub(crate) const NOTICE_AM_ID: u32 = 7;
/// Active-message id of the wake-up for a peer asleep on its notice ring (no payload).
pub(crate) const WAKE_AM_ID: u32 = 8;

/// A UCP context restricted to some transports: memory maps and packed rkeys live here, so
/// the workers of one connection's lanes share it (and its regions).
///
/// Created with `mt_workers_shared`: lanes drive their workers from different threads, which
/// UCX documents as requiring its context to be thread safe; it is when UCX reports the
/// context `UCS_THREAD_MODE_MULTI` (built with multi-thread support), and `thread_safe` says
/// whether it does.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) handle: sys::ucp_context_h,
    /// UCX reports the context `UCS_THREAD_MODE_MULTI`: its context-wide calls are locked.
    /// Without it only one worker (one lane) may use the context.
    pub(crate) thread_safe: bool,
}

// SAFETY: the handle is only destroyed in `Drop`, once every worker (each holds an `Arc` of
// the context) and every region (the lane group holds one too) is gone. Calls on it from
// several threads happen only between the lanes of one connection, and a second lane is only
// opened when `thread_safe` (UCX locks its context-wide calls); with one lane, a memory map or
// unmap holds that lane's engine lock (as its worker's progress does), so no context call
// runs beside the worker's.
unsafe impl Send for Context {}
// SAFETY: see `Send`.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: no worker and no memory map of this context is left (see `Send`); cleaned once.
        unsafe { sys::ucp_cleanup(self.handle) };
    }
}

/// One worker of a [`Context`]: a lane's endpoint, progress and event fd.
///
/// The worker runs in `UCS_THREAD_MODE_SERIALIZED`: UCX does no locking of its own and the
/// owner guarantees one caller at a time (the engine mutex does).
#[derive(Debug)]
pub(crate) struct Ucp {
    pub(crate) context: Arc<Context>,
    pub(crate) worker: sys::ucp_worker_h,
    pub(crate) efd: RawFd,
    /// Whether endpoints ask UCX to detect peer failure (`UCP_ERR_HANDLING_MODE_PEER`).
    pub(crate) peer_failure_mode: bool,
}

/// Whether UCX 1.13 can detect peer failure on every transport `tls` may select. Its shared
/// memory transports (posix, sysv) have no peer-failure handler, and asking for one makes UCX
/// either refuse the endpoint or route same-host peers over tcp instead, so scopes that may use
/// shared memory run without it; the out-of-band socket still reports a dead peer.
///
/// ```text
/// Some("tcp,self") → true    Some("shm,self") → false    None (UCX picks) → false
/// ```
pub(crate) fn detects_peer_failure(tls: Option<&str>) -> bool {
    const SHARED_MEMORY: [&str; 8] = ["shm", "posix", "sysv", "cma", "knem", "xpmem", "mm", "all"];
    match tls {
        None => false,
        // `^list` excludes: everything else, shared memory included, stays allowed.
        Some(tls) if tls.trim_start().starts_with('^') => false,
        Some(tls) => !tls.split(',').map(str::trim).any(|t| SHARED_MEMORY.contains(&t) || t.is_empty()),
    }
}

impl Ucp {
    /// Opens a context with RMA, AM and wakeup features, restricted to `tls` when given (the
    /// syntax of `UCX_TLS`; otherwise UCX reads `UCX_TLS` from the environment itself), and
    /// its first worker. `peer_failure_mode`: see [`detects_peer_failure`].
    pub(crate) fn open(tls: Option<&str>, peer_failure_mode: bool) -> Result<Ucp, TransportError> {
        let mut config: *mut sys::ucp_config_t = std::ptr::null_mut();
        // SAFETY: null env prefix and file name ask for the defaults + environment.
        let status = unsafe { sys::ucp_config_read(std::ptr::null(), std::ptr::null(), &mut config) };
        setup(status, "ucp_config_read")?;
        if let Some(tls) = tls {
            let value = CString::new(tls).map_err(|_| unavailable("UCX_TLS contains a NUL byte".into()))?;
            // SAFETY: `config` is live; both strings are NUL-terminated and outlive the call.
            let status = unsafe { sys::ucp_config_modify(config, c"TLS".as_ptr(), value.as_ptr()) };
            if status != sys::UCS_OK {
                // SAFETY: `config` came from ucp_config_read and is released once.
                unsafe { sys::ucp_config_release(config) };
                return Err(unavailable(format!("UCX_TLS={tls} is not accepted: {}", status_text(status))));
            }
        }
        let params = sys::ucp_params_t {
            field_mask: u64::from(sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED),
            features: u64::from(sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_AM | sys::UCP_FEATURE_WAKEUP),
            mt_workers_shared: 1,
            ..Default::default()
        };
        let mut handle: sys::ucp_context_h = std::ptr::null_mut();
        // SAFETY: `params` and `config` are valid for the call; `handle` receives the context.
        let status = unsafe { sys::ucp_init(&params, config, &mut handle) };
        // SAFETY: the config is no longer needed whatever ucp_init returned.
        unsafe { sys::ucp_config_release(config) };
        setup(status, "ucp_init")?;
        let mut attributes = sys::ucp_context_attr_t {
            field_mask: u64::from(sys::UCP_ATTR_FIELD_THREAD_MODE),
            ..Default::default()
        };
        // SAFETY: `handle` is the live context just created; `attributes` is valid for the call.
        let status = unsafe { sys::ucp_context_query(handle, &mut attributes) };
        let thread_safe = status == sys::UCS_OK && attributes.thread_mode == sys::UCS_THREAD_MODE_MULTI;
        Ucp::on(Arc::new(Context { handle, thread_safe }), peer_failure_mode)
    }

    /// Another worker of the same context, for another lane of the connection. Refused when
    /// UCX does not lock its context-wide calls (built without multi-thread support): lanes
    /// drive their workers from different threads.
    pub(crate) fn another(&self) -> Result<Ucp, TransportError> {
        lanes_allowed(self.context.thread_safe)?;
        Ucp::on(self.context.clone(), self.peer_failure_mode)
    }

    fn on(context: Arc<Context>, peer_failure_mode: bool) -> Result<Ucp, TransportError> {
        let worker_params = sys::ucp_worker_params_t {
            field_mask: u64::from(sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE),
            thread_mode: sys::UCS_THREAD_MODE_SERIALIZED,
            ..Default::default()
        };
        let mut worker: sys::ucp_worker_h = std::ptr::null_mut();
        // SAFETY: the context is live (held by `context`); `worker_params` is valid for the call.
        let status = unsafe { sys::ucp_worker_create(context.handle, &worker_params, &mut worker) };
        if status != sys::UCS_OK {
            return Err(unavailable(format!("ucp_worker_create failed: {}", status_text(status))));
        }
        let mut efd: RawFd = -1;
        // SAFETY: `worker` is live and its context has the WAKEUP feature.
        let status = unsafe { sys::ucp_worker_get_efd(worker, &mut efd) };
        let ucp = Ucp { context, worker, efd, peer_failure_mode };
        setup(status, "ucp_worker_get_efd")?;
        Ok(ucp)
    }

    /// The worker's address, as the peer needs it for `ucp_ep_create`.
    pub(crate) fn address(&self) -> Result<Vec<u8>, TransportError> {
        worker_address(self.worker)
    }

    /// One round of progress; returns how many events it handled.
    pub(crate) fn progress(&self) -> u32 {
        // SAFETY: `worker` is live; the caller holds the engine lock (serialized mode).
        unsafe { sys::ucp_worker_progress(self.worker) }
    }

    /// Progresses until nothing is left to do right now (bounded, so a flood cannot pin the caller).
    pub(crate) fn progress_all(&self) {
        for _ in 0..1024 {
            if self.progress() == 0 {
                break;
            }
        }
    }

    /// Arms the event fd. `true`: nothing pending, safe to sleep on [`Ucp::efd`]; `false`:
    /// events arrived meanwhile, progress again first.
    pub(crate) fn arm(&self) -> bool {
        // SAFETY: `worker` is live; the caller holds the engine lock.
        unsafe { sys::ucp_worker_arm(self.worker) == sys::UCS_OK }
    }

    /// Registers `callback(arg, …)` for the active message `id`.
    pub(crate) fn set_am_handler(
        &self,
        id: u32,
        callback: sys::ucp_am_recv_callback_t,
        arg: *mut c_void,
    ) -> Result<(), TransportError> {
        let params = sys::ucp_am_handler_param_t {
            field_mask: u64::from(
                sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                    | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                    | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG
                    | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
            ),
            id,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: callback,
            arg,
        };
        // SAFETY: `worker` is live; `arg` outlives the worker (the engine keeps it alive).
        setup(
            unsafe { sys::ucp_worker_set_am_recv_handler(self.worker, &params) },
            "ucp_worker_set_am_recv_handler",
        )
    }

    /// Creates an endpoint to the worker at `address`, reporting peer failures to
    /// `on_error(arg, ep, status)`.
    /// [`crate::wire::screen_worker_address`] against this worker's own address.
    fn screen_address(&self, address: &[u8]) -> Result<Vec<u8>, TransportError> {
        crate::wire::screen_worker_address(address, &self.address()?)
    }

    pub(crate) fn connect(
        &self,
        address: &[u8],
        on_error: sys::ucp_err_handler_cb_t,
        arg: *mut c_void,
    ) -> Result<sys::ucp_ep_h, TransportError> {
        let padded = self.screen_address(address)?;
        let params = sys::ucp_ep_params_t {
            field_mask: u64::from(
                sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER,
            ),
            address: padded.as_ptr().cast(),
            err_mode: if self.peer_failure_mode {
                sys::UCP_ERR_HANDLING_MODE_PEER
            } else {
                sys::UCP_ERR_HANDLING_MODE_NONE
            },
            err_handler: sys::ucp_err_handler_t { cb: on_error, arg },
            ..Default::default()
        };
        let mut ep: sys::ucp_ep_h = std::ptr::null_mut();
        // SAFETY: `worker` is live; `padded` outlives the call and holds the address an
        // authenticated peer sent, screened by `screen_worker_address` and followed by zeros, so UCX's
        // parser (which takes no length) stays inside the buffer for a truncated address. UCX
        // does not validate the rest of the structure: only authenticated peers get here (the
        // backend refuses to connect without a token). `arg` outlives the endpoint.
        let status = unsafe { sys::ucp_ep_create(self.worker, &params, &mut ep) };
        if status == sys::UCS_ERR_UNREACHABLE {
            // The peer's worker offers no transport this one was opened with: both sides chose
            // different UCX transports.
            return Err(TransportError::Handshake(format!(
                "the peer's UCX transports cannot reach this side's ({}): open both with the same --channel (UCX_TLS)",
                status_text(status)
            )));
        }
        if status != sys::UCS_OK {
            return Err(TransportError::Handshake(format!(
                "cannot create an endpoint to the peer's worker address: {}",
                status_text(status)
            )));
        }
        Ok(ep)
    }

    /// Waits for `request` (an nbx request handle, or null for done) by progressing, up to
    /// `spins` rounds; frees it. Returns its final status, `UCS_INPROGRESS` if it did not finish.
    pub(crate) fn finish(&self, request: sys::ucs_status_ptr_t, spins: u32) -> sys::ucs_status_t {
        if !sys::status_ptr_is_ptr(request) {
            return sys::status_ptr_status(request);
        }
        let mut status = sys::UCS_INPROGRESS;
        for round in 0..spins {
            // SAFETY: `request` is a live request handle of this worker until freed below.
            status = unsafe { sys::ucp_request_check_status(request) };
            if status != sys::UCS_INPROGRESS {
                break;
            }
            if self.progress() == 0 && round % 64 == 63 {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        // SAFETY: freeing a finished request releases it; an unfinished one is released by UCX
        // when it completes.
        unsafe { sys::ucp_request_free(request) };
        status
    }
}

/// The address of a live `worker`, copied out of UCX's buffer.
pub(crate) fn worker_address(worker: sys::ucp_worker_h) -> Result<Vec<u8>, TransportError> {
    let mut address: *mut sys::ucp_address_t = std::ptr::null_mut();
    let mut len = 0usize;
    // SAFETY: `worker` is live (caller's contract); UCX allocates `address`, released below.
    let status = unsafe { sys::ucp_worker_get_address(worker, &mut address, &mut len) };
    setup(status, "ucp_worker_get_address")?;
    // SAFETY: UCX returned `len` readable bytes at `address`.
    let bytes = unsafe { std::slice::from_raw_parts(address.cast::<u8>(), len) }.to_vec();
    // SAFETY: `address` came from ucp_worker_get_address on this worker; released once.
    unsafe { sys::ucp_worker_release_address(worker, address) };
    Ok(bytes)
}

impl Drop for Ucp {
    fn drop(&mut self) {
        // SAFETY: the engine closed the endpoint before; the worker is destroyed once. The
        // context goes with its last holder (`Context::drop`).
        unsafe { sys::ucp_worker_destroy(self.worker) };
    }
}

/// `Ok` when a context whose thread safety is `thread_safe` may carry a second worker.
fn lanes_allowed(thread_safe: bool) -> Result<(), TransportError> {
    if thread_safe {
        return Ok(());
    }
    Err(unavailable(
        "this UCX was built without multi-thread support, so its context-wide calls are not locked and \
         lanes on several threads would race: use one lane per connection (or a UCX built with --enable-mt)"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::{detects_peer_failure, lanes_allowed, Ucp};
    use rdma_hint_core::TransportError;

    #[test]
    fn a_second_lane_needs_a_context_ucx_locks() {
        assert!(lanes_allowed(true).is_ok());
        let refused = lanes_allowed(false).unwrap_err();
        assert!(
            matches!(&refused, TransportError::Unavailable { reason, .. } if reason.contains("multi-thread")),
            "{refused}"
        );
        // The system UCX is asked, not assumed: what it answers decides whether lanes open.
        let first = Ucp::open(Some("self"), false).expect("a UCX context");
        assert_eq!(first.another().is_ok(), first.context.thread_safe);
    }

    #[test]
    fn peer_failure_mode_only_without_shared_memory() {
        assert!(detects_peer_failure(Some("tcp,self")));
        assert!(detects_peer_failure(Some("tcp")));
        assert!(!detects_peer_failure(Some("shm,self")));
        assert!(!detects_peer_failure(Some("posix,cma,self")));
        assert!(!detects_peer_failure(Some("^tcp")));
        assert!(!detects_peer_failure(None));
    }
}
