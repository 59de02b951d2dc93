//! `rdma-hint deepep-size`, run as a process.

use serde_json::Value;
use std::process::{Command, Output};

fn deepep_size(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-hint")).arg("deepep-size").args(args).output().unwrap()
}

#[test]
fn first_line_is_the_byte_count() {
    let output = deepep_size(&["--tokens", "128", "--hidden", "7168", "--ranks", "16", "--experts", "256"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(text.lines().next(), Some("1908410496"));
}

#[test]
fn json_carries_limits_and_warnings() {
    let output = deepep_size(&[
        "--tokens",
        "1024",
        "--hidden",
        "7168",
        "--ranks",
        "64",
        "--experts",
        "1024",
        "--json",
    ]);
    assert!(output.status.success());
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(report["bytes"].as_u64().unwrap() > 32 << 30);
    assert_eq!(report["within_deepep_limits"], false);
    assert!(report["gib"].as_f64().unwrap() > 32.0);
    assert!(!report["warnings"].as_array().unwrap().is_empty());
}

#[test]
fn budget_prints_the_largest_token_count() {
    let output = deepep_size(&["--hidden", "7168", "--ranks", "16", "--experts", "256", "--budget", "2GiB"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    let tokens: u64 = text.lines().next().unwrap().parse().unwrap();
    assert_eq!(tokens, 144);
}

#[test]
fn invalid_shapes_exit_non_zero_with_one_line() {
    for args in [
        &["--tokens", "128", "--hidden", "7000", "--ranks", "16", "--experts", "256"][..],
        &["--tokens", "0", "--hidden", "7168", "--ranks", "16", "--experts", "256"][..],
        &["--hidden", "7168", "--ranks", "16", "--experts", "256"][..],
        &["--hidden", "7168", "--ranks", "16", "--experts", "256", "--budget", "1K"][..],
        &["--hidden", "7168", "--ranks", "16", "--experts", "256", "--budget", "lots"][..],
    ] {
        let output = deepep_size(args);
        assert!(!output.status.success(), "{args:?} accepted");
        assert!(output.stdout.is_empty());
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.trim_end().lines().count() <= 3, "{stderr}");
    }
}
