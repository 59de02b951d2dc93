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
    rdma_hint_backend_core::timer::ensure_started();
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

/// What this process holds, by kind: each open descriptor's target (`socket`, `anon_inode:[eventfd]`,
/// `/dev/infiniband/uverbs0`; socket and pipe inode numbers dropped) and each thread's name,
/// sorted. A leak check names what changed, not only how many.
pub fn held() -> Vec<String> {
    let mut held = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").into_iter().flatten().flatten() {
        if let Ok(target) = std::fs::read_link(entry.path()) {
            let target = target.to_string_lossy().into_owned();
            let kind = match target.split_once(":[") {
                Some((kind @ ("socket" | "pipe"), _)) => kind.to_owned(),
                _ => target,
            };
            held.push(format!("fd {kind}"));
        }
    }
    for entry in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        if let Ok(name) = std::fs::read_to_string(entry.path().join("comm")) {
            held.push(format!("thread {}", name.trim_end()));
        }
    }
    held.sort();
    held
}

/// Each kind of thing whose count differs between two [`held`] lists, as
/// `"fd socket: 0 -> 1"` (before -> after).
pub fn held_change(before: &[String], after: &[String]) -> Vec<String> {
    let count = |list: &[String], item: &String| list.iter().filter(|x| *x == item).count();
    let mut items: Vec<&String> = before.iter().chain(after).collect();
    items.sort();
    items.dedup();
    items
        .into_iter()
        .filter_map(|item| {
            let (was, now) = (count(before, item), count(after, item));
            (was != now).then(|| format!("{item}: {was} -> {now}"))
        })
        .collect()
}
