//! What only the UCX backend's out-of-band exchange has: malformed UCX hellos from an
//! authenticated insider, and a garbage rkey refused at connect. The contract every backend
//! meets is `tests/conformance.rs`.

use rdma_hint_core::{MemoryKind, PeerEndpoint, Transport, TransportError};
use rdma_hint_oob::RegionDescriptor;
use rdma_hint_ucx::wire::Hello;
use rdma_hint_ucx::UcxTransport;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

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

/// A hand-written TCP client that holds the token (an insider sending bad bytes).
fn raw_dial(address: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    let token = rdma_hint_oob::Token::new(TEST_TOKEN).unwrap();
    rdma_hint_oob::authenticate(&mut stream, Some(&token), rdma_hint_oob::Role::Dialer).unwrap();
    stream
}

/// The hello of a real UCX transport, caught by a raw listener it dials (a dialler speaks
/// first; its connect then fails, as the listener leaves).
fn genuine_hello() -> Hello {
    let bait = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = bait.local_addr().unwrap();
    let dialling = std::thread::spawn(move || {
        let transport = peer_transport("tcp,self");
        let _ = rdma_hint_backend_core::blocking::block_on(transport.connect(
            PeerEndpoint::Dial(address),
            &[],
            deadline(5),
        ));
    });
    let (mut caught, _) = bait.accept().unwrap();
    caught.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let token = rdma_hint_oob::Token::new(TEST_TOKEN).unwrap();
    rdma_hint_oob::authenticate(&mut caught, Some(&token), rdma_hint_oob::Role::Listener).unwrap();
    let hello = Hello::decode(&mut caught).unwrap();
    drop(caught);
    dialling.join().unwrap();
    hello
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
    let result = rdma_hint_backend_core::blocking::block_on(transport.connect(
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
        regions: vec![RegionDescriptor { id: 0, len: 4096, address: 0x10000, flags: 0, key: vec![2; 32] }],
        ring: None,
    }
}

#[test]
fn malformed_out_of_band_messages_are_rejected_with_a_reason() {
    let err = raw_peer_sends(b"GET / HTTP/1.1\r\n\r\n".to_vec(), false);
    assert!(matches!(err, TransportError::Unauthorized { .. }), "{err}");
    let err = raw_peer_sends(b"GET / HTTP/1.1\r\n\r\n".to_vec(), true);
    assert!(err.to_string().contains("bad magic"), "{err}");
    let mut wrong_version = hello().encode();
    wrong_version[8] = 9; // the version before this one
    let err = raw_peer_sends(wrong_version, true);
    assert!(err.to_string().contains("version"), "{err}");
    // The connection blob's length (after the magic, the version and the backend byte) says
    // more than any UCX hello carries: refused before a byte of it is read.
    let mut oversized = hello().encode();
    oversized[11..13].copy_from_slice(&u16::MAX.to_le_bytes());
    let err = raw_peer_sends(oversized, true);
    assert!(err.to_string().contains("connection blob of 65535 B exceeds"), "{err}");
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
    // A genuine worker address, and a corrupt rkey.
    let liar = std::thread::spawn(move || {
        let transport = peer_transport("tcp,self");
        let region = transport.register(MemoryKind::Host, 4096).unwrap();
        let theirs = genuine_hello();
        let mut stream = raw_dial(address);
        let mine = Hello {
            worker_address: theirs.worker_address.clone(),
            regions: vec![RegionDescriptor {
                id: region.id.0,
                len: 4096,
                address: 0x10000,
                flags: 0,
                key: vec![0xff; 7],
            }],
            ring: None,
        };
        stream.write_all(&mine.encode()).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let err = rdma_hint_backend_core::blocking::block_on(receiver.connect(
        PeerEndpoint::Listen(address),
        &[],
        deadline(5),
    ))
    .unwrap_err();
    liar.join().unwrap();
    assert!(err.to_string().contains("packed rkey of 7 B"), "{err}");
}
