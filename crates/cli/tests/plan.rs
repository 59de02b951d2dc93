//! `rdma-hint plan`, run as a process.

use serde_json::Value;
use std::process::{Command, Output};

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-hint")).arg("plan").args(args).output().unwrap()
}

#[test]
fn json_lists_blocks_batches_and_signalled() {
    let output = plan(&[
        "--len",
        "150000",
        "--block",
        "64K",
        "--align",
        "4K",
        "--batch",
        "2",
        "--signal-every",
        "2",
        "--json",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let plan: Value = serde_json::from_slice(&output.stdout).unwrap();
    let blocks = plan["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[2]["offset"], 131072);
    assert_eq!(blocks[2]["len"], 150000 - 131072, "the last block is what is left, not padded");
    assert_eq!(plan["batches"], serde_json::json!([[0, 1], [2]]));
    assert_eq!(plan["signalled"], serde_json::json!([1, 2]));
    let payload: u64 = blocks.iter().map(|b| b["len"].as_u64().unwrap()).sum();
    assert_eq!(payload, 150000);
}

#[test]
fn text_plan_summarises_long_plans() {
    let output = plan(&["--len", "64M", "--block", "64K", "--align", "4K"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.starts_with("64 MiB at offset 0"));
    assert!(text.contains("1024 blocks") && text.contains("128 doorbells") && text.contains('…'));
}

#[test]
fn invalid_arguments_exit_with_one_line() {
    for args in [
        &["--len", "0", "--block", "64K", "--align", "4K"][..],
        &["--len", "1M", "--block", "0", "--align", "4K"][..],
        &["--len", "1M", "--block", "64K", "--align", "3000"][..],
        &["--len", "1M", "--block", "6000", "--align", "4K"][..],
        &["--len", "1M", "--block", "64K", "--align", "4K", "--region", "1000"][..],
        &["--len", "1M", "--block", "64K", "--align", "4K", "--batch", "0"][..],
        &["--len", "lots", "--block", "64K", "--align", "4K"][..],
    ] {
        let output = plan(args);
        assert!(!output.status.success(), "{args:?} accepted");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(!stderr.is_empty() && output.stdout.is_empty(), "{args:?}");
        assert!(stderr.trim_end().lines().count() <= 3, "{stderr}");
    }
}

#[test]
fn a_range_is_planned_exactly_wherever_it_starts() {
    // The whole of a 1000 B region (no room for padding) and a range off the alignment: both
    // are cut from their start, the last block what is left, nothing past the range.
    for (args, blocks) in [
        (
            &["--len", "1000", "--block", "64K", "--align", "4K", "--region", "1000", "--json"][..],
            vec![(0, 1000)],
        ),
        (
            &["--len", "70000", "--block", "64K", "--align", "4K", "--offset", "100", "--json"][..],
            vec![(100, 65536), (65636, 70000 - 65536)],
        ),
    ] {
        let output = plan(args);
        assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        let plan: Value = serde_json::from_slice(&output.stdout).unwrap();
        let got: Vec<(u64, u64)> = plan["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["offset"].as_u64().unwrap(), b["len"].as_u64().unwrap()))
            .collect();
        assert_eq!(got, blocks, "{args:?}");
    }
}
