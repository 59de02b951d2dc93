//! What only the staged backend's own protocol has: a sender killed in the middle of a frame,
//! malformed staged hellos and frames from a hand-written peer. The contract every backend
//! meets (bytes, deadlines, dead peers, leaks, tokens) is `tests/conformance.rs`.
//!
//! Peers are this test binary re-run with `RDMA_HINT_PEER` set (see `peer_main`).

use rdma_hint_core::{Arrival, MemoryKind, PeerEndpoint, Transport, TransportError};
use rdma_hint_integration_tests::{env, peer_role, Peer};
use rdma_hint_staged::wire::{ChannelKind, Frame, FrameKind, Hello, FLAG_IMM};
use rdma_hint_staged::{StagedChannel, StagedTransport};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

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

/// Entry point of the peer processes; does nothing in a normal test run.
#[test]
#[ignore = "runs only as a peer process spawned by the other tests"]
fn peer_main() {
    let Some(role) = peer_role() else { return };
    match role.as_str() {
        "raw-half-writer" => raw_half_writer(),
        other => panic!("unknown role {other}"),
    }
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

#[test]
fn sender_killed_mid_write_never_reports_the_region_complete() {
    let transport = StagedTransport::new(StagedChannel::Tcp);
    let region = transport.register(MemoryKind::Host, 1 << 20).unwrap();
    let address = transport.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut peer = Peer::spawn("raw-half-writer", &[("DIAL", address.to_string())]);
    rdma_hint_backend_core::blocking::block_on(transport.connect(
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
        rdma_hint_backend_core::blocking::block_on(transport.wait_arrivals(&mut arrivals, deadline(20)));
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
    let connected = rdma_hint_backend_core::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[region.id],
        deadline(2),
    ));
    let error = match connected {
        Err(e) => e,
        Ok(_) => {
            let mut arrivals = [Arrival::EMPTY; 1];
            rdma_hint_backend_core::blocking::block_on(transport.wait_arrivals(&mut arrivals, deadline(10)))
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
            let ack = Frame::ack(0, 3);
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
