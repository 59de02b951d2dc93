//! Raw FFI bindings to the system UCX (`libucp`, `libucs`), generated at build time by bindgen
//! from the headers `pkg-config ucx` points at (Debian 12: `libucx-dev` 1.13.1).
//!
//! Only the calls the rdma-hint UCX backend makes are bound. Everything here is `unsafe` C API;
//! use the `rdma-hint-ucx` crate for a safe transport. Linking needs `libucp.so`/`libucs.so`
//! (Debian: `libucx0`) at run time.
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, missing_docs, unreachable_pub)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks)]

include!(concat!(env!("OUT_DIR"), "/ucx.rs"));

/// `UCS_PTR_IS_ERR`: a `ucs_status_ptr_t` that carries an error status instead of a request.
#[inline]
pub fn status_ptr_is_err(ptr: ucs_status_ptr_t) -> bool {
    (ptr as usize) >= (UCS_ERR_LAST as isize as usize)
}

/// `UCS_PTR_IS_PTR`: a `ucs_status_ptr_t` that is a request handle (neither NULL nor an error).
#[inline]
pub fn status_ptr_is_ptr(ptr: ucs_status_ptr_t) -> bool {
    (ptr as usize).wrapping_sub(1) < (UCS_ERR_LAST as isize as usize).wrapping_sub(1)
}

/// `UCS_PTR_STATUS`: the status a `ucs_status_ptr_t` carries (`UCS_OK` for NULL,
/// `UCS_INPROGRESS` for a request handle).
#[inline]
pub fn status_ptr_status(ptr: ucs_status_ptr_t) -> ucs_status_t {
    if status_ptr_is_ptr(ptr) {
        UCS_INPROGRESS
    } else {
        ptr as isize as ucs_status_t
    }
}

/// `ucp_init`: the header's inline wrapper around `ucp_init_version` with the compiled API version.
///
/// # Safety
/// Same contract as `ucp_init_version`: valid pointers for `params`, `config` (or null) and `context_p`.
pub unsafe fn ucp_init(
    params: *const ucp_params_t,
    config: *const ucp_config_t,
    context_p: *mut ucp_context_h,
) -> ucs_status_t {
    // SAFETY: forwarded under the caller's contract; the version constants match the headers bound.
    unsafe { ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context_p) }
}
