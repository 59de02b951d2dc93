//! Errors of verbs calls as rdma-hint errors.

use rdma_hint_core::TransportError;

/// [`TransportError::Unavailable`] for `call`, with the OS error it left in `errno`.
pub(crate) fn unavailable(call: &str) -> TransportError {
    TransportError::Unavailable {
        backend: crate::BACKEND,
        reason: format!("{call} failed: {}", std::io::Error::last_os_error()),
    }
}

/// A verbs call that returns 0 or an errno value.
pub(crate) fn check(code: i32, call: &str) -> Result<(), TransportError> {
    if code == 0 {
        Ok(())
    } else {
        Err(TransportError::Unavailable {
            backend: crate::BACKEND,
            reason: format!("{call} failed: {}", std::io::Error::from_raw_os_error(code)),
        })
    }
}
