//! The hint cache as a trust boundary, attacked through the files a user who can write the
//! cache directory plants there, as processes: no write follows a planted link, no read blocks
//! on a fifo or swallows an endless file, a recorded knee past every bound is ignored (never a
//! zero or absurd hint), a directory others can write is not used, and an empty or relative
//! cache variable is ignored.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;

fn scratch(name: &str) -> common::Scratch {
    common::scratch("cache", name)
}

/// `rdma-hint ARGS` with `cache` as its hint cache, under a memory limit, killed (and the test
/// failed) if it runs past `limit`.
fn bounded(cache: &Path, args: &[&str], limit: Duration) -> Output {
    let child = Command::new("sh")
        .arg("-c")
        // 2 GiB of address space: a reader that swallowed an endless file fails here instead of
        // taking the machine's memory.
        .arg("ulimit -v 2097152; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_rdma-hint"))
        .args(args)
        .env("RDMA_HINT_CACHE_DIR", cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::output_within(child, &format!("rdma-hint {args:?}"), limit)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

const SWEEP: [&str; 9] =
    ["sweep", "--sizes", "16K..2M", "--transfer", "4M", "--iters", "1", "--latency-samples", "3"];

/// The staged:shm hint of host:0 as `probe --json` reports it.
fn probe_hint(cache: &Path) -> Value {
    let output = bounded(cache, &["probe", "--json"], Duration::from_secs(60));
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    report["hints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["source"] == "host:0" && h["transport"] == "staged:shm")
        .unwrap()
        .clone()
}

#[test]
fn a_planted_link_is_never_written_through() {
    let cache = scratch("link");
    let victim = cache.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    // The names the old writer used, and the files themselves.
    for name in ["measured.json.tmp", "calibrated.json.tmp", "calibrated.json"] {
        std::os::unix::fs::symlink(&victim, cache.join(name)).unwrap();
    }
    let output = bounded(&cache, &SWEEP, Duration::from_secs(120));
    assert!(output.status.success(), "{}", stderr(&output));
    let calibrate = bounded(
        &cache,
        &["calibrate", "--budget-ms", common::CALIBRATION_BUDGET_MS],
        Duration::from_secs(120),
    );
    assert!(calibrate.status.success(), "{}", stderr(&calibrate));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "a write went through a planted link");
    let measured = cache.join("measured.json");
    if measured.exists() {
        let metadata = std::fs::symlink_metadata(&measured).unwrap();
        assert!(metadata.is_file());
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o077,
            0,
            "readable by others"
        );
    }
    let _ = std::fs::remove_dir_all(cache);
}

/// A cache directory that is a link (to a directory of this user, mode 0700: what the old
/// check, which followed links, accepted) is not used: calibrate stores nothing through it
/// and says why (before, it stored `calibrated.json` wherever the link pointed).
#[test]
fn a_linked_cache_directory_is_not_used() {
    let base = scratch("linked-dir");
    let (real, link) = (base.join("real"), base.join("link"));
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let calibrate = bounded(
        &link,
        &["calibrate", "--budget-ms", common::CALIBRATION_BUDGET_MS],
        Duration::from_secs(120),
    );
    assert!(calibrate.status.success(), "{}", stderr(&calibrate));
    assert!(stderr(&calibrate).contains("a symbolic link"), "{}", stderr(&calibrate));
    assert!(!real.join("calibrated.json").exists(), "stored through a linked cache directory");
    let _ = std::fs::remove_dir_all(base);
}

/// A calibration entry whose figures are numbers but lie past what the model takes (`o` of
/// 2 s, `B` of 2 PB/s) is ignored with a warning naming the file: probe answers every path
/// (before, the path's hint failed with "invalid path profile" in probe, estimate and sweep).
#[test]
fn an_out_of_range_calibration_is_ignored_with_a_warning() {
    let cache = scratch("calibration-range");
    let file = cache.join("calibrated.json");
    // A busy machine can make a fit poor, and a poor fit is not kept: calibrate until one is.
    for _ in 0..5 {
        let calibrate = bounded(
            &cache,
            &["calibrate", "--budget-ms", common::CALIBRATION_BUDGET_MS],
            Duration::from_secs(120),
        );
        assert!(calibrate.status.success(), "{}", stderr(&calibrate));
        if file.exists() {
            break;
        }
    }
    let stored = std::fs::read(&file).expect("five calibrations in a row fitted poorly");
    for (field, value) in [("fixed_cost_us", 2e6), ("bandwidth_gbps", 2e6)] {
        let mut entries: Value = serde_json::from_slice(&stored).unwrap();
        for entry in entries.as_array_mut().unwrap() {
            entry[field] = Value::from(value);
        }
        std::fs::write(&file, serde_json::to_vec(&entries).unwrap()).unwrap();
        let probe = bounded(&cache, &["probe"], Duration::from_secs(60));
        assert!(probe.status.success(), "{field} {value}: {}", stderr(&probe));
        let report = String::from_utf8_lossy(&probe.stdout).into_owned();
        assert!(!report.contains("invalid path profile"), "{field} {value}: {report}");
        assert!(stderr(&probe).contains("invalid hint cache entry"), "{field} {value}: {}", stderr(&probe));
        assert!(probe_hint(&cache)["block_bytes"].as_u64().is_some_and(|b| b > 0), "{field} {value}");
    }
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn a_fifo_or_an_endless_file_is_not_read() {
    let cache = scratch("fifo");
    let fifo = cache.join("measured.json");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::os::unix::fs::symlink("/dev/zero", cache.join("calibrated.json")).unwrap();
    let output = bounded(&cache, &["probe"], Duration::from_secs(60));
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(text.contains("not a regular file") && text.contains("measured.json"), "{text}");
    assert!(text.contains("calibrated.json"), "{text}");
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn a_recorded_knee_past_every_bound_is_ignored_with_a_warning() {
    let cache = scratch("knee");
    let output = bounded(&cache, &SWEEP, Duration::from_secs(120));
    assert!(output.status.success(), "{}", stderr(&output));
    let file = cache.join("measured.json");
    if !file.exists() {
        // The sweep did not reach its plateau, so it recorded nothing to tamper with.
        assert!(String::from_utf8_lossy(&output.stdout).contains("recorded: nothing"));
        return;
    }
    for knee in [u64::MAX, 1 << 63, 16 << 30] {
        let mut entries: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        for entry in entries.as_array_mut().unwrap() {
            entry["knee_bytes"] = Value::from(knee);
        }
        std::fs::write(&file, serde_json::to_vec(&entries).unwrap()).unwrap();
        let hint = probe_hint(&cache);
        let block = hint["block_bytes"].as_u64().unwrap();
        assert!(block > 0 && block <= 64 << 20, "knee {knee}: answered {block} B");
        assert_eq!(hint["origin"], "model", "knee {knee}: {hint}");
        let probe = bounded(&cache, &["probe"], Duration::from_secs(60));
        assert!(stderr(&probe).contains("invalid hint cache entry"), "{}", stderr(&probe));
    }
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn a_directory_others_can_write_is_not_used() {
    let cache = scratch("shared");
    std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let output = bounded(&cache, &SWEEP, Duration::from_secs(120));
    let text = stderr(&output);
    assert!(
        text.contains("not using this hint cache directory") && text.contains("writable by others"),
        "{text}"
    );
    assert!(!cache.join("measured.json").exists(), "wrote into a directory others can write");
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn an_empty_or_relative_cache_variable_is_ignored() {
    let home = scratch("home");
    let cwd = scratch("cwd");
    for value in ["", "relative/cache"] {
        let output = Command::new(env!("CARGO_BIN_EXE_rdma-hint"))
            .args(SWEEP)
            .env("RDMA_HINT_CACHE_DIR", value)
            .env("XDG_CACHE_HOME", "also/relative")
            .env("HOME", &home)
            .current_dir(&cwd)
            .output()
            .unwrap();
        assert!(output.status.success(), "{value:?}: {}", stderr(&output));
        let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{value:?}: wrote into the working directory: {left:?}");
    }
    let _ = std::fs::remove_dir_all(home);
    let _ = std::fs::remove_dir_all(cwd);
}
