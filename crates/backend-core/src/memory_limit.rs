//! How much memory a registration may commit, asked before anything is allocated.
//!
//! A region a transport allocates is committed memory (page-locked, shared or touched), and
//! memory the kernel has to find for a request past what is free is taken from whatever its OOM
//! killer picks: on a shared machine, somebody else's job. So every registration of memory the
//! transport allocates is checked first against the smallest of
//! - the machine's `MemAvailable` (`/proc/meminfo`),
//! - every memory cgroup this process sits in, up to the root (v1 `memory.limit_in_bytes`,
//!   v2 `memory.max`, less what each already uses that it could not reclaim),
//!
//! less a margin ([`margin_bytes`]) left for everybody else, and against the transport's own
//! cap when one is set. A refusal is [`TransportError::OutOfMemory`], saying how much there is.

use rdma_hint_core::TransportError;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The most of a kernel file this module reads (mountinfo on a busy host is the largest).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// What may be committed now, in bytes, and what sets that figure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committable {
    /// Bytes a registration may commit now (the margin already taken off).
    pub bytes: u64,
    /// The limit that sets `bytes`: `"MemAvailable"` or a cgroup with its path.
    pub limited_by: String,
}

/// Bytes kept free for the rest of the machine out of `free` bytes: 1/16 of it, at least 64 MiB.
///
/// ```
/// use rdma_hint_backend_core::memory_limit::margin_bytes;
/// assert_eq!(margin_bytes(1 << 30), 64 << 20);
/// assert_eq!(margin_bytes(16 << 30), 1 << 30);
/// ```
pub fn margin_bytes(free: u64) -> u64 {
    (free / 16).max(64 << 20)
}

/// What this process may commit now; `None` where nothing can be read (no `/proc`): then no
/// machine limit is applied, only the transport's cap.
pub fn committable() -> Option<Committable> {
    let mut best: Option<(u64, String)> =
        mem_available().map(|bytes| (bytes, "the machine's MemAvailable".to_string()));
    for (free, limited_by) in cgroup_headroom() {
        if best.as_ref().is_none_or(|(bytes, _)| free < *bytes) {
            best = Some((free, limited_by));
        }
    }
    best.map(|(free, limited_by)| Committable { bytes: free.saturating_sub(margin_bytes(free)), limited_by })
}

/// `Ok` if `len` more bytes may be committed: within `cap` (bytes the transport may hold
/// at once, of which `held` are held) and within what the machine and cgroups can spare.
///
/// ```
/// use rdma_hint_core::TransportError;
/// use rdma_hint_backend_core::memory_limit::check_commit;
/// assert!(check_commit(4096, None, 0).is_ok());
/// let refused = check_commit(4096, Some(8192), 6144).unwrap_err();
/// assert!(matches!(refused, TransportError::OutOfMemory { available: 2048, .. }), "{refused}");
/// assert!(check_commit(1 << 60, None, 0).is_err()); // an exabyte is never free
/// ```
pub fn check_commit(len: u64, cap: Option<u64>, held: u64) -> Result<(), TransportError> {
    if let Some(cap) = cap {
        let available = cap.saturating_sub(held);
        if len > available {
            let limited_by = format!("the transport's memory cap of {cap} B, {held} B of it held");
            return Err(TransportError::OutOfMemory { len, available, limited_by });
        }
    }
    if let Some(Committable { bytes, limited_by }) = committable() {
        if len > bytes {
            let limited_by = format!("{limited_by}, less a margin for the rest of the machine");
            return Err(TransportError::OutOfMemory { len, available: bytes, limited_by });
        }
    }
    Ok(())
}

fn read_bounded(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path).ok()?.take(MAX_FILE_BYTES).read_to_string(&mut text).ok()?;
    Some(text)
}

fn mem_available() -> Option<u64> {
    let meminfo = read_bounded(Path::new("/proc/meminfo"))?;
    let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Free bytes under each memory cgroup this process belongs to (each level up to the root of
/// its hierarchy), with a name for the limit.
fn cgroup_headroom() -> Vec<(u64, String)> {
    let (Some(membership), Some(mounts)) =
        (read_bounded(Path::new("/proc/self/cgroup")), read_bounded(Path::new("/proc/self/mountinfo")))
    else {
        return Vec::new();
    };
    let mut headroom = Vec::new();
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let version = match controllers {
            "" => Version::V2,
            list if list.split(',').any(|c| c == "memory") => Version::V1,
            _ => continue,
        };
        let Some((root, mount_point)) = mount_of(&mounts, version) else { continue };
        // The mount may show a subtree of the hierarchy (a container's): the part of our path
        // below its root is where our cgroup sits under the mount point.
        let Some(below) = path.strip_prefix(root.as_str()) else { continue };
        let mut directory = mount_point.join(below.trim_start_matches('/'));
        loop {
            if let Some(free) = version.free_bytes(&directory) {
                headroom.push((free, format!("the memory cgroup {}", directory.display())));
            }
            if directory == mount_point || !directory.pop() {
                break;
            }
        }
    }
    headroom
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

impl Version {
    /// The limit less what is used and cannot be reclaimed (inactive file pages can), or `None`
    /// where this level sets no limit.
    fn free_bytes(self, directory: &Path) -> Option<u64> {
        let number = |name: &str| read_bounded(&directory.join(name))?.trim().parse::<u64>().ok();
        let (limit, usage, reclaimable) = match self {
            Version::V1 => {
                (number("memory.limit_in_bytes")?, number("memory.usage_in_bytes")?, "total_inactive_file")
            }
            // "max" does not parse: no limit at this level.
            Version::V2 => (number("memory.max")?, number("memory.current")?, "inactive_file"),
        };
        // v1 reports "no limit" as a huge page-rounded number.
        if limit >= 1 << 62 {
            return None;
        }
        let stat = read_bounded(&directory.join("memory.stat")).unwrap_or_default();
        let inactive = stat
            .lines()
            .find_map(|line| line.strip_prefix(reclaimable)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
            .unwrap_or(0);
        Some(limit.saturating_sub(usage.saturating_sub(inactive)))
    }
}

/// The root and mount point of the memory hierarchy of `version` in `mountinfo`.
fn mount_of(mountinfo: &str, version: Version) -> Option<(String, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        let (mount, filesystem) = line.split_once(" - ")?;
        let mut fields = mount.split_whitespace();
        let root = fields.nth(3)?;
        let mount_point = fields.next()?;
        let mut filesystem = filesystem.split_whitespace();
        let matches = match (version, filesystem.next()?) {
            (Version::V2, "cgroup2") => true,
            (Version::V1, "cgroup") => filesystem.nth(1)?.split(',').any(|option| option == "memory"),
            _ => false,
        };
        matches.then(|| (root.to_string(), PathBuf::from(mount_point)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_names_each_hierarchy() {
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu
32 25 0:28 /container /sys/fs/cgroup/unified rw,relatime shared:11 - cgroup2 cgroup2 rw
";
        assert_eq!(mount_of(mountinfo, Version::V1), Some(("/".into(), "/sys/fs/cgroup/memory".into())));
        assert_eq!(
            mount_of(mountinfo, Version::V2),
            Some(("/container".into(), "/sys/fs/cgroup/unified".into()))
        );
        assert_eq!(mount_of("31 25 0:27 / /x rw - cgroup cgroup rw,cpu\n", Version::V1), None);
    }

    #[test]
    fn the_machine_has_a_positive_figure_below_its_memory() {
        let committable = committable().expect("this is Linux with /proc");
        assert!(committable.bytes > 0 && committable.bytes < mem_available().unwrap(), "{committable:?}");
    }
}
