//! Turning discovered facts into `PathProfile`s: sources, NIC transports, and their pairs.

use crate::backends;
use rdma_hint_core::{
    DriverVersions, GpuFacts, PathClass, PathProfile, SourceFacts, SourceId, SourceKind, TransportFacts,
    TransportId, TransportKind, GIB,
};
use rdma_hint_discovery::topology::{Nic, NicKind};
use rdma_hint_discovery::Topology;

/// Per-message cost of an RDMA WRITE on a hardware NIC when the verbs backend has not measured
/// it: doorbell MMIO ≈ 0.1 µs, WQE fetch + processing ≈ 0.15 µs, CQE share with selective
/// signalling ≈ 0.1 µs.
pub const NIC_PER_OP_US: f64 = 0.35;
/// Per-message cost of Soft-RoCE (rxe): the kernel builds every packet (≈ 5 µs a block).
pub const SOFT_ROCE_PER_OP_US: f64 = 5.0;
/// `max_msg_sz` assumed for sysfs-only NIC facts (mlx5 and rxe both report at least 1 GiB).
pub const ASSUMED_MAX_MSG_BYTES: u64 = GIB;

/// Per-block cost of a GPU source over staged shm, without the copy-engine launch the model
/// adds for every staged GPU block: the queued `cuMemcpyDtoHAsync`, the handoff to the link
/// thread and the stream wait of each signalled block. Calibrated on an H200 (Gen5 x16):
/// `rdma-hint calibrate --source gpu:0` fitted o = 2.8–3.0 µs, B = 53–54 GB/s.
pub const STAGED_SHM_GPU_PER_BLOCK_US: f64 = 2.65;

/// A memory source with where sysfs put it.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub(crate) facts: SourceFacts,
    /// Index of the GPU in the sysfs topology, for path classes.
    pub(crate) sysfs_gpu: Option<u32>,
}

/// Host nodes and GPUs. With CUDA facts, GPUs are numbered by CUDA ordinal and matched to sysfs
/// by PCI address; without, by sysfs PCI order.
pub(crate) fn sources(
    topology: &Topology,
    cuda: Option<&[(u32, GpuFacts)]>,
    warnings: &mut Vec<String>,
) -> Vec<Source> {
    let mut sources: Vec<Source> = topology
        .hosts
        .iter()
        .map(|host| Source {
            facts: SourceFacts { memory_bytes: host.memory_bytes, ..SourceFacts::host(host.id) },
            sysfs_gpu: None,
        })
        .collect();
    match cuda {
        Some(cuda) => {
            for (ordinal, facts) in cuda {
                let sysfs = topology.gpus.iter().find(|g| Some(g.pci.as_str()) == facts.pci.as_deref());
                if sysfs.is_none() {
                    warnings.push(format!(
                        "gpu:{ordinal} ({}) is not in the sysfs tree: its NIC path classes are unknown",
                        facts.pci.as_deref().unwrap_or("no PCI address")
                    ));
                }
                sources.push(Source {
                    facts: SourceFacts {
                        id: SourceId::Gpu(*ordinal),
                        numa_node: sysfs.and_then(|g| g.numa_node),
                        memory_bytes: facts.memory_bytes,
                        pcie: sysfs.and_then(|g| g.link),
                        kind: SourceKind::Gpu(facts.clone()),
                    },
                    sysfs_gpu: sysfs.map(|g| g.index),
                });
            }
            for hidden in topology
                .gpus
                .iter()
                .filter(|g| !cuda.iter().any(|(_, f)| f.pci.as_deref() == Some(g.pci.as_str())))
            {
                warnings.push(format!("GPU {} is in sysfs but not visible to CUDA; skipped", hidden.pci));
            }
        }
        None => {
            for gpu in &topology.gpus {
                sources.push(Source {
                    facts: SourceFacts {
                        id: SourceId::Gpu(gpu.index),
                        numa_node: gpu.numa_node,
                        memory_bytes: None,
                        pcie: gpu.link,
                        kind: SourceKind::Gpu(GpuFacts { pci: Some(gpu.pci.clone()), ..GpuFacts::default() }),
                    },
                    sysfs_gpu: Some(gpu.index),
                });
            }
        }
    }
    sources
}

/// Transport facts for an RDMA NIC from sysfs alone, or why there are none.
pub(crate) fn rdma_transport(nic: &Nic) -> Result<TransportFacts, String> {
    let rate = nic.rate_gbits.ok_or_else(|| format!("{}: no port rate in sysfs", nic.name))?;
    let soft_roce = nic.pci.is_none() || nic.name.starts_with("rxe");
    Ok(TransportFacts {
        id: TransportId::verbs(&nic.name).map_err(|e| e.to_string())?,
        kind: TransportKind::Verbs,
        wire_gbps: rate / 8.0,
        nic_pcie: if soft_roce { None } else { nic.link },
        per_op_overhead_us: if soft_roce { SOFT_ROCE_PER_OP_US } else { NIC_PER_OP_US },
        mtu_bytes: nic.mtu_bytes,
        max_msg_bytes: ASSUMED_MAX_MSG_BYTES,
        max_payload_bytes: nic.max_payload_bytes,
        queried_from_backend: false,
        rate_note: None,
    })
}

/// The path from a memory source to a transport that needs no NIC.
pub(crate) fn software_profile(source: SourceFacts, transport: &backends::SoftwareTransport) -> PathProfile {
    let gpu_driver = source.gpu().and_then(|g| g.driver_version.clone());
    let mut facts = transport.facts.clone();
    // From GPU memory the staged shm channel does not memcpy: the copy engine writes the peer's
    // page-locked mapping, so the GPU's PCIe link bounds it, not the memcpy rate.
    if let (true, Some(_), Some(link)) = (facts.id == TransportId::STAGED_SHM, source.gpu(), source.pcie) {
        facts.wire_gbps = link.effective_gbps();
        facts.per_op_overhead_us = STAGED_SHM_GPU_PER_BLOCK_US;
        facts.rate_note = Some("GPU source: the copy engine writes the peer's page-locked mapping".into());
    }
    PathProfile {
        source,
        transport: facts,
        path_class: PathClass::NoNic,
        bridges: 0,
        versions: DriverVersions {
            transport_driver: Some(transport.driver.clone()),
            firmware: None,
            gpu_driver,
        },
    }
}

/// One candidate pair: its profile, or why it has none.
pub(crate) type Candidate = Result<PathProfile, (SourceId, TransportId, String)>;

/// Every (source, transport) pair: software transports for every source, RDMA NICs for every
/// source sysfs can place.
pub(crate) fn candidates(
    topology: &Topology,
    sources: &[Source],
    software: &[backends::SoftwareTransport],
    queried: &[backends::VerbsDevice],
) -> Vec<Candidate> {
    let mut out = Vec::new();
    for source in sources {
        let gpu_driver = source.facts.gpu().and_then(|g| g.driver_version.clone());
        for transport in software {
            out.push(Ok(software_profile(source.facts.clone(), transport)));
        }
        for nic in topology.nics.iter().filter(|n| n.kind == NicKind::Rdma) {
            // A device name no transport id can hold (sysfs is not ours) is no candidate.
            let Ok(id) = TransportId::verbs(&nic.name) else { continue };
            let fail = |why: String| Err((source.facts.id, id.clone(), why));
            let transport = match (rdma_transport(nic), queried.iter().find(|d| d.name == nic.name)) {
                // The device's own answer wins over sysfs; the PCIe facts only sysfs knows stay.
                (from_sysfs, Some(device)) => TransportFacts {
                    nic_pcie: from_sysfs.as_ref().ok().and_then(|t| t.nic_pcie),
                    max_payload_bytes: nic.max_payload_bytes,
                    ..device.facts.clone()
                },
                (Ok(t), None) => t,
                (Err(why), None) => {
                    out.push(fail(why));
                    continue;
                }
            };
            let sysfs_source = match source.facts.id {
                SourceId::Host(_) => Some(source.facts.id),
                SourceId::Gpu(_) => source.sysfs_gpu.map(SourceId::Gpu),
            };
            let Some((path_class, bridges)) = sysfs_source.and_then(|s| topology.path(s, nic)) else {
                out.push(fail("the PCIe position of the GPU or NIC is unknown".into()));
                continue;
            };
            if !nic.active {
                out.push(fail(format!("{} has no ACTIVE port", nic.name)));
                continue;
            }
            out.push(Ok(PathProfile {
                source: source.facts.clone(),
                transport,
                path_class,
                bridges,
                versions: DriverVersions {
                    transport_driver: nic
                        .driver
                        .as_ref()
                        .map(|d| format!("{d} {}", nic.driver_version.as_deref().unwrap_or("(no version)"))),
                    firmware: nic.firmware.clone(),
                    gpu_driver: gpu_driver.clone(),
                },
            }));
        }
    }
    out
}
