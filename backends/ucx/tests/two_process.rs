//! Two processes over real UCX transports: chunked writes of random data over shared memory
//! (`shm,self`), tcp on loopback (`tcp,self`) and tcp between two network namespaces, bytes
//! verified by the receiver; a receiver killed mid-transfer; a link set down mid-transfer;
//! malformed out-of-band messages; unregistered memory.
//!
//! Peers are this test binary re-run with `RDMA_HINT_PEER` set (see `peer_main`).

use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer, TransferError};
use rdma_hint_integration_tests::{
    env, first_mismatch, ip, netns_available, peer_role, random_bytes, Peer, TwoHosts,
};
use rdma_hint_model::SourceId;
use rdma_hint_transport::{Arrival, MemoryKind, PeerEndpoint, RegionId, Transport, TransportError, WriteOp};
use rdma_hint_ucx::wire::{ExposedRegion, Hello};
use rdma_hint_ucx::UcxTransport;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const ALIGN: u64 = 4096;
const SIZES: [u64; 5] = [1, 4095, 64 * 1024, (1 << 20) + 3, 64 << 20];

fn deadline(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

/// The token every test peer and its parent hold: peers listen on namespace addresses, which
/// need one (a non-loopback listener without a token is refused).
const TEST_TOKEN: &[u8] = b"rdma-hint test peers";

/// A transport for `tls` holding [`TEST_TOKEN`].
fn peer_transport(tls: &str) -> UcxTransport {
    UcxTransport::open(Some(tls)).unwrap().with_token(TEST_TOKEN).unwrap()
}

fn say(line: String) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// UCX sees every interface; tests only ever talk over loopback or their own veth.
fn loopback_only() -> (&'static str, String) {
    ("UCX_NET_DEVICES", "lo".to_string())
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

/// Registers a region, says where to dial, waits for the transfer's arrival and checks every
/// byte against the seed.
fn receiver() {
    let len: u64 = env("LEN").parse().unwrap();
    let seed: u64 = env("SEED").parse().unwrap();
    let transport = peer_transport(&env("TLS"));
    let region = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
    let address = transport.bind(env("LISTEN").parse().unwrap()).unwrap();
    say(format!("LISTENING {address}"));
    rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[region.id],
        deadline(30),
    ))
    .unwrap();
    say("CONNECTED".into());
    let mut arrivals = [Arrival::EMPTY; 4];
    let ready = rdma_hint_transport::blocking::block_on(transport.wait_arrivals(&mut arrivals, deadline(60)))
        .unwrap();
    assert_eq!(ready, 1);
    assert_eq!((arrivals[0].imm, arrivals[0].region), (7, region.id));
    let mut arrived = vec![0u8; len as usize];
    transport.read_region(region.id, 0, &mut arrived).unwrap();
    match first_mismatch(&arrived, &random_bytes(len as usize, seed)) {
        None => say(format!("RESULT OK {len}")),
        Some(at) => say(format!("RESULT MISMATCH at {at}")),
    }
}

/// Dials the receiver and writes `LEN` random bytes in 64 KiB blocks with a `DEADLINE_MS`
/// deadline; reports the outcome and how long it took instead of panicking.
fn sender() {
    let len: u64 = env("LEN").parse().unwrap();
    let seed: u64 = env("SEED").parse().unwrap();
    let transport = peer_transport(&env("TLS"));
    let source = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
    transport.write_region(source.id, 0, &random_bytes(len as usize, seed)).unwrap();
    let peer = PeerEndpoint::Dial(env("DIAL").parse().unwrap());
    let remote =
        rdma_hint_transport::blocking::block_on(transport.connect(peer, &[], deadline(30))).unwrap()[0];
    say("CONNECTED".into());
    let mut chunker = chunker(&transport);
    let started = Instant::now();
    let limit = Duration::from_millis(env("DEADLINE_MS").parse().unwrap());
    let result = rdma_hint_transport::blocking::block_on(chunker.write(
        &transport,
        Transfer::new(&source, &remote, len).notify(7),
        started + limit,
    ));
    let verdict = match result {
        Ok(report) => format!("completed {}", report.payload_bytes),
        Err(e) => format!("failed after {} B confirmed: {e}", e.confirmed_bytes()),
    };
    say(format!("OUTCOME {} ms {verdict}", started.elapsed().as_millis()));
    // Stay until the parent is done with us.
    std::thread::sleep(Duration::from_secs(60));
}

fn chunker(transport: &UcxTransport) -> Chunker {
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, ALIGN).unwrap());
    chunker
}

/// The parent sends to a child receiver over `tls`; the child verifies.
fn transfer_to_child(tls: &str, len: u64) {
    let seed = len ^ 0x5eed;
    let mut peer = Peer::spawn(
        "receiver",
        &[
            ("TLS", tls.to_string()),
            ("LEN", len.to_string()),
            ("SEED", seed.to_string()),
            ("LISTEN", "127.0.0.1:0".to_string()),
            loopback_only(),
        ],
    );
    let address: SocketAddr = peer.expect("LISTENING").parse().unwrap();
    let transport = peer_transport(tls);
    let source = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
    transport.write_region(source.id, 0, &random_bytes(len as usize, seed)).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(30),
    ))
    .unwrap();
    assert_eq!(remote.len(), 1);
    let transfer = Transfer::new(&source, &remote[0], len).notify(7);
    let report = rdma_hint_transport::blocking::block_on(chunker(&transport).write(
        &transport,
        transfer,
        deadline(60),
    ))
    .unwrap();
    assert_eq!(report.payload_bytes, len);
    assert_eq!(peer.expect("RESULT"), format!("OK {len}"), "{tls}, {len} B");
    assert!(peer.child.wait().unwrap().success());
}

#[test]
fn shm_chunked_writes_arrive_byte_exact() {
    for len in SIZES {
        transfer_to_child("shm,self", len);
    }
}

#[test]
fn tcp_chunked_writes_arrive_byte_exact() {
    std::env::set_var("UCX_NET_DEVICES", "lo");
    for len in SIZES {
        transfer_to_child("tcp,self", len);
    }
}

/// A child receiver that is killed once the sender has started: the sender ends with a typed
/// error well within its deadline, never reports the whole region written, and later posts
/// fail at once.
fn receiver_killed_mid_transfer(tls: &str) {
    let len: u64 = 1 << 30;
    let mut peer = Peer::spawn(
        "receiver",
        &[
            ("TLS", tls.to_string()),
            ("LEN", len.to_string()),
            ("SEED", "3".to_string()),
            ("LISTEN", "127.0.0.1:0".to_string()),
            loopback_only(),
        ],
    );
    let address: SocketAddr = peer.expect("LISTENING").parse().unwrap();
    let transport = peer_transport(tls);
    let source = transport.register(MemoryKind::Host, len).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(30),
    ))
    .unwrap()[0];
    let killer = std::thread::spawn(move || {
        assert_eq!(peer.expect("CONNECTED"), "");
        std::thread::sleep(Duration::from_millis(30));
        peer.child.kill().unwrap();
        peer
    });
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(4096, ALIGN).unwrap());
    let started = Instant::now();
    let result = rdma_hint_transport::blocking::block_on(chunker.write(
        &transport,
        Transfer::new(&source, &remote, len).notify(1),
        started + Duration::from_secs(20),
    ));
    let elapsed = started.elapsed();
    drop(killer.join().unwrap());
    match result {
        Err(TransferError::Transport {
            source: TransportError::PeerGone(_) | TransportError::Completion { .. },
            confirmed_bytes,
        }) => assert!(confirmed_bytes < len, "{tls}"),
        other => panic!("{tls}: expected the peer to be reported gone, got {other:?}"),
    }
    assert!(elapsed < Duration::from_secs(10), "{tls}: noticed after {elapsed:?}");
    let again = rdma_hint_transport::blocking::block_on(chunker.write(
        &transport,
        Transfer::new(&source, &remote, 4096),
        deadline(5),
    ));
    assert!(
        matches!(again, Err(TransferError::Transport { source: TransportError::PeerGone(_), .. })),
        "{tls}: {again:?}"
    );
}

#[test]
fn shm_receiver_killed_mid_transfer_fails_the_sender_in_time() {
    receiver_killed_mid_transfer("shm,self");
}

#[test]
fn tcp_receiver_killed_mid_transfer_fails_the_sender_in_time() {
    std::env::set_var("UCX_NET_DEVICES", "lo");
    receiver_killed_mid_transfer("tcp,self");
}

#[test]
fn tcp_across_two_network_namespaces() {
    if !netns_available() {
        return;
    }
    let hosts = TwoHosts::create(1);
    let in_ns = |i: usize| ("UCX_NET_DEVICES", hosts.links[i].clone());
    for len in [(1 << 20) + 3, 64 << 20] {
        let seed = len ^ 0xabc;
        let common = [("TLS", "tcp".to_string()), ("LEN", len.to_string()), ("SEED", seed.to_string())];
        let mut receiver = Peer::spawn_in(
            Some(&hosts.names[1]),
            "receiver",
            &[common.as_slice(), &[("LISTEN", format!("{}:0", hosts.addresses[1])), in_ns(1)]].concat(),
        );
        let address = receiver.expect("LISTENING");
        assert!(address.starts_with(&hosts.addresses[1]), "listens on its namespace's address: {address}");
        let mut sender = Peer::spawn_in(
            Some(&hosts.names[0]),
            "sender",
            &[common.as_slice(), &[("DIAL", address), ("DEADLINE_MS", "60000".into()), in_ns(0)]].concat(),
        );
        assert_eq!(receiver.expect("RESULT"), format!("OK {len}"));
        assert!(sender.expect("OUTCOME").ends_with(&format!("completed {len}")));
    }

    // The link goes down mid-transfer: the sender stops by its deadline with a typed error.
    let len: u64 = 1 << 30;
    let common = [("TLS", "tcp".to_string()), ("LEN", len.to_string()), ("SEED", "5".to_string())];
    let mut receiver = Peer::spawn_in(
        Some(&hosts.names[1]),
        "receiver",
        &[common.as_slice(), &[("LISTEN", format!("{}:0", hosts.addresses[1])), in_ns(1)]].concat(),
    );
    let address = receiver.expect("LISTENING");
    let mut sender = Peer::spawn_in(
        Some(&hosts.names[0]),
        "sender",
        &[common.as_slice(), &[("DIAL", address), ("DEADLINE_MS", "3000".into()), in_ns(0)]].concat(),
    );
    assert_eq!(sender.expect("CONNECTED"), "");
    std::thread::sleep(Duration::from_millis(50));
    ip(&["-n", &hosts.names[0], "link", "set", &hosts.links[0], "down"]);
    let outcome = sender.expect("OUTCOME");
    let elapsed_ms: u64 = outcome.split_whitespace().next().unwrap().parse().unwrap();
    assert!(outcome.contains("failed after"), "{outcome}");
    assert!(elapsed_ms < 6000, "{outcome}");
    drop(receiver);
}

/// A hand-written TCP client that holds the token (an insider sending bad bytes).
fn raw_dial(address: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    let token = rdma_hint_oob::Token::new(TEST_TOKEN).unwrap();
    rdma_hint_oob::authenticate(&mut stream, Some(&token), rdma_hint_oob::Role::Dialer).unwrap();
    stream
}

/// A listening transport that a raw socket sends `bytes` to (after authenticating when
/// `authenticated`): what `connect` answers at its short deadline (a listener drops a bad
/// candidate and waits for a good one).
fn raw_peer_sends(bytes: Vec<u8>, authenticated: bool) -> TransportError {
    let transport = peer_transport("tcp,self");
    let region = transport.register(MemoryKind::Host, 4096).unwrap();
    let address = transport.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let raw = std::thread::spawn(move || {
        let mut stream = if authenticated { raw_dial(address) } else { TcpStream::connect(address).unwrap() };
        let _ = stream.write_all(&bytes);
        // Keep the socket open until the transport has judged the bytes.
        std::thread::sleep(Duration::from_millis(500));
    });
    let result = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[region.id],
        deadline(2),
    ));
    raw.join().unwrap();
    result.unwrap_err()
}

fn hello() -> Hello {
    Hello {
        worker_address: vec![1; 64],
        regions: vec![ExposedRegion { id: 0, address: 0x10000, len: 4096, rkey: vec![2; 32] }],
    }
}

#[test]
fn malformed_out_of_band_messages_are_rejected_with_a_reason() {
    let err = raw_peer_sends(b"GET / HTTP/1.1\r\n\r\n".to_vec(), false);
    assert!(matches!(err, TransportError::Unauthorized { .. }), "{err}");
    let err = raw_peer_sends(b"GET / HTTP/1.1\r\n\r\n".to_vec(), true);
    assert!(err.to_string().contains("bad magic"), "{err}");
    let mut wrong_version = hello().encode();
    wrong_version[8] = 9;
    let err = raw_peer_sends(wrong_version, true);
    assert!(err.to_string().contains("version"), "{err}");
    let mut oversized = hello().encode();
    oversized[10..12].copy_from_slice(&u16::MAX.to_le_bytes());
    let err = raw_peer_sends(oversized, true);
    assert!(err.to_string().contains("worker address of 65535 B exceeds"), "{err}");
    // A truncated hello followed by silence: the deadline, not a hang.
    let started = Instant::now();
    let err = raw_peer_sends(hello().encode()[..20].to_vec(), true);
    assert!(matches!(err, TransportError::DeadlineExceeded { .. } | TransportError::PeerGone(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A well-formed hello whose rkey is garbage: UCX refuses to unpack it and `connect` fails
/// with a handshake error instead of accepting a peer it cannot write to.
#[test]
fn a_garbage_rkey_is_refused_at_connect() {
    let receiver = peer_transport("tcp,self");
    receiver.register(MemoryKind::Host, 4096).unwrap();
    let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    // A genuine worker address taken from the receiver's own hello, and a corrupt rkey.
    let liar = std::thread::spawn(move || {
        let transport = peer_transport("tcp,self");
        let region = transport.register(MemoryKind::Host, 4096).unwrap();
        let mut stream = raw_dial(address);
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let theirs = Hello::decode(&mut stream).unwrap();
        let mine = Hello {
            worker_address: theirs.worker_address.clone(),
            regions: vec![ExposedRegion {
                id: region.id.0,
                address: 0x10000,
                len: 4096,
                rkey: vec![0xff; 7],
            }],
        };
        stream.write_all(&mine.encode()).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let err = rdma_hint_transport::blocking::block_on(receiver.connect(
        PeerEndpoint::Listen(address),
        &[],
        deadline(5),
    ))
    .unwrap_err();
    liar.join().unwrap();
    assert!(err.to_string().contains("packed rkey of 7 B"), "{err}");
}

#[test]
fn unregistered_or_out_of_range_memory_fails_before_posting() {
    std::env::set_var("UCX_NET_DEVICES", "lo");
    let receiver = peer_transport("tcp,self");
    let target = receiver.register(MemoryKind::Host, 1 << 20).unwrap();
    let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let accepting = std::thread::spawn(move || {
        rdma_hint_transport::blocking::block_on(receiver.connect(
            PeerEndpoint::Listen(address),
            &[target.id],
            deadline(10),
        ))
        .unwrap();
        receiver
    });
    let sender = peer_transport("tcp,self");
    let source = sender.register(MemoryKind::Host, 1 << 20).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(sender.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(10),
    ))
    .unwrap()[0];
    let receiver = accepting.join().unwrap();
    let op = WriteOp {
        wr_id: 1,
        local: source.id,
        local_offset: 0,
        remote: remote.id,
        remote_offset: 0,
        len: 4096,
        signalled: true,
        imm: Some(5),
    };
    let unregistered = WriteOp { local: RegionId(42), ..op };
    assert!(matches!(
        sender.post_writes(&[op, unregistered]),
        Err(TransportError::UnregisteredRegion(RegionId(42)))
    ));
    let past_end = WriteOp { remote_offset: (1 << 20) - 100, ..op };
    assert!(matches!(
        sender.post_writes(&[past_end]),
        Err(TransportError::OutOfBounds { side: "remote", .. })
    ));
    assert!(matches!(
        sender.post_writes(&[WriteOp { len: 0, ..op }]),
        Err(TransportError::ZeroLength { .. })
    ));
    assert!(matches!(
        sender.register(MemoryKind::CudaDevice { ordinal: 0 }, 4096),
        Err(TransportError::UnsupportedMemory { .. })
    ));
    assert!(matches!(sender.register(MemoryKind::Host, 0), Err(TransportError::Registration { .. })));
    // Nothing of the refused batches was posted: the receiver sees no arrival.
    let mut arrivals = [Arrival::EMPTY; 2];
    assert_eq!(receiver.poll_arrivals(&mut arrivals).unwrap(), 0);
    // A region exposed to a connected peer cannot be pulled from under it.
    assert!(receiver.deregister(target.id).is_err());
    // And the connection still works.
    sender.write_region(source.id, 0, &[9u8; 4096]).unwrap();
    sender.post_writes(&[op]).unwrap();
    let mut completions = [rdma_hint_transport::Completion::EMPTY; 2];
    assert_eq!(
        rdma_hint_transport::blocking::block_on(sender.wait_completions(&mut completions, deadline(10)))
            .unwrap(),
        1
    );
    assert_eq!(
        rdma_hint_transport::blocking::block_on(receiver.wait_arrivals(&mut arrivals, deadline(10))).unwrap(),
        1
    );
    let mut arrived = [0u8; 4096];
    receiver.read_region(target.id, 0, &mut arrived).unwrap();
    assert!(arrived.iter().all(|b| *b == 9));
}

#[test]
fn pre_shared_tokens_gate_the_handshake() {
    std::env::set_var("UCX_NET_DEVICES", "lo");
    for (listener_token, dialer_token, accepted) in [
        (Some(&b"s3cret"[..]), Some(&b"s3cret"[..]), true),
        (Some(b"s3cret"), Some(b"guess!"), false),
        (Some(b"s3cret"), None, false),
        // Without a token the UCX backend connects to nobody: only authenticated peers may
        // hand it a worker address.
        (None, None, false),
    ] {
        let mut receiver = UcxTransport::open(Some("tcp,self")).unwrap();
        if let Some(token) = listener_token {
            receiver = receiver.with_token(token).unwrap();
        }
        let target = receiver.register(MemoryKind::Host, 4096).unwrap();
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let accepting = std::thread::spawn(move || {
            rdma_hint_transport::blocking::block_on(receiver.connect(
                PeerEndpoint::Listen(address),
                &[target.id],
                deadline(10),
            ))
            .is_ok()
        });
        let mut sender = UcxTransport::open(Some("tcp,self")).unwrap();
        if let Some(token) = dialer_token {
            sender = sender.with_token(token).unwrap();
        }
        let dialed = rdma_hint_transport::blocking::block_on(sender.connect(
            PeerEndpoint::Dial(address),
            &[],
            deadline(10),
        ))
        .is_ok();
        assert_eq!((accepting.join().unwrap(), dialed), (accepted, accepted));
    }
}
