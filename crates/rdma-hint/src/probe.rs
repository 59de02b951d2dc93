//! The probe: every source, NIC, path class and hint of one machine (or sysfs tree).

use crate::backends::{self, Absence, BackendDetail};
use crate::error::Error;
use crate::profiles::{self, Candidate, Source};
use rdma_hint_core::pcie::PcieLink;
use rdma_hint_core::TransportId;
use rdma_hint_core::{GpuFacts, HintError, HintPolicy, SizeHint, SourceId, TransportFacts};
use rdma_hint_discovery::topology::{Nic, NicKind, PathEntry};
use rdma_hint_discovery::Topology;
use serde::Serialize;
use std::path::PathBuf;

/// What to probe and how.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Root of the sysfs tree (`/sys` on a live system, a fixture tree in tests).
    pub sysfs_root: PathBuf,
    /// Ask the CUDA driver for GPU facts (only meaningful for the live `/sys`).
    pub live_gpus: bool,
    /// Policy of the hint model.
    pub policy: HintPolicy,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions { sysfs_root: PathBuf::from("/sys"), live_gpus: true, policy: HintPolicy::default() }
    }
}

impl ProbeOptions {
    /// Options for a fixture tree: no live GPU facts.
    pub fn for_tree(root: impl Into<PathBuf>) -> ProbeOptions {
        ProbeOptions { sysfs_root: root.into(), live_gpus: false, policy: HintPolicy::default() }
    }
}

/// One memory source as the report lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceEntry {
    /// `host:N` or `gpu:N`.
    pub id: SourceId,
    /// `host` or `gpu`.
    pub kind: &'static str,
    /// PCI address (GPUs).
    pub pci: Option<String>,
    /// NUMA node.
    pub numa: Option<u32>,
    /// Memory in bytes.
    pub memory_bytes: Option<u64>,
    /// PCIe link (GPUs).
    pub pcie: Option<PcieLink>,
    /// CUDA driver facts (GPUs with feature `cuda` on a machine with the driver).
    pub gpu: Option<GpuFacts>,
}

/// A pair that has no hint, and what to do instead.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NoHint {
    /// Source.
    pub source: SourceId,
    /// Transport id.
    pub transport: TransportId,
    /// Why.
    pub reason: String,
    /// What to use instead.
    pub fallback: Option<String>,
}

/// Everything `rdma-hint probe` prints.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// Root of the sysfs tree read.
    pub sysfs_root: String,
    /// Where GPU facts came from (`cuda driver 13.0`, or why only sysfs).
    pub gpu_facts: String,
    /// Memory sources.
    pub sources: Vec<SourceEntry>,
    /// NICs (RDMA devices and PCI-backed interfaces).
    pub nics: Vec<Nic>,
    /// Transports hints were computed for.
    pub transports: Vec<TransportFacts>,
    /// Path class of every (source, NIC) pair.
    pub paths: Vec<PathEntry>,
    /// One hint per (source, transport) pair that has one.
    pub hints: Vec<SizeHint>,
    /// Pairs without a hint, with the reason and fallback.
    pub no_hint: Vec<NoHint>,
    /// What backends report about how they move data here (UCX's estimate and lanes).
    pub details: Vec<BackendDetail>,
    /// Backends that contribute nothing here, and why.
    pub absent: Vec<Absence>,
    /// Skipped or assumed facts.
    pub warnings: Vec<String>,
    /// Per source, the hint `get_low_latency_rdma_size_hint` answers (`TransportSelector::Auto`).
    pub defaults: Vec<SizeHint>,
}

/// Discovered facts, before any hint is computed.
#[derive(Debug, Clone)]
pub(crate) struct Inventory {
    pub(crate) topology: Topology,
    pub(crate) sources: Vec<Source>,
    pub(crate) candidates: Vec<Candidate>,
    pub(crate) gpu_facts: String,
    pub(crate) absent: Vec<Absence>,
    pub(crate) details: Vec<BackendDetail>,
    pub(crate) warnings: Vec<String>,
    pub(crate) sysfs_root: String,
}

impl Inventory {
    pub(crate) fn discover(options: &ProbeOptions) -> Result<Inventory, Error> {
        let topology = Topology::discover(&options.sysfs_root)?;
        let mut warnings = topology.warnings.clone();
        let (cuda, gpu_facts) = if options.live_gpus {
            match backends::cuda_gpus() {
                Ok(gpus) => {
                    let driver = gpus
                        .first()
                        .and_then(|(_, f)| f.driver_version.clone())
                        .unwrap_or_else(|| "(no GPU)".into());
                    let summary = format!("CUDA driver {driver}: {} GPU(s)", gpus.len());
                    (Some(gpus), summary)
                }
                Err(why) => (None, why),
            }
        } else {
            (None, "sysfs tree only (live CUDA facts not used for this tree)".to_string())
        };
        let sources = profiles::sources(&topology, cuda.as_deref(), &mut warnings);
        let (software, mut absent) = backends::software_transports(options.live_gpus);
        let verbs = backends::verbs_devices(options.live_gpus);
        let queried = verbs.as_deref().unwrap_or_default();
        let candidates = profiles::candidates(&topology, &sources, &software, queried);
        let sysfs_root = options.sysfs_root.display().to_string();
        let rdma_devices = topology.nics.iter().filter(|n| n.kind == NicKind::Rdma).count();
        absent.extend(backends::absences(rdma_devices, &sysfs_root, options.live_gpus, &verbs));
        let mut details: Vec<BackendDetail> = software
            .iter()
            .filter_map(|t| {
                t.detail.clone().map(|detail| BackendDetail { transport: t.facts.id.clone(), detail })
            })
            .collect();
        details.extend(
            queried.iter().map(|d| BackendDetail { transport: d.facts.id.clone(), detail: d.detail.clone() }),
        );
        Ok(Inventory { absent, details, topology, sources, candidates, gpu_facts, warnings, sysfs_root })
    }

    pub(crate) fn report(&self, policy: &HintPolicy, measured: Option<&std::path::Path>) -> ProbeReport {
        let mut hints = Vec::new();
        let mut no_hint = Vec::new();
        let mut transports: Vec<TransportFacts> = Vec::new();
        for candidate in &self.candidates {
            match candidate {
                Ok(profile) => {
                    if !transports.iter().any(|t| t.id == profile.transport.id) {
                        transports.push(profile.transport.clone());
                    }
                    match crate::measured::hint(profile, policy, measured) {
                        Ok(hint) => hints.push(hint),
                        Err(err) => no_hint.push(NoHint {
                            source: profile.source.id,
                            transport: profile.transport.id.clone(),
                            fallback: match &err {
                                HintError::Unsupported { fallback, .. } => Some(fallback.clone()),
                                _ => None,
                            },
                            reason: match err {
                                HintError::Unsupported { reason, .. } => reason,
                                other => other.to_string(),
                            },
                        }),
                    }
                }
                Err((source, transport, why)) => no_hint.push(NoHint {
                    source: *source,
                    transport: transport.clone(),
                    reason: why.clone(),
                    fallback: Some("the staged backend".into()),
                }),
            }
        }
        let defaults = self
            .sources
            .iter()
            .filter_map(|source| {
                let of_source: Vec<SizeHint> =
                    hints.iter().filter(|h| h.source == source.facts.id).cloned().collect();
                crate::auto_choice(&of_source).cloned()
            })
            .collect();
        ProbeReport {
            defaults,
            sysfs_root: self.sysfs_root.clone(),
            gpu_facts: self.gpu_facts.clone(),
            sources: self
                .sources
                .iter()
                .map(|s| SourceEntry {
                    id: s.facts.id,
                    kind: if s.facts.gpu().is_some() { "gpu" } else { "host" },
                    pci: s.facts.gpu().and_then(|g| g.pci.clone()),
                    numa: s.facts.numa_node,
                    memory_bytes: s.facts.memory_bytes,
                    pcie: s.facts.pcie,
                    gpu: s.facts.gpu().cloned(),
                })
                .collect(),
            nics: self.topology.nics.clone(),
            transports,
            paths: self.paths(),
            hints,
            no_hint,
            details: self.details.clone(),
            absent: self.absent.clone(),
            warnings: self.warnings.clone(),
        }
    }

    /// The path matrix in the report's numbering (CUDA ordinals when CUDA facts are in use).
    fn paths(&self) -> Vec<PathEntry> {
        let mut paths = Vec::new();
        for source in &self.sources {
            let sysfs_id = match source.facts.id {
                SourceId::Host(_) => source.facts.id,
                SourceId::Gpu(_) => match source.sysfs_gpu {
                    Some(index) => SourceId::Gpu(index),
                    None => continue,
                },
            };
            for nic in &self.topology.nics {
                if let Some((class, bridges)) = self.topology.path(sysfs_id, nic) {
                    paths.push(PathEntry { source: source.facts.id, nic: nic.name.clone(), class, bridges });
                }
            }
        }
        paths
    }
}

/// Probes a machine (or a sysfs tree) and computes every hint.
///
/// ```
/// use rdma_hint::probe;
/// use rdma_hint::probing::ProbeOptions;
/// // A tree with nothing in it still yields host hints over the staged backend.
/// let empty = std::env::temp_dir();
/// let report = probe(&ProbeOptions::for_tree(&empty)).unwrap();
/// assert!(report.hints.iter().all(|h| h.block_bytes > 0 && h.block_bytes % h.align_bytes == 0));
/// ```
///
/// On the live machine (`live_gpus`), hints measured by `rdma-hint sweep` under the current
/// driver and firmware versions replace the model's (`origin: measured`).
pub fn probe(options: &ProbeOptions) -> Result<ProbeReport, Error> {
    let measured = if options.live_gpus { crate::measured::cache_file() } else { None };
    Ok(Inventory::discover(options)?.report(&options.policy, measured.as_deref()))
}
