//! Attacks on `rdma-hint serve` from 127.0.0.1, as processes: what an unauthenticated client
//! learns (never the token), silent connections that must not starve a legitimate sweep, and a
//! peer that breaks the protocol (an error for that run; the next peer is served).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

mod common;

use common::free_address;

const TOKEN: &[u8] = b"correct horse battery staple";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rdma-hint-attack-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn token_file(dir: &Path) -> PathBuf {
    let file = dir.join("token");
    std::fs::write(&file, TOKEN).unwrap();
    file
}

fn serve(dir: &Path, address: &str, extra: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-hint"))
        .env("RDMA_HINT_CACHE_DIR", dir)
        .args(["serve", "--listen", address, "--bytes", "4M"])
        .args(if extra.contains(&"--timeout-s") { &[][..] } else { &["--timeout-s", "60"][..] })
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it listens (the first line of its output says so).
    let mut first = [0u8; 1];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    child
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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether this test runs as root; if not, says it skipped (and fails where CI requires root).
fn running_as_root(needs: &str) -> bool {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")));
    if !is_root {
        assert!(std::env::var_os("RDMA_HINT_REQUIRE_NETNS").is_none(), "{needs} needs root");
        eprintln!("skipped: {needs} needs root (CI runs it as root)");
    }
    is_root
}

/// A hand-written staged peer on TCP, past the (token-less) authentication and the hellos:
/// the stream and the region `serve` exposed.
fn raw_staged_peer(address: &str) -> (TcpStream, rdma_hint::staged::wire::ExposedRegion) {
    use rdma_hint::staged::wire::{ChannelKind, Hello};
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
    use rdma_hint::staged::wire::{Frame, FrameKind, FLAG_IMM};
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
    use rdma_hint::oob::{authenticate, Role, Token};
    use rdma_hint::ucx::wire::{ExposedRegion, Hello};
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
        let hello = Hello {
            worker_address,
            regions: vec![ExposedRegion {
                id: 0,
                address: 0x10000,
                len: 4096,
                rkey: vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            }],
            ring: None,
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
    use rdma_hint::staged::wire::{ChannelKind, ExposedRegion, Frame, Hello};
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

/// What every fake peer's Python starts with: the protocol version and ring size it speaks
/// (checked against this build below) and `committed_memfd(size)`, a sealed memfd every page
/// of which is committed, as our own regions and rings are.
macro_rules! fake_peer_common {
    () => {
        r#"
import fcntl, os, socket, struct, sys, time
VERSION = 6
RING_BYTES = 266240
def committed_memfd(size):
    fd = os.memfd_create("fake", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size); os.posix_fallocate(fd, 0, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd
"#
    };
}

/// What the fake servers share: listen on a free loopback port and print it, accept the
/// victim, send the token-less preamble and read the victim's (`read(n)` reads exactly `n`).
const FAKE_SERVE_PRELUDE: &str = concat!(
    fake_peer_common!(),
    r#"tcp = socket.socket(); tcp.bind(("127.0.0.1", 0)); tcp.listen(1)
print(tcp.getsockname()[1], flush=True)
victim, _ = tcp.accept(); victim.settimeout(20)
victim.sendall(b"RDHAUTH1" + b"\0" + os.urandom(32))
def read(n):
    data = b""
    while len(data) < n:
        chunk = victim.recv(n - len(data))
        if not chunk: sys.exit(0)
        data += chunk
    return data
read(41)
"#
);

/// The fake peers speak the staged protocol's version and size its ring as this build does.
#[test]
fn the_fake_peers_speak_this_builds_protocol() {
    for prelude in [FAKE_SERVE_PRELUDE, FAKE_SWEEP_PRELUDE] {
        assert!(prelude.contains(&format!("VERSION = {}\n", rdma_hint::staged::wire::VERSION)));
        assert!(prelude.contains(&format!("RING_BYTES = {}\n", rdma_hint::staged::ring::RING_BYTES)));
    }
}

/// The loopback address a fake server printed as its first line (its port).
fn fake_server_address(server: &mut Child) -> String {
    let mut port = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(server.stdout.as_mut().unwrap()), &mut port)
        .unwrap();
    format!("127.0.0.1:{}", port.trim())
}

/// A quick `sweep --channel shm --peer ADDRESS` with `dir` as its cache.
fn shm_sweep_against(dir: &Path, address: &str) -> Command {
    let mut sweep = Command::new(env!("CARGO_BIN_EXE_rdma-hint"));
    sweep
        .env("RDMA_HINT_CACHE_DIR", dir)
        .args(["sweep", "--channel", "shm", "--peer", address, "--sizes", "64K", "--transfer", "1M"])
        .args(["--iters", "1", "--latency-samples", "3", "--no-record"]);
    sweep
}

/// Another user's fake `serve` on the shm channel cannot make a sweep map anything: the
/// hand-off socket's owner is checked (`SO_PEERCRED`) before a cookie or descriptor moves, so
/// the old attack (a planted symlink, a file of the attacker's choosing) has nothing to aim at.
/// Needs root to run the fake as `nobody` (CI runs as root and requires it).
#[test]
fn another_users_fake_serve_gets_no_shm_mapping() {
    if !running_as_root("running the fake server as another user") {
        return;
    }
    let dir = scratch("other-user");
    let fake = dir.join("fake_serve.py");
    std::fs::write(
        &fake,
        FAKE_SERVE_PRELUDE.to_string()
            + r#"
name = b"rdma-hint-" + os.urandom(8).hex().encode()
unix = socket.socket(socket.AF_UNIX); unix.bind(b"\0" + name); unix.listen(1)
hello = b"RDMAHINT" + struct.pack("<HBH", VERSION, 1, 1) + struct.pack("<IQB", 0, 4 << 20, 0) + bytes([len(name)]) + name + bytes(32)
victim.sendall(hello)
read(8 + 2 + 1 + 2 + 1 + 32)
unix.settimeout(10)
try:
    conn, _ = unix.accept()
    conn.settimeout(5)
    print("cookie:", len(conn.recv(64)), flush=True)
except socket.timeout:
    pass
"#,
    )
    .unwrap();
    let mut server = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            fake.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let address = fake_server_address(&mut server);
    let swept = shm_sweep_against(&dir, &address).output().unwrap();
    let served = server.wait_with_output().unwrap();
    assert_eq!(swept.status.code(), Some(1), "{}", text(&swept.stderr));
    assert!(text(&swept.stderr).contains("runs as uid 65534"), "{}", text(&swept.stderr));
    assert!(!text(&served.stdout).contains("cookie: 32"), "the cookie reached another user");
    let _ = std::fs::remove_dir_all(dir);
}

/// Saying "finished" first does not excuse a violation after it: the run still fails.
#[test]
fn a_violation_after_the_finish_marker_still_fails_the_run() {
    use rdma_hint::staged::wire::{Frame, FrameKind, FLAG_IMM};
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

/// After [`FAKE_SERVE_PRELUDE`]: a fake `serve` on the shm channel, as our own user (so the
/// hand-off's owner check passes), that advertises one 4 MiB region and then, by `mode`, hands over a sealed memfd that is
/// larger than advertised (`big`), one of the right size with no page committed (`sparse`),
/// or nothing but messages without descriptors (`empty`). Prints its port, then `done`.
const FAKE_SHM_SERVE: &str = r#"
mode = sys.argv[1]
advertised = 4 << 20
name = b"rdma-hint-" + os.urandom(8).hex().encode()
unix = socket.socket(socket.AF_UNIX); unix.bind(b"\0" + name); unix.listen(1)
hello = b"RDMAHINT" + struct.pack("<HBH", VERSION, 1, 1) + struct.pack("<IQB", 0, advertised, 0) + bytes([len(name)]) + name + os.urandom(32)
victim.sendall(hello)
read(8 + 2 + 1 + 2 + 1 + 32)
unix.settimeout(10)
conn, _ = unix.accept(); conn.settimeout(10)
conn.recv(32)
conn.recvmsg(1, socket.CMSG_SPACE(4 * 250))
fd = os.memfd_create("fake", os.MFD_ALLOW_SEALING)
size = 64 << 20 if mode == "big" else advertised
os.ftruncate(fd, size)
if mode == "big":
    os.posix_fallocate(fd, 0, size)
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
try:
    if mode == "empty":
        for _ in range(100):
            conn.sendmsg([b"\0"])
            time.sleep(0.1)
    else:
        socket.send_fds(conn, [b"\x02"], [fd, committed_memfd(RING_BYTES)])
        time.sleep(3)
except OSError:
    pass
print("done", flush=True)
"#;

/// `sweep --channel shm --peer` against [`FAKE_SHM_SERVE`] in `mode`, within 20 s.
fn sweep_against_fake_shm_serve(name: &str, mode: &str) -> (Output, Output) {
    let dir = scratch(name);
    let fake = dir.join("fake_shm_serve.py");
    std::fs::write(&fake, FAKE_SERVE_PRELUDE.to_string() + FAKE_SHM_SERVE).unwrap();
    let mut server = Command::new("python3")
        .arg(&fake)
        .arg(mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let address = fake_server_address(&mut server);
    let swept =
        shm_sweep_against(&dir, &address).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let swept = common::output_within(swept, "the sweep against a fake shm serve", Duration::from_secs(20));
    let served = common::output_within(server, "the fake shm serve", Duration::from_secs(20));
    let _ = std::fs::remove_dir_all(dir);
    (swept, served)
}

/// A memfd larger than the region it stands for is not mapped (before, a 4 GiB memfd for a
/// region advertised as 4 KiB was mapped and populated at its real size).
#[test]
fn a_memfd_larger_than_its_advertised_region_is_not_mapped() {
    refused_by_fake_shm_serve("shm-big", "big", "advertised 4194304 B, holds 67108864 B");
}

/// [`sweep_against_fake_shm_serve`] in `mode`: the sweep fails with exit 1 saying `says`.
fn refused_by_fake_shm_serve(name: &str, mode: &str, says: &str) {
    let (swept, _) = sweep_against_fake_shm_serve(name, mode);
    let stderr = text(&swept.stderr);
    assert_eq!(swept.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

/// A memfd of the advertised size with no page committed is not mapped: populating the
/// mapping would commit the peer's region on this side, charged to us.
#[test]
fn a_memfd_whose_pages_the_peer_never_committed_is_not_mapped() {
    refused_by_fake_shm_serve("shm-sparse", "sparse", "are committed");
}

/// Hand-off messages without the descriptors due are refused at once (before, each was taken
/// as a part of the descriptors, and a stream of empty ones held the sweep).
#[test]
fn a_hand_off_message_without_its_descriptors_is_refused_at_once() {
    let started = std::time::Instant::now();
    refused_by_fake_shm_serve("shm-empty", "empty", "carried 0 descriptors where 2 were due");
    assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
}

/// What the fake sweeps on the shm channel share: connect to `serve` (its address in argv[1]),
/// the token-less preamble, and `meet(regions, count)`, which sends a shm hello exposing
/// `count` packed regions and returns serve's hand-off socket name and cookie.
const FAKE_SWEEP_PRELUDE: &str = concat!(
    fake_peer_common!(),
    r#"host, port = sys.argv[1].rsplit(":", 1)
serve = socket.create_connection((host, int(port))); serve.settimeout(20)
serve.sendall(b"RDHAUTH1" + b"\0" + os.urandom(32))
def read(n):
    data = b""
    while len(data) < n:
        chunk = serve.recv(n - len(data))
        if not chunk: sys.exit("closed")
        data += chunk
    return data
read(41)
def meet(regions, count):
    serve.sendall(b"RDMAHINT" + struct.pack("<HBH", VERSION, 1, count) + regions + b"\0" + bytes(32))
    _, _, theirs = struct.unpack("<HBH", read(8 + 5)[8:])
    read(13 * theirs)
    name = read(read(1)[0])
    return name, read(32)
"#
);

/// Starts the fake sweep `script` with `args` (stdin kept open: it waits for it to close) and
/// returns it once it printed `line`.
fn fake_sweep_said(script: &Path, args: &[&str], line: &str) -> Child {
    let mut peer = Command::new("python3")
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(peer.stdout.as_mut().unwrap()), &mut said)
        .unwrap();
    assert_eq!(said.trim(), line);
    peer
}

/// A fake sweep that completes the shm hand-off with `serve`, then writes into serve's ring
/// (which it was handed to publish on) by `mode`: a first slot numbered as no announcement
/// it can hold (`wild-sequence`), or one announcement of a write past the end of the region
/// serve exposed (`outside`). Prints `written`, then waits for stdin to close.
const FAKE_RING_WRITER: &str = r#"
import mmap
mode = sys.argv[2]
size = 4 << 20
name, cookie = meet(struct.pack("<IQB", 0, size, 0), 1)
unix = socket.socket(socket.AF_UNIX); unix.connect(b"\0" + name); unix.settimeout(10)
unix.sendall(cookie)
_, theirs, _, _ = socket.recv_fds(unix, 1, 250)
socket.send_fds(unix, [b"\x02"], [committed_memfd(size), committed_memfd(RING_BYTES)])
ring = mmap.mmap(theirs[-1], RING_BYTES)
# Slot 0 starts at byte 128; its last word (byte 184) numbers the announcement it holds.
if mode == "wild-sequence":
    ring[184:192] = struct.pack("<Q", 1 << 40)
else:
    # kind write, flags placed|imm, region 0, offset: the region's last byte, 2 bytes long.
    ring[128:168] = struct.pack("<BBHIQQQII", 1, 6, 0, 0, serve_region_len - 1, 2, 0, 7, 0)
    ring[184:192] = struct.pack("<Q", 1)
print("written", flush=True)
sys.stdin.readline()
"#;

/// `serve --channel shm` against [`FAKE_RING_WRITER`] in `mode`: serve's run fails with a
/// protocol error naming what was wrong, and serve neither crashes nor hangs.
fn serve_refuses_a_ring_written_by(name: &str, mode: &str, says: &str) {
    let dir = scratch(name);
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "1", "--channel", "shm"]);
    let fake = dir.join("fake_ring_writer.py");
    // serve exposes one region of its `--bytes` (4 MiB).
    let body = FAKE_RING_WRITER.replace("serve_region_len", &(4u64 << 20).to_string());
    std::fs::write(&fake, FAKE_SWEEP_PRELUDE.to_string() + &body).unwrap();
    let mut peer = fake_sweep_said(&fake, &[&address, mode], "written");
    let served = common::output_within(server, "serve after a bad ring", Duration::from_secs(20));
    drop(peer.stdin.take());
    peer.wait().unwrap();
    let stderr = text(&served.stderr);
    assert!(!served.status.success(), "{stderr}");
    assert!(served.status.code().is_some(), "serve died of a signal: {stderr}");
    assert!(stderr.contains("protocol error") && stderr.contains(says), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The ring is memory the peer writes: a slot numbered as no announcement it can hold is a
/// protocol error, not a read of whatever the slot holds.
#[test]
fn a_wild_ring_sequence_from_the_peer_is_a_protocol_error() {
    serve_refuses_a_ring_written_by("ring-sequence", "wild-sequence", "where announcement 1 or none belongs");
}

/// An announcement on the ring passes the same rules as a TCP frame: a write past the end of
/// the exposed region is refused before any byte is copied or arrival delivered.
#[test]
fn a_ring_announcement_outside_the_region_is_a_protocol_error() {
    serve_refuses_a_ring_written_by("ring-outside", "outside", "outside region 0");
}

/// A fake sweep that passes the TCP handshake with `serve --channel shm --timeout-s 5`, then
/// presents its hand-off cookie a byte every 0.4 s (13 s in all): serve cuts it off by the
/// one deadline of the run, not 5 s after its last byte (before, each read had 5 s of its own
/// and the trickle held serve for as long as it went on).
#[test]
fn a_trickled_hand_off_cookie_is_cut_off_by_the_runs_deadline() {
    let dir = scratch("shm-trickle");
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "1", "--channel", "shm", "--timeout-s", "5"]);
    let fake = dir.join("fake_sweep.py");
    std::fs::write(
        &fake,
        FAKE_SWEEP_PRELUDE.to_string()
            + r#"
name, _ = meet(b"", 0)
unix = socket.socket(socket.AF_UNIX); unix.connect(b"\0" + name)
started = time.monotonic()
try:
    for _ in range(32):
        unix.sendall(b"\0")
        time.sleep(0.4)
    unix.settimeout(5)
    cut = unix.recv(1) == b""
except OSError:
    cut = True
print("cut off" if cut else "held", round(time.monotonic() - started, 1), flush=True)
"#,
    )
    .unwrap();
    let trickle = Command::new("python3").arg(&fake).arg(&address).output().unwrap();
    let said = text(&trickle.stdout);
    let seconds: f64 = said.split_whitespace().nth(2).and_then(|s| s.parse().ok()).unwrap_or(f64::MAX);
    let served = common::output_within(server, "serve", Duration::from_secs(30));
    assert!(said.starts_with("cut off"), "{said} {}", text(&trickle.stderr));
    // The cut-off is noticed at the next byte after the close: the deadline plus one 0.4 s step.
    assert!(seconds < 6.5, "cut off after {seconds} s; serve: {}", text(&served.stderr));
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

/// A peer's regions are mapped only when this side writes them: a fake sweep that exposes a
/// 64 MiB region to `serve` (which only receives) costs serve no mapping of it (before, both
/// sides mapped and populated every region the other exposed: a 4 GiB memfd took serve from
/// 10 MB to 3.3 GB resident).
#[test]
fn serve_does_not_map_a_region_it_never_writes() {
    let dir = scratch("shm-unwritten");
    let address = free_address();
    let mut server = serve(&dir, &address, &["--count", "1", "--channel", "shm"]);
    let fake = dir.join("fake_sweep.py");
    std::fs::write(
        &fake,
        FAKE_SWEEP_PRELUDE.to_string()
            + r#"
size = 64 << 20
name, cookie = meet(struct.pack("<IQB", 0, size, 0), 1)
unix = socket.socket(socket.AF_UNIX); unix.connect(b"\0" + name); unix.settimeout(10)
unix.sendall(cookie)
fd = committed_memfd(size)
unix.recvmsg(1, socket.CMSG_SPACE(4 * 250))
socket.send_fds(unix, [b"\x02"], [fd, committed_memfd(RING_BYTES)])
time.sleep(1)
print("handed over", flush=True)
sys.stdin.readline()
"#,
    )
    .unwrap();
    let mut peer = fake_sweep_said(&fake, &[&address], "handed over");
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.id())).unwrap();
    let shared_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssShmem:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    drop(peer.stdin.take());
    peer.wait().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    // Its own 4 MiB region is mapped; the peer's 64 MiB is not.
    assert!(shared_kib < 32 * 1024, "serve maps {shared_kib} KiB of shared memory");
    let _ = std::fs::remove_dir_all(dir);
}
