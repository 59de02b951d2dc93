//! The hint model: `t(s) = o + s / B` per message (Hockney / LogGP; NCCL's tuner and UCX's
//! `ucp_ep_evaluate_perf` use the same form).
//!
//! * `B` — the narrowest of: wire rate, the source's PCIe link, the NIC's PCIe link, and the cap
//!   of the path class (GPUDirect through the root complex is slow on many CPUs).
//! * `o` — fixed cost per message: backend per-op overhead (doorbell, WQE, completion share), one
//!   PCIe switch hop per bridge, the path-class latency (UCX: phb/node 0.3 µs, sys 0.5 µs), and a
//!   copy-engine launch per block when a GPU is staged through host memory.
//! * efficiency `η(s) = s / (s + o·B)`; the smallest block reaching the target is
//!   `s* = η / (1 − η) · o · B` (η = 0.5 gives Hockney's n½).
//!
//! `s*` is then bounded by the latency budget and the clamps, rounded up to the alignment and,
//! if that overshoots the upper bound, down again. Every step that changes the answer leaves a
//! [`Reason`].

use crate::error::HintError;
use crate::profile::{PathClass, PathProfile, SourceId, SourceKind, TransportKind};
use crate::transport_id::TransportId;
use crate::{KIB, MIB};
use serde::{Deserialize, Serialize};
use std::fmt;

/// NCCL splits buffers on 128 B boundaries; every block start keeps that alignment.
pub const NCCL_SPLIT_ALIGN_BYTES: u64 = 128;
/// PCIe Max_Payload_Size UCX assumes when the real one is unknown.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 = 512;
/// GPUDirect RDMA pins and maps GPU memory in 64 KiB pages.
pub const GPUDIRECT_PAGE_BYTES: u64 = 64 * KIB;
/// Added per PCIe bridge between source and NIC, in µs (one switch hop ≈ 100 ns).
pub const BRIDGE_HOP_US: f64 = 0.1;
/// Path-class latency through the host bridge (UCX's phb/node distance), in µs.
pub const PHB_LATENCY_US: f64 = 0.3;
/// Path-class latency across NUMA nodes (UCX's sys distance), in µs.
pub const SYS_LATENCY_US: f64 = 0.5;
/// Bandwidth cap for GPUDirect RDMA through the root complex, in GB/s (top of UCX's phb range).
pub const GPU_PHB_CAP_GBPS: f64 = 19.0;
/// Copy-engine launch cost per block that is *not* hidden behind the previous copy, charged
/// when a GPU is staged through host memory. Calibrated on an H200 with `cuMemcpyBatchAsync`
/// (`benches/gpu-staging.sh`): 4 KiB D2H blocks move at 10.4 GB/s, 0.39 µs per block of which
/// 0.08 µs is the transfer; from 64 KiB on, launches overlap the running copy (53.8 GB/s), so the
/// effective serial cost that puts the hint within 2× of the measured knee is 0.25 µs.
pub const COPY_ENGINE_LAUNCH_US: f64 = 0.25;

/// Largest wire rate a profile may claim (1 PB/s): beyond it the input is garbage, not hardware.
pub const MAX_WIRE_GBPS: f64 = 1e6;
/// Largest per-op cost a profile may claim (1 s).
pub const MAX_PER_OP_US: f64 = 1e6;

/// Knobs of the computation. `Default` is what `get_low_latency_rdma_size_hint` uses.
///
/// ```
/// use rdma_hint_core::{compute_hint, HintPolicy, PathProfile};
/// let strict = HintPolicy { target_efficiency: 0.8, ..HintPolicy::default() };
/// let hint = compute_hint(&PathProfile::example_gpu_nic(), &strict).unwrap();
/// let relaxed = compute_hint(&PathProfile::example_gpu_nic(), &HintPolicy::default()).unwrap();
/// assert!(hint.block_bytes <= relaxed.block_bytes);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HintPolicy {
    /// Target share of the path bandwidth `B` a stream of blocks should reach, in (0, 1).
    pub target_efficiency: f64,
    /// Upper bound on one block's latency `o + s/B` in µs, if any (default 1 ms: a guard against
    /// absurd blocks on slow paths, not the efficiency target).
    pub latency_budget_us: Option<f64>,
    /// Smallest block the hint may be, in bytes.
    pub min_block_bytes: u64,
    /// Largest block the hint may be, in bytes (one 400G QP drops off its peak above ≈ 1 MiB).
    pub max_block_bytes: u64,
}

impl Default for HintPolicy {
    fn default() -> Self {
        HintPolicy {
            target_efficiency: 0.9,
            latency_budget_us: Some(1000.0),
            min_block_bytes: 16 * KIB,
            max_block_bytes: 4 * MIB,
        }
    }
}

impl HintPolicy {
    /// Checks every field; the model calls this first.
    pub(crate) fn validate(&self) -> Result<(), HintError> {
        let eta = self.target_efficiency;
        if !(eta.is_finite() && eta > 0.0 && eta <= 0.999) {
            return Err(HintError::InvalidPolicy {
                field: "target_efficiency",
                value: eta.to_string(),
                why: "must be in (0, 0.999]",
            });
        }
        if let Some(budget) = self.latency_budget_us {
            if !(budget.is_finite() && budget > 0.0) {
                return Err(HintError::InvalidPolicy {
                    field: "latency_budget_us",
                    value: budget.to_string(),
                    why: "must be a positive number of µs",
                });
            }
        }
        if self.min_block_bytes == 0 {
            return Err(HintError::InvalidPolicy {
                field: "min_block_bytes",
                value: "0".into(),
                why: "must be at least 1 byte",
            });
        }
        if self.max_block_bytes < self.min_block_bytes {
            return Err(HintError::InvalidPolicy {
                field: "max_block_bytes",
                value: self.max_block_bytes.to_string(),
                why: "must be at least min_block_bytes",
            });
        }
        Ok(())
    }
}

/// Whether a hint came from the model or from a measured sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Computed from the path profile.
    Model,
    /// Taken from a measured block-size sweep on this hardware and driver.
    Measured,
    /// Computed by the model from `o` and `B` fitted on the live path (`rdma-hint calibrate`).
    Calibrated,
}

/// Which part of the computation a [`Reason`] explains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Factor {
    /// What bound the bandwidth `B`.
    Bandwidth,
    /// One part of the fixed cost `o`.
    FixedCost,
    /// One input of the alignment.
    Alignment,
    /// The efficiency target and the raw `s*`.
    Efficiency,
    /// A bound that changed the block (latency budget, clamp, max message, memory).
    Bound,
    /// A property of the route (GPUDirect, class caps, assumed defaults).
    Route,
    /// A measured sweep replaced the model's block.
    Measured,
    /// `o` and `B` fitted on the live path replaced the model's constants.
    Calibrated,
}

/// One line of explanation: the factor, its value with units, and where the value came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reason {
    /// Which part of the computation this explains.
    pub factor: Factor,
    /// The value with its unit, e.g. `"50.0 GB/s"`.
    pub value: String,
    /// Where the value came from or why it applies.
    pub why: String,
}

impl Reason {
    /// A reason line.
    pub fn new(factor: Factor, value: impl Into<String>, why: impl Into<String>) -> Reason {
        Reason { factor, value: value.into(), why: why.into() }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {} — {}", self.factor, self.value, self.why)
    }
}

/// The answer: block size and alignment for one (source, transport) pair, with its explanation.
///
/// Invariants (checked by [`crate::validate_hint`]): `block_bytes > 0`, `align_bytes` is a power
/// of two, `block_bytes % align_bytes == 0`, the block fits `max_msg` and the device memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeHint {
    /// Memory source the hint is for.
    pub source: SourceId,
    /// Transport identity (`verbs:mlx5_0`, `staged:shm`, …).
    pub transport: TransportId,
    /// Block size to post, in bytes.
    pub block_bytes: u64,
    /// Alignment in bytes: every block of a range that starts on it starts on it too.
    pub align_bytes: u64,
    /// Distance class of the path (`class` in JSON).
    #[serde(rename = "class")]
    pub path_class: PathClass,
    /// Path bandwidth `B` the model used, in GB/s.
    pub bandwidth_gbps: f64,
    /// Fixed cost per message `o` the model used, in µs.
    pub fixed_cost_us: f64,
    /// Predicted streaming bandwidth at this block size, in GB/s.
    pub predicted_gbps: f64,
    /// Predicted time for one block, `o + s/B`, in µs.
    pub predicted_latency_us: f64,
    /// Predicted share of `B` reached at this block size, in (0, 1].
    pub efficiency: f64,
    /// Model or measurement.
    pub origin: Origin,
    /// How the numbers came about, in order.
    pub reasons: Vec<Reason>,
}

/// Predicted efficiency `s / (s + o·B)` of blocks of `block_bytes` on a path with fixed cost
/// `fixed_cost_us` µs and bandwidth `bandwidth_gbps` GB/s.
///
/// ```
/// let eta = rdma_hint_core::model::efficiency(64 * 1024, 1.0, 50.0);
/// assert!((eta - 65536.0 / (65536.0 + 50_000.0)).abs() < 1e-12);
/// ```
pub fn efficiency(block_bytes: u64, fixed_cost_us: f64, bandwidth_gbps: f64) -> f64 {
    let s = block_bytes as f64;
    s / (s + fixed_cost_us * bandwidth_gbps * 1e3)
}

/// Time one block of `block_bytes` takes on a path with fixed cost `fixed_cost_us` µs and
/// bandwidth `bandwidth_gbps` GB/s: `o + s/B`, in µs.
///
/// ```
/// let t = rdma_hint_core::model::latency_us(50_000, 2.0, 50.0);
/// assert!((t - 3.0).abs() < 1e-12); // 2 µs + 50 kB at 50 GB/s
/// ```
pub fn latency_us(block_bytes: u64, fixed_cost_us: f64, bandwidth_gbps: f64) -> f64 {
    fixed_cost_us + block_bytes as f64 / (bandwidth_gbps * 1e3)
}

impl SizeHint {
    /// The same hint at another block size and bandwidth: efficiency, predicted bandwidth and
    /// latency recomputed from its fixed cost (what a measured knee and plateau change).
    pub fn rescaled(self, block_bytes: u64, bandwidth_gbps: f64) -> SizeHint {
        let efficiency = efficiency(block_bytes, self.fixed_cost_us, bandwidth_gbps);
        SizeHint {
            block_bytes,
            bandwidth_gbps,
            efficiency,
            predicted_gbps: bandwidth_gbps * efficiency,
            predicted_latency_us: latency_us(block_bytes, self.fixed_cost_us, bandwidth_gbps),
            ..self
        }
    }
}

fn check_profile(profile: &PathProfile) -> Result<(), HintError> {
    let transport = &profile.transport;
    let invalid = |field: &'static str, value: String, why: &'static str| {
        Err(HintError::InvalidProfile { field, value, why })
    };
    if !(transport.wire_gbps > 0.0 && transport.wire_gbps <= MAX_WIRE_GBPS) {
        return invalid("wire_gbps", transport.wire_gbps.to_string(), "must be in (0, 10⁶] GB/s");
    }
    if !(transport.per_op_overhead_us >= 0.0 && transport.per_op_overhead_us <= MAX_PER_OP_US) {
        return invalid(
            "per_op_overhead_us",
            transport.per_op_overhead_us.to_string(),
            "must be in [0, 10⁶] µs",
        );
    }
    if transport.max_msg_bytes == 0 {
        return invalid("max_msg_bytes", "0".into(), "must be at least 1 byte");
    }
    for (field, value) in
        [("mtu_bytes", transport.mtu_bytes), ("max_payload_bytes", transport.max_payload_bytes)]
    {
        if let Some(v) = value {
            if !v.is_power_of_two() || v > 64 * KIB {
                return invalid(field, v.to_string(), "must be a power of two ≤ 64 KiB");
            }
        }
    }
    if let Some(gpu) = profile.source.gpu() {
        if let Some(g) = gpu.vmm_granularity_bytes {
            if !g.is_power_of_two() {
                return invalid("vmm_granularity_bytes", g.to_string(), "must be a power of two");
            }
        }
    }
    if profile.source.memory_bytes == Some(0) {
        return invalid("memory_bytes", "0".into(), "a source has memory");
    }
    Ok(())
}

/// Computes the hint for one path under one policy.
///
/// Errors: [`HintError::InvalidProfile`] / [`HintError::InvalidPolicy`] for out-of-range inputs,
/// [`HintError::Unsupported`] when the path is not a low-latency route (GPU without GPUDirect
/// RDMA, GPU and NIC on different NUMA nodes, an alignment no allowed block can meet).
///
/// ```
/// use rdma_hint_core::{compute_hint, HintPolicy, PathClass, PathProfile};
/// let hint = compute_hint(&PathProfile::example_gpu_nic(), &HintPolicy::default()).unwrap();
/// assert_eq!(hint.path_class, PathClass::Pix);
/// assert_eq!(hint.align_bytes, 64 * 1024); // GPUDirect page
/// assert!(hint.efficiency >= 0.9);
/// ```
pub fn compute_hint(profile: &PathProfile, policy: &HintPolicy) -> Result<SizeHint, HintError> {
    policy.validate()?;
    check_profile(profile)?;
    let mut reasons = Vec::new();
    let (bandwidth_gbps, fixed_cost_us) = bandwidth_and_cost(profile, &mut reasons)?;
    let align_bytes = alignment(profile, &mut reasons);
    block_for(profile, policy, Costs { bandwidth_gbps, fixed_cost_us, align_bytes }, reasons, Origin::Model)
}

/// `o` and `B` fitted on the live path (see [`crate::fit`]), in µs and GB/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FittedCosts {
    /// Fixed cost per block `o`, in µs.
    pub fixed_cost_us: f64,
    /// Bandwidth `B`, in GB/s.
    pub bandwidth_gbps: f64,
}

impl FittedCosts {
    /// Whether the model can take them: `B` in (0, 10⁶] GB/s, `o` in [0, 10⁶] µs (the bounds
    /// of a path profile's own figures). A stored calibration is checked with this before it
    /// is used, so one out-of-range entry is ignored rather than failing every hint.
    ///
    /// ```
    /// use rdma_hint_core::model::FittedCosts;
    /// assert!(FittedCosts { fixed_cost_us: 1.5, bandwidth_gbps: 20.0 }.check().is_ok());
    /// assert!(FittedCosts { fixed_cost_us: 2e6, bandwidth_gbps: 20.0 }.check().is_err());
    /// assert!(FittedCosts { fixed_cost_us: 1.5, bandwidth_gbps: 2e6 }.check().is_err());
    /// ```
    pub fn check(&self) -> Result<(), HintError> {
        let FittedCosts { fixed_cost_us, bandwidth_gbps } = *self;
        if !(bandwidth_gbps.is_finite() && bandwidth_gbps > 0.0 && bandwidth_gbps <= MAX_WIRE_GBPS) {
            return Err(HintError::InvalidProfile {
                field: "bandwidth_gbps",
                value: bandwidth_gbps.to_string(),
                why: "a fitted bandwidth must be in (0, 10⁶] GB/s",
            });
        }
        if !(fixed_cost_us.is_finite() && (0.0..=MAX_PER_OP_US).contains(&fixed_cost_us)) {
            return Err(HintError::InvalidProfile {
                field: "fixed_cost_us",
                value: fixed_cost_us.to_string(),
                why: "a fitted fixed cost must be in [0, 10⁶] µs",
            });
        }
        Ok(())
    }
}

/// The hint for one path from `o` and `B` fitted on it instead of the model's constants: the
/// alignment, the bounds and the route checks (GPUDirect, NUMA) stay the model's.
///
/// ```
/// use rdma_hint_core::model::{compute_hint_fitted, FittedCosts, Origin};
/// use rdma_hint_core::{HintPolicy, PathProfile};
/// let fitted = FittedCosts { fixed_cost_us: 2.0, bandwidth_gbps: 10.0 };
/// let hint = compute_hint_fitted(&PathProfile::example_host_nic(), &HintPolicy::default(), fitted).unwrap();
/// assert_eq!(hint.origin, Origin::Calibrated);
/// assert_eq!(hint.fixed_cost_us, 2.0);
/// assert!(hint.block_bytes >= 9 * 2 * 10_000); // s* = 9·o·B at η = 0.9
/// ```
pub fn compute_hint_fitted(
    profile: &PathProfile,
    policy: &HintPolicy,
    fitted: FittedCosts,
) -> Result<SizeHint, HintError> {
    policy.validate()?;
    check_profile(profile)?;
    fitted.check()?;
    let FittedCosts { fixed_cost_us, bandwidth_gbps } = fitted;
    // The model's own B and o are computed for its route checks, then replaced.
    let mut model_reasons = Vec::new();
    let (model_bandwidth, model_cost) = bandwidth_and_cost(profile, &mut model_reasons)?;
    let mut reasons = vec![
        Reason::new(
            Factor::Calibrated,
            rate(bandwidth_gbps),
            format!("B fitted on the live path (the model's constants say {})", rate(model_bandwidth)),
        ),
        Reason::new(
            Factor::Calibrated,
            format!("{fixed_cost_us:.2} µs"),
            format!("o fitted on the live path (the model's constants say {model_cost:.2} µs)"),
        ),
    ];
    let align_bytes = alignment(profile, &mut reasons);
    block_for(
        profile,
        policy,
        Costs { bandwidth_gbps, fixed_cost_us, align_bytes },
        reasons,
        Origin::Calibrated,
    )
}

/// What the block is computed from.
struct Costs {
    bandwidth_gbps: f64,
    fixed_cost_us: f64,
    align_bytes: u64,
}

/// `s*` for `costs` under `policy`'s target, bounds and the alignment.
fn block_for(
    profile: &PathProfile,
    policy: &HintPolicy,
    costs: Costs,
    mut reasons: Vec<Reason>,
    origin: Origin,
) -> Result<SizeHint, HintError> {
    let Costs { bandwidth_gbps, fixed_cost_us, align_bytes } = costs;
    let eta = policy.target_efficiency;
    let ideal = eta / (1.0 - eta) * fixed_cost_us * bandwidth_gbps * 1e3;
    reasons.push(Reason::new(
        Factor::Efficiency,
        format!("{:.0} B", ideal),
        format!("s* = η/(1−η)·o·B with η = {eta}, o = {fixed_cost_us:.2} µs, B = {}", rate(bandwidth_gbps)),
    ));
    // Shave float noise so an exact product (90 000.000 000 1) does not round up a byte.
    let mut target = (ideal * (1.0 - 1e-12)).ceil().max(1.0) as u64;

    if let Some(budget) = policy.latency_budget_us {
        let allowed = ((budget - fixed_cost_us) * bandwidth_gbps * 1e3).floor();
        if allowed < target as f64 {
            let allowed = allowed.max(1.0) as u64;
            reasons.push(Reason::new(
                Factor::Bound,
                format!("{allowed} B"),
                format!("latency budget {budget} µs per block caps the block (o + s/B ≤ budget)"),
            ));
            target = allowed;
        }
    }

    let (upper, upper_why) = upper_bound(profile, policy);
    let lower = policy.min_block_bytes.min(upper);
    if target < lower {
        reasons.push(Reason::new(
            Factor::Bound,
            format!("{lower} B"),
            format!("raised to the policy minimum block {} B", policy.min_block_bytes),
        ));
        target = lower;
    } else if target > upper {
        reasons.push(Reason::new(Factor::Bound, format!("{upper} B"), upper_why.clone()));
        target = upper;
    }

    let block_bytes = round_to_alignment(target, align_bytes, upper);
    if block_bytes == 0 {
        return Err(HintError::Unsupported {
            reason: format!(
                "the path needs {align_bytes} B alignment but no block may exceed {upper} B ({upper_why})"
            ),
            fallback: "the staged backend, which has no alignment floor above 4 KiB".into(),
        });
    }
    if block_bytes != target {
        reasons.push(Reason::new(
            Factor::Alignment,
            format!("{block_bytes} B"),
            format!("{target} B rounded to a multiple of the {align_bytes} B alignment"),
        ));
    }

    let efficiency = efficiency(block_bytes, fixed_cost_us, bandwidth_gbps);
    Ok(SizeHint {
        source: profile.source.id,
        transport: profile.transport.id.clone(),
        block_bytes,
        align_bytes,
        path_class: profile.path_class,
        bandwidth_gbps,
        fixed_cost_us,
        predicted_gbps: bandwidth_gbps * efficiency,
        predicted_latency_us: latency_us(block_bytes, fixed_cost_us, bandwidth_gbps),
        efficiency,
        origin,
        reasons,
    })
}

/// A rate in GB/s with enough digits that a slow path does not read as zero: `0.0125 GB/s`,
/// `5.5 GB/s`.
pub fn rate(gbytes_per_s: f64) -> String {
    if gbytes_per_s < 1.0 {
        format!("{gbytes_per_s:.3} GB/s")
    } else {
        format!("{gbytes_per_s:.1} GB/s")
    }
}

/// A line rate in Gb/s, like [`rate`]: `0.1 Gb/s`, `400 Gb/s`.
fn rate_gbits(gbits_per_s: f64) -> String {
    if gbits_per_s < 10.0 {
        format!("{gbits_per_s:.2} Gb/s")
    } else {
        format!("{gbits_per_s:.0} Gb/s")
    }
}

/// `B` in GB/s and `o` in µs, with their reasons; refuses routes that are not low-latency.
fn bandwidth_and_cost(profile: &PathProfile, reasons: &mut Vec<Reason>) -> Result<(f64, f64), HintError> {
    let transport = &profile.transport;
    let over_nic = matches!(transport.kind, TransportKind::Verbs | TransportKind::Ucx);
    let class = profile.path_class;

    let mut candidates: Vec<(f64, String)> = vec![(
        transport.wire_gbps,
        format!(
            "{} rate {} ({}){}",
            transport.id,
            rate(transport.wire_gbps),
            rate_gbits(transport.wire_gbps * 8.0),
            transport.rate_note.as_ref().map(|note| format!(" [{note}]")).unwrap_or_default()
        ),
    )];
    if let Some(link) = profile.source.pcie {
        candidates.push((link.effective_gbps(), format!("{} PCIe link {link}", profile.source.id)));
    }
    if let Some(link) = transport.nic_pcie {
        candidates.push((link.effective_gbps(), format!("NIC PCIe link {link}")));
    }

    let mut fixed: Vec<(f64, String)> = vec![(
        transport.per_op_overhead_us,
        format!(
            "{} per-op overhead ({})",
            transport.id,
            if transport.queried_from_backend { "from the backend" } else { "model default" }
        ),
    )];
    if over_nic && profile.bridges > 0 {
        fixed.push((
            f64::from(profile.bridges) * BRIDGE_HOP_US,
            format!("{} PCIe bridge hop(s) × {BRIDGE_HOP_US} µs", profile.bridges),
        ));
    }
    match class {
        PathClass::Phb | PathClass::Node => {
            fixed.push((PHB_LATENCY_US, format!("{class}: through the host bridge (UCX phb/node)")))
        }
        PathClass::Sys => fixed.push((SYS_LATENCY_US, "SYS: across the inter-socket link (UCX sys)".into())),
        _ => {}
    }

    if let SourceKind::Gpu(gpu) = &profile.source.kind {
        if over_nic {
            if gpu.gpudirect_rdma == Some(false) {
                return Err(HintError::Unsupported {
                    reason: format!(
                        "{} does not support GPUDirect RDMA (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 0)",
                        profile.source.id
                    ),
                    fallback: "the staged backend (GPU → pinned host → NIC)".into(),
                });
            }
            if class == PathClass::Sys {
                return Err(HintError::Unsupported {
                    reason: format!(
                        "{} and {} sit on different NUMA nodes; GPUDirect RDMA across the inter-socket link is not a low-latency path (NCCL disables it beyond PXB, UCX caps it at 0.22 GB/s)",
                        profile.source.id, transport.id
                    ),
                    fallback: "a NIC on the GPU's NUMA node (see the path matrix) or the staged backend".into(),
                });
            }
            if matches!(class, PathClass::Phb | PathClass::Node) {
                candidates.push((
                    GPU_PHB_CAP_GBPS,
                    format!("{class} cap for GPUDirect through the root complex (UCX phb range 3.5–19 GB/s; NCCL stages beyond PXB)"),
                ));
            }
            if gpu.gpudirect_rdma.is_none() {
                reasons.push(Reason::new(
                    Factor::Route,
                    "unknown",
                    "GPUDirect RDMA support unknown (no CUDA driver facts); assumed available",
                ));
            }
        } else {
            fixed.push((
                COPY_ENGINE_LAUNCH_US,
                "copy-engine launch per block (GPU staged through pinned host memory)".into(),
            ));
        }
    }

    let (bandwidth, bound_by) =
        candidates.iter().min_by(|a, b| a.0.total_cmp(&b.0)).cloned().ok_or_else(|| {
            HintError::InvalidProfile { field: "wire_gbps", value: "none".into(), why: "a path needs a rate" }
        })?;
    let others: Vec<String> =
        candidates.iter().filter(|c| c.1 != bound_by).map(|c| format!("{} {}", rate(c.0), c.1)).collect();
    reasons.push(Reason::new(
        Factor::Bandwidth,
        rate(bandwidth),
        if others.is_empty() {
            format!("bound by {bound_by}")
        } else {
            format!("bound by {bound_by}; also on the path: {}", others.join(", "))
        },
    ));
    let mut total = 0.0;
    for (cost, why) in fixed {
        total += cost;
        reasons.push(Reason::new(Factor::FixedCost, format!("{cost:.2} µs"), why));
    }
    if total <= 0.0 {
        return Err(HintError::InvalidProfile {
            field: "per_op_overhead_us",
            value: "0".into(),
            why: "a path with no fixed cost has no sweet spot; give the backend's per-op overhead",
        });
    }
    Ok((bandwidth, total))
}

/// Alignment = lcm of every requirement on the path (all powers of two, so the largest).
fn alignment(profile: &PathProfile, reasons: &mut Vec<Reason>) -> u64 {
    let transport = &profile.transport;
    let mut parts: Vec<(u64, String)> = vec![(NCCL_SPLIT_ALIGN_BYTES, "NCCL's 128 B split alignment".into())];
    parts.push(match transport.max_payload_bytes {
        Some(mps) => (mps, "PCIe Max_Payload_Size of the NIC".into()),
        None => (DEFAULT_MAX_PAYLOAD_BYTES, "PCIe max payload UCX assumes when unknown".into()),
    });
    if let Some(mtu) = transport.mtu_bytes {
        parts.push((mtu, "path MTU: the first fragment is a full packet".into()));
    }
    if transport.kind == TransportKind::Staged {
        parts.push((4 * KIB, "page-aligned slots of the pinned bounce ring".into()));
    }
    if let Some(gpu) = profile.source.gpu() {
        parts.push((GPUDIRECT_PAGE_BYTES, "GPUDirect page (GPU memory is mapped in 64 KiB pages)".into()));
        if let Some(g) = gpu.vmm_granularity_bytes {
            reasons.push(Reason::new(
                Factor::Route,
                format!("{g} B"),
                "VMM granularity: size registered GPU regions in these units (not a block alignment)",
            ));
        }
    }
    let align = parts.iter().map(|p| p.0).max().unwrap_or(NCCL_SPLIT_ALIGN_BYTES);
    for (value, why) in parts {
        let mark = if value == align { " (binding)" } else { "" };
        reasons.push(Reason::new(Factor::Alignment, format!("{value} B{mark}"), why));
    }
    align
}

/// `target` rounded up to a multiple of `align_bytes`, or down where up would overflow or pass
/// `upper` (0 where no multiple fits).
fn round_to_alignment(target: u64, align_bytes: u64, upper: u64) -> u64 {
    target
        .div_ceil(align_bytes)
        .checked_mul(align_bytes)
        .filter(|block| *block <= upper)
        .unwrap_or(upper / align_bytes * align_bytes)
}

/// `block` bytes within the bounds every hint of `profile` keeps under `policy` (the policy's
/// smallest and largest block, the transport's largest message, the source's memory), rounded
/// to `align_bytes` as a computed hint is: up, or down where up would pass the largest. `None`
/// where no multiple of the alignment fits. For blocks chosen from measurements (a calibrated
/// curve's crossing, the median of pooled calibrations), which must not leave those bounds.
///
/// ```
/// use rdma_hint_core::model::bounded_block;
/// use rdma_hint_core::{HintPolicy, PathProfile};
/// let profile = PathProfile::example_host_nic();
/// let policy = HintPolicy::default();
/// assert_eq!(bounded_block(&profile, &policy, 1, 4096), Some(policy.min_block_bytes));
/// assert_eq!(bounded_block(&profile, &policy, u64::MAX, 4096), Some(policy.max_block_bytes));
/// assert_eq!(bounded_block(&profile, &policy, 20_000, 4096), Some(20_480));
/// ```
pub fn bounded_block(
    profile: &PathProfile,
    policy: &HintPolicy,
    block: u64,
    align_bytes: u64,
) -> Option<u64> {
    let (upper, _) = upper_bound(profile, policy);
    let target = block.clamp(policy.min_block_bytes.min(upper), upper);
    Some(round_to_alignment(target, align_bytes.max(1), upper)).filter(|block| *block > 0)
}

/// The largest block allowed and why.
fn upper_bound(profile: &PathProfile, policy: &HintPolicy) -> (u64, String) {
    let mut bounds = vec![
        (policy.max_block_bytes, format!("policy maximum block {} B", policy.max_block_bytes)),
        (
            profile.transport.max_msg_bytes,
            format!("transport max message {} B", profile.transport.max_msg_bytes),
        ),
    ];
    if let Some(memory) = profile.source.memory_bytes {
        bounds.push((memory, format!("{} memory {memory} B", profile.source.id)));
    }
    bounds.into_iter().min_by_key(|b| b.0).unwrap_or((policy.max_block_bytes, String::new()))
}

#[cfg(test)]
mod tests;
