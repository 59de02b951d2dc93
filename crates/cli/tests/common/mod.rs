//! What the CLI's end-to-end tests share: the binary with a hint cache of its own, and a fresh
//! scratch directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `rdma-hint ARGS` with `cache` as its hint cache.
pub(crate) fn rdma_hint(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-hint"))
        .env("RDMA_HINT_CACHE_DIR", cache)
        .args(args)
        .output()
        .unwrap()
}

/// An empty directory `rdma-hint-SUITE-NAME-PID` under the temp directory.
pub(crate) fn scratch(suite: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rdma-hint-{suite}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
