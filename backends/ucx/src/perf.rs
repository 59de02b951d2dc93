//! UCX's own performance estimate for a transport scope, as hint-model facts.
//!
//! `ucp_ep_evaluate_perf` answers "how long does a message of s bytes take on this endpoint",
//! from UCX's transport models (the same `o + s/B` shape the hint model uses). Two sizes give
//! both terms. The estimate needs an endpoint; before a peer exists the transport asks it of a
//! loopback endpoint between two workers of its own context, which selects the same shm or tcp
//! lanes a peer on this host (or across a veth) would.

use crate::engine::MAX_SGES;
use crate::status::{setup, status_text, unavailable};
use crate::worker::Ucp;
use rdma_hint_backend_core::MAX_REGION_BYTES;
use rdma_hint_core::{
    CallerMemoryPath, Capabilities, MemoryKind, TransportError, TransportFacts, TransportId, TransportKind,
    MAX_OPS_PER_POST,
};
use rdma_hint_core::{KIB, MIB};
use rdma_hint_ucx_sys as sys;
use std::ffi::CStr;

/// What UCX estimates for one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Fixed cost per message in µs (`o`).
    pub overhead_us: f64,
    /// Bandwidth in GB/s (`B`).
    pub gbps: f64,
    /// The lanes UCX selected, e.g. `rma_bw: cma/memory; am: posix/memory`.
    pub lanes: String,
}

const SMALL: u64 = 64 * KIB;
const LARGE: u64 = 4 * MIB;

/// Estimates `o` and `B` for `ep` from UCX's model at 64 KiB and 4 MiB.
pub(crate) fn evaluate(ep: sys::ucp_ep_h) -> Result<(f64, f64), TransportError> {
    let time = |size: u64| -> Result<f64, TransportError> {
        let param = sys::ucp_ep_evaluate_perf_param_t {
            field_mask: u64::from(sys::UCP_EP_PERF_PARAM_FIELD_MESSAGE_SIZE),
            message_size: size as usize,
        };
        let mut attr = sys::ucp_ep_evaluate_perf_attr_t {
            field_mask: u64::from(sys::UCP_EP_PERF_ATTR_FIELD_ESTIMATED_TIME),
            estimated_time: 0.0,
        };
        // SAFETY: `ep` is a live endpoint; `param` and `attr` are valid for the call.
        setup(unsafe { sys::ucp_ep_evaluate_perf(ep, &param, &mut attr) }, "ucp_ep_evaluate_perf")?;
        Ok(attr.estimated_time)
    };
    let (small, large) = (time(SMALL)?, time(LARGE)?);
    if !(small > 0.0 && large > small) {
        return Err(unavailable(format!(
            "UCX's estimate is not usable ({small:e} s for {SMALL} B, {large:e} s for {LARGE} B)"
        )));
    }
    let bytes_per_second = (LARGE - SMALL) as f64 / (large - small);
    let overhead_s = (small - SMALL as f64 / bytes_per_second).max(0.0);
    Ok((overhead_s * 1e6, bytes_per_second / 1e9))
}

/// The lanes of `ep` as UCX prints them, condensed to `purpose: transport/device` pairs.
pub(crate) fn lanes(ep: sys::ucp_ep_h) -> String {
    let mut buffer: *mut std::ffi::c_char = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: open_memstream allocates `buffer` and updates it on fclose.
    let stream = unsafe { sys::open_memstream(&mut buffer, &mut size) };
    if stream.is_null() {
        return String::from("(unknown)");
    }
    // SAFETY: `ep` is live; `stream` is an open FILE that we close right after.
    unsafe {
        sys::ucp_ep_print_info(ep, stream);
        sys::fclose(stream);
    }
    if buffer.is_null() {
        return String::from("(unknown)");
    }
    // SAFETY: after fclose, `buffer` is a NUL-terminated string owned by us; freed once.
    let text = unsafe { CStr::from_ptr(buffer) }.to_string_lossy().into_owned();
    // SAFETY: `buffer` was allocated by open_memstream with malloc.
    unsafe { libc::free(buffer.cast()) };
    condense_lanes(&text)
}

/// Turns `ucp_ep_print_info` lines such as
/// `#                 lane[0]:  8:cma/memory.0 md[4]           -> md[4]/cma/sysdev[255] rma_bw#0`
/// into `rma_bw: cma/memory`, one entry per distinct purpose and transport.
pub(crate) fn condense_lanes(text: &str) -> String {
    let mut entries: Vec<String> = Vec::new();
    for line in text.lines().filter(|line| line.contains("lane[")) {
        let Some((local, remote)) = line.split_once("->") else { continue };
        // `lane[1]:  8:cma/memory.0 md[4]`: the transport/device is the word after `N:`.
        let Some(transport) = local
            .split_whitespace()
            .filter_map(|word| word.split_once(':').map(|(_, rest)| rest))
            .find(|rest| rest.contains('/'))
        else {
            continue;
        };
        let transport = transport.split('.').next().unwrap_or(transport);
        // `md[4]/cma/sysdev[255] rma_bw#0 am`: purposes follow the remote md path.
        for purpose in remote.split_whitespace().skip(1) {
            let entry = format!("{}: {transport}", purpose.split('#').next().unwrap_or(purpose));
            if !entries.contains(&entry) {
                entries.push(entry);
            }
        }
    }
    if entries.is_empty() {
        String::from("(no lanes reported)")
    } else {
        entries.join("; ")
    }
}

/// Estimates the scope `ucp` was opened with, on a loopback endpoint between its worker and a
/// second worker of the same context.
pub(crate) fn self_estimate(ucp: &Ucp) -> Result<Estimate, TransportError> {
    let probe = ProbeWorker::create(ucp)?;
    let address = probe.address()?;
    let ep = ucp
        .connect(&address, None, std::ptr::null_mut())
        .map_err(|e| unavailable(format!("no UCX transport in this scope reaches a local peer: {e}")))?;
    let result = evaluate(ep).map(|(overhead_us, gbps)| Estimate { overhead_us, gbps, lanes: lanes(ep) });
    // A tcp endpoint starts connecting when created; let that finish so closing it does not
    // leave a connect racing the probe worker's teardown (UCX would log it as an error).
    for _ in 0..200 {
        let events = ucp.progress() + probe.progress();
        if events == 0 {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
    let param = sys::ucp_request_param_t {
        op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
        flags: sys::UCP_EP_CLOSE_FLAG_FORCE,
        ..Default::default()
    };
    // SAFETY: `ep` is live, never used for data, and closed once.
    let request = unsafe { sys::ucp_ep_close_nbx(ep, &param) };
    ucp.finish(request, 1000);
    drop(probe);
    result
}

/// A second worker on the transport's context, only for the loopback estimate.
struct ProbeWorker(sys::ucp_worker_h);

impl ProbeWorker {
    fn create(ucp: &Ucp) -> Result<ProbeWorker, TransportError> {
        let params = sys::ucp_worker_params_t {
            field_mask: u64::from(sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE),
            thread_mode: sys::UCS_THREAD_MODE_SINGLE,
            ..Default::default()
        };
        let mut worker: sys::ucp_worker_h = std::ptr::null_mut();
        // SAFETY: the context is live; `params` is valid for the call.
        let status = unsafe { sys::ucp_worker_create(ucp.context.handle, &params, &mut worker) };
        if status != sys::UCS_OK {
            return Err(unavailable(format!("ucp_worker_create failed: {}", status_text(status))));
        }
        Ok(ProbeWorker(worker))
    }

    fn progress(&self) -> u32 {
        // SAFETY: the probe worker is live and only used by this thread.
        unsafe { sys::ucp_worker_progress(self.0) }
    }

    fn address(&self) -> Result<Vec<u8>, TransportError> {
        crate::worker::worker_address(self.0)
    }
}

impl Drop for ProbeWorker {
    fn drop(&mut self) {
        // SAFETY: no endpoint refers to this worker any more; destroyed once.
        unsafe { sys::ucp_worker_destroy(self.0) };
    }
}

/// Whether the scope is TCP alone (`ucx:tcp`): no shared memory, the kernel copies every byte
/// on both sides and a peer's puts land only through our own worker.
pub(crate) fn tcp_only(id: &TransportId) -> bool {
    id.to_string().ends_with(":tcp")
}

pub(crate) fn capabilities(id: TransportId, estimate: &Estimate, max_outstanding: u32) -> Capabilities {
    // Caller memory is mapped in place. Over TCP the kernel copies each byte on both sides and
    // rdma-hint copies nothing. Over shared memory each byte is copied once: by the posting
    // thread into the peer's memory where UCX maps it here (a peer region UCX allocated), else
    // by CMA's `process_vm_writev` (a peer region in its caller's memory). Each count is the
    // most that side may copy; only one of them copies a given connection's bytes.
    let (send_copies, medium_copies) = if tcp_only(&id) { (0, 2) } else { (1, 1) };
    let caller_memory = vec![CallerMemoryPath {
        kind: MemoryKind::Host,
        send_copies,
        receive_copies: Some(0),
        medium_copies,
    }];
    Capabilities {
        facts: TransportFacts {
            id,
            kind: TransportKind::Ucx,
            wire_gbps: estimate.gbps,
            nic_pcie: None,
            per_op_overhead_us: estimate.overhead_us,
            mtu_bytes: None,
            // UCX fragments puts itself; the bound is the largest region.
            max_msg_bytes: MAX_REGION_BYTES,
            max_payload_bytes: None,
            queried_from_backend: true,
            rate_note: None,
        },
        max_outstanding_wrs: max_outstanding,
        max_wrs_per_post: MAX_OPS_PER_POST as u32,
        max_sges: MAX_SGES,
        memory_kinds: vec![MemoryKind::Host],
        caller_memory,
        // A post copies (direct) or hands UCX non-blocking puts, under the worker's lock,
        // which the progress thread holds for one bounded `ucp_worker_progress` (or while it
        // takes in a region the peer exposes, which is rare); a full notice ring on the peer
        // answers `QueueFull` at once.
        posts_without_waiting: true,
    }
}

#[cfg(test)]
mod tests {
    use super::condense_lanes;

    #[test]
    fn lanes_are_condensed_per_purpose() {
        let text = "#\n# UCP endpoint \n#\n#               peer: <no debug data>\n\
            #                 lane[0]:  1:sysv/memory.0 md[1]       -> md[1]/sysv/sysdev[255] am am_bw#0\n\
            #                 lane[1]:  2:posix/memory.0 md[2]      -> md[2]/posix/sysdev[255]\n\
            #                 lane[2]:  8:cma/memory.0 md[4]        -> md[4]/cma/sysdev[255] rma_bw#0\n\
            #                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)\n";
        assert_eq!(condense_lanes(text), "am: sysv/memory; am_bw: sysv/memory; rma_bw: cma/memory");
        let tcp = "#   lane[0]:  1:tcp/lo.0 md[0]   -> md[0]/tcp/sysdev[255] rma_bw#0 am am_bw#0 keepalive\n";
        assert_eq!(condense_lanes(tcp), "rma_bw: tcp/lo; am: tcp/lo; am_bw: tcp/lo; keepalive: tcp/lo");
        assert_eq!(condense_lanes("nothing"), "(no lanes reported)");
    }
}
