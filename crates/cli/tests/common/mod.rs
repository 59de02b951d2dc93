//! What the CLI's end-to-end tests share: the binary with a hint cache of its own, a fresh
//! scratch directory, a free loopback port, and a wait for a child process with a deadline.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

pub(crate) mod cgroup;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The `--budget-ms` of the tests' calibrations: one no busy machine makes too short (the
/// default second fitted 2 rounds over staged:tcp beside test-all's four busy loops on two
/// cores, and was refused as "a path this slow"), where an idle machine stops at the
/// calibration's round cap long before it.
pub(crate) const CALIBRATION_BUDGET_MS: &str = "10000";

/// Runs `rdma-hint ARGS` with `cache` as its hint cache.
pub(crate) fn rdma_hint(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-hint"))
        .env("RDMA_HINT_CACHE_DIR", cache)
        .args(args)
        .output()
        .unwrap()
}

/// An empty directory `rdma-hint-SUITE-NAME-PID` under the temp directory, removed when the
/// guard goes, a failing test's included (a panic unwinds through it).
pub(crate) fn scratch(suite: &str, name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("rdma-hint-{suite}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A test's scratch directory (see [`scratch`]).
#[derive(Debug)]
pub(crate) struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback address with a port nobody listens on now.
pub(crate) fn free_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("127.0.0.1:{port}")
}

/// The output of `child` (started with piped stdout and stderr), which must end within
/// `limit`: past it the child is killed and the test fails, naming `what`.
pub(crate) fn output_within(child: Child, what: &str, limit: Duration) -> Output {
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || done.send(child.wait_with_output().unwrap()).unwrap());
    let output = finished.recv_timeout(limit).unwrap_or_else(|_| {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        panic!("{what} still ran after {limit:?}");
    });
    waiter.join().unwrap();
    output
}

/// `rdma-hint serve --listen ADDRESS --bytes 4M` (and `--timeout-s 60` unless `extra` sets
/// one) with `dir` as its cache, once it listens (its first line of output says so).
pub(crate) fn serve(dir: &Path, address: &str, extra: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-hint"))
        .env("RDMA_HINT_CACHE_DIR", dir)
        .args(["serve", "--listen", address, "--bytes", "4M"])
        .args(if extra.contains(&"--timeout-s") { &[][..] } else { &["--timeout-s", "60"][..] })
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    child
}

/// Bytes a process printed, as text.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether this test runs as root; if not, says it skipped (and fails where CI requires root).
pub(crate) fn running_as_root(needs: &str) -> bool {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")));
    if !is_root {
        assert!(std::env::var_os("RDMA_HINT_REQUIRE_NETNS").is_none(), "{needs} needs root");
        eprintln!("skipped: {needs} needs root (CI runs it as root)");
    }
    is_root
}
