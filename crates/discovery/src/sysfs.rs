//! Reading a sysfs tree into plain records. Rooted at any directory so tests use fixture trees.
//!
//! Layout read (paths relative to the root, `/sys` on a live system):
//!
//! * `bus/pci/devices/<bdf>` → symlink into `devices/pci<domain>:<bus>/…/<bdf>`; inside:
//!   `class`, `vendor`, `device`, `numa_node`, `current_link_speed`, `current_link_width`,
//!   `max_link_speed`, `max_link_width`, `config` (for Max_Payload_Size), `driver` → symlink.
//! * `class/infiniband/<dev>/device` → PCI function; `fw_ver`; `parent` (Soft-RoCE: netdev
//!   name); `ports/<n>/{rate,state,link_layer}`.
//! * `class/net/<if>/device` → PCI function (or a virtio device below one); `speed` (Mb/s),
//!   `mtu` (bytes).
//! * `devices/system/node/node<N>/meminfo` → `Node N MemTotal: … kB`.
//! * `module/<driver>/version`.
//!
//! Unreadable or garbled entries are skipped with a warning; only an unusable root is an error.

use rdma_hint_core::pcie::PcieLink;
use std::fs;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Discovery errors. Anything short of an unusable root becomes a warning instead.
#[derive(Debug, Error)]
pub enum DiscoveryError {
    /// The root directory cannot be read.
    #[error("cannot read sysfs root {path}: {source}")]
    RootUnreadable {
        /// The root given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The root exists but is not a directory.
    #[error("sysfs root {0} is not a directory")]
    NotADirectory(PathBuf),
}

/// A PCI address `dddd:bb:dd.f`, checked for shape.
///
/// ```
/// use rdma_hint_discovery::sysfs::is_pci_address;
/// assert!(is_pci_address("0000:3b:00.0"));
/// assert!(!is_pci_address("pci0000:3a"));
/// assert!(!is_pci_address("virtio0"));
/// ```
pub fn is_pci_address(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() == 12
        && bytes[4] == b':'
        && bytes[7] == b':'
        && bytes[10] == b'.'
        && bytes.iter().enumerate().all(|(i, b)| matches!(i, 4 | 7 | 10) || b.is_ascii_hexdigit())
}

/// Where a PCI function sits: host bridge first, then every PCI function down to itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPath {
    /// `pci<domain>:<bus>` host bridge (root complex) name.
    pub host_bridge: String,
    /// PCI addresses from the root port down to the function itself (last element).
    pub functions: Vec<String>,
}

impl PciPath {
    /// Splits a path below `<root>/devices` (`pci0000:00/0000:00:01.0/0000:01:00.0/virtio0`)
    /// into host bridge and PCI functions, dropping non-PCI tail components (`virtio0`, `net/…`).
    pub fn from_components<'a>(components: impl IntoIterator<Item = &'a str>) -> Option<PciPath> {
        let mut components = components.into_iter();
        let host_bridge = components.next().filter(|c| c.starts_with("pci"))?.to_string();
        let functions: Vec<String> =
            components.take_while(|c| is_pci_address(c)).map(str::to_string).collect();
        (!functions.is_empty()).then_some(PciPath { host_bridge, functions })
    }

    /// The function's own address.
    pub fn address(&self) -> &str {
        self.functions.last().map(String::as_str).unwrap_or_default()
    }
}

/// One PCI function from `bus/pci/devices`.
#[derive(Debug, Clone, PartialEq)]
pub struct PciFunction {
    /// Position in the tree.
    pub path: PciPath,
    /// 24-bit class code (`0x030200` = 3D controller).
    pub class: u32,
    /// Vendor id (`0x10de` = NVIDIA).
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// NUMA node, `None` when sysfs says -1 or nothing.
    pub numa_node: Option<u32>,
    /// Negotiated link.
    pub link: Option<PcieLink>,
    /// Capable link.
    pub max_link: Option<PcieLink>,
    /// PCIe Max_Payload_Size in bytes, from the `config` file (needs root for the full space).
    pub max_payload_bytes: Option<u64>,
    /// Bound driver (`mlx5_core`, `nvidia`).
    pub driver: Option<String>,
}

/// One port of an RDMA device.
#[derive(Debug, Clone, PartialEq)]
pub struct RdmaPort {
    /// Port number (from 1).
    pub number: u32,
    /// Rate in Gb/s from `rate` (`"400 Gb/sec (4X NDR)"`).
    pub rate_gbits: Option<f64>,
    /// `state` says ACTIVE.
    pub active: bool,
    /// `InfiniBand` or `Ethernet`.
    pub link_layer: Option<String>,
}

/// One entry of `class/infiniband`.
#[derive(Debug, Clone, PartialEq)]
pub struct RdmaDevice {
    /// Device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// PCI function behind it, if any.
    pub pci: Option<PciPath>,
    /// Firmware version.
    pub fw_ver: Option<String>,
    /// Netdev a software device (Soft-RoCE) runs on.
    pub parent_netdev: Option<String>,
    /// Ports.
    pub ports: Vec<RdmaPort>,
}

/// One entry of `class/net`.
#[derive(Debug, Clone, PartialEq)]
pub struct NetDevice {
    /// Interface name.
    pub name: String,
    /// PCI function behind it, if any.
    pub pci: Option<PciPath>,
    /// Link speed in Mb/s (`None` when unknown or -1).
    pub speed_mbits: Option<u64>,
    /// MTU in bytes.
    pub mtu_bytes: Option<u64>,
}

/// One host NUMA node.
#[derive(Debug, Clone, PartialEq)]
pub struct NumaNode {
    /// Node id.
    pub id: u32,
    /// MemTotal in bytes.
    pub memory_bytes: Option<u64>,
}

/// Everything read from one sysfs tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SysfsSnapshot {
    /// PCI functions, sorted by address.
    pub pci: Vec<PciFunction>,
    /// RDMA devices, sorted by name.
    pub rdma: Vec<RdmaDevice>,
    /// Network interfaces, sorted by name.
    pub net: Vec<NetDevice>,
    /// NUMA nodes, sorted by id.
    pub numa: Vec<NumaNode>,
    /// Skipped or garbled entries.
    pub warnings: Vec<String>,
}

impl SysfsSnapshot {
    /// The PCI function with this address.
    pub fn function(&self, address: &str) -> Option<&PciFunction> {
        self.pci.iter().find(|f| f.path.address() == address)
    }
}

/// The most bytes read from one sysfs file: a page, what an attribute (or a PCI function's
/// extended configuration space) holds.
const MAX_ATTRIBUTE_BYTES: u64 = 4096;

/// At most [`MAX_ATTRIBUTE_BYTES`] of a regular file: opened without blocking (a fifo in a
/// `--sysfs-root` tree must not hang discovery), not through a link, and refused if it is not
/// a regular file (`/dev/zero` must not be read without end).
fn read_capped(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Never through a link (a real attribute is none) nor as a terminal: opening some devices
    // has effects of its own.
    let flags = libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY;
    let file = fs::OpenOptions::new().read(true).custom_flags(flags).open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_ATTRIBUTE_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

fn read_trimmed(path: &Path) -> Option<String> {
    let bytes = read_capped(path)?;
    Some(String::from_utf8(bytes).ok()?.trim().to_string())
}

fn parse_hex(text: &str) -> Option<u64> {
    u64::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

/// Parses a `numa_node` file: `-1` and garbage mean unknown.
pub fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim().parse::<u32>().ok().filter(|n| *n < 4096)
}

/// Parses an RDMA port `rate` file (`"400 Gb/sec (4X NDR)"`, `"2.5 Gb/sec (1X SDR)"`) into Gb/s.
pub fn parse_rate_gbits(text: &str) -> Option<f64> {
    let mut words = text.split_whitespace();
    let value: f64 = words.next()?.parse().ok()?;
    (words.next()? == "Gb/sec" && value.is_finite() && value > 0.0 && value < 100_000.0).then_some(value)
}

/// Parses a `meminfo` of a NUMA node (`Node 0 MemTotal:  263846932 kB`) into bytes.
pub fn parse_node_meminfo(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (_, rest) = line.split_once("MemTotal:")?;
        let mut words = rest.split_whitespace();
        let kib: u64 = words.next()?.parse().ok()?;
        (words.next() == Some("kB")).then(|| kib.checked_mul(1024)).flatten()
    })
}

/// Reads Max_Payload_Size from a PCI configuration space dump: walks the capability list to
/// the PCI Express capability (id 0x10) and decodes Device Control bits 7:5.
///
/// ```
/// use rdma_hint_discovery::sysfs::parse_max_payload;
/// let mut config = vec![0u8; 256];
/// config[0x06] = 0x10;            // status: capability list present
/// config[0x34] = 0x40;            // first capability at 0x40
/// config[0x40] = 0x10;            // PCI Express capability, next = 0
/// config[0x48] = 0b0010_0000;     // Device Control: MPS encoding 1 → 256 B
/// assert_eq!(parse_max_payload(&config), Some(256));
/// ```
pub fn parse_max_payload(config: &[u8]) -> Option<u64> {
    const STATUS_CAP_LIST: u8 = 0x10;
    if config.get(0x06)? & STATUS_CAP_LIST == 0 {
        return None;
    }
    let mut pointer = usize::from(*config.get(0x34)? & 0xfc);
    // The list is at most 48 entries in 256 bytes; bound the walk against loops.
    for _ in 0..48 {
        if pointer < 0x40 {
            return None;
        }
        let id = *config.get(pointer)?;
        if id == 0x10 {
            let control = *config.get(pointer + 8)?;
            let encoding = (control >> 5) & 0b111;
            return (encoding <= 5).then(|| 128u64 << encoding);
        }
        pointer = usize::from(*config.get(pointer + 1)? & 0xfc);
    }
    None
}

fn below_devices(root: &Path, link: &Path) -> Option<Vec<String>> {
    let devices = fs::canonicalize(root.join("devices")).ok()?;
    let target = fs::canonicalize(link).ok()?;
    let relative = target.strip_prefix(&devices).ok()?;
    Some(relative.iter().map(|c| c.to_string_lossy().into_owned()).collect())
}

fn pci_path_of(root: &Path, link: &Path) -> Option<PciPath> {
    let components = below_devices(root, link)?;
    PciPath::from_components(components.iter().map(String::as_str))
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(read) => read.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => Vec::new(),
    };
    entries.sort();
    entries
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Reads the tree under `root`.
pub fn read_sysfs(root: &Path) -> Result<SysfsSnapshot, DiscoveryError> {
    let meta = fs::metadata(root)
        .map_err(|source| DiscoveryError::RootUnreadable { path: root.to_path_buf(), source })?;
    if !meta.is_dir() {
        return Err(DiscoveryError::NotADirectory(root.to_path_buf()));
    }
    fs::read_dir(root)
        .map_err(|source| DiscoveryError::RootUnreadable { path: root.to_path_buf(), source })?;

    let mut snapshot = SysfsSnapshot::default();
    read_pci(root, &mut snapshot);
    read_rdma(root, &mut snapshot);
    read_net(root, &mut snapshot);
    read_numa(root, &mut snapshot);
    Ok(snapshot)
}

fn read_pci(root: &Path, snapshot: &mut SysfsSnapshot) {
    let bus = root.join("bus/pci/devices");
    if !bus.is_dir() {
        snapshot.warnings.push(format!("{} missing: no PCI devices seen", bus.display()));
        return;
    }
    for entry in sorted_entries(&bus) {
        let name = file_name(&entry);
        let Some(path) = pci_path_of(root, &entry) else {
            snapshot.warnings.push(format!(
                "skipped PCI entry {name}: link does not resolve to a PCI function under {}/devices",
                root.display()
            ));
            continue;
        };
        let attr = |file: &str| read_trimmed(&entry.join(file));
        let class = attr("class").as_deref().and_then(parse_hex);
        let vendor = attr("vendor").as_deref().and_then(parse_hex);
        let device = attr("device").as_deref().and_then(parse_hex);
        let (Some(class), Some(vendor), Some(device)) = (class, vendor, device) else {
            snapshot
                .warnings
                .push(format!("skipped PCI function {name}: class/vendor/device unreadable or not hex"));
            continue;
        };
        let (Ok(class), Ok(vendor), Ok(device)) =
            (u32::try_from(class), u16::try_from(vendor), u16::try_from(device))
        else {
            snapshot.warnings.push(format!("skipped PCI function {name}: ids out of range"));
            continue;
        };
        let link = |speed: &str, width: &str| {
            PcieLink::from_sysfs(&attr(speed).unwrap_or_default(), &attr(width).unwrap_or_default())
        };
        let config = read_capped(&entry.join("config")).unwrap_or_default();
        snapshot.pci.push(PciFunction {
            path,
            class,
            vendor,
            device,
            numa_node: attr("numa_node").as_deref().and_then(parse_numa_node),
            link: link("current_link_speed", "current_link_width"),
            max_link: link("max_link_speed", "max_link_width"),
            max_payload_bytes: parse_max_payload(&config),
            driver: fs::read_link(entry.join("driver")).ok().map(|p| file_name(&p)),
        });
    }
}

fn read_rdma(root: &Path, snapshot: &mut SysfsSnapshot) {
    for entry in sorted_entries(&root.join("class/infiniband")) {
        let name = file_name(&entry);
        let mut ports = Vec::new();
        for port_dir in sorted_entries(&entry.join("ports")) {
            let Ok(number) = file_name(&port_dir).parse::<u32>() else {
                snapshot.warnings.push(format!("{name}: ignored port entry {}", port_dir.display()));
                continue;
            };
            let state = read_trimmed(&port_dir.join("state")).unwrap_or_default();
            ports.push(RdmaPort {
                number,
                rate_gbits: read_trimmed(&port_dir.join("rate")).as_deref().and_then(parse_rate_gbits),
                active: state.ends_with("ACTIVE"),
                link_layer: read_trimmed(&port_dir.join("link_layer")),
            });
        }
        let pci = pci_path_of(root, &entry.join("device"));
        let parent_netdev = read_trimmed(&entry.join("parent")).filter(|p| !p.is_empty());
        if pci.is_none() && parent_netdev.is_none() {
            snapshot.warnings.push(format!(
                "RDMA device {name}: no PCI function and no parent netdev; path classes unknown"
            ));
        }
        snapshot.rdma.push(RdmaDevice {
            name,
            pci,
            fw_ver: read_trimmed(&entry.join("fw_ver")).filter(|v| !v.is_empty()),
            parent_netdev,
            ports,
        });
    }
}

fn read_net(root: &Path, snapshot: &mut SysfsSnapshot) {
    for entry in sorted_entries(&root.join("class/net")) {
        let name = file_name(&entry);
        let number = |file: &str| {
            read_trimmed(&entry.join(file)).and_then(|t| t.parse::<i64>().ok()).filter(|v| *v > 0)
        };
        snapshot.net.push(NetDevice {
            pci: pci_path_of(root, &entry.join("device")),
            speed_mbits: number("speed").and_then(|v| u64::try_from(v).ok()),
            mtu_bytes: number("mtu").and_then(|v| u64::try_from(v).ok()),
            name,
        });
    }
}

fn read_numa(root: &Path, snapshot: &mut SysfsSnapshot) {
    for entry in sorted_entries(&root.join("devices/system/node")) {
        let name = file_name(&entry);
        let Some(id) = name.strip_prefix("node").and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        snapshot.numa.push(NumaNode {
            id,
            memory_bytes: read_trimmed(&entry.join("meminfo")).as_deref().and_then(parse_node_meminfo),
        });
    }
    snapshot.numa.sort_by_key(|n| n.id);
}

/// Reads `<root>/module/<driver>/version`, if the module exports one.
pub fn module_version(root: &Path, driver: &str) -> Option<String> {
    read_trimmed(&root.join("module").join(driver).join("version")).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_reject_garbage() {
        assert_eq!(parse_numa_node("-1"), None);
        assert_eq!(parse_numa_node("1\n"), Some(1));
        assert_eq!(parse_numa_node("zero"), None);
        assert_eq!(parse_rate_gbits("400 Gb/sec (4X NDR)"), Some(400.0));
        assert_eq!(parse_rate_gbits("2.5 Gb/sec (1X SDR)"), Some(2.5));
        assert_eq!(parse_rate_gbits("fast"), None);
        assert_eq!(parse_rate_gbits("-5 Gb/sec"), None);
        assert_eq!(parse_rate_gbits("inf Gb/sec"), None);
        assert_eq!(parse_node_meminfo("Node 0 MemTotal:       1024 kB\nNode 0 MemFree: 1 kB"), Some(1 << 20));
        assert_eq!(parse_node_meminfo("Node 0 MemTotal: lots"), None);
        assert_eq!(parse_node_meminfo("Node 0 MemTotal: 99999999999999999999 kB"), None);
    }

    #[test]
    fn max_payload_walk_survives_loops_and_truncation() {
        let mut looping = vec![0u8; 256];
        looping[0x06] = 0x10;
        looping[0x34] = 0x40;
        looping[0x40] = 0x05; // MSI
        looping[0x41] = 0x40; // points at itself
        assert_eq!(parse_max_payload(&looping), None);
        assert_eq!(parse_max_payload(&looping[..0x30]), None);
        assert_eq!(parse_max_payload(&[]), None);
    }

    #[test]
    fn pci_path_drops_non_pci_tail() {
        let path =
            PciPath::from_components(["pci0000:00", "0000:00:03.0", "virtio0", "net", "eth0"]).unwrap();
        assert_eq!(path.host_bridge, "pci0000:00");
        assert_eq!(path.functions, vec!["0000:00:03.0".to_string()]);
        assert!(PciPath::from_components(["virtual", "net", "lo"]).is_none());
        assert!(PciPath::from_components(["pci0000:00"]).is_none());
    }

    #[test]
    fn unusable_roots_are_errors() {
        assert!(matches!(
            read_sysfs(Path::new("/nonexistent/rdma-hint")),
            Err(DiscoveryError::RootUnreadable { .. })
        ));
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(matches!(read_sysfs(file.path()), Err(DiscoveryError::NotADirectory(_))));
    }

    #[test]
    fn empty_root_is_a_warning_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = read_sysfs(dir.path()).unwrap();
        assert!(snapshot.pci.is_empty());
        assert!(!snapshot.warnings.is_empty());
    }

    #[test]
    fn garbled_function_is_skipped_with_warning() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let function = root.join("devices/pci0000:00/0000:00:01.0");
        fs::create_dir_all(&function).unwrap();
        fs::write(function.join("class"), "not hex").unwrap();
        fs::write(function.join("vendor"), "0x10de").unwrap();
        fs::write(function.join("device"), "0x2335").unwrap();
        fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:01.0",
            root.join("bus/pci/devices/0000:00:01.0"),
        )
        .unwrap();
        // A dangling link: skipped too.
        std::os::unix::fs::symlink("../../../devices/nowhere", root.join("bus/pci/devices/0000:00:02.0"))
            .unwrap();
        let snapshot = read_sysfs(root).unwrap();
        assert!(snapshot.pci.is_empty());
        assert_eq!(snapshot.warnings.len(), 2, "{:?}", snapshot.warnings);
    }

    /// An attribute that is a link (to a device node, or to any file) is not opened: a real
    /// sysfs attribute never is one, and opening some devices has effects of its own.
    #[test]
    fn attributes_behind_links_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        fs::write(&real, "0x020000").unwrap();
        let link = dir.path().join("class");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(read_trimmed(&real).as_deref(), Some("0x020000"));
        assert_eq!(read_trimmed(&link), None, "read through a link");
        std::os::unix::fs::symlink("/dev/tty", dir.path().join("tty")).unwrap();
        assert_eq!(read_trimmed(&dir.path().join("tty")), None);
    }
}
