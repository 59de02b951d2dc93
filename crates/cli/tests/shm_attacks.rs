//! Attacks on the shm channel from fake peers of our own user or another (Python speaking the
//! staged protocol by hand), as processes: descriptors that are not what they claim, hand-off
//! messages without their descriptors, a hand-off cookie trickled or never sent, a hand-off
//! socket whose backlog is kept full, a peer's ring written wild, holes punched into a region
//! after it was handed over, and a peer that keeps what serve handed it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

mod common;

use common::cgroup::small_cgroup;
use common::{free_address, running_as_root, serve, text};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("attack", name)
}

/// What every fake peer's Python starts with: the wire version and ring size it speaks
/// (checked against this build below), `staged_hello(regions, name, cookie)` and `read_hello()`
/// (the staged part of the one hello), and `committed_memfd(size)`, a sealed memfd every page
/// of which is committed, as our own regions and rings are.
macro_rules! fake_peer_common {
    () => {
        r#"
import fcntl, os, socket, struct, sys, time
VERSION = 12
RING_BYTES = 266240
def staged_hello(regions, name=b"", cookie=bytes(32)):
    """A staged hello on the shm channel exposing `regions`, each (id, len, flags)."""
    blob = bytes([1, len(name)]) + name + cookie
    body = b"".join(struct.pack("<IQQBH", i, n, 0, f, 0) for i, n, f in regions)
    return b"RDMAHINT" + struct.pack("<HBH", VERSION, 1, len(blob)) + blob + struct.pack("<H", len(regions)) + body
def read_hello():
    """Reads the peer's staged hello with `read`: (regions it exposes, hand-off name, cookie)."""
    read(8 + 2 + 1)
    blob = read(struct.unpack("<H", read(2))[0])
    count = struct.unpack("<H", read(2))[0]
    for _ in range(count):
        read(4 + 8 + 8 + 1)
        read(struct.unpack("<H", read(2))[0])
    name = blob[2:2 + blob[1]]
    return count, name, blob[2 + len(name):]
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
        assert!(prelude.contains(&format!("VERSION = {}\n", rdma_hint_oob::WIRE_VERSION)));
        assert!(prelude.contains(&format!("RING_BYTES = {}\n", rdma_hint_staged::ring::RING_BYTES)));
    }
}

/// `dir/fake_serve.py`: [`FAKE_SERVE_PRELUDE`], then `body`.
fn fake_serve_script(dir: &Path, body: &str) -> PathBuf {
    let fake = dir.join("fake_serve.py");
    std::fs::write(&fake, FAKE_SERVE_PRELUDE.to_string() + body).unwrap();
    fake
}

/// Python run as `nobody` (another local user, as root can start one).
fn python_as_nobody() -> Command {
    let mut as_nobody = Command::new("setpriv");
    as_nobody.args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]);
    as_nobody
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
    let fake = fake_serve_script(
        &dir,
        r#"
name = b"rdma-hint-" + os.urandom(8).hex().encode()
unix = socket.socket(socket.AF_UNIX); unix.bind(b"\0" + name); unix.listen(1)
victim.sendall(staged_hello([(0, 4 << 20, 0)], name))
read_hello()
unix.settimeout(10)
try:
    conn, _ = unix.accept()
    conn.settimeout(5)
    print("cookie:", len(conn.recv(64)), flush=True)
except socket.timeout:
    pass
"#,
    );
    let mut server = python_as_nobody().arg(&fake).stdout(Stdio::piped()).spawn().unwrap();
    let address = fake_server_address(&mut server);
    let swept = shm_sweep_against(&dir, &address).output().unwrap();
    let served = server.wait_with_output().unwrap();
    assert_eq!(swept.status.code(), Some(1), "{}", text(&swept.stderr));
    assert!(text(&swept.stderr).contains("runs as uid 65534"), "{}", text(&swept.stderr));
    assert!(!text(&served.stdout).contains("cookie: 32"), "the cookie reached another user");
    let _ = std::fs::remove_dir_all(dir);
}

/// After [`FAKE_SERVE_PRELUDE`]: a fake `serve` on the shm channel, as our own user (so the
/// hand-off's owner check passes), that advertises one 4 MiB region and then, by `mode`, hands over a sealed memfd that is
/// larger than advertised (`big`), one of the right size with no page committed (`sparse`),
/// or nothing but messages without descriptors (`empty`), or a committed 512 MiB one that it
/// punches into one hole right after handing it over (`punched`). Prints its port, then `done`.
const FAKE_SHM_SERVE: &str = r#"
mode = sys.argv[1]
advertised = 512 << 20 if mode == "punched" else 4 << 20
name = b"rdma-hint-" + os.urandom(8).hex().encode()
unix = socket.socket(socket.AF_UNIX); unix.bind(b"\0" + name); unix.listen(1)
victim.sendall(staged_hello([(0, advertised, 0)], name, os.urandom(32)))
read_hello()
unix.settimeout(10)
conn, _ = unix.accept(); conn.settimeout(10)
conn.recv(32)
conn.recvmsg(1, socket.CMSG_SPACE(4 * 250))
fd = os.memfd_create("fake", os.MFD_ALLOW_SEALING)
size = 64 << 20 if mode == "big" else advertised
os.ftruncate(fd, size)
if mode in ("big", "punched"):
    os.posix_fallocate(fd, 0, size)
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
try:
    if mode == "empty":
        for _ in range(100):
            conn.sendmsg([b"\0"])
            time.sleep(0.1)
    else:
        socket.send_fds(conn, [b"\x02"], [fd, committed_memfd(RING_BYTES)])
        if mode == "punched":
            import ctypes
            # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE: allowed under the size seals.
            ctypes.CDLL(None, use_errno=True).fallocate(fd, 3, ctypes.c_long(0), ctypes.c_long(size))
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
/// the token-less preamble, and `meet(regions)`, which sends a shm hello exposing `regions`
/// (each `(id, len, flags)`) and returns serve's hand-off socket name and cookie.
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
def meet(regions):
    serve.sendall(staged_hello(regions))
    _, name, cookie = read_hello()
    return name, cookie
"#
);

/// `dir/fake_sweep.py`: [`FAKE_SWEEP_PRELUDE`], then `body`.
fn fake_sweep_script(dir: &Path, body: &str) -> PathBuf {
    let fake = dir.join("fake_sweep.py");
    std::fs::write(&fake, FAKE_SWEEP_PRELUDE.to_string() + body).unwrap();
    fake
}

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
name, cookie = meet([(0, size, 0)])
unix = socket.socket(socket.AF_UNIX); unix.connect(b"\0" + name); unix.settimeout(10)
unix.sendall(cookie)
socket.send_fds(unix, [b"\x02"], [committed_memfd(size), committed_memfd(RING_BYTES)])
_, theirs, _, _ = socket.recv_fds(unix, 1, 250)
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
    let fake = fake_sweep_script(
        &dir,
        r#"
name, _ = meet([])
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
    );
    let trickle = Command::new("python3").arg(&fake).arg(&address).output().unwrap();
    let said = text(&trickle.stdout);
    let seconds: f64 = said.split_whitespace().nth(2).and_then(|s| s.parse().ok()).unwrap_or(f64::MAX);
    let served = common::output_within(server, "serve", Duration::from_secs(30));
    assert!(said.starts_with("cut off"), "{said} {}", text(&trickle.stderr));
    // The cut-off is noticed at the next byte after the close: the deadline plus one 0.4 s step.
    assert!(seconds < 6.5, "cut off after {seconds} s; serve: {}", text(&served.stderr));
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
    let fake = fake_sweep_script(
        &dir,
        r#"
size = 64 << 20
name, cookie = meet([(0, size, 0)])
unix = socket.socket(socket.AF_UNIX); unix.connect(b"\0" + name); unix.settimeout(10)
unix.sendall(cookie)
fd = committed_memfd(size)
socket.send_fds(unix, [b"\x02"], [fd, committed_memfd(RING_BYTES)])
unix.recvmsg(1, socket.CMSG_SPACE(4 * 250))
time.sleep(1)
print("handed over", flush=True)
sys.stdin.readline()
"#,
    );
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

/// A fake `serve` (another user where the test runs as root) names in its hello a hand-off
/// socket whose backlog it keeps full and never accepts: the sweep's dial ends by its
/// `--connect-timeout-s` with a typed error (before, `connect` slept in the kernel with no
/// timeout and the sweep was still stuck at 70 s against its 30 s deadline).
#[test]
fn a_hand_off_socket_with_a_full_backlog_cannot_hold_a_sweep_past_its_deadline() {
    let dir = scratch("full-backlog");
    let fake = fake_serve_script(
        &dir,
        r#"
name = b"rdma-hint-" + os.urandom(8).hex().encode()
unix = socket.socket(socket.AF_UNIX); unix.bind(b"\0" + name); unix.listen(0)
squatters = []
for _ in range(4):
    squatter = socket.socket(socket.AF_UNIX); squatter.setblocking(False)
    try:
        squatter.connect(b"\0" + name)
    except OSError:
        pass
    squatters.append(squatter)
victim.sendall(staged_hello([(0, 4 << 20, 0)], name, os.urandom(32)))
read_hello()
time.sleep(40)
"#,
    );
    let mut launcher = match running_as_root("running the fake server as another user") {
        true => python_as_nobody(),
        false => Command::new("python3"),
    };
    let mut server = launcher.arg(&fake).stdout(Stdio::piped()).spawn().unwrap();
    let address = fake_server_address(&mut server);
    let started = std::time::Instant::now();
    let swept = shm_sweep_against(&dir, &address)
        .args(["--connect-timeout-s", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let swept = common::output_within(swept, "a sweep dialling a full backlog", Duration::from_secs(20));
    let _ = server.kill();
    let _ = server.wait();
    let stderr = text(&swept.stderr);
    assert_eq!(swept.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("deadline"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(8), "the sweep ended after {:?}", started.elapsed());
    let _ = std::fs::remove_dir_all(dir);
}

/// A fake sweep passes the handshake with `serve --channel shm` (600 s run deadline) and never
/// dials the hand-off socket: a real sweep that dials meanwhile is told at once that serve is
/// busy, the fake's run ends within the handshake's 5 s, and the next sweep is served (before,
/// serve waited the run's whole deadline and the real sweep failed after 31 s on "deadline
/// passed … waiting for the peer's handshake").
#[test]
fn a_peer_that_never_dials_the_hand_off_holds_serve_for_the_handshake_limit_only() {
    let dir = scratch("no-hand-off");
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "2", "--channel", "shm", "--timeout-s", "600"]);
    let fake = fake_sweep_script(
        &dir,
        r#"
meet([])
print("met", flush=True)
sys.stdin.readline()
"#,
    );
    let started = std::time::Instant::now();
    let mut holder = fake_sweep_said(&fake, &[&address], "met");
    let turned_away = shm_sweep_against(&dir, &address).output().unwrap();
    let stderr = text(&turned_away.stderr);
    assert_eq!(turned_away.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is busy with another peer"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(4), "told after {:?}", started.elapsed());
    // The holder's run ends by the handshake's limit; then the next sweep is served.
    std::thread::sleep(Duration::from_secs(6).saturating_sub(started.elapsed()));
    let served_next = shm_sweep_against(&dir, &address).output().unwrap();
    assert!(served_next.status.success(), "{}", text(&served_next.stderr));
    drop(holder.stdin.take());
    let _ = holder.wait();
    let served = common::output_within(server, "serve", Duration::from_secs(30));
    assert!(text(&served.stderr).contains("1 of 2 runs failed"), "{}", text(&served.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// A fake sweep of our own user dials the hand-off with the right cookie and sends a message
/// without its descriptors: serve checks the peer's descriptors before it hands over its own,
/// so the fake leaves with none of serve's memory (before, serve sent its region's and ring's
/// memfds first; a peer that kept them pinned 256 MiB per run until serve could register
/// nothing). A second fake completes the exchange, keeps serve's region memfd and leaves:
/// once serve's run has ended, nothing of that region is committed any more.
#[test]
fn a_peer_keeps_none_of_serves_memory() {
    let dir = scratch("kept-memfds");
    let address = free_address();
    let server = serve(&dir, &address, &["--count", "2", "--channel", "shm"]);
    let fake = fake_sweep_script(
        &dir,
        r#"
mode = sys.argv[2]
name, cookie = meet([])
unix = socket.socket(socket.AF_UNIX); unix.connect(b"\0" + name); unix.settimeout(10)
unix.sendall(cookie)
if mode == "bad":
    unix.sendmsg([b"\0"])
    try:
        _, fds, _, _ = socket.recv_fds(unix, 1, 250)
    except OSError:
        fds = []
    print("got", len(fds), flush=True)
    sys.exit(0)
socket.send_fds(unix, [b"\x01"], [committed_memfd(RING_BYTES)])
_, fds, _, _ = socket.recv_fds(unix, 1, 250)
unix.close(); serve.close()
print("kept", len(fds), flush=True)
sys.stdin.readline()
print("committed", os.fstat(fds[0]).st_blocks * 512, flush=True)
"#,
    );
    let bad = Command::new("python3").arg(&fake).args([&address, "bad"]).output().unwrap();
    assert_eq!(text(&bad.stdout).trim(), "got 0", "{}", text(&bad.stderr));
    let mut keeper = fake_sweep_said(&fake, &[&address, "keep"], "kept 2");
    let served = common::output_within(server, "serve", Duration::from_secs(30));
    assert!(text(&served.stderr).contains("2 of 2 runs failed"), "{}", text(&served.stderr));
    drop(keeper.stdin.take());
    let kept = keeper.wait_with_output().unwrap();
    assert_eq!(text(&kept.stdout).trim(), "committed 0", "serve's region stayed committed for the peer");
    let _ = std::fs::remove_dir_all(dir);
}

/// A fake serve hands over a committed, sealed 512 MiB memfd and punches it into one hole at
/// once (the seals allow it): a sweep in a 256 MiB memory cgroup is never OOM-killed (before,
/// the mapping's population committed the whole region again on the sweep's side, charged to
/// it). Where the punch came before the first write, the region is refused with a typed error
/// (`holes_punched_after_the_check_are_refused_at_mapping` pins that message); where it came
/// after, the sweep's writes commit only the pages they cover.
#[test]
fn a_region_punched_after_the_hand_off_commits_nothing_here() {
    let Some(cgroup) = small_cgroup("punched", 256 << 20) else { return };
    let dir = scratch("shm-punched");
    let fake = dir.join("fake_shm_serve.py");
    std::fs::write(&fake, FAKE_SERVE_PRELUDE.to_string() + FAKE_SHM_SERVE).unwrap();
    let mut server = Command::new("python3")
        .arg(&fake)
        .arg("punched")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let address = fake_server_address(&mut server);
    let args = ["sweep", "--channel", "shm", "--peer", &address, "--sizes", "64K", "--transfer", "1M"];
    let swept =
        cgroup.run(&dir, &[&args[..], &["--iters", "1", "--latency-samples", "3", "--no-record"]].concat());
    let _ = common::output_within(server, "the fake shm serve", Duration::from_secs(20));
    let stderr = text(&swept.stderr);
    assert_eq!(cgroup.oom_kills(), 0, "the OOM killer ran in the sweep's cgroup: {stderr}");
    // Refused, or failed when the fake left (it stays 3 s), or finished: a status, never a
    // signal.
    assert!(matches!(swept.status.code(), Some(0 | 1)), "the sweep ended with {:?}: {stderr}", swept.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}
