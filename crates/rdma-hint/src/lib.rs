//! # rdma-hint
//!
//! Run-time answer to "which block size should I hand this transport for this memory?", and the
//! machinery to move data in exactly those blocks.
//!
//! ```
//! use rdma_hint::{get_low_latency_rdma_size_hint, Device};
//!
//! // Host memory of NUMA node 0. On a machine without an RDMA NIC this is the staged backend's
//! // hint; with one, the closest NIC's.
//! match get_low_latency_rdma_size_hint(Device::Host(0)) {
//!     Ok(hint) => {
//!         assert!(hint.block_bytes > 0 && hint.block_bytes % hint.align_bytes == 0);
//!         println!("{} B blocks, {} B aligned, {:.1} GB/s predicted", hint.block_bytes,
//!                  hint.align_bytes, hint.predicted_gbps);
//!     }
//!     Err(err) => println!("no hint: {err}"),
//! }
//! ```
//!
//! Backends are cargo features: `staged` (default), `verbs`, `ucx`, `cuda`. [`open`] opens any
//! compiled-in one by the id `rdma-hint probe` prints; the [`engine`] moves data over it in
//! the hint's blocks. The async methods never block their thread and need no particular
//! runtime; blocking callers use [`BlockingTransport`] and [`Chunker::transfer_blocking`](engine::Chunker::transfer_blocking).
//!
//! ```
//! use rdma_hint::engine::{Chunker, PostPolicy, TransferRequest};
//! use rdma_hint::{open, Arrival, BlockingTransport, MemoryKind, OpenOptions, PeerEndpoint, Transport, TransportId};
//! use std::time::{Duration, Instant};
//!
//! let id = TransportId::STAGED_TCP; // or "ucx:shm".parse()? with the `ucx` feature
//! let hint = rdma_hint::get_low_latency_rdma_size_hint_with(
//!     rdma_hint::Device::Host(0), &rdma_hint::TransportSelector::Id(id.clone()))?;
//! let (sender, receiver) = (open(&id, &OpenOptions::default())?, open(&id, &OpenOptions::default())?);
//! let len = 1 << 20;
//! let source = sender.register(MemoryKind::Host, len)?;
//! let target = receiver.register(MemoryKind::Host, len)?;
//! sender.write_region(source.id, 0, &vec![7u8; len as usize])?;
//! let address = receiver.bind("127.0.0.1:0".parse().unwrap())?;
//! let deadline = Instant::now() + Duration::from_secs(30);
//! let accepting = std::thread::spawn(move || {
//!     receiver.connect_blocking(PeerEndpoint::Listen(address), &[target.id], deadline)?;
//!     let mut arrivals = [Arrival::EMPTY; 4];
//!     receiver.wait_arrivals_blocking(&mut arrivals, deadline)?;
//!     let mut landed = vec![0u8; len as usize];
//!     receiver.read_region(target.id, 0, &mut landed)?;
//!     Ok::<_, rdma_hint::TransportError>((arrivals[0].imm, landed))
//! });
//! let remote = sender.connect_blocking(PeerEndpoint::Dial(address), &[], deadline)?[0];
//! let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities())?;
//! chunker.set_size_hint(&hint)?;
//! chunker.transfer_blocking(&*sender, TransferRequest::single(&source, 0, &remote, 0, len).notify(9), deadline)?;
//! let (imm, landed) = accepting.join().unwrap()?;
//! assert_eq!(imm, 9);
//! assert!(landed.iter().all(|b| *b == 7));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

/// Every Rust snippet of the README, compiled and run as a doctest.
#[cfg(all(doctest, feature = "staged"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// Every Rust snippet of docs/chunker.md, compiled and run as a doctest.
#[cfg(all(doctest, feature = "staged"))]
#[doc = include_str!("../../../docs/chunker.md")]
pub struct ChunkerDocDoctests;

/// Every Rust snippet of docs/engine.md, compiled and run as a doctest.
#[cfg(all(doctest, feature = "staged"))]
#[doc = include_str!("../../../docs/engine.md")]
pub struct EngineDocDoctests;

mod backends;
mod cache;
mod cache_files;
mod calibrate;
mod discovered;
mod error;
mod estimate;
mod loopback;
mod margins;
mod measured;
#[cfg(feature = "metrics")]
mod metrics;
mod open;
mod probe;
mod profiles;
mod records;

// The root: hints, opening a transport, the contract's everyday types, the two errors. Every
// public item has one path: the rest is in the modules below, each listing what it holds.
pub use calibrate::calibrate;
pub use error::Error;
pub use estimate::estimate;
pub use open::{open, open_lanes, OpenOptions};
pub use probe::probe;
pub use rdma_hint_backend_core::blocking::block_on;
pub use rdma_hint_backend_core::BlockingTransport;
/// A memory source: a GPU by CUDA ordinal, or a host NUMA node.
pub use rdma_hint_core::SourceId as Device;
pub use rdma_hint_core::{
    Arrival, CallerMemory, Completion, ErrorKind, LocalRegion, MemoryKind, PeerEndpoint, ReadOp, RegionId,
    RemoteRegion, SizeHint, Transport, TransportError, TransportId, WriteOp,
};

/// The rest of the transport contract: completions, gathers, capabilities, wait modes,
/// memory the caller lends, and the out-of-band listener a server shares across transports.
pub mod transport {
    pub use rdma_hint_backend_core::{MAX_REGIONS, MAX_REGION_BYTES};
    pub use rdma_hint_core::{
        CallerMemoryPath, Capabilities, CompletionStatus, CopiedBytes, Domain, ForeignMemory, GatherEntry,
        GatherOp, StagedChannelId, TransportFacts, TransportKind, WaitMode, MAX_OPS_PER_POST,
    };
    pub use rdma_hint_oob::Listener;
}

/// Moving data in the hint's blocks: the [`Engine`](engine::Engine) (many transfers, many peers,
/// lanes, its own thread) and the [`Chunker`](engine::Chunker) (its scheduler over one transport,
/// driven by the caller), one request, one result and one error for both.
pub mod engine {
    pub use rdma_hint_engine::{
        Block, BlockSpec, Blocks, ChunkPlan, Chunker, Class, Delivered, Engine, EngineConfig, LaneStats,
        LoopbackTransport, PeerId, PlanError, PostPolicy, RequestError, Segment, TransferError, TransferId,
        TransferRequest, TransferStatus, MAX_LANES, MAX_PEERS, MAX_SEGMENTS, MAX_TRANSFERS,
    };

    /// What the engine does, as typed events for subscribers ([`Engine::subscribe`]): a
    /// trait whose methods do nothing unless overridden, a `tracing` subscriber, and (feature
    /// `metrics`) Prometheus metrics served on loopback.
    pub mod events {
        #[cfg(feature = "metrics")]
        pub use crate::metrics::{MetricsEndpoint, MetricsSubscriber};
        pub use rdma_hint_engine::events::{
            ArrivalsTaken, BlockTiming, BlocksCompleted, DoorbellRung, LaneLost, Subscriber,
            TracingSubscriber, TransferEnded,
        };
    }
}

/// Measuring the path instead of modelling it: calibration (a loopback or a peer), recorded
/// knees, the cache of hints, the bounds of an estimate.
pub mod calibration {
    pub use crate::calibrate::{
        calibrate_loopback, recalibrate_loopback, Calibration, CalibrationPoint, Flatness, LadderTiming,
        Margins, DEFAULT_BUDGET, LADDER_TOP_BYTES, LOOPBACK_REGION_BYTES, MAX_BUDGET, MAX_HINT_SPREAD,
        MAX_ROUNDS, MIN_ROUNDS, PREDICTION_TAIL, RESAMPLES,
    };
    pub use crate::estimate::Estimate;
    pub use crate::loopback::{LoopbackLanes, LoopbackPair};
    pub use crate::measured::POOLED_CALIBRATIONS;
    pub use crate::measured::{ladder_alignment, HintSet};
    pub use crate::records::{forget_calibrations, hint_set, record_measurement};
}

/// The path model: what a hint is computed from, why it says what it says, the fits.
pub mod model {
    pub use crate::profiles::{
        ASSUMED_MAX_MSG_BYTES, NIC_PER_OP_US, SOFT_ROCE_PER_OP_US, STAGED_SHM_GPU_PER_BLOCK_US,
    };
    pub use rdma_hint_core::fit::{median, robust_knee, robust_plateau};
    use rdma_hint_core::SizeHint;
    pub use rdma_hint_core::{
        DriverVersions, GpuFacts, HintError, HintPolicy, Origin, PathClass, PathProfile, PcieLink, Reason,
        SourceFacts, SourceKind,
    };

    /// The model's hint for `profile` under `policy`, or [`Error::Hint`](crate::Error::Hint)
    /// (a policy or profile out of range, or a path with no low-latency route).
    ///
    /// ```
    /// use rdma_hint::model::{compute_hint, HintPolicy, PathProfile};
    /// let hint = compute_hint(&PathProfile::example_gpu_nic(), &HintPolicy::default())?;
    /// assert!(hint.block_bytes > 0 && hint.block_bytes % hint.align_bytes == 0);
    /// let bad = HintPolicy { target_efficiency: 1.5, ..HintPolicy::default() };
    /// assert!(compute_hint(&PathProfile::example_gpu_nic(), &bad).is_err());
    /// # Ok::<(), rdma_hint::Error>(())
    /// ```
    pub fn compute_hint(profile: &PathProfile, policy: &HintPolicy) -> Result<SizeHint, crate::Error> {
        Ok(rdma_hint_core::compute_hint(profile, policy)?)
    }
}

/// What `probe` finds on this machine, and forgetting it after a driver update.
pub mod probing {
    pub use crate::backends::{Absence, BackendDetail};
    pub use crate::discovered::refresh;
    pub use crate::probe::{NoHint, ProbeOptions, ProbeReport, SourceEntry};
    pub use rdma_hint_discovery::topology::NicKind;
}

/// DeepEP-compatible buffer sizing (`get_low_latency_rdma_size_hint` in DeepEP's sense).
pub mod deepep {
    pub use rdma_hint_core::deepep::{DeepEpError, DeepEpSize};

    /// The RDMA buffer DeepEP's low-latency mode allocates for these sizes (its
    /// `get_low_latency_rdma_size_hint`), or [`Error::DeepEp`](crate::Error::DeepEp) for
    /// sizes DeepEP refuses.
    ///
    /// ```
    /// let size = rdma_hint::deepep::low_latency_rdma_size_hint(128, 7168, 16, 256)?;
    /// assert!(size.bytes > 0);
    /// assert!(rdma_hint::deepep::low_latency_rdma_size_hint(0, 7168, 16, 256).is_err());
    /// # Ok::<(), rdma_hint::Error>(())
    /// ```
    pub fn low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank: u64,
        hidden: u64,
        num_ranks: u64,
        num_experts: u64,
    ) -> Result<DeepEpSize, crate::Error> {
        Ok(rdma_hint_core::deepep::low_latency_rdma_size_hint(
            num_max_dispatch_tokens_per_rank,
            hidden,
            num_ranks,
            num_experts,
        )?)
    }

    /// The most dispatch tokens per rank whose buffer fits `budget_bytes`, or
    /// [`Error::DeepEp`](crate::Error::DeepEp).
    pub fn max_tokens_for_budget(
        budget_bytes: u64,
        hidden: u64,
        num_ranks: u64,
        num_experts: u64,
    ) -> Result<u64, crate::Error> {
        Ok(rdma_hint_core::deepep::max_tokens_for_budget(budget_bytes, hidden, num_ranks, num_experts)?)
    }
}

/// The staged backend's own API: its transport, and GPU memory (the cudarc the GPU paths use,
/// a `CudaSlice<u8>` as [`CallerMemory`], the in-process GPU staging pipeline).
#[cfg(feature = "staged")]
pub mod staged {
    #[cfg(feature = "cuda")]
    pub use rdma_hint_staged::cudarc;
    #[cfg(feature = "cuda")]
    pub use rdma_hint_staged::gpu::{cuda_slice_memory, CopyDirection, DeviceBuffer, Gpu, StagingPipeline};
    pub use rdma_hint_staged::{StagedChannel, StagedTransport};
}

/// The UCX backend's own API: its transport, UCX's own estimate, its log.
#[cfg(feature = "ucx")]
pub mod ucx {
    pub use rdma_hint_ucx::{route_log_to_stderr, version, Estimate as UcxEstimate, UcxTransport};
}

/// The verbs backend's own API: its transport, the devices as `ibv_query_device` reports them.
#[cfg(feature = "verbs")]
pub mod verbs {
    pub use rdma_hint_verbs::{devices, library_loaded, DeviceFacts, VerbsTransport};
}

use cache::{HintCache, HintKey};
use open::StagedChannelId;
use probe::Inventory;
use rdma_hint_core::{HintPolicy, Origin, PathProfile};
use std::sync::Arc;

/// Which transport a hint is for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TransportSelector {
    /// The first tier that has a hint for the device:
    /// 1. a verbs RDMA NIC: the closest (best path class, then highest predicted bandwidth);
    /// 2. a software transport, in the order `ucx:shm`, `ucx:tcp` (with the `ucx` feature),
    ///    `staged:shm`, `staged:tcp` — one with a hint measured by `rdma-hint sweep` under the
    ///    current versions before any that is only modelled.
    #[default]
    Auto,
    /// A transport by id, as `rdma-hint probe` lists them (`verbs:mlx5_0`, `staged:shm`).
    Id(TransportId),
}

/// Where a software transport stands in the order [`TransportSelector::Auto`] considers them
/// (`ucx:shm`, `ucx:tcp`, `staged:shm`, `staged:tcp`); `None` for any other.
fn software_rank(id: &TransportId) -> Option<u8> {
    match id {
        TransportId::Ucx(scope) if scope == "shm" => Some(0),
        TransportId::Ucx(scope) if scope == "tcp" => Some(1),
        TransportId::Staged(StagedChannelId::Shm) => Some(2),
        TransportId::Staged(StagedChannelId::Tcp) => Some(3),
        _ => None,
    }
}

fn live_inventory() -> Result<Arc<Inventory>, Error> {
    discovered::inventory_blocking()
}

fn cached_hint(profile: &PathProfile) -> Result<SizeHint, Error> {
    let key = HintKey { source: profile.source.id, transport: profile.transport.id.clone() };
    let file = measured::cache_file();
    Ok(HintCache::global().get_or_compute(&key, &profile.versions, || {
        measured::hint(profile, &HintPolicy::default(), file.as_deref())
    })?)
}

/// The path profile of `device` over the transport with id `transport`, as discovery found it
/// (UCX scopes the probe did not list are asked about now).
pub(crate) fn profile_of(device: Device, transport: &TransportId) -> Result<PathProfile, Error> {
    profile_in(&*live_inventory()?, device, transport)
}

/// The memory source `device`, or an error naming those that exist.
fn source_in(inventory: &Inventory, device: Device) -> Result<&profiles::Source, Error> {
    inventory.sources.iter().find(|s| s.facts.id == device).ok_or_else(|| Error::UnknownDevice {
        device,
        available: inventory.sources.iter().map(|s| s.facts.id.to_string()).collect::<Vec<_>>().join(", "),
    })
}

fn profile_in(inventory: &Inventory, device: Device, transport: &TransportId) -> Result<PathProfile, Error> {
    open::compiled_in(transport)?;
    let unknown = || Error::UnknownTransport {
        transport: transport.clone(),
        available: transport_ids(inventory).join(", "),
    };
    if let Some(candidate) = inventory.candidates.iter().find(|c| match c {
        Ok(p) => p.source.id == device && p.transport.id == *transport,
        Err((source, id, _)) => *source == device && id == transport,
    }) {
        return match candidate {
            Ok(profile) => Ok(profile.clone()),
            Err((_, transport, why)) => {
                Err(Error::NoPath { device, transport: transport.clone(), why: why.clone() })
            }
        };
    }
    let source = source_in(inventory, device)?;
    match transport {
        TransportId::Ucx(_) => {
            let tls = transport.ucx_tls().unwrap_or_default();
            let ucx = backends::ucx_transport(&tls).map_err(|why| Error::NoPath {
                device,
                transport: transport.clone(),
                why,
            })?;
            Ok(profiles::software_profile(source.facts.clone(), &ucx))
        }
        _ => Err(unknown()),
    }
}

/// The block size and alignment to use for transfers from `device` over the best transport.
///
/// Discovery runs once per process; hints are cached per (device, transport, driver/firmware
/// versions). Never returns a zero block: a device without a low-latency route is an error
/// that names the fallback.
///
/// The first call of a process blocks its thread while discovery runs: about 30 ms on a host
/// without a GPU driver, about 0.2 s where the CUDA driver initialises (0.21–0.22 s on an H200
/// host: `benches/results/h200-first-hint.txt`). In async
/// code ask [`hint`] instead, which discovers on a thread of its own; later calls of either
/// take microseconds.
pub fn get_low_latency_rdma_size_hint(device: Device) -> Result<SizeHint, Error> {
    get_low_latency_rdma_size_hint_with(device, &TransportSelector::Auto)
}

/// [`get_low_latency_rdma_size_hint_with`] for async callers: the first call of a process
/// runs discovery on a thread of its own and wakes the awaiting task when it ends (every task
/// asking meanwhile waits for the same discovery), so no executor thread blocks on it. Needs
/// no particular runtime.
///
/// ```
/// use rdma_hint::{block_on, hint, Device, TransportSelector};
/// // Any executor: tokio, smol, or the library's own `block_on`.
/// match block_on(hint(Device::Host(0), &TransportSelector::Auto)) {
///     Ok(hint) => assert!(hint.block_bytes > 0 && hint.block_bytes % hint.align_bytes == 0),
///     Err(err) => println!("no hint: {err}"),
/// }
/// ```
pub async fn hint(device: Device, selector: &TransportSelector) -> Result<SizeHint, Error> {
    let inventory = discovered::inventory().await?;
    hint_from(&inventory, device, selector)
}

/// [`get_low_latency_rdma_size_hint`] for a chosen transport (the first call blocks for
/// discovery, as that one's does).
///
/// ```
/// use rdma_hint::{get_low_latency_rdma_size_hint_with, Device, Error, TransportSelector};
/// let unknown = TransportSelector::Id("verbs:nonexistent".parse()?);
/// // No such device; without the `verbs` feature, no verbs backend at all.
/// assert!(matches!(
///     get_low_latency_rdma_size_hint_with(Device::Host(0), &unknown),
///     Err(Error::UnknownTransport { .. } | Error::FeatureMissing { .. })
/// ));
/// # Ok::<(), Error>(())
/// ```
pub fn get_low_latency_rdma_size_hint_with(
    device: Device,
    selector: &TransportSelector,
) -> Result<SizeHint, Error> {
    hint_from(&*live_inventory()?, device, selector)
}

fn hint_from(inventory: &Inventory, device: Device, selector: &TransportSelector) -> Result<SizeHint, Error> {
    source_in(inventory, device)?;
    let for_device = inventory.candidates.iter().filter(|c| match c {
        Ok(profile) => profile.source.id == device,
        Err((source, _, _)) => *source == device,
    });
    match selector {
        TransportSelector::Id(id) => cached_hint(&profile_in(inventory, device, id)?),
        TransportSelector::Auto => {
            let hints: Vec<SizeHint> =
                for_device.filter_map(|c| c.as_ref().ok()).filter_map(|p| cached_hint(p).ok()).collect();
            auto_choice(&hints).cloned().ok_or_else(|| Error::NoTransport {
                device,
                why: format!(
                    "no RDMA NIC and no software transport has a hint for it (available: {}){}",
                    transport_ids(inventory).join(", "),
                    if cfg!(feature = "staged") { "" } else { "; enable the `staged` feature" }
                ),
            })
        }
    }
}

/// What [`TransportSelector::Auto`] picks among one device's hints (see its order).
pub(crate) fn auto_choice(hints: &[SizeHint]) -> Option<&SizeHint> {
    let best_nic = hints
        .iter()
        .filter(|h| matches!(h.transport, TransportId::Verbs(_)))
        .min_by(|a, b| a.path_class.cmp(&b.path_class).then(b.predicted_gbps.total_cmp(&a.predicted_gbps)));
    if best_nic.is_some() {
        return best_nic;
    }
    let mut software: Vec<&SizeHint> =
        hints.iter().filter(|h| software_rank(&h.transport).is_some()).collect();
    software.sort_by_key(|h| software_rank(&h.transport));
    software.iter().find(|h| h.origin != Origin::Model).or(software.first()).copied()
}

fn transport_ids(inventory: &Inventory) -> Vec<String> {
    let mut ids: Vec<String> = inventory
        .candidates
        .iter()
        .map(|c| match c {
            Ok(profile) => profile.transport.id.to_string(),
            Err((_, transport, _)) => transport.to_string(),
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_device_names_what_exists() {
        let inventory = Inventory::discover(&probing::ProbeOptions::for_tree(std::env::temp_dir())).unwrap();
        match hint_from(&inventory, Device::Gpu(99), &TransportSelector::Auto) {
            Err(Error::UnknownDevice { available, .. }) => assert!(available.contains("host:0")),
            other => panic!("expected UnknownDevice, got {other:?}"),
        }
    }

    #[cfg(feature = "staged")]
    #[test]
    fn auto_without_nic_takes_the_first_software_transport_measured_first() {
        let inventory = Inventory::discover(&probing::ProbeOptions::for_tree(std::env::temp_dir())).unwrap();
        let hint = hint_from(&inventory, Device::Host(0), &TransportSelector::Auto).unwrap();
        // A fixture tree has no UCX; staged:shm comes first unless this machine measured one.
        assert!(
            hint.transport == TransportId::STAGED_SHM || hint.origin == Origin::Measured,
            "{}",
            hint.transport
        );
        assert!(hint.block_bytes > 0 && hint.block_bytes.is_multiple_of(hint.align_bytes));
    }
}
