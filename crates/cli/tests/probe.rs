//! The `rdma-hint probe` command, run as a process.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sysfs").join(name)
}

fn rdma_hint(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-hint")).args(args).output().unwrap()
}

fn probe_json(args: &[&str]) -> Value {
    let output = rdma_hint(&[&["probe", "--json"], args].concat());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn check_hints(report: &Value) {
    let hints = report["hints"].as_array().unwrap();
    assert!(!hints.is_empty());
    for hint in hints {
        let block = hint["block_bytes"].as_u64().unwrap();
        let align = hint["align_bytes"].as_u64().unwrap();
        assert!(block > 0 && align.is_power_of_two() && block % align == 0, "{hint}");
        for key in
            ["source", "transport", "class", "predicted_gbps", "predicted_latency_us", "origin", "reasons"]
        {
            assert!(!hint[key].is_null(), "hint lacks {key}: {hint}");
        }
        assert!(!hint["reasons"].as_array().unwrap().is_empty());
    }
}

#[test]
fn live_probe_prints_host_hints_and_says_why_others_are_absent() {
    let report = probe_json(&[]);
    check_hints(&report);
    let hints = report["hints"].as_array().unwrap();
    assert!(hints.iter().any(|h| h["source"] == "host:0" && h["transport"] == "staged:tcp"));
    let absent = report["absent"].as_array().unwrap();
    assert!(absent.iter().any(|a| a["component"] == "verbs"), "no word on verbs");
    if cfg!(feature = "ucx") {
        // UCX's own estimate for each scope, with the lanes it picked.
        for id in ["ucx:shm", "ucx:tcp"] {
            assert!(hints.iter().any(|h| h["source"] == "host:0" && h["transport"] == id), "no {id} hint");
            let details = report["details"].as_array().unwrap();
            assert!(details
                .iter()
                .any(|d| d["transport"] == id && d["detail"].as_str().unwrap().contains("lanes")));
        }
    } else {
        assert!(absent.iter().any(|a| a["component"] == "ucx"), "no word on ucx");
    }
}

#[test]
fn fixture_probe_classifies_every_pair() {
    let root = fixture("dgx-like");
    let report = probe_json(&["--sysfs-root", root.to_str().unwrap()]);
    check_hints(&report);
    let class = |source: &str, nic: &str| {
        report["paths"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["source"] == source && p["nic"] == nic)
            .map(|p| p["class"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(class("gpu:0", "mlx5_0"), "PIX");
    assert_eq!(class("gpu:2", "mlx5_0"), "NODE");
    assert_eq!(class("gpu:3", "mlx5_0"), "SYS");
    assert_eq!(class("host:1", "mlx5_2"), "PHB");
    let sources = report["sources"].as_array().unwrap();
    assert_eq!(sources.iter().filter(|s| s["kind"] == "gpu").count(), 4);
    assert_eq!(sources[2]["pci"], "0000:03:00.0");
    assert_eq!(report["nics"][0]["name"], "mlx5_0");
    assert_eq!(report["nics"][0]["numa"], 0);
}

#[test]
fn text_report_has_every_section() {
    let root = fixture("gpu-behind-switch");
    let output = rdma_hint(&["probe", "--sysfs-root", root.to_str().unwrap()]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    for section in ["## Memory sources", "## NICs", "## Path matrix", "## Hints", "## Not available here"] {
        assert!(text.contains(section), "missing {section}:\n{text}");
    }
    assert!(text.contains("PXB") && text.contains("GB/s") && text.contains("µs"));
}

#[test]
fn unreadable_root_is_a_one_line_error() {
    let output = rdma_hint(&["probe", "--sysfs-root", "/nonexistent/sysfs"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.starts_with("rdma-hint: cannot read sysfs root"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1);
}

/// A binary built with the `verbs` feature starts where libibverbs cannot be loaded and says so.
/// Where rdma-core is installed the library is hidden for this one run (as root: a private mount
/// namespace with /dev/null bound over it); without root and with rdma-core present, it skips.
#[cfg(feature = "verbs")]
#[test]
fn without_libibverbs_the_binary_starts_and_says_so() {
    let binary = env!("CARGO_BIN_EXE_rdma-hint");
    let library = [
        "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
        "/usr/lib64/libibverbs.so.1",
        "/usr/lib/libibverbs.so.1",
    ]
    .into_iter()
    .find(|path| std::path::Path::new(path).exists())
    .map(|path| std::fs::canonicalize(path).unwrap());
    let output = match library {
        None => std::process::Command::new(binary).arg("probe").output().unwrap(),
        Some(library) => {
            let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
                s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
            });
            if !root {
                eprintln!("skipped: hiding the installed libibverbs needs root");
                return;
            }
            let script = format!("mount --bind /dev/null {} && exec {binary} probe", library.display());
            std::process::Command::new("unshare").args(["-m", "sh", "-c", &script]).output().unwrap()
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() && stderr.starts_with("unshare:") {
        eprintln!("skipped: this container cannot make a mount namespace ({stderr})");
        return;
    }
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("no libibverbs"), "{stdout}");
    assert!(stdout.contains("staged:tcp"), "host hints still there: {stdout}");
}

/// A hostile `--sysfs-root`: a PCI function whose `class` is a fifo nobody writes and whose
/// `config` links to `/dev/zero`. Probe skips the function and answers within seconds under a
/// 1 GiB address-space limit (before, the fifo blocked probe for ever and `/dev/zero` was read
/// until memory ran out).
#[test]
fn a_hostile_sysfs_tree_neither_blocks_nor_exhausts_probe() {
    let root = common::scratch("probe", "hostile-sysfs");
    let function = root.join("devices/pci0000:00/0000:00:01.0");
    std::fs::create_dir_all(&function).unwrap();
    assert!(Command::new("mkfifo").arg(function.join("class")).status().unwrap().success());
    std::fs::write(function.join("vendor"), "0x15b3").unwrap();
    std::fs::write(function.join("device"), "0x1021").unwrap();
    std::os::unix::fs::symlink("/dev/zero", function.join("config")).unwrap();
    let second = root.join("devices/pci0000:00/0000:00:02.0");
    std::fs::create_dir_all(&second).unwrap();
    for (name, value) in [("class", "0x020000"), ("vendor", "0x15b3"), ("device", "0x1021")] {
        std::fs::write(second.join(name), value).unwrap();
    }
    std::os::unix::fs::symlink("/dev/zero", second.join("config")).unwrap();
    std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
    for name in ["0000:00:01.0", "0000:00:02.0"] {
        let target = format!("../../../devices/pci0000:00/{name}");
        std::os::unix::fs::symlink(target, root.join("bus/pci/devices").join(name)).unwrap();
    }
    let probe = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_rdma-hint"))
        .args(["probe", "--json", "--sysfs-root", root.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = common::output_within(probe, "probe over a hostile sysfs tree", Duration::from_secs(30));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let text = report.to_string();
    assert!(text.contains("skipped PCI function 0000:00:01.0"), "{text}");
    let _ = std::fs::remove_dir_all(root);
}
