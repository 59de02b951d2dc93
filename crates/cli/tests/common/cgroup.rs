//! A memory cgroup of the test's own, so a test of a shortage is safe where the fix is absent:
//! the child can take no more than the cgroup's limit, whatever the code under test does.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A cgroup limited to `limit_bytes` for a test named `name`, or `None` (the test skips, saying
/// why) where none can be made: not root, or no memory controller. CI runs as root and sets
/// `RDMA_HINT_REQUIRE_NETNS`, so there it must be made.
pub(crate) fn small_cgroup(name: &str, limit_bytes: u64) -> Option<SmallCgroup> {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")));
    let why = match is_root.then(|| SmallCgroup::new(name, limit_bytes)) {
        Some(Ok(cgroup)) => return Some(cgroup),
        Some(Err(why)) => why,
        None => "creating a memory cgroup needs root".into(),
    };
    assert!(std::env::var_os("RDMA_HINT_REQUIRE_NETNS").is_none(), "a memory cgroup: {why}");
    eprintln!("skipped: {why} (CI runs it as root)");
    None
}

/// A memory cgroup of our own under the one this process is in, with a memory limit; removed
/// on drop.
pub(crate) struct SmallCgroup {
    directory: PathBuf,
    version: u8,
}

impl SmallCgroup {
    /// Creates it, limited to `limit_bytes` (v1's memory hierarchy, or v2 where its memory controller can be enabled
    /// for our cgroup's children), or says why it cannot.
    pub(crate) fn new(name: &str, limit_bytes: u64) -> Result<SmallCgroup, String> {
        let membership = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let v1 = membership.lines().find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers.split(',').any(|c| c == "memory").then(|| path.to_string())
        });
        let attempt = |base: PathBuf, version: u8| -> Result<SmallCgroup, String> {
            let directory = base.join(format!("rdma-hint-test-{name}-{}", std::process::id()));
            std::fs::create_dir(&directory).map_err(|e| format!("{}: {e}", directory.display()))?;
            let cgroup = SmallCgroup { directory, version };
            let limit = if version == 1 { "memory.limit_in_bytes" } else { "memory.max" };
            std::fs::write(cgroup.directory.join(limit), limit_bytes.to_string())
                .map_err(|e| format!("{limit}: {e}"))?;
            // No swap to spill into: a v2 child past memory.max would swap instead of failing.
            if version == 2 {
                let _ = std::fs::write(cgroup.directory.join("memory.swap.max"), "0");
            }
            Ok(cgroup)
        };
        if let Some(path) = v1 {
            let base = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
            if base.is_dir() {
                return attempt(base, 1);
            }
        }
        let path = membership.lines().find_map(|line| line.strip_prefix("0::")).ok_or("no cgroup v2")?;
        for mount in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let base = Path::new(mount).join(path.trim_start_matches('/'));
            let controllers = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == "memory") {
                let _ = std::fs::write(base.join("cgroup.subtree_control"), "+memory");
                return attempt(base, 2);
            }
        }
        Err("neither a v1 memory hierarchy nor a v2 memory controller here".into())
    }

    fn number(&self, file: &str, key: Option<&str>) -> u64 {
        let text = std::fs::read_to_string(self.directory.join(file)).unwrap();
        let value = match key {
            Some(key) => text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')).unwrap(),
            None => text.trim(),
        };
        value.trim().parse().unwrap()
    }

    /// Processes the kernel's OOM killer ended in this cgroup.
    pub(crate) fn oom_kills(&self) -> u64 {
        match self.version {
            1 => self.number("memory.oom_control", Some("oom_kill")),
            _ => self.number("memory.events", Some("oom_kill")),
        }
    }

    /// The most memory the cgroup ever held, in bytes.
    pub(crate) fn peak_bytes(&self) -> u64 {
        match self.version {
            1 => self.number("memory.max_usage_in_bytes", None),
            _ => self.number("memory.peak", None),
        }
    }

    /// `rdma-hint ARGS` inside this cgroup.
    pub(crate) fn run(&self, cache: &Path, args: &[&str]) -> std::process::Output {
        let procs = self.directory.join("cgroup.procs");
        Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > '{}' && exec \"$0\" \"$@\"", procs.display()))
            .arg(env!("CARGO_BIN_EXE_rdma-hint"))
            .args(args)
            .env("RDMA_HINT_CACHE_DIR", cache)
            .output()
            .unwrap()
    }
}

impl Drop for SmallCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.directory);
    }
}
