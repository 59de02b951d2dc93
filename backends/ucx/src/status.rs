//! UCX status codes as rdma-hint errors.

use rdma_hint_core::TransportError;
use rdma_hint_ucx_sys as sys;
use std::ffi::CStr;

/// UCX's own words for `status` (`ucs_status_string`).
pub(crate) fn status_text(status: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string returns a pointer to a static NUL-terminated string for every
    // status value, known or not.
    unsafe { CStr::from_ptr(sys::ucs_status_string(status)) }.to_string_lossy().into_owned()
}

/// `Ok` for `UCS_OK`, otherwise [`TransportError::Unavailable`] naming the call that failed.
pub(crate) fn setup(status: sys::ucs_status_t, call: &str) -> Result<(), TransportError> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(unavailable(format!("{call} failed: {}", status_text(status))))
    }
}

/// The backend cannot run (UCX refused to set up).
pub(crate) fn unavailable(reason: String) -> TransportError {
    TransportError::Unavailable { backend: crate::BACKEND, reason }
}

/// A status code as the `u32` that [`rdma_hint_core::CompletionStatus::Failed`] carries: the
/// magnitude of UCX's negative error code (`UCS_ERR_CONNECTION_RESET` = -25 → 25).
pub(crate) fn completion_code(status: sys::ucs_status_t) -> u32 {
    u32::from(status.unsigned_abs())
}
