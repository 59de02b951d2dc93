//! Two processes, real sockets and shared memory: chunked writes of random data over the shm
//! and TCP channels, bytes verified by the receiver; peers that die mid-transfer; malformed
//! handshakes and frames.
//!
//! Peers are this test binary re-run with `RDMA_HINT_PEER` set (see `peer_main`).

use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer, TransferError};
use rdma_hint_integration_tests::{env, ip, netns_available, peer_role, random_bytes, Peer, TwoHosts};
use rdma_hint_model::SourceId;
use rdma_hint_staged::wire::{ChannelKind, ExposedRegion, Frame, FrameKind, Hello, FLAG_IMM};
use rdma_hint_staged::{StagedChannel, StagedTransport};
use rdma_hint_transport::{Arrival, MemoryKind, PeerEndpoint, Transport, TransportError};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const ALIGN: u64 = 4096;

fn deadline(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

/// A hand-written TCP client past the authentication (no token configured), as any local
/// process can be.
fn raw_dial(address: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    rdma_hint_oob::authenticate(&mut stream, None, rdma_hint_oob::Role::Dialer).unwrap();
    stream
}

/// The token every test peer and its parent hold: peers listen on namespace addresses, which
/// need one (a non-loopback listener without a token is refused).
const TEST_TOKEN: &[u8] = b"rdma-hint test peers";

/// A transport of `channel` holding [`TEST_TOKEN`].
fn peer_transport(channel: StagedChannel) -> StagedTransport {
    StagedTransport::new(channel).with_token(TEST_TOKEN).unwrap()
}

fn channel_named(name: &str) -> StagedChannel {
    match name {
        "shm" => StagedChannel::SharedMemory,
        _ => StagedChannel::Tcp,
    }
}

/// Entry point of the peer processes; does nothing in a normal test run.
#[test]
#[ignore = "runs only as a peer process spawned by the other tests"]
fn peer_main() {
    let Some(role) = peer_role() else { return };
    match role.as_str() {
        "receiver" => receiver(),
        "sender" => sender(),
        "raw-reader" => raw_reader(),
        "raw-half-writer" => raw_half_writer(),
        "sender-outcome" => sender_outcome(),
        other => panic!("unknown role {other}"),
    }
}

/// Registers a region, tells the parent where to dial, waits for the transfer's arrival and
/// checks every byte against the seed.
fn receiver() {
    let channel = channel_named(&env("CHANNEL"));
    let len: u64 = env("LEN").parse().unwrap();
    let seed: u64 = env("SEED").parse().unwrap();
    let transport = peer_transport(channel);
    let region = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
    let address = transport.bind(env("LISTEN").parse().unwrap()).unwrap();
    println!("LISTENING {address}");
    std::io::stdout().flush().unwrap();
    rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[region.id],
        deadline(20),
    ))
    .unwrap();
    let mut arrivals = [Arrival::EMPTY; 4];
    let ready = rdma_hint_transport::blocking::block_on(transport.wait_arrivals(&mut arrivals, deadline(20)))
        .unwrap();
    assert_eq!(ready, 1);
    assert_eq!((arrivals[0].imm, arrivals[0].region), (7, region.id));
    let mut arrived = vec![0u8; len as usize];
    transport.read_region(region.id, 0, &mut arrived).unwrap();
    let expected = random_bytes(len as usize, seed);
    match arrived.iter().zip(&expected).position(|(a, b)| a != b) {
        None => println!("RESULT OK {len}"),
        Some(at) => println!("RESULT MISMATCH at {at}"),
    }
}

/// Dials the receiver and writes `LEN` random bytes in chunked blocks.
fn sender() {
    let channel = channel_named(&env("CHANNEL"));
    let len: u64 = env("LEN").parse().unwrap();
    let seed: u64 = env("SEED").parse().unwrap();
    let transport = peer_transport(channel);
    let source = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
    transport.write_region(source.id, 0, &random_bytes(len as usize, seed)).unwrap();
    let peer = PeerEndpoint::Dial(env("DIAL").parse().unwrap());
    let remote =
        rdma_hint_transport::blocking::block_on(transport.connect(peer, &[], deadline(20))).unwrap()[0];
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, ALIGN).unwrap());
    let report = rdma_hint_transport::blocking::block_on(chunker.write(
        &transport,
        Transfer::new(&source, &remote, len).notify(7),
        deadline(20),
    ));
    println!("SENT {}", report.unwrap().payload_bytes);
    std::io::stdout().flush().unwrap();
    // Stay until killed or the receiver is done.
    std::thread::sleep(Duration::from_secs(60));
}

/// Dials the receiver, says so, writes `LEN` bytes with a `DEADLINE_MS` deadline and reports
/// the outcome and how long it took instead of panicking.
fn sender_outcome() {
    let len: u64 = env("LEN").parse().unwrap();
    let transport = peer_transport(channel_named(&env("CHANNEL")));
    let source = transport.register(MemoryKind::Host, len).unwrap();
    let peer = PeerEndpoint::Dial(env("DIAL").parse().unwrap());
    let remote =
        rdma_hint_transport::blocking::block_on(transport.connect(peer, &[], deadline(20))).unwrap()[0];
    println!("CONNECTED");
    std::io::stdout().flush().unwrap();
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, ALIGN).unwrap());
    let started = Instant::now();
    let limit = Duration::from_millis(env("DEADLINE_MS").parse().unwrap());
    let result = rdma_hint_transport::blocking::block_on(chunker.write(
        &transport,
        Transfer::new(&source, &remote, len),
        started + limit,
    ));
    let verdict = match result {
        Ok(_) => "completed".to_string(),
        Err(e) => format!("failed after {} B confirmed: {e}", e.confirmed_bytes()),
    };
    println!("OUTCOME {} ms {verdict}", started.elapsed().as_millis());
    std::io::stdout().flush().unwrap();
}

/// A bare TCP peer on the TCP channel: handshakes, exposes a 256 MiB region, reads 1 MiB of
/// frames, says so, then waits to be killed.
fn raw_reader() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("LISTENING {}", listener.local_addr().unwrap());
    std::io::stdout().flush().unwrap();
    let (mut stream, _) = listener.accept().unwrap();
    rdma_hint_oob::authenticate(&mut stream, None, rdma_hint_oob::Role::Listener).unwrap();
    let hello = Hello {
        channel: ChannelKind::Tcp,
        regions: vec![ExposedRegion { id: 0, len: 256 << 20 }],
        handoff: None,
    };
    stream.write_all(&hello.encode()).unwrap();
    Hello::decode(&mut stream).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    stream.read_exact(&mut sink).unwrap();
    println!("READ 1MiB");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// A bare TCP peer that announces a 1 MiB write with a notification, sends half of it, and
/// waits to be killed.
fn raw_half_writer() {
    let mut stream = raw_dial(env("DIAL").parse::<SocketAddr>().unwrap());
    stream.write_all(&Hello { channel: ChannelKind::Tcp, regions: vec![], handoff: None }.encode()).unwrap();
    Hello::decode(&mut stream).unwrap();
    let frame = Frame {
        kind: FrameKind::Write,
        flags: FLAG_IMM,
        status: 0,
        region: 0,
        offset: 0,
        len: 1 << 20,
        wr_id: 1,
        imm: 7,
    };
    stream.write_all(&frame.encode()).unwrap();
    stream.write_all(&vec![0xAB; 1 << 19]).unwrap();
    println!("HALF SENT");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// The parent sends; a child process receives and verifies.
fn transfer_to_child(channel: &str, len: u64) {
    let seed = len ^ 0x5eed;
    let mut peer = Peer::spawn(
        "receiver",
        &[
            ("CHANNEL", channel.to_string()),
            ("LEN", len.to_string()),
            ("SEED", seed.to_string()),
            ("LISTEN", "127.0.0.1:0".to_string()),
        ],
    );
    let address: SocketAddr = peer.expect("LISTENING").parse().unwrap();
    let transport = peer_transport(channel_named(channel));
    let source = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
    transport.write_region(source.id, 0, &random_bytes(len as usize, seed)).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(30),
    ))
    .unwrap();
    assert_eq!(remote.len(), 1);
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, ALIGN).unwrap());
    let transfer = Transfer::new(&source, &remote[0], len).notify(7);
    let report =
        rdma_hint_transport::blocking::block_on(chunker.write(&transport, transfer, deadline(20))).unwrap();
    assert_eq!(report.payload_bytes, len);
    assert_eq!(peer.expect("RESULT"), format!("OK {len}"), "{channel}, {len} B");
    assert!(peer.child.wait().unwrap().success());
}

const SIZES: [u64; 5] = [1, 4095, 64 * 1024, (1 << 20) + 3, 64 << 20];

#[test]
fn shm_chunked_writes_arrive_byte_exact() {
    for len in SIZES {
        transfer_to_child("shm", len);
    }
}

#[test]
fn tcp_chunked_writes_arrive_byte_exact() {
    for len in SIZES {
        transfer_to_child("tcp", len);
    }
}

#[test]
fn child_sender_reaches_parent_receiver_over_tcp() {
    let transport = peer_transport(StagedChannel::Tcp);
    let len: u64 = 3 * (1 << 20) + 5;
    let region = transport.register(MemoryKind::Host, len.next_multiple_of(ALIGN)).unwrap();
    let address = transport.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut peer = Peer::spawn(
        "sender",
        &[
            ("CHANNEL", "tcp".into()),
            ("LEN", len.to_string()),
            ("SEED", "11".into()),
            ("DIAL", address.to_string()),
        ],
    );
    rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[region.id],
        deadline(30),
    ))
    .unwrap();
    let mut arrivals = [Arrival::EMPTY; 2];
    assert_eq!(
        rdma_hint_transport::blocking::block_on(transport.wait_arrivals(&mut arrivals, deadline(30)))
            .unwrap(),
        1
    );
    assert_eq!(arrivals[0].imm, 7);
    let mut arrived = vec![0u8; len as usize];
    transport.read_region(region.id, 0, &mut arrived).unwrap();
    assert!(arrived == random_bytes(len as usize, 11));
    assert_eq!(peer.expect("SENT"), len.to_string());
}

#[test]
fn receiver_killed_mid_transfer_fails_the_sender_within_the_deadline() {
    let mut peer = Peer::spawn("raw-reader", &[]);
    let address: SocketAddr = peer.expect("LISTENING").parse().unwrap();
    let transport = StagedTransport::new(StagedChannel::Tcp);
    let len = 64 << 20;
    let source = transport.register(MemoryKind::Host, len).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(30),
    ))
    .unwrap()[0];
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, ALIGN).unwrap());
    let killer = std::thread::spawn(move || {
        assert_eq!(peer.expect("READ"), "1MiB");
        peer.child.kill().unwrap();
        peer
    });
    let started = Instant::now();
    let result = rdma_hint_transport::blocking::block_on(chunker.write(
        &transport,
        Transfer::new(&source, &remote, len).notify(1),
        started + Duration::from_secs(20),
    ));
    drop(killer.join().unwrap());
    match result {
        Err(TransferError::Transport {
            source: TransportError::PeerGone(_) | TransportError::Completion { .. },
            confirmed_bytes,
        })
        | Err(TransferError::DeadlineExceeded { confirmed_bytes, .. }) => assert!(confirmed_bytes < len),
        other => panic!("expected the transfer to fail, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(25), "bounded by the deadline");
    // The link stays broken: new posts fail at once with a typed error.
    let again = rdma_hint_transport::blocking::block_on(chunker.write(
        &transport,
        Transfer::new(&source, &remote, 4096),
        deadline(5),
    ));
    assert!(
        matches!(again, Err(TransferError::Transport { source: TransportError::PeerGone(_), .. })),
        "{again:?}"
    );
}

#[test]
fn shm_receiver_killed_mid_transfer_fails_the_sender_within_the_deadline() {
    let len: u64 = 1 << 30;
    let mut peer = Peer::spawn(
        "receiver",
        &[
            ("CHANNEL", "shm".into()),
            ("LEN", len.to_string()),
            ("SEED", "1".into()),
            ("LISTEN", "127.0.0.1:0".into()),
        ],
    );
    let address: SocketAddr = peer.expect("LISTENING").parse().unwrap();
    let transport = peer_transport(StagedChannel::SharedMemory);
    let source = transport.register(MemoryKind::Host, len).unwrap();
    let remote = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(30),
    ))
    .unwrap()[0];
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(4096, ALIGN).unwrap());
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        peer.child.kill().unwrap();
        peer
    });
    let started = Instant::now();
    let result = rdma_hint_transport::blocking::block_on(chunker.write(
        &transport,
        Transfer::new(&source, &remote, len).notify(7),
        started + Duration::from_secs(20),
    ));
    drop(killer.join().unwrap());
    match result {
        Err(TransferError::Transport { confirmed_bytes, .. })
        | Err(TransferError::DeadlineExceeded { confirmed_bytes, .. }) => {
            assert!(confirmed_bytes < len)
        }
        Ok(_) => {
            panic!("1 GiB in 4 KiB blocks finished within 30 ms: the kill came too late to test anything")
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn sender_killed_mid_write_never_reports_the_region_complete() {
    let transport = StagedTransport::new(StagedChannel::Tcp);
    let region = transport.register(MemoryKind::Host, 1 << 20).unwrap();
    let address = transport.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut peer = Peer::spawn("raw-half-writer", &[("DIAL", address.to_string())]);
    rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[region.id],
        deadline(30),
    ))
    .unwrap();
    assert_eq!(peer.expect("HALF"), "SENT");
    peer.child.kill().unwrap();
    let started = Instant::now();
    let mut arrivals = [Arrival::EMPTY; 1];
    let result =
        rdma_hint_transport::blocking::block_on(transport.wait_arrivals(&mut arrivals, deadline(20)));
    assert!(matches!(result, Err(TransportError::PeerGone(_))), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(matches!(transport.poll_arrivals(&mut arrivals), Err(TransportError::PeerGone(_))));
}

/// What a listening transport answers a raw client that sends `bytes` (after authenticating
/// when `authenticated`). A listener drops a bad candidate and waits for a good one, so a
/// failed handshake is the error it reports at its (short) deadline.
fn raw_peer_sends(bytes: Vec<u8>, authenticated: bool) -> TransportError {
    let transport = StagedTransport::new(StagedChannel::Tcp);
    let region = transport.register(MemoryKind::Host, 1 << 20).unwrap();
    let address = transport.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let raw = std::thread::spawn(move || {
        let mut stream = if authenticated { raw_dial(address) } else { TcpStream::connect(address).unwrap() };
        let _ = stream.write_all(&bytes);
        let mut sink = [0u8; 4096];
        let _ = stream.read(&mut sink);
        std::thread::sleep(Duration::from_millis(500));
    });
    let connected = rdma_hint_transport::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[region.id],
        deadline(2),
    ));
    let error = match connected {
        Err(e) => e,
        Ok(_) => {
            let mut arrivals = [Arrival::EMPTY; 1];
            rdma_hint_transport::blocking::block_on(transport.wait_arrivals(&mut arrivals, deadline(10)))
                .unwrap_err()
        }
    };
    raw.join().unwrap();
    error
}

#[test]
fn malformed_handshakes_are_rejected() {
    let mut bad_version = Hello { channel: ChannelKind::Tcp, regions: vec![], handoff: None }.encode();
    bad_version[8] = 9;
    assert!(matches!(raw_peer_sends(bad_version, true), TransportError::Handshake(_)));
    let http = b"GET / HTTP/1.1\r\n\r\n".to_vec();
    assert!(
        matches!(raw_peer_sends(http.clone(), false), TransportError::Unauthorized { .. }),
        "no preamble"
    );
    assert!(matches!(raw_peer_sends(http, true), TransportError::Handshake(_)));
    let shm_hello = Hello { channel: ChannelKind::Shm, regions: vec![], handoff: None }.encode();
    assert!(matches!(raw_peer_sends(shm_hello, true), TransportError::Handshake(_)), "channel mismatch");
    assert!(
        matches!(raw_peer_sends(b"RDMAH".to_vec(), true), TransportError::PeerGone(_)),
        "truncated hello"
    );
}

#[test]
fn malformed_frames_break_the_link_without_an_arrival() {
    let hello = Hello { channel: ChannelKind::Tcp, regions: vec![], handoff: None }.encode();
    let frame = |region: u32, offset: u64, len: u64| {
        Frame { kind: FrameKind::Write, flags: FLAG_IMM, status: 0, region, offset, len, wr_id: 1, imm: 9 }
            .encode()
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage header", [hello.clone(), vec![0xFF; 40]].concat()),
        ("unexposed region", [hello.clone(), frame(5, 0, 16).to_vec()].concat()),
        ("past the region end", [hello.clone(), frame(0, (1 << 20) - 8, 16).to_vec()].concat()),
        ("offset overflow", [hello.clone(), frame(0, u64::MAX, 16).to_vec()].concat()),
        ("ack never asked for", {
            let ack = Frame {
                kind: FrameKind::Ack,
                flags: 0,
                status: 0,
                region: 0,
                offset: 0,
                len: 0,
                wr_id: 3,
                imm: 0,
            };
            [hello.clone(), ack.encode().to_vec()].concat()
        }),
    ];
    for (name, bytes) in cases {
        match raw_peer_sends(bytes, true) {
            TransportError::PeerGone(reason) => {
                assert!(reason.contains("protocol error"), "{name}: {reason}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn unregistered_memory_fails_before_posting() {
    let transport = StagedTransport::new(StagedChannel::Tcp);
    assert!(matches!(transport.register(MemoryKind::Host, 0), Err(TransportError::Registration { .. })));
    // Without the `cuda` feature GPU memory is unsupported; with it but without a driver, the
    // backend says the GPU path is unavailable here.
    let gpu = transport.register(MemoryKind::CudaDevice { ordinal: 0 }, 4096);
    assert!(
        matches!(gpu, Err(TransportError::UnsupportedMemory { .. } | TransportError::Unavailable { .. }))
            || gpu.is_ok(),
        "{gpu:?}"
    );
    let region = transport.register(MemoryKind::Host, 4096).unwrap();
    transport.deregister(region.id).unwrap();
    assert!(matches!(transport.write_region(region.id, 0, &[1]), Err(TransportError::UnregisteredRegion(_))));
    let op = rdma_hint_transport::WriteOp {
        wr_id: 0,
        local: region.id,
        local_offset: 0,
        remote: region.id,
        remote_offset: 0,
        len: 1,
        signalled: true,
        imm: None,
    };
    assert!(matches!(transport.post_writes(&[op]), Err(TransportError::NotConnected)), "not connected");
}

#[test]
fn tcp_across_two_network_namespaces() {
    if !netns_available() {
        return;
    }
    let hosts = TwoHosts::create(0);
    for len in [(1 << 20) + 3, 64 << 20] {
        let seed = len ^ 0xabc;
        let common = [("CHANNEL", "tcp".to_string()), ("LEN", len.to_string()), ("SEED", seed.to_string())];
        let mut receiver = Peer::spawn_in(
            Some(&hosts.names[1]),
            "receiver",
            &[common.as_slice(), &[("LISTEN", format!("{}:0", hosts.addresses[1]))]].concat(),
        );
        let address = receiver.expect("LISTENING");
        assert!(
            address.starts_with(&hosts.addresses[1]),
            "receiver listens on its namespace's address: {address}"
        );
        let mut sender = Peer::spawn_in(
            Some(&hosts.names[0]),
            "sender",
            &[common.as_slice(), &[("DIAL", address)]].concat(),
        );
        assert_eq!(receiver.expect("RESULT"), format!("OK {len}"));
        assert_eq!(sender.expect("SENT"), len.to_string());
    }

    // The link goes down in the middle of a transfer: the sender stops at its deadline with a
    // typed error, no hang.
    let len: u64 = 1 << 30;
    let common = [("CHANNEL", "tcp".to_string()), ("LEN", len.to_string()), ("SEED", "5".to_string())];
    let mut receiver = Peer::spawn_in(
        Some(&hosts.names[1]),
        "receiver",
        &[common.as_slice(), &[("LISTEN", format!("{}:0", hosts.addresses[1]))]].concat(),
    );
    let address = receiver.expect("LISTENING");
    let mut sender = Peer::spawn_in(
        Some(&hosts.names[0]),
        "sender-outcome",
        &[common.as_slice(), &[("DIAL", address), ("DEADLINE_MS", "3000".to_string())]].concat(),
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

/// Both sides write 32 MiB to each other at once with every block signalled: acks travel
/// through the sender threads, so neither reader waits on a socket write and nothing deadlocks.
#[test]
fn simultaneous_writes_in_both_directions_complete() {
    let len: u64 = 32 << 20;
    let a = StagedTransport::new(StagedChannel::Tcp);
    let b = StagedTransport::new(StagedChannel::Tcp);
    let (a_src, a_dst) =
        (a.register(MemoryKind::Host, len).unwrap(), a.register(MemoryKind::Host, len).unwrap());
    let (b_src, b_dst) =
        (b.register(MemoryKind::Host, len).unwrap(), b.register(MemoryKind::Host, len).unwrap());
    a.write_region(a_src.id, 0, &random_bytes(len as usize, 1)).unwrap();
    b.write_region(b_src.id, 0, &random_bytes(len as usize, 2)).unwrap();
    let address = a.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let policy = PostPolicy { wrs_per_doorbell: 8, signal_every: 1, window: 64 };
    let run = |transport: &StagedTransport, peer: PeerEndpoint, src, dst, seed| {
        let remote = rdma_hint_transport::blocking::block_on(transport.connect(peer, &[dst], deadline(20)))
            .unwrap()[0];
        let mut chunker = Chunker::new(policy, transport.capabilities()).unwrap();
        chunker.set_hint(SourceId::Host(0), BlockSpec::new(256 * 1024, ALIGN).unwrap());
        let local = rdma_hint_transport::LocalRegion { id: src, kind: MemoryKind::Host, len };
        rdma_hint_transport::blocking::block_on(chunker.write(
            transport,
            Transfer::new(&local, &remote, len).notify(seed),
            deadline(30),
        ))
        .unwrap();
        let mut arrivals = [Arrival::EMPTY; 1];
        rdma_hint_transport::blocking::block_on(transport.wait_arrivals(&mut arrivals, deadline(30)))
            .unwrap();
        let mut arrived = vec![0u8; len as usize];
        transport.read_region(dst, 0, &mut arrived).unwrap();
        assert!(arrived == random_bytes(len as usize, 3 - u64::from(seed)), "side {seed} received garbage");
    };
    std::thread::scope(|scope| {
        let (run, a, b) = (&run, &a, &b);
        scope.spawn(move || run(a, PeerEndpoint::Listen(address), a_src.id, a_dst.id, 1));
        scope.spawn(move || run(b, PeerEndpoint::Dial(address), b_src.id, b_dst.id, 2));
    });
}

/// Connects a listener and a dialer with the given tokens; returns both sides' results.
fn connect_with_tokens(listener_token: Option<&[u8]>, dialer_token: Option<&[u8]>) -> (bool, bool) {
    let with = |token: Option<&[u8]>| {
        let transport = StagedTransport::new(StagedChannel::Tcp);
        match token {
            Some(token) => transport.with_token(token).unwrap(),
            None => transport,
        }
    };
    let listener = with(listener_token);
    let region = listener.register(MemoryKind::Host, 4096).unwrap();
    let address = listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let accepting = std::thread::spawn(move || {
        rdma_hint_transport::blocking::block_on(listener.connect(
            PeerEndpoint::Listen(address),
            &[region.id],
            deadline(5),
        ))
        .is_ok()
    });
    let dialer = with(dialer_token);
    let dialed = rdma_hint_transport::blocking::block_on(dialer.connect(
        PeerEndpoint::Dial(address),
        &[],
        deadline(5),
    ))
    .is_ok();
    drop(dialer);
    (accepting.join().unwrap(), dialed)
}

#[test]
fn pre_shared_tokens_gate_the_handshake() {
    assert_eq!(connect_with_tokens(Some(b"s3cret"), Some(b"s3cret")), (true, true));
    assert!(!connect_with_tokens(Some(b"s3cret"), Some(b"s3creT")).0, "wrong token rejected");
    assert!(!connect_with_tokens(Some(b"s3cret"), None).0, "missing token rejected");
    assert!(!connect_with_tokens(None, Some(b"s3cret")).1, "the dialer insists on its token too");
    assert_eq!(connect_with_tokens(None, None), (true, true), "no token configured: open");
    assert!(StagedTransport::new(StagedChannel::Tcp).with_token(b"").is_err());
    assert!(StagedTransport::new(StagedChannel::Tcp).with_token(&[7; 65]).is_err());
}
