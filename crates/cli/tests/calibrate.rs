//! `rdma-hint calibrate`, `probe --calibrate` and the sweep's three hints, end to end on the
//! staged backend over real loopback traffic: the JSON contract, the cache the fit lands in,
//! the hint the library then answers, and the PNG plot.

use serde_json::Value;
use std::path::Path;

mod common;

use common::{rdma_hint, CALIBRATION_BUDGET_MS};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("calibrate", name)
}

/// Calibrations time the machine: one at a time, or on two cores each measures the others'
/// load (a round then outlasts the budget, and the fit is refused as "a path this slow").
fn measuring_alone() -> std::sync::MutexGuard<'static, ()> {
    static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MEASURING.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn calibrate_json(dir: &Path, channel: &str) -> Value {
    let output = rdma_hint(
        dir,
        &[
            "calibrate",
            "--backend",
            "staged",
            "--channel",
            channel,
            "--json",
            "--budget-ms",
            CALIBRATION_BUDGET_MS,
        ],
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn probe_hint(dir: &Path, transport: &str) -> Value {
    let probe = rdma_hint(dir, &["probe", "--json"]);
    assert!(probe.status.success());
    let probe: Value = serde_json::from_slice(&probe.stdout).unwrap();
    probe["hints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["source"] == "host:0" && h["transport"] == transport)
        .unwrap()
        .clone()
}

/// The calibration's contract, whatever this machine's curve looks like: a good fit is stored
/// and answered by the probe; a poor one says why, stores nothing and the probe keeps the model.
fn check_calibration(dir: &Path, channel: &str) {
    let c = calibrate_json(dir, channel);
    for field in ["block_bytes", "align_bytes", "fit_r2", "elapsed_ms"] {
        assert!(c[field].is_number(), "{field} missing: {c}");
    }
    // A poor fit may have no figure to give (a busy machine's times that do not grow with the
    // block fit no bandwidth: JSON says null, not a made-up number); a good one always has.
    for field in ["fixed_cost_us", "bandwidth_gbps"] {
        assert!(
            c[field].is_number() || (c[field].is_null() && c["fit_poor"].is_string()),
            "{field} missing: {c}"
        );
    }
    let (block, align) = (c["block_bytes"].as_u64().unwrap(), c["align_bytes"].as_u64().unwrap());
    assert!(block > 0 && align.is_power_of_two() && block % align == 0, "{c}");
    let points = c["calibration"]["points"].as_array().unwrap();
    assert!(points.len() >= 3, "a ladder of block sizes: {c}");
    assert!(points.iter().all(|p| p["runs"].as_u64().unwrap() >= 3 && p["gbps"].as_f64().unwrap() > 0.0));
    let hint = probe_hint(dir, &format!("staged:{channel}"));
    if c["fit_poor"].is_null() {
        assert_eq!(c["origin"], "calibrated");
        assert!(c["bandwidth_gbps"].as_f64().unwrap() > 0.0 && c["fixed_cost_us"].as_f64().unwrap() >= 0.0);
        let stored = c["stored_in"].as_str().unwrap();
        assert!(Path::new(stored).starts_with(dir), "stored in the cache directory: {stored}");
        assert_eq!(hint["origin"], "calibrated", "{hint}");
        assert_eq!(hint["block_bytes"], c["block_bytes"]);
        assert!(hint["reasons"].to_string().contains("fitted on the live path"), "{hint}");
        // Every figure has its interval, the block's interval holds the fits' middle, the
        // calibration stayed within its budget, and the reasons say how the block was chosen.
        // `o` may be 0 and so may its interval's low end: a flat curve whose smallest blocks
        // run at or above the line has no measurable fixed cost (hint-core's fit reads `o` off
        // them, never below 0), as beside two busy loops in CI, where staged shm fitted 0 with
        // an interval of 0…2.0 µs. Never negative, never outside its interval.
        let (o, o_low, o_high) = (
            c["fixed_cost_us"].as_f64().unwrap(),
            c["fixed_cost_us_low"].as_f64().unwrap(),
            c["fixed_cost_us_high"].as_f64().unwrap(),
        );
        assert!(
            0.0 <= o_low && o_low <= o_high && o_high.is_finite() && (o_low..=o_high).contains(&o),
            "o {o} outside {o_low}…{o_high}: {c}"
        );
        let (b_low, b_high) =
            (c["bandwidth_gbps_low"].as_f64().unwrap(), c["bandwidth_gbps_high"].as_f64().unwrap());
        assert!(0.0 < b_low && b_low <= b_high, "{c}");
        assert!(c["block_bytes_low"].as_f64().unwrap() <= c["block_bytes_high"].as_f64().unwrap(), "{c}");
        assert!(c["elapsed_ms"].as_f64().unwrap() <= c["budget_ms"].as_f64().unwrap(), "over budget: {c}");
        assert!(c["calibration"]["hint"]["reasons"].to_string().contains("resampled fits"), "{c}");
        assert!(c["calibration"]["rounds"].as_u64().unwrap() >= 3, "{c}");
        // An estimate: bounds around the prediction, and the hint's block.
        let estimate = rdma_hint(dir, &["estimate", "--channel", channel, "--len", "64M", "--json"]);
        assert!(estimate.status.success(), "{}", String::from_utf8_lossy(&estimate.stderr));
        let e: Value = serde_json::from_slice(&estimate.stdout).unwrap();
        let (low, mid, high) = (
            e["low_seconds"].as_f64().unwrap(),
            e["seconds"].as_f64().unwrap(),
            e["high_seconds"].as_f64().unwrap(),
        );
        assert!(0.0 < low && low <= mid && mid <= high, "{e}");
        assert_eq!(e["block_bytes"], c["block_bytes"], "{e}");
        assert_eq!(e["blocks"].as_u64().unwrap(), (64u64 << 20).div_ceil(block), "{e}");
    } else {
        assert_eq!(c["origin"], "model", "a poor fit falls back: {c}");
        assert!(c["stored_in"].is_null());
        assert_eq!(hint["origin"], "model");
        assert!(c["calibration"]["hint"]["reasons"].to_string().contains("poor fit"));
    }
}

#[test]
fn calibrate_shm_stores_the_fit_the_probe_then_answers() {
    let _alone = measuring_alone();
    let dir = scratch("shm");
    check_calibration(&dir, "shm");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn calibrate_tcp_stores_the_fit_the_probe_then_answers() {
    let _alone = measuring_alone();
    let dir = scratch("tcp");
    check_calibration(&dir, "tcp");
    let _ = std::fs::remove_dir_all(dir);
}

/// Consecutive calibrations of a path pool their answers: the hint is the median of the runs'
/// own blocks, the estimate pools their margins, and `--fresh` starts over.
#[test]
fn calibrations_pool_until_fresh() {
    let _alone = measuring_alone();
    let dir = scratch("pool");
    let calibrate = |fresh: bool| {
        let mut args = vec![
            "calibrate",
            "--backend",
            "staged",
            "--channel",
            "shm",
            "--budget-ms",
            CALIBRATION_BUDGET_MS,
            "--json",
        ];
        if fresh {
            args.push("--fresh");
        }
        let output = rdma_hint(&dir, &args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let blocks = |c: &Value| -> Vec<u64> {
        c["pooled_blocks_bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect()
    };
    let first = calibrate(false);
    if !first["fit_poor"].is_null() {
        // A machine too busy for a fit stores nothing to pool; the contract test above covers it.
        let _ = std::fs::remove_dir_all(dir);
        return;
    }
    assert_eq!(blocks(&first), vec![first["own_block_bytes"].as_u64().unwrap()], "{first}");
    assert_eq!(first["block_bytes"], first["own_block_bytes"], "one run answers itself: {first}");
    // A poor fit keeps nothing of its own and leaves the pool as it was.
    let (mut pooled, mut runs) = (first.clone(), 1);
    for _ in 0..2 {
        let next = calibrate(false);
        if next["fit_poor"].is_null() {
            (pooled, runs) = (next, runs + 1);
        }
    }
    let pool = blocks(&pooled);
    assert_eq!(pool.len(), runs, "{pooled}");
    assert_eq!(pool.last(), pooled["own_block_bytes"].as_u64().as_ref(), "{pooled}");
    let (block, align) = (pooled["block_bytes"].as_u64().unwrap(), pooled["align_bytes"].as_u64().unwrap());
    // The median by ratio (for an even pool the geometric mean of the middle two, or the
    // smaller where both are ladder blocks), aligned up.
    let mut sorted = pool.clone();
    sorted.sort_unstable();
    let middle = sorted.len() / 2;
    let median = match (sorted.len() % 2, sorted.get(middle.wrapping_sub(1))) {
        (1, _) | (_, None) => sorted[middle],
        (_, Some(&below)) if below.is_power_of_two() && sorted[middle].is_power_of_two() => below,
        (_, Some(&below)) => ((below as f64) * (sorted[middle] as f64)).sqrt().round() as u64,
    };
    assert_eq!(block, median.next_multiple_of(align), "{pooled}");
    if runs > 1 {
        assert!(
            pooled["calibration"]["hint"]["reasons"].to_string().contains("median of the last"),
            "{pooled}"
        );
        let estimate = rdma_hint(&dir, &["estimate", "--channel", "shm", "--len", "8M", "--json"]);
        assert!(estimate.status.success(), "{}", String::from_utf8_lossy(&estimate.stderr));
        let e: Value = serde_json::from_slice(&estimate.stdout).unwrap();
        assert_eq!(e["pooled_calibrations"].as_u64(), Some(runs as u64), "{e}");
    }
    // A fresh run that fails loses nothing: the pool is replaced only by a stored calibration.
    let failed = rdma_hint(&dir, &["calibrate", "--channel", "shm", "--fresh", "--budget-ms", "1"]);
    assert!(!failed.status.success());
    let estimate = rdma_hint(&dir, &["estimate", "--channel", "shm", "--len", "1M", "--json"]);
    assert!(
        estimate.status.success(),
        "a failed --fresh kept the pool: {}",
        String::from_utf8_lossy(&estimate.stderr)
    );
    let e: Value = serde_json::from_slice(&estimate.stdout).unwrap();
    assert_eq!(e["pooled_calibrations"].as_u64(), Some(runs as u64), "{e}");
    let fresh = calibrate(true);
    if fresh["fit_poor"].is_null() {
        assert_eq!(blocks(&fresh).len(), 1, "--fresh starts a new pool: {fresh}");
        assert_eq!(fresh["block_bytes"], fresh["own_block_bytes"], "{fresh}");
        let next = calibrate(false);
        if next["fit_poor"].is_null() {
            assert_eq!(blocks(&next).len(), 2, "the new pool holds the fresh run and this one: {next}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_sweep_keeps_model_calibrated_and_recorded_hints_apart_and_plots_png() {
    let _alone = measuring_alone();
    let dir = scratch("sweep");
    let c = calibrate_json(&dir, "shm");
    let json = dir.join("sweep.json");
    let png = dir.join("sweep.png");
    let sweep = |record: bool| {
        let mut args = vec![
            "sweep",
            "--backend",
            "staged",
            "--sizes",
            "16K..8M",
            "--iters",
            "2",
            "--transfer",
            "8M",
            "--latency-samples",
            "20",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            png.to_str().unwrap(),
        ];
        if !record {
            args.push("--no-record");
        }
        let output = rdma_hint(&dir, &args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            serde_json::from_slice::<Value>(&std::fs::read(&json).unwrap()).unwrap(),
        )
    };
    let (text, report) = sweep(false);
    let hints = &report["hints"];
    assert!(hints["model"]["block_bytes"].as_u64().unwrap() > 0);
    assert!(hints["recorded"].is_null(), "nothing recorded yet: {hints}");
    let points = report["points"].as_array().unwrap();
    let marked = |label: &str, block: &Value| {
        points
            .iter()
            .any(|p| &p["block_bytes"] == block && p["hints"].as_array().unwrap().iter().any(|h| h == label))
    };
    assert!(marked("model", &hints["model"]["block_bytes"]), "the model's hint is measured and marked");
    if c["origin"] == "calibrated" {
        assert_eq!(hints["calibrated"]["block_bytes"], c["block_bytes"]);
        assert!(marked("calibrated", &c["block_bytes"]), "the calibrated block is measured: {report}");
        assert_eq!(report["hint_origin"], "calibrated");
        assert!(text.contains("calibrated hint"), "{text}");
    }
    // The robust verdict: the plateau is one of the measured medians, not above the best one.
    let plateau = report["plateau_gbps"].as_f64().unwrap();
    assert!(points.iter().any(|p| (p["median_gbps"].as_f64().unwrap() - plateau).abs() < 1e-9));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000, "a PNG with content");
    // Recording: the knee is kept apart from the calibrated hint and, being newer, answers.
    // (A sweep up to 8 MiB reaches the staged shm plateau, 10 GB/s from 1–2 MiB, even on a
    // loaded 2-core machine where 2 MiB was sometimes still the first block at 90 %: the knee
    // is confirmed by a larger block, so it is recorded.)
    // A busy moment can still dent the curve so that no knee is confirmed within the sizes
    // (the sweep then says so and records nothing): up to three sweeps, until one records.
    for attempt in 1..=3 {
        let (text, recorded) = sweep(true);
        if recorded["plateau_reached"] == true {
            assert!(text.contains("recorded: ") && !text.contains("recorded: nothing"), "{text}");
            break;
        }
        assert!(text.contains("recorded: nothing (") && attempt < 3, "{text}");
    }
    let (_, report) = sweep(false);
    assert!(report["hints"]["recorded"]["block_bytes"].is_number(), "{}", report["hints"]);
    assert_eq!(report["hint_origin"], "measured");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn probe_calibrate_fits_every_path_and_shows_it() {
    let _alone = measuring_alone();
    // The default second fitted 1 round of 7 sizes over tcp beside four busy loops, and was
    // refused; 10 s fitted 2 rounds over shm there once ("a path this slow; give a longer
    // budget", which is right: too few rounds are no fit). A refusal for the budget is asked
    // again, from a fresh cache, with three times the budget.
    let mut attempts = [(CALIBRATION_BUDGET_MS, "probe"), ("30000", "probe-longer")].into_iter().peekable();
    let (dir, output) = loop {
        let (budget, name) = attempts.next().expect("an attempt");
        let dir = scratch(name);
        let output = rdma_hint(&dir, &["probe", "--calibrate", "--budget-ms", budget]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let log = String::from_utf8_lossy(&output.stderr);
        let short = ["staged:shm", "staged:tcp"].iter().any(|transport| {
            log.lines().any(|line| {
                line.contains(&format!("calibrate host:0 over {transport}: "))
                    && line.contains("give a longer budget")
            })
        });
        if !short || attempts.peek().is_none() {
            break (dir, output);
        }
    };
    let log = String::from_utf8_lossy(&output.stderr);
    for transport in ["staged:shm", "staged:tcp"] {
        assert!(log.contains(&format!("host:0 over {transport}: o = ")), "{log}");
    }
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("## Hints"), "{text}");
    // One fit per calibration: the line's o and B are the ones stored and answered (before,
    // the line showed the direct fit, o = 14.82 µs, where the cache and the reasons held the
    // resampled fits' medians, 12.48 µs).
    // (A poor fit stores nothing: a busy machine can make every fit poor.)
    let stored = std::fs::read(dir.join("calibrated.json")).unwrap_or_else(|_| b"[]".to_vec());
    let stored: Value = serde_json::from_slice(&stored).unwrap();
    for entry in stored.as_array().unwrap() {
        let (source, transport) = (entry["source"].as_str().unwrap(), entry["transport"].as_str().unwrap());
        let line = log
            .lines()
            .find(|line| line.contains(&format!("calibrated {source} over {transport}: ")))
            .unwrap_or_else(|| panic!("no line for {source} over {transport}: {log}"));
        let figure = |after: &str| -> f64 {
            line.split(after).nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap()
        };
        let (o, b) = (entry["fixed_cost_us"].as_f64().unwrap(), entry["bandwidth_gbps"].as_f64().unwrap());
        assert!((figure("o = ") - o).abs() <= 0.006, "{line} against the stored o {o}");
        assert!((figure("B = ") - b).abs() <= 0.0006, "{line} against the stored B {b}");
    }
    // The reason for a block chosen from the curve names the one rule that chose it.
    let probe = rdma_hint(&dir, &["probe", "--json"]);
    let report: Value = serde_json::from_slice(&probe.stdout).unwrap();
    for hint in report["hints"].as_array().unwrap() {
        for reason in hint["reasons"].as_array().unwrap() {
            let why = reason["why"].as_str().unwrap_or_default();
            if why.starts_with("chosen by calibration") {
                let rules =
                    ["only at a larger block", "promises more at its block", "disagree by more than 2×"];
                assert_eq!(rules.iter().filter(|rule| why.contains(*rule)).count(), 1, "{why}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn calibrate_refuses_a_zero_budget_and_unknown_paths() {
    let dir = scratch("refuse");
    // No calibration yet: estimate says what to run, and refuses zero bytes.
    let uncalibrated = rdma_hint(&dir, &["estimate", "--channel", "tcp", "--len", "1M"]);
    assert_eq!(uncalibrated.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&uncalibrated.stderr).contains("run `rdma-hint calibrate`"));
    assert!(!rdma_hint(&dir, &["estimate", "--len", "0"]).status.success());
    let zero = rdma_hint(&dir, &["calibrate", "--budget-ms", "0"]);
    assert!(!zero.status.success());
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--budget-ms"));
    let unknown = rdma_hint(&dir, &["calibrate", "--source", "gpu:99"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("gpu:99"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}
