//! Memory a run may commit, as processes: a request past what the process's memory cgroup
//! holds is refused before anything is committed (before this check the shm memfd was
//! committed with `posix_fallocate` until the kernel's OOM killer ended the process, or on a
//! machine without a cgroup limit, whatever other process it picked), and `--memory-cap`
//! bounds what one transport allocates.
//!
//! The shortage is made safe to show: the child runs in a memory cgroup of its own with a
//! limit of 256 MiB, so even code without the check could take no more than that.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{rdma_hint, scratch};

const LIMIT_BYTES: u64 = 256 << 20;

/// A memory cgroup of our own under the one this process is in, limited to [`LIMIT_BYTES`];
/// removed on drop.
struct SmallCgroup {
    directory: PathBuf,
    version: u8,
}

impl SmallCgroup {
    /// Creates it (v1's memory hierarchy, or v2 where its memory controller can be enabled
    /// for our cgroup's children), or says why it cannot.
    fn new(name: &str) -> Result<SmallCgroup, String> {
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
            std::fs::write(cgroup.directory.join(limit), LIMIT_BYTES.to_string())
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
    fn oom_kills(&self) -> u64 {
        match self.version {
            1 => self.number("memory.oom_control", Some("oom_kill")),
            _ => self.number("memory.events", Some("oom_kill")),
        }
    }

    /// The most memory the cgroup ever held, in bytes.
    fn peak_bytes(&self) -> u64 {
        match self.version {
            1 => self.number("memory.max_usage_in_bytes", None),
            _ => self.number("memory.peak", None),
        }
    }

    /// `rdma-hint ARGS` inside this cgroup.
    fn run(&self, cache: &Path, args: &[&str]) -> std::process::Output {
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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A 320 MiB shm sweep in a 256 MiB cgroup: the typed error, naming the cgroup, before a page
/// of the region is committed (the cgroup's peak stays far below the request) and without an
/// OOM kill; then a 48 MiB sweep in the same cgroup runs and verifies its bytes (the check
/// does not refuse what fits).
#[test]
fn a_sweep_past_its_memory_cgroup_is_refused_before_anything_is_committed() {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")));
    let cgroup = match is_root.then(|| SmallCgroup::new("oom")) {
        Some(Ok(cgroup)) => cgroup,
        why => {
            let why = match why {
                Some(Err(why)) => why,
                _ => "creating a memory cgroup needs root".into(),
            };
            assert!(std::env::var_os("RDMA_HINT_REQUIRE_NETNS").is_none(), "a memory cgroup: {why}");
            eprintln!("skipped: {why} (CI runs it as root)");
            return;
        }
    };
    let dir = scratch("memory", "cgroup");
    let sweep = |transfer: &str| {
        let args = ["sweep", "--channel", "shm", "--sizes", "64K", "--transfer", transfer];
        cgroup.run(&dir, &[&args[..], &["--iters", "1", "--latency-samples", "3", "--no-record"]].concat())
    };
    let refused = sweep("320M");
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("can be committed") && stderr.contains("memory cgroup"), "{stderr}");
    assert_eq!(cgroup.oom_kills(), 0, "the OOM killer ran in the cgroup");
    let peak = cgroup.peak_bytes();
    assert!(peak < 64 << 20, "the cgroup peaked at {peak} B before the refusal");

    let fits = sweep("48M");
    assert!(fits.status.success(), "{}", text(&fits.stderr));
    assert_eq!(cgroup.oom_kills(), 0, "the OOM killer ran in the cgroup");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--memory-cap` bounds what one transport allocates: a 32 MiB transfer under a 16 MiB cap
/// is refused before it starts, saying so; under a 64 MiB cap it runs.
#[test]
fn memory_cap_bounds_what_a_sweep_allocates() {
    let dir = scratch("memory", "cap");
    let sweep = |cap: &str| {
        let args = ["sweep", "--channel", "tcp", "--sizes", "64K", "--transfer", "32M", "--memory-cap", cap];
        rdma_hint(&dir, &[&args[..], &["--iters", "1", "--latency-samples", "3", "--no-record"]].concat())
    };
    let refused = sweep("16M");
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("memory cap of 16777216 B"), "{}", text(&refused.stderr));
    let runs = sweep("64M");
    assert!(runs.status.success(), "{}", text(&runs.stderr));
    let _ = std::fs::remove_dir_all(dir);
}
