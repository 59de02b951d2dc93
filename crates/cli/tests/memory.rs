//! Memory a run may commit, as processes: a request past what the process's memory cgroup
//! holds is refused before anything is committed (before this check the shm memfd was
//! committed with `posix_fallocate` until the kernel's OOM killer ended the process, or on a
//! machine without a cgroup limit, whatever other process it picked), a sweep allocates
//! nothing past the registrations that were checked, and `--memory-cap` bounds everything a
//! sweep allocates.
//!
//! The shortage is made safe to show: the child runs in a memory cgroup of its own with a
//! limit of 256 MiB, so even code without the check could take no more than that.

mod common;

use common::cgroup::small_cgroup;
use common::{rdma_hint, scratch};

const LIMIT_BYTES: u64 = 256 << 20;

use common::text;

/// A 320 MiB shm sweep in a 256 MiB cgroup: the typed error, naming the cgroup, before a page
/// of the region is committed (the cgroup's peak stays far below the request) and without an
/// OOM kill; then a 48 MiB sweep in the same cgroup runs and verifies its bytes (the check
/// does not refuse what fits).
#[test]
fn a_sweep_past_its_memory_cgroup_is_refused_before_anything_is_committed() {
    let Some(cgroup) = small_cgroup("oom", LIMIT_BYTES) else { return };
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

/// `--memory-cap` bounds what a sweep allocates: a 32 MiB transfer under a 16 MiB cap is
/// refused before it starts, naming the flag; under a 64 MiB cap (source and target) it runs.
#[test]
fn memory_cap_bounds_what_a_sweep_allocates() {
    let dir = scratch("memory", "cap");
    let sweep = |cap: &str| {
        let args = ["sweep", "--channel", "tcp", "--sizes", "64K", "--transfer", "32M", "--memory-cap", cap];
        rdma_hint(&dir, &[&args[..], &["--iters", "1", "--latency-samples", "3", "--no-record"]].concat())
    };
    let refused = sweep("16M");
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("--memory-cap 16 MiB"), "{}", text(&refused.stderr));
    let runs = sweep("64M");
    assert!(runs.status.success(), "{}", text(&runs.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// A loopback sweep of 90 MiB in a 256 MiB cgroup: both registrations fit, and nothing else
/// of that size is allocated, so it runs to the end (before, the source was filled from a
/// 90 MiB `Vec` allocated after the checks: the OOM killer ended it).
#[test]
fn a_sweep_allocates_nothing_past_what_was_checked() {
    let Some(cgroup) = small_cgroup("unchecked", LIMIT_BYTES) else { return };
    let dir = scratch("memory", "unchecked");
    let args = ["sweep", "--channel", "shm", "--sizes", "1M", "--transfer", "90M", "--iters", "1"];
    let swept = cgroup.run(&dir, &[&args[..], &["--latency-samples", "3", "--no-record"]].concat());
    assert!(swept.status.success(), "{}", text(&swept.stderr));
    assert_eq!(cgroup.oom_kills(), 0, "the OOM killer ran in the cgroup");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--memory-cap` bounds the whole sweep, not each transport: a loopback sweep of 32 MiB
/// registers a source and a target (64 MiB), refused under a 48 MiB cap naming the flag
/// (before, each transport checked its own 32 MiB against the cap and both passed).
#[test]
fn memory_cap_bounds_the_whole_sweep() {
    let dir = scratch("memory", "whole-cap");
    let sweep = |cap: &str| {
        let args = ["sweep", "--channel", "shm", "--sizes", "64K", "--transfer", "32M", "--memory-cap", cap];
        rdma_hint(&dir, &[&args[..], &["--iters", "1", "--latency-samples", "3", "--no-record"]].concat())
    };
    let refused = sweep("48M");
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--memory-cap 48 MiB") && stderr.contains("64 MiB in all"), "{stderr}");
    let runs = sweep("72M");
    assert!(runs.status.success(), "{}", text(&runs.stderr));
    let _ = std::fs::remove_dir_all(dir);
}
