//! What this process holds, for leak and soak tests.

/// Entries of `dir` whose names start with `prefix` (0 when `dir` cannot be read).
pub fn count_entries(dir: &str, prefix: &str) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    count_entries("/proc/self/fd", "")
}

/// Threads of this process. The library's one deadline-timer thread is started first: it lives
/// for the whole process, so counting it only after its first use would read as a leak.
pub fn threads() -> usize {
    rdma_hint_toolkit::timer::ensure_started();
    count_entries("/proc/self/task", "")
}

/// Resident memory of this process in KiB (`VmRSS`).
pub fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
