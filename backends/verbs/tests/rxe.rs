//! Real RDMA traffic over Soft-RoCE. These tests need an RDMA device, so they are `#[ignore]`d
//! (a test that cannot run here is reported as ignored, never as passed): the VM harness
//! (`scripts/vm/verbs-tests.sh`, which CI runs) runs them with `--ignored` where `RXE_DEV`
//! names the rxe device. Run with `--ignored` anywhere else, they fail for want of `RXE_DEV`.
//!
//! Two processes (this test binary re-run as the peer with `RDMA_HINT_PEER` set): chunked RDMA
//! WRITEs of random data, bytes verified by the receiver; a wrong rkey (a proxy rewrites it in
//! the hello) fails as a typed completion error; a receiver killed mid-transfer fails the sender
//! within its deadline; unregistered memory fails before posting.

use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer, TransferError};
use rdma_hint_integration_tests::{env, first_mismatch, peer_role, random_bytes, Peer};
use rdma_hint_model::SourceId;
use rdma_hint_transport::{Arrival, MemoryKind, PeerEndpoint, RegionId, Transport, TransportError, WriteOp};
use rdma_hint_verbs::wire::Hello;
use rdma_hint_verbs::VerbsTransport;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const ALIGN: u64 = 4096;

fn deadline(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

/// The token every test peer and its parent hold: the two-VM peers listen on a RoCE address,
/// which needs one (a non-loopback listener without a token is refused).
const TEST_TOKEN: &[u8] = b"rdma-hint test peers";

/// A transport on `device` holding [`TEST_TOKEN`].
fn peer_transport(device: &str) -> VerbsTransport {
    VerbsTransport::open(Some(device)).unwrap().with_token(TEST_TOKEN).unwrap()
}

fn say(line: String) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// The rxe device the VM harness set up.
fn rxe() -> String {
    std::env::var("RXE_DEV")
        .expect("no RXE_DEV: these tests run inside the Soft-RoCE VM (scripts/vm/verbs-tests.sh)")
}

/// Entry point of the peer processes; does nothing in a normal test run.
#[test]
#[ignore = "runs only as a peer process spawned by the other tests"]
fn peer_main() {
    let Some(role) = peer_role() else { return };
    match role.as_str() {
        "receiver" => receiver(),
        "sender" => sender(),
        other => panic!("unknown role {other}"),
    }
}

/// Registers a region, says where to dial, waits for the arrival and checks every byte.
fn receiver() {
    let len: u64 = env("LEN").parse().unwrap();
    let seed: u64 = env("SEED").parse().unwrap();
    let transport = peer_transport(&env("RXE_DEV"));
    let region = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:0".into());
    let address = transport.bind(listen.parse().unwrap()).unwrap();
    say(format!("LISTENING {address}"));
    rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[region.id],
        deadline(60),
    ))
    .unwrap();
    say("CONNECTED".into());
    let mut arrivals = [Arrival::EMPTY; 4];
    match rdma_hint_transport::blocking::block_on(transport.wait_arrivals(&mut arrivals, deadline(120))) {
        Ok(ready) => {
            assert_eq!(ready, 1);
            assert_eq!((arrivals[0].imm, arrivals[0].region), (7, region.id));
            let mut arrived = vec![0u8; len as usize];
            transport.read_region(region.id, 0, &mut arrived).unwrap();
            match first_mismatch(&arrived, &random_bytes(len as usize, seed)) {
                None => say(format!("RESULT OK {len}")),
                Some(at) => say(format!("RESULT MISMATCH at {at}")),
            }
        }
        Err(e) => say(format!("RESULT ERROR {e}")),
    }
    // Stay until the parent is done with us (it kills us), or `STAY_S` seconds.
    let stay = std::env::var("STAY_S").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    std::thread::sleep(Duration::from_secs(stay));
}

/// Dials `DIAL` (the receiver, possibly in another VM) and writes `LEN` random bytes with an
/// immediate; used by `scripts/vm/verbs-two-vms.sh`.
fn sender() {
    let len: u64 = env("LEN").parse().unwrap();
    let seed: u64 = env("SEED").parse().unwrap();
    let transport = peer_transport(&env("RXE_DEV"));
    let source = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
    transport.write_region(source.id, 0, &random_bytes(len as usize, seed)).unwrap();
    let peer = PeerEndpoint::Dial(env("DIAL").parse().unwrap());
    // The receiver's VM may still be booting: a refused dial is retried until the deadline.
    let until = deadline(120);
    let remote = loop {
        match rdma_hint_transport::blocking::block_on(transport.connect(peer, &[], until)) {
            Err(TransportError::Refused { .. }) if Instant::now() < until => continue,
            connected => break connected.unwrap()[0],
        }
    };
    let transfer = Transfer::new(&source, &remote, len).notify(7);
    let report = rdma_hint_transport::blocking::block_on(chunker(&transport, 64 * 1024).write(
        &transport,
        transfer,
        deadline(300),
    ))
    .unwrap();
    say(format!("SENT {}", report.payload_bytes));
    // Let the receiver read its arrival before this side's QP goes away.
    std::thread::sleep(Duration::from_secs(5));
}

fn spawn_receiver(device: &str, len: u64, seed: u64) -> (Peer, SocketAddr) {
    let mut peer = Peer::spawn(
        "receiver",
        &[("RXE_DEV", device.to_string()), ("LEN", len.to_string()), ("SEED", seed.to_string())],
    );
    let address = peer.expect("LISTENING").parse().unwrap();
    (peer, address)
}

fn chunker(transport: &VerbsTransport, block: u64) -> Chunker {
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(block, ALIGN.min(block)).unwrap());
    chunker
}

#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn chunked_rdma_writes_arrive_byte_exact() {
    let device = rxe();
    for len in [1, 4095, 64 * 1024, (1 << 20) + 3, 8 << 20] {
        let seed = len ^ 0x5eed;
        let (mut peer, address) = spawn_receiver(&device, len, seed);
        let transport = peer_transport(&device);
        let source = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
        transport.write_region(source.id, 0, &random_bytes(len as usize, seed)).unwrap();
        let remote = rdma_hint_transport::blocking::block_on(transport.connect(
            PeerEndpoint::Dial(address),
            &[],
            deadline(60),
        ))
        .unwrap();
        assert_eq!(remote.len(), 1);
        let transfer = Transfer::new(&source, &remote[0], len).notify(7);
        let report = rdma_hint_transport::blocking::block_on(chunker(&transport, 64 * 1024).write(
            &transport,
            transfer,
            deadline(120),
        ))
        .unwrap();
        assert_eq!(report.payload_bytes, len);
        assert_eq!(peer.expect("RESULT"), format!("OK {len}"), "{len} B");
    }
}

/// Forwards the out-of-band exchange between a dialer and `receiver`, rewriting the rkey the
/// receiver advertises, then keeps both sockets open (piping the ready bytes).
fn rkey_rewriting_proxy(receiver: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut dialer, _) = listener.accept().unwrap();
        let mut upstream = TcpStream::connect(receiver).unwrap();
        // The proxy holds the token (an insider rewriting rkeys): it authenticates each leg.
        let token = rdma_hint_oob::Token::new(TEST_TOKEN).unwrap();
        rdma_hint_oob::authenticate(&mut upstream, Some(&token), rdma_hint_oob::Role::Dialer).unwrap();
        rdma_hint_oob::authenticate(&mut dialer, Some(&token), rdma_hint_oob::Role::Listener).unwrap();
        let mut theirs = Hello::decode(&mut upstream).unwrap();
        for region in &mut theirs.regions {
            region.rkey ^= 0x5a5a;
        }
        dialer.write_all(&theirs.encode()).unwrap();
        let mine = Hello::decode(&mut dialer).unwrap();
        upstream.write_all(&mine.encode()).unwrap();
        let mut byte = [0u8; 1];
        upstream.read_exact(&mut byte).unwrap();
        dialer.write_all(&byte).unwrap();
        dialer.read_exact(&mut byte).unwrap();
        upstream.write_all(&byte).unwrap();
        std::thread::sleep(Duration::from_secs(60));
    });
    address
}

#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn a_wrong_rkey_fails_as_a_typed_completion_error() {
    let device = rxe();
    let (mut peer, address) = spawn_receiver(&device, 1 << 20, 1);
    let transport = peer_transport(&device);
    let source = transport.register(MemoryKind::Host, 1 << 20).unwrap();
    let proxy = rkey_rewriting_proxy(address);
    let remote = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Dial(proxy),
        &[],
        deadline(60),
    ))
    .unwrap()[0];
    let started = Instant::now();
    let result = rdma_hint_transport::blocking::block_on(chunker(&transport, 64 * 1024).write(
        &transport,
        Transfer::new(&source, &remote, 1 << 20),
        deadline(30),
    ));
    match result {
        // IBV_WC_REM_ACCESS_ERR = 10: the responder refused the rkey.
        Err(TransferError::Transport {
            source: TransportError::Completion { code, .. },
            confirmed_bytes,
        }) => {
            assert_eq!(code, 10, "expected IBV_WC_REM_ACCESS_ERR");
            assert_eq!(confirmed_bytes, 0);
        }
        other => panic!("expected a remote access error, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    // The QP is in error now: later posts fail at once with a typed error.
    let again = rdma_hint_transport::blocking::block_on(chunker(&transport, 4096).write(
        &transport,
        Transfer::new(&source, &remote, 4096),
        deadline(5),
    ));
    assert!(
        matches!(again, Err(TransferError::Transport { source: TransportError::PeerGone(_), .. })),
        "{again:?}"
    );
    drop(peer.child.kill());
}

#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn a_receiver_killed_mid_transfer_fails_the_sender_within_its_deadline() {
    let device = rxe();
    let len: u64 = 64 << 20;
    let (mut peer, address) = spawn_receiver(&device, len, 2);
    let transport = peer_transport(&device);
    let source = transport.register(MemoryKind::Host, len).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(60),
    ))
    .unwrap()[0];
    let killer = std::thread::spawn(move || {
        assert_eq!(peer.expect("CONNECTED"), "");
        std::thread::sleep(Duration::from_millis(200));
        peer.child.kill().unwrap();
        peer
    });
    let started = Instant::now();
    let result = rdma_hint_transport::blocking::block_on(chunker(&transport, 64 * 1024).write(
        &transport,
        Transfer::new(&source, &remote, len),
        started + Duration::from_secs(60),
    ));
    let elapsed = started.elapsed();
    drop(killer.join().unwrap());
    match result {
        Err(TransferError::Transport {
            source: TransportError::PeerGone(_) | TransportError::Completion { .. },
            confirmed_bytes,
        }) => {
            assert!(confirmed_bytes < len)
        }
        other => panic!("expected the peer to be reported gone, got {other:?}"),
    }
    assert!(elapsed < Duration::from_secs(30), "noticed after {elapsed:?}");
}

#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn unregistered_or_out_of_range_memory_fails_before_posting() {
    let device = rxe();
    let (mut peer, address) = spawn_receiver(&device, 4096, 3);
    let transport = peer_transport(&device);
    let source = transport.register(MemoryKind::Host, 4096).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(60),
    ))
    .unwrap()[0];
    let op = WriteOp {
        wr_id: 1,
        local: source.id,
        local_offset: 0,
        remote: remote.id,
        remote_offset: 0,
        len: 4096,
        signalled: true,
        imm: Some(7),
    };
    assert!(matches!(
        transport.post_writes(&[WriteOp { local: RegionId(9), ..op }]),
        Err(TransportError::UnregisteredRegion(RegionId(9)))
    ));
    assert!(matches!(
        transport.post_writes(&[WriteOp { remote_offset: 1, ..op }]),
        Err(TransportError::OutOfBounds { .. })
    ));
    assert!(matches!(
        transport.post_writes(&[WriteOp { len: 0, ..op }]),
        Err(TransportError::ZeroLength { .. })
    ));
    assert!(matches!(transport.register(MemoryKind::Host, 0), Err(TransportError::Registration { .. })));
    assert!(matches!(
        transport.register(MemoryKind::CudaDevice { ordinal: 0 }, 4096),
        Err(TransportError::UnsupportedMemory { .. })
    ));
    // Nothing was posted by the refused calls; the valid one moves the bytes.
    transport.write_region(source.id, 0, &random_bytes(4096, 3)).unwrap();
    transport.post_writes(&[op]).unwrap();
    let mut completions = [rdma_hint_transport::Completion::EMPTY; 4];
    assert_eq!(
        rdma_hint_transport::blocking::block_on(transport.wait_completions(&mut completions, deadline(30)))
            .unwrap(),
        1
    );
    assert_eq!(peer.expect("RESULT"), "OK 4096");
}

#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn capabilities_come_from_the_device() {
    let device = rxe();
    let devices = rdma_hint_verbs::devices().unwrap();
    let rxe = devices.iter().find(|d| d.name == device).expect("the rxe device is listed");
    assert!(rxe.facts.queried_from_backend);
    assert!(rxe.facts.mtu_bytes.is_some_and(|m| (256..=4096).contains(&m)), "{}", rxe.summary);
    assert!(rxe.facts.max_msg_bytes >= 1 << 20, "{}", rxe.summary);
    assert!(rxe.max_qp_wr >= 64 && rxe.max_sge >= 1, "{}", rxe.summary);
    eprintln!("{}: {}", rxe.name, rxe.summary);
}

/// A connected pair in this process (two QPs on the same device), receiver exposing `len` bytes.
fn pair(
    device: &str,
    len: u64,
) -> (
    VerbsTransport,
    VerbsTransport,
    rdma_hint_transport::LocalRegion,
    rdma_hint_transport::LocalRegion,
    rdma_hint_transport::RemoteRegion,
) {
    let receiver = VerbsTransport::open(Some(device)).unwrap();
    let target = receiver.register(MemoryKind::Host, len).unwrap();
    let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let accepting = std::thread::spawn(move || {
        rdma_hint_transport::blocking::block_on(receiver.connect(
            PeerEndpoint::Listen(address),
            &[target.id],
            deadline(60),
        ))
        .unwrap();
        receiver
    });
    let sender = VerbsTransport::open(Some(device)).unwrap();
    let source = sender.register(MemoryKind::Host, len).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(sender.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(60),
    ))
    .unwrap()[0];
    (sender, accepting.join().unwrap(), source, target, remote)
}

#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn a_deadline_shorter_than_the_transfer_stops_it_in_time() {
    let device = rxe();
    let len = 32 << 20;
    let (sender, _receiver, source, _, remote) = pair(&device, len);
    let started = Instant::now();
    let result = rdma_hint_transport::blocking::block_on(chunker(&sender, 4096).write(
        &sender,
        Transfer::new(&source, &remote, len),
        started + Duration::from_millis(50),
    ));
    match result {
        Err(TransferError::DeadlineExceeded { confirmed_bytes, len: asked }) => {
            assert!(confirmed_bytes < asked)
        }
        other => panic!("expected the deadline, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "stopped after {:?}", started.elapsed());
}

/// Restart and reconnect, 100 times: every cycle opens, connects, moves 64 KiB verified, and
/// drops both sides; descriptors and threads end where they started (no leaked QPs, CQs, MRs
/// or device contexts: each holds a descriptor or kernel object behind the uverbs fd).
#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn a_hundred_connect_transfer_drop_cycles_leak_nothing() {
    use rdma_hint_integration_tests::{open_fds, threads};
    let device = rxe();
    drop(pair(&device, 64 * 1024));
    let before = (open_fds(), threads());
    for cycle in 0..100u32 {
        let (sender, receiver, source, target, remote) = pair(&device, 64 * 1024);
        let data = random_bytes(64 * 1024, u64::from(cycle));
        sender.write_region(source.id, 0, &data).unwrap();
        rdma_hint_transport::blocking::block_on(chunker(&sender, 16 * 1024).write(
            &sender,
            Transfer::new(&source, &remote, 64 * 1024).notify(cycle),
            deadline(30),
        ))
        .unwrap();
        let mut arrivals = [Arrival::EMPTY; 1];
        rdma_hint_transport::blocking::block_on(receiver.wait_arrivals(&mut arrivals, deadline(30))).unwrap();
        assert_eq!(arrivals[0].imm, cycle);
        let mut arrived = vec![0u8; 64 * 1024];
        receiver.read_region(target.id, 0, &mut arrived).unwrap();
        assert!(arrived == data, "cycle {cycle}");
    }
    assert_eq!(before, (open_fds(), threads()), "(fds, threads) before and after 100 cycles");
}

/// The netdev under rxe goes down mid-transfer: the sender ends with a typed error (the QP's
/// retries run out, or the deadline) and never reports the transfer complete. The link comes
/// back up afterwards for the tests that follow.
#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn the_link_going_down_mid_transfer_fails_the_sender_in_time() {
    let device = rxe();
    let netdev =
        std::env::var("RXE_NETDEV").expect("RXE_NETDEV: the netdev under rxe (set by the VM harness)");
    let len = 64 << 20;
    let (sender, _receiver, source, _, remote) = pair(&device, len);
    let link = move |state: &str| {
        let status = std::process::Command::new("ip").args(["link", "set", &netdev, state]).status().unwrap();
        assert!(status.success(), "ip link set {netdev} {state}");
    };
    let cutter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        link("down");
        link
    });
    let started = Instant::now();
    let result = rdma_hint_transport::blocking::block_on(chunker(&sender, 64 * 1024).write(
        &sender,
        Transfer::new(&source, &remote, len),
        started + Duration::from_secs(20),
    ));
    let elapsed = started.elapsed();
    let link = cutter.join().unwrap();
    link("up");
    match result {
        Err(TransferError::Transport { confirmed_bytes, .. })
        | Err(TransferError::DeadlineExceeded { confirmed_bytes, .. }) => {
            assert!(confirmed_bytes < len)
        }
        other => panic!("expected the transfer to fail, got {other:?}"),
    }
    assert!(elapsed < Duration::from_secs(25), "ended after {elapsed:?}");
    eprintln!("link down: sender ended after {elapsed:?}: {}", result.unwrap_err());
}

/// The fault case repeated: 100 transfers whose receiver is dropped mid-way end with a typed
/// error each time and leave descriptors and threads as they were.
#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn a_hundred_failed_transfers_leak_nothing() {
    use rdma_hint_integration_tests::{open_fds, threads};
    let device = rxe();
    drop(pair(&device, 64 * 1024));
    let before = (open_fds(), threads());
    let mut failed = 0;
    for cycle in 0..100u32 {
        let len = 4 << 20;
        let (sender, receiver, source, _, remote) = pair(&device, len);
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            drop(receiver);
        });
        let result = rdma_hint_transport::blocking::block_on(chunker(&sender, 4096).write(
            &sender,
            Transfer::new(&source, &remote, len),
            deadline(30),
        ));
        closer.join().unwrap();
        if let Err(e) = result {
            assert!(matches!(e, TransferError::Transport { .. }), "cycle {cycle}: {e}");
            failed += 1;
        }
    }
    assert!(failed >= 90, "only {failed} of 100 transfers saw the receiver go");
    assert_eq!(before, (open_fds(), threads()), "(fds, threads) after 100 failed transfers");
}
