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
//! Backends are cargo features: `staged` (default), `verbs`, `ucx`, `cuda`.

mod backends;
mod error;
pub mod measured;
mod probe;
mod profiles;

pub use backends::{Absence, BackendDetail};
pub use error::Error;
pub use probe::{probe, NoHint, ProbeOptions, ProbeReport, SourceEntry};
pub use profiles::{ASSUMED_MAX_MSG_BYTES, NIC_PER_OP_US, SOFT_ROCE_PER_OP_US};
pub use rdma_hint_chunker as chunker;
pub use rdma_hint_core as core;
pub use rdma_hint_core::{HintPolicy, Origin, PathClass, Reason, SizeHint, SourceId};

/// A memory source: a GPU by CUDA ordinal, or a host NUMA node.
pub type Device = SourceId;

use probe::Inventory;
use rdma_hint_core::{compute_hint, HintCache, HintKey, PathProfile, TransportKind};
use std::sync::{Arc, Mutex, PoisonError};

/// Which transport a hint is for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TransportSelector {
    /// The closest RDMA NIC with a hint (best path class, then highest predicted bandwidth);
    /// without one, the staged backend over TCP.
    #[default]
    Auto,
    /// A transport by id, as `rdma-hint probe` lists them (`verbs:mlx5_0`, `staged:shm`).
    Id(String),
}

static LIVE: Mutex<Option<Arc<Inventory>>> = Mutex::new(None);

fn live_inventory() -> Result<Arc<Inventory>, Error> {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(inventory) = live.as_ref() {
        return Ok(inventory.clone());
    }
    let inventory = Arc::new(Inventory::discover(&ProbeOptions::default())?);
    *live = Some(inventory.clone());
    Ok(inventory)
}

/// Forgets the discovered machine so the next call reads sysfs and the drivers again (after a
/// driver or firmware update, hot-plug). Cached hints whose versions changed are recomputed.
pub fn refresh() {
    *LIVE.lock().unwrap_or_else(PoisonError::into_inner) = None;
}

fn cached_hint(profile: &PathProfile) -> Result<SizeHint, Error> {
    let key = HintKey { source: profile.source.id, transport: profile.transport.id.clone() };
    Ok(HintCache::global().get_or_compute(&key, &profile.versions, || {
        let hint = compute_hint(profile, &HintPolicy::default())?;
        let measured = measured::cache_file().and_then(|file| {
            measured::lookup(&file, profile.source.id, &profile.transport.id, &profile.versions)
        });
        Ok(match measured {
            Some(measured) => measured::apply(hint, &measured),
            None => hint,
        })
    })?)
}

/// Records a measured knee for `device` over `transport` (as `rdma-hint sweep` does) in the
/// cache file, keyed by the versions the machine runs now, and drops the in-process cache so
/// the next hint uses it. Returns the file written.
pub fn record_measurement(
    device: Device,
    transport: &str,
    knee_bytes: u64,
    plateau_gbps: f64,
) -> Result<std::path::PathBuf, Error> {
    let inventory = live_inventory()?;
    let profile = inventory
        .candidates
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .find(|p| p.source.id == device && p.transport.id == transport)
        .ok_or_else(|| Error::UnknownTransport {
            transport: transport.to_string(),
            available: transport_ids(&inventory).join(", "),
        })?;
    let file = measured::cache_file().ok_or_else(|| Error::NoPath {
        device,
        transport: transport.to_string(),
        why: "no cache directory: set RDMA_HINT_CACHE_DIR, XDG_CACHE_HOME or HOME".into(),
    })?;
    let entry = measured::MeasuredHint {
        source: device,
        transport: transport.to_string(),
        versions: profile.versions.clone(),
        knee_bytes,
        plateau_gbps,
        measured_at_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    measured::store(&file, entry).map_err(|e| Error::NoPath {
        device,
        transport: transport.to_string(),
        why: format!("writing {}: {e}", file.display()),
    })?;
    HintCache::global().clear();
    Ok(file)
}

/// The block size and alignment to use for transfers from `device` over the best transport.
///
/// Discovery runs once per process; hints are cached per (device, transport, driver/firmware
/// versions). Never returns a zero block: a device without a low-latency route is an error
/// that names the fallback.
pub fn get_low_latency_rdma_size_hint(device: Device) -> Result<SizeHint, Error> {
    get_low_latency_rdma_size_hint_with(device, &TransportSelector::Auto)
}

/// [`get_low_latency_rdma_size_hint`] for a chosen transport.
///
/// ```
/// use rdma_hint::{get_low_latency_rdma_size_hint_with, Device, Error, TransportSelector};
/// let unknown = TransportSelector::Id("verbs:nonexistent".into());
/// assert!(matches!(
///     get_low_latency_rdma_size_hint_with(Device::Host(0), &unknown),
///     Err(Error::UnknownTransport { .. })
/// ));
/// ```
pub fn get_low_latency_rdma_size_hint_with(
    device: Device,
    selector: &TransportSelector,
) -> Result<SizeHint, Error> {
    hint_from(&*live_inventory()?, device, selector)
}

fn hint_from(inventory: &Inventory, device: Device, selector: &TransportSelector) -> Result<SizeHint, Error> {
    if !inventory.sources.iter().any(|s| s.facts.id == device) {
        return Err(Error::UnknownDevice {
            device,
            available: inventory
                .sources
                .iter()
                .map(|s| s.facts.id.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let for_device = inventory.candidates.iter().filter(|c| match c {
        Ok(profile) => profile.source.id == device,
        Err((source, _, _)) => *source == device,
    });
    match selector {
        TransportSelector::Id(id) => {
            let candidate = for_device
                .clone()
                .find(|c| match c {
                    Ok(profile) => &profile.transport.id == id,
                    Err((_, transport, _)) => transport == id,
                })
                .ok_or_else(|| Error::UnknownTransport {
                    transport: id.clone(),
                    available: transport_ids(inventory).join(", "),
                })?;
            match candidate {
                Ok(profile) => cached_hint(profile),
                Err((_, transport, why)) => {
                    Err(Error::NoPath { device, transport: transport.clone(), why: why.clone() })
                }
            }
        }
        TransportSelector::Auto => {
            let best_nic = for_device
                .clone()
                .filter_map(|c| c.as_ref().ok())
                .filter(|p| matches!(p.transport.kind, TransportKind::Verbs | TransportKind::Ucx))
                .filter_map(|p| cached_hint(p).ok())
                .min_by(|a, b| {
                    a.path_class.cmp(&b.path_class).then(b.predicted_gbps.total_cmp(&a.predicted_gbps))
                });
            if let Some(hint) = best_nic {
                return Ok(hint);
            }
            hint_from(inventory, device, &TransportSelector::Id("staged:tcp".into()))
        }
    }
}

fn transport_ids(inventory: &Inventory) -> Vec<String> {
    let mut ids: Vec<String> = inventory
        .candidates
        .iter()
        .map(|c| match c {
            Ok(profile) => profile.transport.id.clone(),
            Err((_, transport, _)) => transport.clone(),
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
        let inventory = Inventory::discover(&ProbeOptions::for_tree(std::env::temp_dir())).unwrap();
        match hint_from(&inventory, Device::Gpu(99), &TransportSelector::Auto) {
            Err(Error::UnknownDevice { available, .. }) => assert!(available.contains("host:0")),
            other => panic!("expected UnknownDevice, got {other:?}"),
        }
    }

    #[cfg(feature = "staged")]
    #[test]
    fn auto_without_nic_falls_back_to_staged_tcp() {
        let inventory = Inventory::discover(&ProbeOptions::for_tree(std::env::temp_dir())).unwrap();
        let hint = hint_from(&inventory, Device::Host(0), &TransportSelector::Auto).unwrap();
        assert_eq!(hint.transport, "staged:tcp");
        assert!(hint.block_bytes > 0 && hint.block_bytes % hint.align_bytes == 0);
    }
}
