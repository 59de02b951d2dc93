//! Sources, NICs and the NCCL-style path class of every (source, NIC) pair.

use crate::sysfs::{self, DiscoveryError, PciPath, SysfsSnapshot};
use rdma_hint_core::pcie::PcieLink;
use rdma_hint_core::profile::{PathClass, SourceId};
use serde::Serialize;
use std::path::Path;

/// A GPU found in the PCI tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuDevice {
    /// Index in PCI-address order (`CUDA_DEVICE_ORDER=PCI_BUS_ID` numbering).
    pub index: u32,
    /// PCI address.
    pub pci: String,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// NUMA node of its root complex (`numa` in JSON).
    #[serde(rename = "numa")]
    pub numa_node: Option<u32>,
    /// Negotiated PCIe link.
    pub link: Option<PcieLink>,
    #[serde(skip)]
    path: PciPath,
}

/// What kind of network device a [`Nic`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NicKind {
    /// An RDMA device (`class/infiniband`): verbs and UCX can use it.
    Rdma,
    /// A plain network interface (`class/net`) backed by a PCI function: sockets only.
    Net,
}

/// A NIC found in sysfs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Nic {
    /// Device or interface name.
    pub name: String,
    /// RDMA or plain network.
    pub kind: NicKind,
    /// PCI address, if any.
    pub pci: Option<String>,
    /// NUMA node (`numa` in JSON).
    #[serde(rename = "numa")]
    pub numa_node: Option<u32>,
    /// Port rate in Gb/s.
    pub rate_gbits: Option<f64>,
    /// Negotiated PCIe link.
    pub link: Option<PcieLink>,
    /// Path MTU in bytes (IB MTU for RDMA devices).
    pub mtu_bytes: Option<u64>,
    /// PCIe Max_Payload_Size in bytes.
    pub max_payload_bytes: Option<u64>,
    /// Firmware version.
    pub firmware: Option<String>,
    /// Kernel driver.
    pub driver: Option<String>,
    /// Kernel driver version (`/sys/module/<driver>/version`).
    pub driver_version: Option<String>,
    /// A port is ACTIVE (always true for plain interfaces).
    pub active: bool,
    /// `InfiniBand` or `Ethernet` for RDMA devices.
    pub link_layer: Option<String>,
    /// Netdev of a RoCE / Soft-RoCE device.
    pub netdev: Option<String>,
    #[serde(skip)]
    path: Option<PciPath>,
}

/// A host NUMA node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostNode {
    /// Node id.
    pub id: u32,
    /// MemTotal in bytes.
    pub memory_bytes: Option<u64>,
}

/// The class of one (source, NIC) pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathEntry {
    /// Source.
    pub source: SourceId,
    /// NIC name.
    pub nic: String,
    /// Class.
    pub class: PathClass,
    /// PCIe bridges (switch ports) traversed between them.
    pub bridges: u32,
}

/// Sources and NICs of one machine, as sysfs shows them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Topology {
    /// GPUs.
    pub gpus: Vec<GpuDevice>,
    /// NICs: RDMA devices, then PCI-backed interfaces.
    pub nics: Vec<Nic>,
    /// Host NUMA nodes (node 0 alone if sysfs lists none).
    pub hosts: Vec<HostNode>,
    /// What was skipped or assumed.
    pub warnings: Vec<String>,
}

/// Vendors whose VGA-class (0x0300) functions are compute GPUs; other vendors' VGA functions are
/// BMC or emulated displays (ASPEED, Matrox, QEMU, VMware) and are not data sources.
const GPU_VGA_VENDORS: [u16; 2] = [0x10de, 0x1002];

/// Whether a PCI function is a GPU: a 3D controller (0x0302) or processing accelerator display
/// (0x0380) of any vendor, or a VGA controller (0x0300) of NVIDIA or AMD.
pub fn is_gpu(class: u32, vendor: u16) -> bool {
    match class >> 8 {
        0x0302 | 0x0380 => true,
        0x0300 => GPU_VGA_VENDORS.contains(&vendor),
        _ => false,
    }
}

/// Largest IB MTU (256…4096 B) that fits an Ethernet MTU with RoCEv2 headers.
pub fn roce_mtu(netdev_mtu: u64) -> Option<u64> {
    const ROCE_HEADERS: u64 = 100;
    (8..=12).rev().map(|shift| 1u64 << shift).find(|mtu| mtu + ROCE_HEADERS <= netdev_mtu)
}

/// NCCL's classification of two PCI functions.
///
/// Returns the class and how many bridges (switch ports) the path crosses. `single_node` says
/// the machine has one NUMA node, which settles an unknown `numa_node`.
pub fn classify(
    a: &PciPath,
    a_numa: Option<u32>,
    b: &PciPath,
    b_numa: Option<u32>,
    single_node: bool,
) -> (PathClass, u32) {
    if a == b {
        return (PathClass::SameDevice, 0);
    }
    if a.host_bridge != b.host_bridge {
        let same_node = match (a_numa, b_numa) {
            (Some(x), Some(y)) => x == y,
            _ => single_node,
        };
        return (if same_node { PathClass::Node } else { PathClass::Sys }, 0);
    }
    let common = a.functions.iter().zip(&b.functions).take_while(|(x, y)| x == y).count();
    // Bridges strictly between the deepest common ancestor and each endpoint.
    let a_below = (a.functions.len() - common).saturating_sub(1) as u32;
    let b_below = (b.functions.len() - common).saturating_sub(1) as u32;
    if common == 0 {
        return (PathClass::Phb, a_below + b_below);
    }
    // A PCIe switch is an upstream port with downstream ports below it: endpoints one port below
    // a common upstream port (or on the same bridge) cross a single switch.
    let class = if a_below <= 1 && b_below <= 1 { PathClass::Pix } else { PathClass::Pxb };
    (class, a_below + b_below + 1)
}

impl Topology {
    /// Reads and classifies the sysfs tree under `root` (`/sys` on a live system).
    ///
    /// ```no_run
    /// let topology = rdma_hint_discovery::Topology::discover(std::path::Path::new("/sys")).unwrap();
    /// for entry in topology.matrix() {
    ///     println!("{} ↔ {}: {}", entry.source, entry.nic, entry.class);
    /// }
    /// ```
    pub fn discover(root: &Path) -> Result<Topology, DiscoveryError> {
        let snapshot = sysfs::read_sysfs(root)?;
        Ok(Topology::from_snapshot(root, snapshot))
    }

    /// Builds the topology from an already read snapshot; `root` locates `module/*/version`.
    pub fn from_snapshot(root: &Path, snapshot: SysfsSnapshot) -> Topology {
        let mut topology = Topology { warnings: snapshot.warnings.clone(), ..Topology::default() };

        for (index, function) in snapshot.pci.iter().filter(|f| is_gpu(f.class, f.vendor)).enumerate() {
            topology.gpus.push(GpuDevice {
                index: index as u32,
                pci: function.path.address().to_string(),
                vendor: function.vendor,
                device: function.device,
                numa_node: function.numa_node,
                link: function.link,
                path: function.path.clone(),
            });
        }

        let netdev_of_pci = |address: &str| {
            snapshot.net.iter().find(|n| n.pci.as_ref().is_some_and(|p| p.address() == address))
        };
        for device in &snapshot.rdma {
            let parent =
                device.parent_netdev.as_deref().and_then(|name| snapshot.net.iter().find(|n| n.name == name));
            let path = device.pci.clone().or_else(|| parent.and_then(|n| n.pci.clone()));
            let function = path.as_ref().and_then(|p| snapshot.function(p.address()));
            let netdev = parent.or_else(|| path.as_ref().and_then(|p| netdev_of_pci(p.address())));
            let port = device.ports.iter().find(|p| p.active).or(device.ports.first());
            let link_layer = port.and_then(|p| p.link_layer.clone());
            let mtu_bytes = match link_layer.as_deref() {
                Some("Ethernet") => netdev.and_then(|n| n.mtu_bytes).and_then(roce_mtu),
                _ => Some(4096),
            };
            let driver = function.and_then(|f| f.driver.clone());
            topology.nics.push(Nic {
                name: device.name.clone(),
                kind: NicKind::Rdma,
                pci: path.as_ref().map(|p| p.address().to_string()),
                numa_node: function.and_then(|f| f.numa_node),
                rate_gbits: port.and_then(|p| p.rate_gbits),
                link: function.and_then(|f| f.link),
                mtu_bytes,
                max_payload_bytes: function.and_then(|f| f.max_payload_bytes),
                firmware: device.fw_ver.clone(),
                driver_version: driver.as_deref().and_then(|d| sysfs::module_version(root, d)),
                driver,
                active: port.is_some_and(|p| p.active),
                link_layer,
                netdev: netdev.map(|n| n.name.clone()),
                path,
            });
        }
        for net in snapshot.net.iter().filter(|n| n.pci.is_some()) {
            let function = net.pci.as_ref().and_then(|p| snapshot.function(p.address()));
            let driver = function.and_then(|f| f.driver.clone());
            topology.nics.push(Nic {
                name: net.name.clone(),
                kind: NicKind::Net,
                pci: net.pci.as_ref().map(|p| p.address().to_string()),
                numa_node: function.and_then(|f| f.numa_node),
                rate_gbits: net.speed_mbits.map(|m| m as f64 / 1000.0),
                link: function.and_then(|f| f.link),
                mtu_bytes: net.mtu_bytes,
                max_payload_bytes: function.and_then(|f| f.max_payload_bytes),
                firmware: None,
                driver_version: driver.as_deref().and_then(|d| sysfs::module_version(root, d)),
                driver,
                active: true,
                link_layer: Some("Ethernet".into()),
                netdev: Some(net.name.clone()),
                path: net.pci.clone(),
            });
        }

        topology.hosts =
            snapshot.numa.iter().map(|n| HostNode { id: n.id, memory_bytes: n.memory_bytes }).collect();
        if topology.hosts.is_empty() {
            topology.warnings.push("no NUMA nodes listed: assuming one host node 0".into());
            topology.hosts.push(HostNode { id: 0, memory_bytes: None });
        }
        topology
    }

    fn single_node(&self) -> bool {
        self.hosts.len() <= 1
    }

    /// Every source: host nodes first, then GPUs.
    pub fn sources(&self) -> Vec<SourceId> {
        self.hosts
            .iter()
            .map(|h| SourceId::Host(h.id))
            .chain(self.gpus.iter().map(|g| SourceId::Gpu(g.index)))
            .collect()
    }

    /// The GPU with this index.
    pub fn gpu(&self, index: u32) -> Option<&GpuDevice> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The NIC with this name.
    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.name == name)
    }

    /// Class and bridge count between `source` and `nic`; `None` if either position is unknown.
    pub fn path(&self, source: SourceId, nic: &Nic) -> Option<(PathClass, u32)> {
        match source {
            SourceId::Host(node) => {
                let same_node = match nic.numa_node {
                    Some(n) => n == node,
                    None => self.single_node(),
                };
                Some((if same_node { PathClass::Phb } else { PathClass::Sys }, 0))
            }
            SourceId::Gpu(index) => {
                let gpu = self.gpu(index)?;
                let nic_path = nic.path.as_ref()?;
                Some(classify(&gpu.path, gpu.numa_node, nic_path, nic.numa_node, self.single_node()))
            }
        }
    }

    /// The full source × NIC matrix (pairs with unknown positions are left out).
    pub fn matrix(&self) -> Vec<PathEntry> {
        let mut entries = Vec::new();
        for source in self.sources() {
            for nic in &self.nics {
                if let Some((class, bridges)) = self.path(source, nic) {
                    entries.push(PathEntry { source, nic: nic.name.clone(), class, bridges });
                }
            }
        }
        entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(host_bridge: &str, functions: &[&str]) -> PciPath {
        PciPath {
            host_bridge: host_bridge.into(),
            functions: functions.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn classes_follow_nccl() {
        let gpu_under_switch =
            path("pci0000:00", &["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]);
        let nic_same_switch =
            path("pci0000:00", &["0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:05:00.0"]);
        let nic_other_root_port = path("pci0000:00", &["0000:00:1c.0", "0000:06:00.0"]);
        let nic_other_bridge = path("pci0000:20", &["0000:20:01.0", "0000:21:00.0"]);
        let gpu_behind_two_switches = path(
            "pci0000:00",
            &["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0"],
        );
        assert_eq!(
            classify(&gpu_under_switch, Some(0), &nic_same_switch, Some(0), false),
            (PathClass::Pix, 3)
        );
        assert_eq!(
            classify(&gpu_behind_two_switches, Some(0), &nic_same_switch, Some(0), false).0,
            PathClass::Pxb
        );
        assert_eq!(
            classify(&gpu_under_switch, Some(0), &nic_other_root_port, Some(0), false).0,
            PathClass::Phb
        );
        assert_eq!(
            classify(&gpu_under_switch, Some(0), &nic_other_bridge, Some(0), false).0,
            PathClass::Node
        );
        assert_eq!(classify(&gpu_under_switch, Some(0), &nic_other_bridge, Some(1), false).0, PathClass::Sys);
        assert_eq!(classify(&gpu_under_switch, None, &nic_other_bridge, None, true).0, PathClass::Node);
        assert_eq!(classify(&gpu_under_switch, None, &nic_other_bridge, None, false).0, PathClass::Sys);
        assert_eq!(
            classify(&gpu_under_switch, Some(0), &gpu_under_switch, Some(0), false).0,
            PathClass::SameDevice
        );
        // Two functions of one device on the same bridge.
        let nic_port0 = path("pci0000:00", &["0000:00:01.0", "0000:3b:00.0"]);
        let nic_port1 = path("pci0000:00", &["0000:00:01.0", "0000:3b:00.1"]);
        assert_eq!(classify(&nic_port0, Some(0), &nic_port1, Some(0), false).0, PathClass::Pix);
    }

    #[test]
    fn gpu_detection_skips_bmc_and_emulated_displays() {
        assert!(is_gpu(0x030200, 0x10de));
        assert!(is_gpu(0x030000, 0x10de));
        assert!(is_gpu(0x038000, 0x1002));
        assert!(is_gpu(0x030200, 0x8086));
        assert!(!is_gpu(0x030000, 0x1a03), "ASPEED BMC VGA");
        assert!(!is_gpu(0x030000, 0x1234), "QEMU std VGA");
        assert!(!is_gpu(0x020000, 0x15b3), "Ethernet");
    }

    #[test]
    fn roce_mtu_fits_the_ethernet_frame() {
        assert_eq!(roce_mtu(1500), Some(1024));
        assert_eq!(roce_mtu(9000), Some(4096));
        assert_eq!(roce_mtu(4200), Some(4096));
        assert_eq!(roce_mtu(300), None);
    }
}
