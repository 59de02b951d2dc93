//! Real RDMA traffic over Soft-RoCE. These tests need an RDMA device, so they are `#[ignore]`d
//! (a test that cannot run here is reported as ignored, never as passed): the VM harness
//! (`scripts/vm/verbs-tests.sh`, which CI runs) runs them with `--ignored` where `RXE_DEV`
//! names the rxe device. Run with `--ignored` anywhere else, they fail for want of `RXE_DEV`.
//!
//! What only RDMA has: a wrong rkey (a proxy rewrites it in the hello) fails as a typed
//! completion error. The peer roles here (`receiver`, `sender`) also carry the two-VM run
//! (`scripts/vm/verbs-two-vms.sh`). The contract every backend meets is `tests/conformance.rs`.

use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer, TransferError};
use rdma_hint_integration_tests::{env, first_mismatch, peer_role, random_bytes, Peer};
use rdma_hint_model::SourceId;
use rdma_hint_transport::{Arrival, MemoryKind, PeerEndpoint, Transport, TransportError};
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
