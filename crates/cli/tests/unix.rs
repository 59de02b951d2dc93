//! The CLI as a Unix tool, run as a process: a closed pipe ends it quietly, bad arguments are
//! refused up front with a reason naming the flag, output paths are checked before measuring,
//! a refused peer is said to be refused, `serve` and `sweep` agree on how a sweep ended, and
//! logs are plain text when stderr is not a terminal.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{free_address, output_within};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("unix", name)
}

fn command(cache: &PathBuf, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rdma-hint"));
    command.env("RDMA_HINT_CACHE_DIR", cache).env("UCX_NET_DEVICES", "lo").args(args);
    command
}

fn run(cache: &PathBuf, args: &[&str]) -> Output {
    command(cache, args).output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts `args` fail with a usage or run-time error whose text contains each of `words`.
fn refused(args: &[&str], words: &[&str]) {
    let dir = scratch("refused");
    let output = run(&dir, args);
    let text = stderr(&output);
    assert!(!output.status.success(), "{args:?} was accepted: {text}");
    assert!(!text.contains("panicked"), "{args:?}: {text}");
    for word in words {
        assert!(text.contains(word), "{args:?}: `{word}` missing from: {text}");
    }
    assert!(
        output.stdout.is_empty(),
        "{args:?} printed results: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    let _ = std::fs::remove_dir_all(dir);
}

const QUICK: [&str; 8] =
    ["--sizes", "16K..32K", "--iters", "1", "--transfer", "1M", "--latency-samples", "5"];

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let dir = scratch("pipe");
    // The reader is gone before probe writes a byte.
    let mut child =
        command(&dir, &["probe", "--json"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "probe | true: {:?} {}", output.status, stderr(&output));
    assert!(output.stderr.is_empty(), "{}", stderr(&output));

    // `plan --json | head -1`: the reader leaves after the first line of a 262144-block plan.
    let mut child = command(&dir, &["plan", "--len", "1G", "--block", "4K", "--align", "4K", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "{");
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "plan | head -1: {:?} {}", output.status, stderr(&output));
    assert!(output.stderr.is_empty(), "{}", stderr(&output));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn meaningless_arguments_are_refused_naming_the_flag() {
    let deepep = ["deepep-size", "--hidden", "7168", "--ranks", "16", "--experts", "256"];
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["sweep", "--latency-samples", "0"], vec!["--latency-samples", "at least 1"]),
        (vec!["sweep", "--iters", "0"], vec!["--iters"]),
        (vec!["sweep", "--transfer", "0"], vec!["--transfer"]),
        (vec!["sweep", "--sizes", "3K..5K"], vec!["--sizes", "powers of two"]),
        (vec!["sweep", "--sizes", "6K"], vec!["--sizes", "multiple of the 4 KiB alignment"]),
        (vec!["sweep", "--transfer", "1M", "--sizes", "16M"], vec!["--transfer", "16 MiB"]),
        // Past what any registration takes (1 TiB): the refusal names the flag (#52).
        (
            vec!["sweep", "--transfer", "64T", "--sizes", "64K"],
            vec!["--transfer 65536 GiB", "cannot register"],
        ),
        (
            vec!["sweep", "--memory-cap", "1M", "--sizes", "64K", "--transfer", "1M"],
            vec!["--memory-cap 1 MiB"],
        ),
        (vec!["sweep", "--source", "gpu:x"], vec!["--source"]),
        (vec!["sweep", "--backend", "nccl"], vec!["--backend", "staged, ucx, verbs"]),
        (vec!["sweep", "--channel", "carrier-pigeon"], vec!["--channel", "shm or tcp"]),
        (vec!["sweep", "--backend", "verbs", "--channel", "tcp"], vec!["--channel", "verbs"]),
        (
            vec!["sweep", "--backend", "ucx", "--channel", "tcp", "--ucx-tls", "posix"],
            vec!["--ucx-tls", "--channel"],
        ),
        (vec!["serve", "--bytes", "1K"], vec!["--bytes", "4096"]),
        (vec!["sweep", "--plot", "curve.pdf"], vec!["--plot", "curve.pdf", "FILE.svg or FILE.png"]),
        (vec!["sweep", "--sizes", "8K,16K", "--transfer", "1MB"], vec!["--transfer", "1MB", "ambiguous"]),
        (vec!["serve", "--timeout-s", "18446744073709551615"], vec!["--timeout-s"]),
        (vec!["serve", "--token-file", "/dev/zero"], vec!["--token-file", "not a regular file"]),
        (vec!["plan", "--len", "4K", "--block", "4K", "--align", "4K", "--batch", "0"], vec!["--batch"]),
        ([&deepep[..], &["--tokens", "128", "--budget", "2GiB"]].concat(), vec!["--tokens", "--budget"]),
        ([&deepep[..], &["--tokens", "1K"]].concat(), vec!["--tokens", "whole number"]),
        (deepep.to_vec(), vec!["--tokens"]),
    ];
    for (args, words) in cases {
        refused(&args, &words);
    }
}

#[test]
fn a_budget_past_deepeps_limit_answers_what_deepep_accepts() {
    let dir = scratch("deepep");
    let args =
        ["deepep-size", "--hidden", "7168", "--ranks", "16", "--experts", "256", "--budget", "8000000T"];
    let output = run(&dir, &[&args[..], &["--json"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    let tokens = answer["max_tokens"].as_u64().unwrap();
    assert!(tokens < i32::MAX as u64, "not the search's upper end: {answer}");
    assert_eq!(answer["within_deepep_limits"], true, "{answer}");
    let text = String::from_utf8(run(&dir, &args).stdout).unwrap();
    assert!(text.contains("DeepEP's own limit"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn output_paths_are_checked_before_measuring() {
    for flag in ["--json", "--plot"] {
        let dir = scratch("paths");
        let started = Instant::now();
        let output = run(&dir, &["sweep", flag, "/nonexistent/dir/x.out"]);
        let text = stderr(&output);
        assert!(!output.status.success());
        assert!(text.contains(flag) && text.contains("/nonexistent/dir/x.out"), "{text}");
        assert!(output.stdout.is_empty(), "it measured first");
        assert!(!dir.join("measured.json").exists(), "it recorded a knee first");
        assert!(started.elapsed() < Duration::from_secs(20), "it measured first");
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn a_sweep_says_where_its_files_and_its_knee_went_and_logs_plainly() {
    let dir = scratch("where");
    let json = dir.join("out.json");
    // Wide enough to reach the staged shm plateau (about 10 GB/s from 1–2 MiB), so a knee is
    // recorded and its place said, even on a loaded 2-core machine where 64 KiB was sometimes
    // still the best block of a QUICK sweep.
    let sizes = ["--sizes", "16K..8M", "--iters", "2", "--transfer", "8M", "--latency-samples", "5"];
    let output = command(&dir, &[&["sweep", "--json", json.to_str().unwrap()], &sizes[..]].concat())
        .env("RDMA_HINT_LOG", "debug")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let text = String::from_utf8(output.stdout.clone()).unwrap();
    assert!(text.contains(&format!("report: {}", json.display())), "{text}");
    // Where the knee went: into the cache file, or nowhere with the reason (a curve a busy
    // moment dented can leave the plateau unconfirmed within the sizes swept).
    let recorded = text.contains(&format!("in {}", dir.join("measured.json").display()));
    let skipped = text.contains("recorded: nothing (");
    assert!(recorded != skipped, "{text}");
    assert_eq!(recorded, dir.join("measured.json").exists(), "{text}");
    assert!(!output.stderr.is_empty(), "debug logs expected");
    assert!(
        !output.stderr.contains(&0x1b),
        "colour codes in a log that is not a terminal: {}",
        stderr(&output)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_peer_nobody_listens_for_is_refused_quickly() {
    let dir = scratch("refused-peer");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let started = Instant::now();
    let output = run(
        &dir,
        &[&["sweep", "--channel", "tcp", "--peer", &format!("127.0.0.1:{port}")], &QUICK[..]].concat(),
    );
    let text = stderr(&output);
    assert!(!output.status.success());
    assert!(text.contains("refused"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(20), "waited for the whole deadline: {text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `args` (a command meant to fail at once) for at most `limit`; kills it past that.
fn ends_within(dir: &PathBuf, args: &[&str], limit: Duration) -> Output {
    let child = command(dir, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    output_within(child, &format!("{args:?}"), limit)
}

#[test]
fn serve_names_the_address_it_cannot_listen_on() {
    // 192.0.2.1 (TEST-NET-1) is on no interface here: binding it fails without any traffic.
    refused(
        &["serve", "--listen", "192.0.2.1:80", "--insecure", "--count", "1"],
        &["--listen", "192.0.2.1:80"],
    );
    // Without a token (or --insecure) a non-loopback listener is refused, naming both ways out.
    refused(&["serve", "--listen", "0.0.0.0:0", "--count", "1"], &["--listen", "--token-file", "--insecure"]);
}

/// A listen address that cannot work ends `serve` at once with one line, instead of retrying
/// it for every run it was asked to serve (forever, without `--count`).
#[test]
fn serve_ends_at_once_when_it_cannot_listen() {
    let dir = scratch("serve-in-use");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    for args in [vec!["serve", "--listen", &address], vec!["serve", "--listen", "0.0.0.0:0"]] {
        let output = ends_within(&dir, &args, Duration::from_secs(20));
        let text = stderr(&output);
        assert!(!output.status.success(), "{args:?}: {text}");
        assert_eq!(text.trim_end().lines().count(), 1, "{args:?}: one line, not a retry loop: {text}");
        assert!(text.contains("--listen"), "{args:?}: {text}");
    }
    assert!(stderr(&ends_within(&dir, &["serve", "--listen", &address], Duration::from_secs(20)))
        .contains("in use"));
    let _ = std::fs::remove_dir_all(dir);
}

/// `--backend ucx` talks only to authenticated peers: `serve` and `sweep --peer` without a
/// token end at once with one line naming where a token comes from (before, serve printed
/// "serving" and then "run N: invalid token" dozens of times a second).
#[test]
fn ucx_without_a_token_is_refused_at_start_in_one_line() {
    if !cfg!(feature = "ucx") {
        return; // `--backend ucx` is refused as not compiled in (CI builds every feature)
    }
    let dir = scratch("ucx-token");
    let address = free_address();
    let serve = ["serve", "--listen", address.as_str(), "--backend", "ucx", "--count", "1"];
    let sweep =
        ["sweep", "--backend", "ucx", "--peer", address.as_str(), "--sizes", "64K", "--transfer", "1M"];
    for args in [&serve[..], &sweep[..]] {
        let output = command(&dir, args)
            .env_remove("RDMA_HINT_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = output_within(output, &format!("{args:?}"), Duration::from_secs(20));
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {text}");
        assert_eq!(text.trim_end().lines().count(), 1, "{args:?}: one line: {text}");
        assert!(text.contains("--token-file") && text.contains("RDMA_HINT_TOKEN"), "{args:?}: {text}");
        assert!(output.stdout.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&output.stdout));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Host names resolve: `serve --listen localhost:PORT` and `sweep --peer localhost:PORT` meet
/// (before, both were refused as "invalid socket address syntax"); a name that does not
/// resolve is refused naming the flag.
#[test]
fn serve_and_sweep_take_host_names() {
    let dir = scratch("host-names");
    let port = free_address().rsplit_once(':').unwrap().1.to_string();
    let named = format!("localhost:{port}");
    let server = spawned(&dir, &["serve", "--listen", &named, "--bytes", "4M", "--count", "1"]);
    let swept = run(&dir, &[&["sweep", "--peer", &named, "--no-record"][..], &QUICK[..]].concat());
    assert!(swept.status.success(), "{}", stderr(&swept));
    let served = output_within(server, "serve on localhost", Duration::from_secs(30));
    assert!(served.status.success(), "{}", stderr(&served));
    refused(&["sweep", "--peer", "localhost:notaport"], &["--peer", "HOST:PORT"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// A token file both sides of a serve/sweep pair read, in `dir`.
fn shared_token(dir: &std::path::Path) -> String {
    let token = dir.join("token");
    std::fs::write(&token, b"a token both sides hold").unwrap();
    token.to_str().unwrap().to_string()
}

/// `rdma-hint ARGS` started in the background, its output kept.
fn spawned(dir: &PathBuf, args: &[&str]) -> std::process::Child {
    command(dir, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

/// `serve` and `sweep --peer` with nothing but the address and the token: the same channel by
/// default, and the listener is serve's for every run (nobody else can bind its port between
/// two peers).
#[test]
fn serve_and_sweep_work_with_default_flags_on_one_listener() {
    let dir = scratch("serve-defaults");
    let token = &shared_token(&dir);
    let address = free_address();
    let server = spawned(
        &dir,
        &["serve", "--listen", &address, "--bytes", "4M", "--count", "2", "--token-file", token],
    );
    let sweep = |dir: &PathBuf| {
        run(
            dir,
            &[&["sweep", "--peer", &address, "--token-file", token, "--no-record"][..], &QUICK[..]].concat(),
        )
    };
    let first = sweep(&dir);
    assert!(first.status.success(), "default flags: {}", stderr(&first));
    assert!(
        std::net::TcpListener::bind(&address).is_err(),
        "serve let go of {address} between two peers: another process could take it"
    );
    let second = sweep(&dir);
    assert!(second.status.success(), "second peer: {}", stderr(&second));
    let served = server.wait_with_output().unwrap();
    assert!(served.status.success(), "{}", stderr(&served));
    let _ = std::fs::remove_dir_all(dir);
}

/// Two sides on different channels are told so in one sentence that names `--channel`.
#[test]
fn a_channel_mismatch_names_the_flag() {
    let dir = scratch("serve-mismatch");
    let token = &shared_token(&dir);
    let mut backends = vec!["staged"];
    if cfg!(feature = "ucx") {
        backends.push("ucx");
    }
    for backend in backends {
        let address = free_address();
        let server = spawned(
            &dir,
            &[
                "serve",
                "--backend",
                backend,
                "--listen",
                &address,
                "--bytes",
                "4M",
                "--count",
                "1",
                "--timeout-s",
                "20",
                "--token-file",
                token,
            ],
        );
        let sweep = run(
            &dir,
            &[
                &["sweep", "--backend", backend, "--channel", "shm", "--peer", &address, "--no-record"][..],
                &["--token-file", token],
                &QUICK[..],
            ]
            .concat(),
        );
        let text = stderr(&sweep);
        assert!(!sweep.status.success(), "{backend}: {text}");
        assert!(text.contains("--channel"), "{backend}: the mismatch does not name --channel: {text}");
        let served = server.wait_with_output().unwrap();
        assert!(!served.status.success(), "{backend}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A sweep that needs more than `serve` exposes fails on both sides; one that finishes
/// succeeds on both.
#[test]
fn serve_and_sweep_agree_on_how_the_sweep_ended() {
    let dir = scratch("serve");
    for (bytes, sweep_ok) in [("1M", false), ("4M", true)] {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let address = format!("127.0.0.1:{port}");
        let server = command(
            &dir,
            &["serve", "--listen", &address, "--bytes", bytes, "--timeout-s", "60", "--count", "1"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let sweep = run(
            &dir,
            &[
                "sweep",
                "--channel",
                "tcp",
                "--peer",
                &address,
                "--sizes",
                "64K,2M",
                "--transfer",
                "2M",
                "--iters",
                "1",
            ],
        );
        let served = server.wait_with_output().unwrap();
        assert_eq!(sweep.status.success(), sweep_ok, "sweep against --bytes {bytes}: {}", stderr(&sweep));
        assert_eq!(served.status.success(), sweep_ok, "serve --bytes {bytes}: {}", stderr(&served));
        if !sweep_ok {
            assert!(stderr(&sweep).contains("--bytes 2MiB"), "{}", stderr(&sweep));
            assert!(stderr(&served).contains("--bytes"), "{}", stderr(&served));
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plans_count_in_the_right_number() {
    let dir = scratch("plan");
    let output = run(&dir, &["plan", "--len", "4K", "--block", "4K", "--align", "4K"]);
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains(": 1 block of 4 KiB") && text.contains("1 doorbell of ≤ 8 work requests"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn probe_text_reads_well() {
    let dir = scratch("probe-text");
    let output = run(&dir, &["probe"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        !text.contains(" 0.0 GB/s") && !text.contains("(0 Gb/s)"),
        "a slow rate printed as zero:\n{text}"
    );
    let absent = text.split("## Not available here").nth(1).unwrap();
    let lines = absent.lines().take_while(|l| !l.starts_with("## "));
    for component in ["verbs", "ucx", "cuda"] {
        let count = lines.clone().filter(|l| l.starts_with(&format!("{component}:"))).count();
        assert!(count <= 1, "{count} `{component}` lines under Not available:\n{absent}");
    }
    // The Hints table's columns line up under their header (the transport id is padded).
    let hints = text.split("## Hints\n").nth(1).unwrap();
    let mut rows = hints.lines().take_while(|l| !l.trim().is_empty());
    let header: Vec<char> = rows.next().unwrap().chars().collect();
    let block_end = header.iter().collect::<String>().find("block").unwrap() + "block".len();
    let mut count = 0;
    for row in rows.filter(|row| row.starts_with("host:") || row.starts_with("gpu:")) {
        let row: Vec<char> = row.chars().collect();
        let block: String = row[block_end - 10..block_end].iter().collect();
        assert!(
            block.trim_start().ends_with('B') && row[block_end] == ' ',
            "misaligned under `block`:\n{hints}"
        );
        count += 1;
    }
    assert!(count > 0, "no hint rows:\n{hints}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A recorded knee shows the sweep's plateau as its B and a date, not a raw epoch.
#[test]
fn recorded_hints_carry_the_measured_bandwidth_and_a_date() {
    let dir = scratch("recorded");
    let json = dir.join("out.json");
    // Up to 8 MiB, so the curve reaches its plateau (and a knee is recorded) on a loaded
    // machine too: over QUICK's two sizes, noise alone decides whether the larger is the knee.
    // A busy moment can dent the curve so that no knee is confirmed within the sizes (the
    // sweep then says so and records nothing): the median of three transfers per size, and up
    // to five sweeps, until one records (one iteration a size, three sweeps, recorded nothing
    // beside four busy loops once).
    let sizes = ["--sizes", "16K..8M", "--iters", "3", "--transfer", "8M", "--latency-samples", "5"];
    let mut sweep = Value::Null;
    for attempt in 1..=5 {
        let output = run(&dir, &[&["sweep", "--json", json.to_str().unwrap()], &sizes[..]].concat());
        assert!(output.status.success(), "{}", stderr(&output));
        sweep = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        if dir.join("measured.json").exists() {
            break;
        }
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(said.contains("recorded: nothing (") && attempt < 5, "no knee recorded in 5 sweeps: {said}");
    }
    let probe: Value = serde_json::from_slice(&run(&dir, &["probe", "--json"]).stdout).unwrap();
    let hint =
        probe["hints"].as_array().unwrap().iter().find(|h| h["transport"] == "staged:shm").unwrap().clone();
    assert_eq!(hint["origin"], "measured");
    let (bandwidth, plateau) =
        (hint["bandwidth_gbps"].as_f64().unwrap(), sweep["plateau_gbps"].as_f64().unwrap());
    assert!((bandwidth - plateau).abs() < 1e-9, "B {bandwidth} is not the measured plateau {plateau}");
    let text = String::from_utf8(run(&dir, &["probe"]).stdout).unwrap();
    let line = text.lines().find(|l| l.contains("Measured:") && l.contains("measured knee")).unwrap();
    assert!(line.contains(" UTC") && !line.contains("unix time"), "{line}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn verbs_without_a_device_says_why() {
    let dir = scratch("verbs");
    let output = run(&dir, &["sweep", "--backend", "verbs"]);
    let text = stderr(&output);
    if output.status.success() {
        return; // This machine has an RDMA device; nothing to explain.
    }
    assert!(!text.contains("(none)") && !text.contains("unknown transport"), "{text}");
    assert!(text.contains("RDMA device") || text.contains("feature `verbs`"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A clean close is not a warning: a UCX sweep that succeeds logs nothing at WARN.
#[cfg(feature = "ucx")]
#[test]
fn a_successful_ucx_sweep_warns_about_nothing() {
    let dir = scratch("ucx-quiet");
    for channel in ["shm", "tcp"] {
        let output = run(
            &dir,
            &[&["sweep", "--backend", "ucx", "--channel", channel, "--no-record"], &QUICK[..]].concat(),
        );
        let text = stderr(&output);
        assert!(output.status.success(), "{channel}: {text}");
        assert!(!text.contains("WARN"), "ucx:{channel}: {text}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// UCX logs to stdout by default; its warnings (here: an unused `UCX_*` variable, printed at
/// exit) must not end up inside `--json` output.
#[cfg(feature = "ucx")]
#[test]
fn ucx_warnings_stay_out_of_json_on_stdout() {
    let dir = scratch("ucx-json");
    let output = command(
        &dir,
        &[
            "calibrate",
            "--backend",
            "ucx",
            "--channel",
            "shm",
            "--budget-ms",
            common::CALIBRATION_BUDGET_MS,
            "--json",
        ],
    )
    .env("UCX_RDMA_HINT_TEST_UNUSED", "1")
    .env("UCX_NET_DEVICES", "lo")
    .env_remove("UCX_LOG_FILE")
    .output()
    .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!("stdout is not one JSON object ({e}): {}", String::from_utf8_lossy(&output.stdout))
    });
    assert!(json["block_bytes"].as_u64().unwrap() > 0);
    assert!(
        stderr(&output).contains("UCX_RDMA_HINT_TEST_UNUSED"),
        "UCX's warning went to stderr: {}",
        stderr(&output)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A hint cache file that does not parse is ignored (the model answers) and said so.
#[test]
fn a_corrupt_cache_file_is_named_not_ignored_silently() {
    let dir = scratch("corrupt-cache");
    std::fs::write(dir.join("measured.json"), b"{ not json").unwrap();
    let output = run(&dir, &["probe"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(text.contains("corrupt") && text.contains("measured.json"), "nothing said about it: {text}");
    let _ = std::fs::remove_dir_all(dir);
}
