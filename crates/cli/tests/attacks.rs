//! Attacks on `rdma-hint serve` from 127.0.0.1, as processes: what an unauthenticated client
//! learns (never the token), silent connections that must not starve a legitimate sweep, and a
//! peer that breaks the protocol (an error for that run; the next peer is served).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;

use common::{free_address, running_as_root, serve, text};

const TOKEN: &[u8] = b"correct horse battery staple";

fn scratch(name: &str) -> common::Scratch {
    common::scratch("attack", name)
}

fn token_file(dir: &Path) -> PathBuf {
    let file = dir.join("token");
    std::fs::write(&file, TOKEN).unwrap();
    file
}

fn sweep(dir: &Path, address: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-hint"))
        .env("RDMA_HINT_CACHE_DIR", dir)
        .args(["sweep", "--channel", "tcp", "--peer", address, "--sizes", "64K", "--transfer", "1M"])
        .args(["--iters", "1", "--latency-samples", "3", "--no-record"])
        .args(extra)
        .output()
        .unwrap()
}

/// A hand-written staged peer on TCP, past the (token-less) authentication and the hellos:
/// the stream and the region `serve` exposed.
fn raw_staged_peer(address: &str) -> (TcpStream, rdma_hint_staged::wire::ExposedRegion) {
    use rdma_hint_staged::wire::{ChannelKind, Hello};
    let mut peer = TcpStream::connect(address).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    peer.write_all(&preamble(0)).unwrap();
    let mut theirs = [0u8; 41];
    peer.read_exact(&mut theirs).unwrap();
    peer.write_all(&Hello { channel: ChannelKind::Tcp, regions: vec![], handoff: None }.encode()).unwrap();
    let region = Hello::decode(&mut peer).unwrap().regions[0].clone();
    (peer, region)
}

/// The no-token authentication preamble, written by hand: magic, flags, a nonce.
fn preamble(flags: u8) -> Vec<u8> {
    let mut bytes = b"RDHAUTH1".to_vec();
    bytes.push(flags);
    bytes.extend((0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5c));
    bytes
}

/// A client that claims to hold a token and sends a made-up proof learns the listener's
/// preamble and MAC (73 bytes), never the token; the legitimate sweep that follows succeeds.
#[test]
fn an_unauthenticated_client_never_sees_the_token() {
    let dir = scratch("theft");
    let file = token_file(&dir);
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "1", "--token-file", file.to_str().unwrap()]);
    let mut thief = TcpStream::connect(&address).unwrap();
    thief.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    thief.write_all(&[preamble(1), vec![0u8; 32]].concat()).unwrap();
    let mut seen = Vec::new();
    let _ = thief.read_to_end(&mut seen);
    assert!(seen.len() <= 8 + 1 + 32 + 32, "{} B reached an unauthenticated client", seen.len());
    assert!(!seen.windows(TOKEN.len()).any(|w| w == TOKEN), "the token was sent");
    // Without a token, the same client is refused before anything but the preamble.
    let mut stranger = TcpStream::connect(&address).unwrap();
    stranger.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stranger.write_all(&preamble(0)).unwrap();
    let mut seen = Vec::new();
    let _ = stranger.read_to_end(&mut seen);
    assert!(seen.len() <= 8 + 1 + 32, "{} B reached a client without a token", seen.len());

    let swept = sweep(&dir, &address, &["--token-file", file.to_str().unwrap()]);
    assert!(swept.status.success(), "{}", text(&swept.stderr));
    let served = server.wait_with_output().unwrap();
    assert!(served.status.success(), "{}", text(&served.stderr));
    assert!(text(&served.stderr).contains("wrong token"), "the refusal is logged: {}", text(&served.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// A sweep whose token is wrong is refused on both sides; the token it holds is not sent.
#[test]
fn a_wrong_token_is_refused_on_both_sides() {
    let dir = scratch("wrong");
    let file = token_file(&dir);
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, b"incorrect horse").unwrap();
    let address = free_address();
    let server =
        serve(&dir, &address, &["--count", "1", "--token-file", file.to_str().unwrap(), "--timeout-s", "8"]);
    let swept = sweep(&dir, &address, &["--token-file", wrong.to_str().unwrap()]);
    assert!(!swept.status.success());
    assert!(text(&swept.stderr).contains("wrong token"), "{}", text(&swept.stderr));
    let served = server.wait_with_output().unwrap();
    assert!(!served.status.success(), "no legitimate peer came: {}", text(&served.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// Three hundred connections that never say a word (more than the 256 handshakes a listener
/// runs at once) do not hold `serve`: the oldest is cut off to make room, and a token-holding
/// sweep that comes after them succeeds well within its deadline.
#[test]
fn three_hundred_silent_connections_do_not_starve_a_legitimate_sweep() {
    let dir = scratch("silent");
    let file = token_file(&dir);
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "1", "--token-file", file.to_str().unwrap()]);
    let silent: Vec<TcpStream> = (0..300).map(|_| TcpStream::connect(&address).unwrap()).collect();
    let started = std::time::Instant::now();
    let swept = sweep(&dir, &address, &["--token-file", file.to_str().unwrap()]);
    assert!(swept.status.success(), "{}", text(&swept.stderr));
    assert!(started.elapsed() < Duration::from_secs(25), "the sweep waited {:?}", started.elapsed());
    let served = server.wait_with_output().unwrap();
    assert!(served.status.success(), "{}", text(&served.stderr));
    drop(silent);
    let _ = std::fs::remove_dir_all(dir);
}

/// A client that trickles its preamble a byte a second is cut off 5 s after it connected,
/// not 5 s after its last byte: the handshake limit is one absolute deadline.
#[test]
fn a_trickling_handshake_is_cut_off_after_five_seconds() {
    let dir = scratch("trickle");
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "1", "--timeout-s", "30"]);
    let mut trickle = TcpStream::connect(&address).unwrap();
    let started = std::time::Instant::now();
    let mut cut_off = None;
    for byte in preamble(0) {
        std::thread::sleep(Duration::from_millis(700));
        if trickle.write_all(&[byte]).is_err() {
            cut_off = Some(started.elapsed());
            break;
        }
        // Our preamble has reached the listener's thread; a closed socket reads 0.
        trickle.set_nonblocking(true).unwrap();
        let mut probe = [0u8; 64];
        let closed = matches!(std::io::Read::read(&mut trickle, &mut probe), Ok(0));
        trickle.set_nonblocking(false).unwrap();
        if closed {
            cut_off = Some(started.elapsed());
            break;
        }
    }
    let cut_off = cut_off.expect("the trickle was never cut off");
    assert!(cut_off < Duration::from_secs(8), "cut off after {cut_off:?}");
    let swept = sweep(&dir, &address, &[]);
    assert!(swept.status.success(), "{}", text(&swept.stderr));
    assert!(server.wait_with_output().unwrap().status.success());
    let _ = std::fs::remove_dir_all(dir);
}

/// Garbage, and then a peer that passes the handshake but writes past the region: that run is
/// an error line and counts as failed; `serve` lives on and serves the next peer's sweep.
#[test]
fn serve_survives_garbage_and_a_protocol_violation_and_serves_the_next_peer() {
    use rdma_hint_staged::wire::{Frame, FrameKind, FLAG_IMM};
    let dir = scratch("violation");
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "2", "--channel", "tcp"]);
    let mut garbage = TcpStream::connect(&address).unwrap();
    garbage.write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(64)).unwrap();
    let mut half_magic = TcpStream::connect(&address).unwrap();
    half_magic.write_all(b"RDHA").unwrap();

    let (mut violator, region) = raw_staged_peer(&address);
    let past_the_end = Frame {
        kind: FrameKind::Write,
        flags: FLAG_IMM,
        status: 0,
        region: region.id,
        offset: region.len - 8,
        len: 16,
        wr_id: 1,
        imm: 9,
    };
    violator.write_all(&past_the_end.encode()).unwrap();
    violator.write_all(&[0u8; 16]).unwrap();
    let mut rest = Vec::new();
    let _ = violator.read_to_end(&mut rest);

    let swept = sweep(&dir, &address, &[]);
    assert!(swept.status.success(), "the next peer was not served: {}", text(&swept.stderr));
    let served = server.wait_with_output().unwrap();
    let log = text(&served.stderr);
    assert!(!served.status.success(), "a run broke the protocol: {log}");
    assert!(log.contains("run 1") && log.contains("protocol error"), "{log}");
    assert!(log.contains("1 of 2 runs failed"), "{log}");
    assert!(text(&served.stdout).contains("run 2: the peer's sweep finished"), "{}", text(&served.stdout));
    drop((garbage, half_magic));
    let _ = std::fs::remove_dir_all(dir);
}

/// A listener on an address other than loopback needs a token or an explicit --insecure.
#[test]
fn serve_refuses_a_remote_listener_without_a_token() {
    let dir = scratch("remote");
    let output = Command::new(env!("CARGO_BIN_EXE_rdma-hint"))
        .env("RDMA_HINT_CACHE_DIR", &dir)
        .env_remove("RDMA_HINT_TOKEN")
        .args(["serve", "--listen", "0.0.0.0:0", "--count", "1"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("token"), "{}", text(&output.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

fn dev_shm() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn shm_sweep(dir: &Path, sizes: &str, transfer: &str, iters: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rdma-hint"));
    command.env("RDMA_HINT_CACHE_DIR", dir).args([
        "sweep",
        "--channel",
        "shm",
        "--sizes",
        sizes,
        "--transfer",
        transfer,
        "--iters",
        iters,
        "--latency-samples",
        "3",
        "--no-record",
    ]);
    command
}

/// Shared regions are anonymous memfds handed over a Unix socket: no file under /dev/shm that
/// another user could open or plant a symlink for, and nothing left behind by a run that
/// finishes or by one killed with SIGKILL.
#[test]
fn shm_sweeps_leave_nothing_in_dev_shm_even_when_killed() {
    let dir = scratch("shm-files");
    let before = dev_shm();
    let output = shm_sweep(&dir, "64K", "1M", "1").output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(dev_shm(), before, "a finished shm sweep left files");
    let mut running = shm_sweep(&dir, "4K..16M", "64M", "1000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert!(running.try_wait().unwrap().is_none(), "the sweep ended before it could be killed");
    running.kill().unwrap();
    running.wait().unwrap();
    assert_eq!(dev_shm(), before, "a killed shm sweep left files");
    let _ = std::fs::remove_dir_all(dir);
}

/// Memory that cannot be committed is a registration error with exit 1, not a SIGBUS
/// (exit 135) on first touch: here the file-size limit stands in for a memory shortage.
#[test]
fn memory_that_cannot_be_committed_is_a_typed_error() {
    let dir = scratch("commit");
    let binary = env!("CARGO_BIN_EXE_rdma-hint");
    let output = Command::new("bash")
        .env("RDMA_HINT_CACHE_DIR", &dir)
        .args(["-c", &format!(
            "trap '' XFSZ; ulimit -f 8192; exec {binary} sweep --channel shm --sizes 16M --transfer 16M --iters 1 --latency-samples 2 --no-record"
        )])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("cannot register"), "{}", text(&output.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// A full (8 MiB) /dev/shm does not matter to a 16 MiB shm sweep: regions are not files there.
/// Needs root for the private mount namespace (CI runs as root and requires it).
#[test]
fn a_full_dev_shm_does_not_stop_a_shm_sweep() {
    if !running_as_root("a private mount of /dev/shm") {
        return;
    }
    let dir = scratch("full-shm");
    let binary = env!("CARGO_BIN_EXE_rdma-hint");
    let output = Command::new("unshare")
        .env("RDMA_HINT_CACHE_DIR", &dir)
        .args(["-m", "sh", "-c", &format!(
            "mount -t tmpfs -o size=8m tmpfs /dev/shm && exec {binary} sweep --channel shm --sizes 16M --transfer 16M --iters 1 --latency-samples 2 --no-record"
        )])
        .output()
        .unwrap();
    assert!(output.status.success(), "{:?}: {}", output.status, text(&output.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// `sweep --backend ucx --peer ADDRESS` with the token in `file`.
#[cfg(feature = "ucx")]
fn ucx_sweep(dir: &Path, address: &str, file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-hint"))
        .env("RDMA_HINT_CACHE_DIR", dir)
        .env("UCX_NET_DEVICES", "lo")
        .args(["sweep", "--backend", "ucx", "--channel", "tcp", "--peer", address, "--sizes", "64K"])
        .args(["--transfer", "1M", "--iters", "1", "--latency-samples", "3", "--no-record"])
        .args(["--token-file", file.to_str().unwrap()])
        .output()
        .unwrap()
}

/// A UCX peer must hold the token: an address it sends reaches UCX only after it proved it.
/// Without a token, `serve --backend ucx` refuses to start; with one, a client that cannot
/// authenticate is dropped before UCX sees a byte, and one that can but sends a truncated or
/// foreign-format worker address is refused by the screen in front of `ucp_ep_create`;
/// `serve` lives through all of it and serves the legitimate sweep that follows.
#[cfg(feature = "ucx")]
#[test]
fn garbage_ucx_addresses_never_reach_ucx_on_the_serving_side() {
    use rdma_hint_oob::{authenticate, put_prefixed_u16, Backend, Hello, RegionDescriptor, Role, Token};
    let dir = scratch("ucx-serve");
    let file = token_file(&dir);
    let no_token = Command::new(env!("CARGO_BIN_EXE_rdma-hint"))
        .env("RDMA_HINT_CACHE_DIR", &dir)
        .env("UCX_NET_DEVICES", "lo")
        .env_remove("RDMA_HINT_TOKEN")
        .args(["serve", "--backend", "ucx", "--listen", &free_address(), "--count", "1", "--timeout-s", "5"])
        .output()
        .unwrap();
    assert!(!no_token.status.success());
    assert!(text(&no_token.stderr).contains("token"), "{}", text(&no_token.stderr));

    let address = free_address();
    std::env::set_var("UCX_NET_DEVICES", "lo");
    let server =
        serve(&dir, &address, &["--backend", "ucx", "--count", "1", "--token-file", file.to_str().unwrap()]);
    // No token: dropped at the preamble, whatever follows.
    let mut stranger = TcpStream::connect(&address).unwrap();
    stranger.write_all(&[preamble(0), vec![0xa5; 100]].concat()).unwrap();
    // The token, and then addresses UCX would choke on: truncated, and another format.
    let token = Token::new(TOKEN).unwrap();
    for worker_address in [vec![0x01; 4], [vec![0x0e], vec![0x5a; 99]].concat()] {
        let mut insider = TcpStream::connect(&address).unwrap();
        insider.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        authenticate(&mut insider, Some(&token), Role::Dialer).unwrap();
        // The UCX backend's connection blob: the worker address (u16 length first), no ring.
        let mut connection = Vec::new();
        put_prefixed_u16(&mut connection, &worker_address);
        connection.push(0);
        let hello = Hello {
            backend: Backend::Ucx,
            connection,
            regions: vec![RegionDescriptor {
                id: 0,
                len: 4096,
                address: 0x10000,
                flags: 0,
                key: vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            }],
        };
        insider.write_all(&hello.encode()).unwrap();
        let mut rest = Vec::new();
        let _ = insider.read_to_end(&mut rest);
    }
    let swept = ucx_sweep(&dir, &address, &file);
    assert!(swept.status.success(), "{}", text(&swept.stderr));
    let served = server.wait_with_output().unwrap();
    assert!(served.status.success(), "{:?}: {}", served.status, text(&served.stderr));
    let log = text(&served.stderr);
    assert!(log.contains("worker address"), "the screen said why: {log}");
    drop(stranger);
    let _ = std::fs::remove_dir_all(dir);
}

/// The dialling side: a fake server on loopback that answers `sweep --backend ucx --peer`
/// with a garbage worker address. It cannot prove the token, so the sweep stops at the
/// preamble with a typed error (exit 1), and UCX never parses the fake's bytes.
#[cfg(feature = "ucx")]
#[test]
fn a_fake_ucx_server_cannot_feed_an_address_to_a_sweep() {
    let dir = scratch("ucx-fake");
    let file = token_file(&dir);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let (mut victim, _) = listener.accept().unwrap();
        let mut garbage = preamble(0);
        garbage.extend_from_slice(b"RDMAHUCX");
        garbage.extend_from_slice(&2u16.to_le_bytes());
        garbage.extend_from_slice(&100u16.to_le_bytes());
        garbage.extend_from_slice(&[0x5a; 100]);
        let _ = victim.write_all(&garbage);
        std::thread::sleep(Duration::from_secs(2));
    });
    let swept = ucx_sweep(&dir, &address, &file);
    fake.join().unwrap();
    assert_eq!(swept.status.code(), Some(1), "{}", text(&swept.stderr));
    assert!(text(&swept.stderr).contains("token"), "{}", text(&swept.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// The other side of a protocol violation: a fake `serve` that passes the handshake, then
/// acknowledges a write the sweep never sent. The sweep stops with the protocol error and a
/// non-zero status.
#[test]
fn a_serving_peer_that_breaks_the_protocol_fails_the_sweep() {
    use rdma_hint_staged::wire::{ChannelKind, ExposedRegion, Frame, Hello};
    let dir = scratch("fake-serve");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let (mut victim, _) = listener.accept().unwrap();
        victim.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        victim.write_all(&preamble(0)).unwrap();
        let mut theirs = [0u8; 41];
        victim.read_exact(&mut theirs).unwrap();
        let hello = Hello {
            channel: ChannelKind::Tcp,
            regions: vec![ExposedRegion { id: 0, len: 4 << 20, notify_each_write: false }],
            handoff: None,
        };
        victim.write_all(&hello.encode()).unwrap();
        Hello::decode(&mut victim).unwrap();
        let unsolicited = Frame::ack(0, 77);
        victim.write_all(&unsolicited.encode()).unwrap();
        std::thread::sleep(Duration::from_secs(3));
    });
    let swept = sweep(&dir, &address, &[]);
    fake.join().unwrap();
    assert_eq!(swept.status.code(), Some(1), "{}", text(&swept.stderr));
    assert!(text(&swept.stderr).contains("protocol error"), "{}", text(&swept.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// Saying "finished" first does not excuse a violation after it: the run still fails.
#[test]
fn a_violation_after_the_finish_marker_still_fails_the_run() {
    use rdma_hint_staged::wire::{Frame, FrameKind, FLAG_IMM};
    let dir = scratch("after-finish");
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "1", "--channel", "tcp"]);
    let (mut peer, exposed) = raw_staged_peer(&address);
    // The sweep's "finished" immediate (0x5357_0001) on a proper 4 KiB write...
    let finished = Frame {
        kind: FrameKind::Write,
        flags: FLAG_IMM,
        status: 0,
        region: exposed.id,
        offset: 0,
        len: 4096,
        wr_id: 1,
        imm: 0x5357_0001,
    };
    peer.write_all(&finished.encode()).unwrap();
    peer.write_all(&[0u8; 4096]).unwrap();
    // ...then a frame of no known kind.
    peer.write_all(&[0xee; 40]).unwrap();
    let mut rest = Vec::new();
    let _ = peer.read_to_end(&mut rest);
    let served = server.wait_with_output().unwrap();
    assert!(!served.status.success(), "{}", text(&served.stderr));
    assert!(text(&served.stderr).contains("protocol"), "{}", text(&served.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// A sweep that dials while `serve` is serving another peer is told at once that serve is
/// busy (before, it sat in the backlog until its own deadline and was reset); when the first
/// peer leaves, the next sweep is served.
#[test]
fn a_sweep_that_arrives_during_a_run_is_told_serve_is_busy() {
    let dir = scratch("busy");
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "2", "--channel", "tcp"]);
    let (holder, _) = raw_staged_peer(&address);
    let started = std::time::Instant::now();
    let turned_away = sweep(&dir, &address, &[]);
    let stderr = text(&turned_away.stderr);
    assert_eq!(turned_away.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is busy with another peer"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(5), "told after {:?}", started.elapsed());
    drop(holder);
    let served_next = sweep(&dir, &address, &[]);
    assert!(served_next.status.success(), "{}", text(&served_next.stderr));
    let served = common::output_within(server, "serve", Duration::from_secs(30));
    // The first run failed (its peer left without a sweep); the turned-away sweep was no run.
    assert!(text(&served.stderr).contains("1 of 2 runs failed"), "{}", text(&served.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// A peer that passes the handshake and then sends nothing holds `serve` for the idle
/// timeout, not for the run's whole `--timeout-s` (600 s by default).
#[test]
fn a_peer_that_goes_quiet_after_the_handshake_is_cut_off_by_the_idle_timeout() {
    let dir = scratch("idle");
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "1", "--channel", "tcp", "--idle-timeout-s", "2"]);
    let started = std::time::Instant::now();
    let (_quiet, _) = raw_staged_peer(&address);
    let served = common::output_within(server, "serve", Duration::from_secs(20));
    assert!(!served.status.success());
    assert!(text(&served.stderr).contains("went quiet: nothing arrived for 2 s"), "{}", text(&served.stderr));
    assert!(started.elapsed() < Duration::from_secs(8), "held serve for {:?}", started.elapsed());
    let _ = std::fs::remove_dir_all(dir);
}
