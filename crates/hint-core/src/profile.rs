//! `PathProfile`: every fact about one (memory source, transport) pair that the model reads.

use crate::pcie::PcieLink;
use crate::transport_id::TransportId;
use crate::{GIB, KIB, MIB};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Where the data lives: a host NUMA node or a GPU.
///
/// Displays as `host:N` / `gpu:N`, the spelling the CLI accepts.
///
/// ```
/// use rdma_hint_core::SourceId;
/// assert_eq!(SourceId::Gpu(1).to_string(), "gpu:1");
/// assert_eq!("host:0".parse::<SourceId>().unwrap(), SourceId::Host(0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum SourceId {
    /// Host memory on this NUMA node.
    Host(u32),
    /// Device memory of the GPU with this CUDA ordinal (or enumeration index without CUDA).
    Gpu(u32),
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceId::Host(n) => write!(f, "host:{n}"),
            SourceId::Gpu(n) => write!(f, "gpu:{n}"),
        }
    }
}

impl From<SourceId> for String {
    fn from(id: SourceId) -> String {
        id.to_string()
    }
}

impl TryFrom<String> for SourceId {
    type Error = String;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl std::str::FromStr for SourceId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, index) = s.split_once(':').ok_or_else(|| format!("`{s}` is not `host:N` or `gpu:N`"))?;
        let index: u32 =
            index.parse().map_err(|_| format!("`{index}` in `{s}` is not a non-negative integer"))?;
        match kind {
            "host" => Ok(SourceId::Host(index)),
            "gpu" => Ok(SourceId::Gpu(index)),
            other => Err(format!("unknown source kind `{other}` (expected host or gpu)")),
        }
    }
}

/// What kind of memory a source is, with the facts that only apply to that kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SourceKind {
    /// Host DRAM of one NUMA node.
    Host,
    /// GPU device memory.
    Gpu(GpuFacts),
}

/// Facts about one GPU, from sysfs and (feature `cuda`) the CUDA driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct GpuFacts {
    /// Marketing name (`NVIDIA H200`), if the driver told us.
    pub name: Option<String>,
    /// PCI address `dddd:bb:dd.f`.
    pub pci: Option<String>,
    /// Device memory in bytes.
    pub memory_bytes: Option<u64>,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`; `None` when unknown (no driver).
    pub gpudirect_rdma: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`; `None` when unknown.
    pub dmabuf: Option<bool>,
    /// Minimum VMM allocation granularity in bytes (2 MiB on H200).
    pub vmm_granularity_bytes: Option<u64>,
    /// CUDA driver version as `major.minor` (e.g. `13.0`).
    pub driver_version: Option<String>,
}

/// Facts about the memory source of a path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceFacts {
    /// Which source.
    pub id: SourceId,
    /// Host or GPU, with GPU facts.
    pub kind: SourceKind,
    /// NUMA node the memory (or the GPU's PCIe root) belongs to; `None` if unknown.
    pub numa_node: Option<u32>,
    /// Memory size in bytes (NUMA node MemTotal or GPU memory); bounds the hint.
    pub memory_bytes: Option<u64>,
    /// PCIe link of the GPU (none for host memory).
    pub pcie: Option<PcieLink>,
}

impl SourceFacts {
    /// A host NUMA node with no other facts known.
    pub fn host(numa_node: u32) -> SourceFacts {
        SourceFacts {
            id: SourceId::Host(numa_node),
            kind: SourceKind::Host,
            numa_node: Some(numa_node),
            memory_bytes: None,
            pcie: None,
        }
    }

    /// The GPU facts, if this source is a GPU.
    pub fn gpu(&self) -> Option<&GpuFacts> {
        match &self.kind {
            SourceKind::Gpu(facts) => Some(facts),
            SourceKind::Host => None,
        }
    }
}

/// Distance between a memory source and a NIC, in NCCL's classes, plus the two cases a staged
/// (no NIC) path has.
///
/// Ordered from closest to farthest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PathClass {
    /// Source and destination are the same device (loopback on one GPU or host node).
    #[serde(rename = "SAME")]
    SameDevice,
    /// No NIC on the path: host-staged transfer over shared memory or sockets.
    #[serde(rename = "NONIC")]
    NoNic,
    /// At most one PCIe bridge/switch between source and NIC.
    #[serde(rename = "PIX")]
    Pix,
    /// Several PCIe bridges, without crossing the host bridge.
    #[serde(rename = "PXB")]
    Pxb,
    /// Through the CPU's PCIe host bridge (root complex).
    #[serde(rename = "PHB")]
    Phb,
    /// Across PCIe host bridges within one NUMA node.
    #[serde(rename = "NODE")]
    Node,
    /// Across NUMA nodes (the inter-socket link).
    #[serde(rename = "SYS")]
    Sys,
}

impl PathClass {
    /// Every class, closest first.
    pub const ALL: [PathClass; 7] = [
        PathClass::SameDevice,
        PathClass::NoNic,
        PathClass::Pix,
        PathClass::Pxb,
        PathClass::Phb,
        PathClass::Node,
        PathClass::Sys,
    ];

    /// The label NCCL and `nvidia-smi topo -m` use.
    pub fn label(&self) -> &'static str {
        match self {
            PathClass::SameDevice => "SAME",
            PathClass::NoNic => "NONIC",
            PathClass::Pix => "PIX",
            PathClass::Pxb => "PXB",
            PathClass::Phb => "PHB",
            PathClass::Node => "NODE",
            PathClass::Sys => "SYS",
        }
    }
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Which family of backend a transport is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// Raw ibverbs RC queue pairs.
    Verbs,
    /// UCX UCP.
    Ucx,
    /// Host-staged fallback (pinned bounce ring over shared memory or TCP).
    Staged,
    /// In-process `memcpy` between two regions (tests and benches).
    Loopback,
}

/// Facts about the transport side of a path: NIC or software channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransportFacts {
    /// Stable identity: `verbs:mlx5_0`, `staged:shm`, `ucx:tcp`…
    pub id: TransportId,
    /// Backend family.
    pub kind: TransportKind,
    /// Wire (or channel) rate in GB/s.
    pub wire_gbps: f64,
    /// PCIe link of the NIC, if there is a NIC.
    pub nic_pcie: Option<PcieLink>,
    /// Fixed software + hardware cost per posted message in µs (doorbell, WQE, completion share,
    /// or for software channels the per-block handoff).
    pub per_op_overhead_us: f64,
    /// Path MTU in bytes (first-fragment size), if packetized.
    pub mtu_bytes: Option<u64>,
    /// Largest single message in bytes (`max_msg_sz`).
    pub max_msg_bytes: u64,
    /// PCIe Max_Payload_Size of the NIC in bytes, if known (512 B assumed otherwise, as UCX).
    pub max_payload_bytes: Option<u64>,
    /// Whether the facts came from the backend itself (`true`) or from sysfs and defaults.
    pub queried_from_backend: bool,
    /// Why `wire_gbps` is not what the backend said (an implausible estimate clamped), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_note: Option<String>,
}

/// Driver and firmware versions a hint is valid for; part of the cache key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct DriverVersions {
    /// NIC/transport driver (kernel module name + version, or library version).
    pub transport_driver: Option<String>,
    /// NIC firmware (`fw_ver`).
    pub firmware: Option<String>,
    /// GPU driver (CUDA driver version) for GPU sources.
    pub gpu_driver: Option<String>,
}

/// Everything the hint model reads for one (source, transport) pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathProfile {
    /// The memory source.
    pub source: SourceFacts,
    /// The transport / NIC.
    pub transport: TransportFacts,
    /// Distance between them.
    pub path_class: PathClass,
    /// PCIe bridges between source and NIC (0 when no NIC), for the latency term.
    pub bridges: u32,
    /// Versions the profile was read under.
    pub versions: DriverVersions,
}

impl PathProfile {
    /// A documented example: host memory on NUMA node 0, a 200 Gb/s NIC (Gen4 x16) one switch
    /// away. Used in doc examples and benchmarks.
    pub fn example_host_nic() -> PathProfile {
        PathProfile {
            source: SourceFacts { memory_bytes: Some(256 * GIB), ..SourceFacts::host(0) },
            transport: TransportFacts {
                id: TransportId::Verbs("mlx5_0".into()),
                kind: TransportKind::Verbs,
                wire_gbps: 25.0,
                nic_pcie: Some(PcieLink { speed_gts: 16.0, width: 16 }),
                per_op_overhead_us: 0.35,
                mtu_bytes: Some(4 * KIB),
                max_msg_bytes: GIB,
                max_payload_bytes: Some(256),
                queried_from_backend: false,
                rate_note: None,
            },
            path_class: PathClass::Pix,
            bridges: 1,
            versions: DriverVersions::default(),
        }
    }

    /// A documented example: an H200 (Gen5 x16, 64 KiB GPUDirect pages) next to a 400 Gb/s NIC
    /// on the same PCIe switch.
    pub fn example_gpu_nic() -> PathProfile {
        let gpu = GpuFacts {
            name: Some("NVIDIA H200".into()),
            pci: Some("0000:1b:00.0".into()),
            memory_bytes: Some(141 * 1000 * 1000 * 1000),
            gpudirect_rdma: Some(true),
            dmabuf: Some(true),
            vmm_granularity_bytes: Some(2 * MIB),
            driver_version: Some("13.0".into()),
        };
        PathProfile {
            source: SourceFacts {
                id: SourceId::Gpu(0),
                memory_bytes: gpu.memory_bytes,
                kind: SourceKind::Gpu(gpu),
                numa_node: Some(0),
                pcie: Some(PcieLink { speed_gts: 32.0, width: 16 }),
            },
            transport: TransportFacts {
                id: TransportId::Verbs("mlx5_0".into()),
                kind: TransportKind::Verbs,
                wire_gbps: 50.0,
                nic_pcie: Some(PcieLink { speed_gts: 32.0, width: 16 }),
                per_op_overhead_us: 0.35,
                mtu_bytes: Some(4 * KIB),
                max_msg_bytes: GIB,
                max_payload_bytes: Some(512),
                queried_from_backend: false,
                rate_note: None,
            },
            path_class: PathClass::Pix,
            bridges: 1,
            versions: DriverVersions::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_id_round_trips_and_rejects_garbage() {
        for id in [SourceId::Host(0), SourceId::Gpu(7)] {
            assert_eq!(id.to_string().parse::<SourceId>().unwrap(), id);
        }
        for bad in ["", "gpu", "gpu:", "gpu:-1", "nic:0", "host:x"] {
            assert!(bad.parse::<SourceId>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn classes_order_by_distance() {
        assert!(PathClass::Pix < PathClass::Pxb);
        assert!(PathClass::Phb < PathClass::Node);
        assert!(PathClass::Node < PathClass::Sys);
        assert_eq!(serde_json_label(PathClass::Pxb), "\"PXB\"");
    }

    fn serde_json_label(class: PathClass) -> String {
        serde_json::to_string(&class).unwrap()
    }
}
