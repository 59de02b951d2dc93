//! What only the staged backend's own protocol has: a sender killed in the middle of a frame,
//! malformed staged hellos and frames from a hand-written peer. The contract every backend
//! meets (bytes, deadlines, dead peers, leaks, tokens) is `tests/conformance.rs`.
//!
//! Peers are this test binary re-run with `RDMA_HINT_PEER` set (see `peer_main`).

use rdma_hint_core::{
    Arrival, Completion, CompletionStatus, MemoryKind, PeerEndpoint, ReadOp, RegionId, Transport,
    TransportError, WriteOp,
};
use rdma_hint_integration_tests::{env, peer_role, Peer};
use rdma_hint_oob::Control;
use rdma_hint_staged::wire::{
    ChannelKind, ExposedRegion, Frame, FrameKind, Hello, FLAG_IMM, HEADER_BYTES, MAX_CONTROL_FRAME,
};
use rdma_hint_staged::{StagedChannel, StagedTransport, FLUSHED_STATUS};
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

/// A hand-written TCP peer past the handshake, exposing one region of 4 KiB (id 0).
fn raw_peer_of_one_region(address: SocketAddr) -> TcpStream {
    let mut stream = raw_dial(address);
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let region = ExposedRegion { id: 0, len: 4096, notify_each_write: false };
    let hello = Hello { channel: ChannelKind::Tcp, regions: vec![region], handoff: None };
    stream.write_all(&hello.encode()).unwrap();
    Hello::decode(&mut stream).unwrap();
    stream
}

/// `transport` takes the peer dialling `address`, exposing nothing.
fn accept(transport: &StagedTransport, address: SocketAddr) {
    let connected = rdma_hint_backend_core::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[],
        deadline(10),
    ));
    connected.unwrap();
}

/// Posts write 1: 64 signalled bytes of `source` into the peer's region 0.
fn post_signalled_write(transport: &StagedTransport, source: RegionId) {
    let write =
        WriteOp { wr_id: 1, local: source, remote: RegionId(0), len: 64, signalled: true, ..WriteOp::EMPTY };
    transport.post_writes(&[write]).unwrap();
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
        // A refused hello is answered with why; a cut one with nothing (the listener waits
        // for its rest), so this side gives up listening and leaves.
        stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
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
    bad_version[8] = 9; // the version before this one
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

/// One control message in the `Control` frame that carries it on TCP.
fn control(message: Control) -> Vec<u8> {
    let mut body = Vec::new();
    message.encode(&mut body);
    [Frame::control(body.len() as u64).encode().to_vec(), body].concat()
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
        ("a control frame outside the control protocol", {
            [hello.clone(), Frame::control(1).encode().to_vec(), vec![9]].concat()
        }),
        ("an answer to a request never asked", {
            [hello.clone(), control(Control::Done { seq: 0, refused: None })].concat()
        }),
        ("an oversized control frame", {
            [hello.clone(), Frame::control(MAX_CONTROL_FRAME + 1).encode().to_vec()].concat()
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

/// A peer that keeps its socket open and answers nothing (no ack, no read's bytes) ends the
/// link after 30 s of silence, as an RC queue pair ends at its retry timeout: the waiting write
/// and read are flushed, and the read's destination can be released again.
#[test]
fn a_peer_that_answers_nothing_is_gone_after_thirty_seconds_of_silence() {
    let transport = StagedTransport::new(StagedChannel::Tcp);
    let source = transport.register(MemoryKind::Host, 4096).unwrap();
    let destination = transport.register(MemoryKind::Host, 4096).unwrap();
    let address = transport.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let silent = std::thread::spawn(move || {
        let mut stream = raw_peer_of_one_region(address);
        stream.set_read_timeout(None).unwrap();
        // Takes the write and the read request, answers neither, until the link ends.
        let mut taken = 0;
        let mut sink = [0u8; 4096];
        while let Ok(read @ 1..) = stream.read(&mut sink) {
            taken += read;
        }
        taken
    });
    accept(&transport, address);
    post_signalled_write(&transport, source.id);
    let read = ReadOp {
        wr_id: 2,
        local: destination.id,
        remote: RegionId(0),
        len: 64,
        signalled: true,
        ..ReadOp::EMPTY
    };
    transport.post_reads(&[read]).unwrap();
    assert!(
        matches!(transport.deregister(destination.id), Err(TransportError::RegionBusy { .. })),
        "a read's destination is busy while its bytes are awaited"
    );
    let started = Instant::now();
    let mut flushed = Vec::new();
    let mut completions = [Completion::EMPTY; 4];
    while flushed.len() < 2 {
        let waited = rdma_hint_backend_core::blocking::block_on(
            transport.wait_completions(&mut completions, deadline(60)),
        );
        let count = waited.unwrap_or_else(|e| panic!("after {:?} and {flushed:?}: {e}", started.elapsed()));
        flushed.extend(completions[..count].iter().map(|c| (c.wr_id, c.status)));
    }
    let silence = started.elapsed();
    let gone = CompletionStatus::Failed { code: FLUSHED_STATUS };
    assert_eq!(flushed, vec![(1, gone), (2, gone)]);
    assert!(
        silence > Duration::from_secs(25) && silence < Duration::from_secs(50),
        "ended after {silence:?}"
    );
    transport.deregister(destination.id).unwrap();
    assert!(silent.join().unwrap() > 0, "the peer was sent the write and the request");
}

/// A peer that takes a signalled write and closes its socket without acknowledging it: a sender
/// in `BusyPoll`, whose own polls take the socket, learns the end at once (its poll hands the
/// end to the reader thread), not at the silence bound, and the write is flushed.
#[test]
fn a_busy_polling_writer_whose_peer_closes_unanswered_is_flushed_at_once() {
    let transport = StagedTransport::new(StagedChannel::Tcp);
    transport.set_wait_mode(rdma_hint_core::WaitMode::BusyPoll);
    let source = transport.register(MemoryKind::Host, 4096).unwrap();
    let address = transport.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let closing = std::thread::spawn(move || {
        let mut stream = raw_peer_of_one_region(address);
        let mut frame = [0u8; HEADER_BYTES + 64];
        stream.read_exact(&mut frame).unwrap();
        // Closes without an ack.
    });
    accept(&transport, address);
    post_signalled_write(&transport, source.id);
    closing.join().unwrap();
    let started = Instant::now();
    let mut completions = [Completion::EMPTY; 2];
    let waited = rdma_hint_backend_core::blocking::block_on(
        transport.wait_completions(&mut completions, deadline(60)),
    );
    let count = waited.unwrap_or_else(|e| panic!("after {:?}: {e}", started.elapsed()));
    assert_eq!(
        completions[..count],
        [Completion { wr_id: 1, status: CompletionStatus::Failed { code: FLUSHED_STATUS } }]
    );
    assert!(started.elapsed() < Duration::from_secs(5), "the end was seen after {:?}", started.elapsed());
}

/// A peer that answers a withdrawal and writes the region anyway, in the same breath: the write
/// behind its answer is a breach that ends the link, and not one byte of it lands in the region
/// the application was told it has back (nor may a read behind it take the region's bytes).
#[test]
fn a_write_behind_the_answer_to_a_withdrawal_never_lands() {
    use rdma_hint_backend_core::blocking::block_on;
    let transport = StagedTransport::new(StagedChannel::Tcp);
    let region = transport.register(MemoryKind::Host, 1 << 20).unwrap();
    let address = transport.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let raw = std::thread::spawn(move || {
        let mut stream = raw_dial(address);
        stream
            .write_all(&Hello { channel: ChannelKind::Tcp, regions: vec![], handoff: None }.encode())
            .unwrap();
        Hello::decode(&mut stream).unwrap();
        // The owner's withdrawal: a control frame carrying Withdraw (tag · length · seq · id).
        let mut header = [0u8; HEADER_BYTES];
        stream.read_exact(&mut header).unwrap();
        let frame = Frame::decode(&header).unwrap();
        assert_eq!(frame.kind, FrameKind::Control);
        let mut body = vec![0u8; frame.len as usize];
        stream.read_exact(&mut body).unwrap();
        let seq = u32::from_le_bytes(body[3..7].try_into().unwrap());
        let write = Frame {
            kind: FrameKind::Write,
            flags: 0,
            status: 0,
            region: 0,
            offset: 0,
            len: 4096,
            wr_id: 1,
            imm: 0,
        };
        let answer_then_write =
            [control(Control::Done { seq, refused: None }), write.encode().to_vec(), vec![0xEE; 4096]]
                .concat();
        stream.write_all(&answer_then_write).unwrap();
        let mut sink = [0u8; 64];
        let _ = stream.read(&mut sink);
    });
    block_on(transport.connect(PeerEndpoint::Listen(address), &[region.id], deadline(10))).unwrap();
    let withdrawn = block_on(transport.withdraw(region.id, deadline(10)));
    assert!(matches!(withdrawn, Ok(()) | Err(TransportError::PeerGone(_))), "{withdrawn:?}");
    std::thread::sleep(Duration::from_millis(300));
    let mut landed = vec![0u8; 4096];
    transport.read_region(region.id, 0, &mut landed).unwrap();
    assert!(landed.iter().all(|byte| *byte == 0), "the write behind the peer's answer landed");
    let mut arrivals = [Arrival::EMPTY; 1];
    let gone = block_on(transport.wait_arrivals(&mut arrivals, deadline(10)));
    assert!(
        matches!(&gone, Err(TransportError::PeerGone(reason)) if reason.contains("protocol error")),
        "{gone:?}"
    );
    raw.join().unwrap();
}
