//! The peer processes of the two-process rules: this test binary re-run as a role, told which
//! backend of the suite to open (`RDMA_HINT_CONFORMANCE_BACKEND`).

use crate::backend::{Backend, TEST_TOKEN};
use crate::pair::{chunker, deadline};
use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_core::{Arrival, MemoryKind, PeerEndpoint, Transport, TransportError};
use rdma_hint_engine::TransferRequest;
use rdma_hint_integration_tests::{env, first_mismatch, peer_role, random_bytes, Peer};
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Names the suite instance a peer process opens.
pub const BACKEND_VAR: &str = "RDMA_HINT_CONFORMANCE_BACKEND";

/// The suite instance this process is a peer for, when it is one.
pub fn backend_key() -> Option<String> {
    peer_role()?;
    Some(env(BACKEND_VAR))
}

/// Spawns a `receiver` for instance `key` listening on `listen` that expects `len` bytes from
/// `seed` with immediate 7; returns it and the address it listens on.
pub fn spawn_receiver(key: &str, len: u64, seed: u64, listen: SocketAddr) -> (Peer, SocketAddr) {
    let vars = [("LEN", len.to_string()), ("SEED", seed.to_string()), ("LISTEN", listen.to_string())];
    let mut peer = spawn(key, None, "receiver", &vars);
    let address = peer.expect("LISTENING").parse().expect("the receiver's address");
    (peer, address)
}

/// Spawns this binary as `role` for instance `key` (inside `netns` when given).
pub(crate) fn spawn(key: &str, netns: Option<&str>, role: &str, vars: &[(&str, String)]) -> Peer {
    let mut all = vec![(BACKEND_VAR, key.to_string())];
    all.extend(vars.iter().cloned());
    Peer::spawn_in(netns, role, &all)
}

fn say(line: String) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// Runs the role this process was started as, on `backend`.
pub fn run<B: Backend>(backend: &B) {
    let role = peer_role().expect("a peer role");
    // Peers listen on namespace addresses too, where a listener needs a token.
    let transport = backend.open(Some(TEST_TOKEN));
    match role.as_str() {
        "receiver" => receiver(&transport),
        "sender" | "sender-outcome" => sender(&transport, role == "sender-outcome"),
        other => panic!("unknown role {other}"),
    }
}

/// Registers `LEN` bytes, says where to dial (`LISTENING`), then checks the arrival and every
/// byte against `SEED` (`RESULT OK len`), and stays `STAY_S` seconds (default 120) or until
/// killed.
fn receiver<T: Transport>(transport: &T) {
    let len: u64 = env("LEN").parse().expect("LEN");
    let seed: u64 = env("SEED").parse().expect("SEED");
    let region = transport.register(MemoryKind::Host, len.next_multiple_of(4096)).expect("register");
    let address = transport.bind(env("LISTEN").parse().expect("LISTEN")).expect("bind");
    say(format!("LISTENING {address}"));
    block_on(transport.connect(PeerEndpoint::Listen(address), &[region.id], deadline(60))).expect("accept");
    say("CONNECTED".into());
    let mut arrivals = [Arrival::EMPTY; 4];
    match block_on(transport.wait_arrivals(&mut arrivals, deadline(120))) {
        Ok(ready) => {
            assert_eq!((ready, arrivals[0].imm, arrivals[0].region), (1, 7, region.id));
            let mut arrived = vec![0u8; len as usize];
            transport.read_region(region.id, 0, &mut arrived).expect("read");
            match first_mismatch(&arrived, &random_bytes(len as usize, seed)) {
                None => say(format!("RESULT OK {len}")),
                Some(at) => say(format!("RESULT MISMATCH at {at}")),
            }
        }
        Err(e) => say(format!("RESULT ERROR {e}")),
    }
    let stay = std::env::var("STAY_S").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    std::thread::sleep(Duration::from_secs(stay));
}

/// Dials `DIAL` and writes `LEN` bytes from `SEED` with immediate 7 (`SENT len`); as
/// `sender-outcome`, within `DEADLINE_MS`, saying how it ended (`OUTCOME …`).
fn sender<T: Transport>(transport: &T, outcome: bool) {
    let len: u64 = env("LEN").parse().expect("LEN");
    let seed: u64 = env("SEED").parse().expect("SEED");
    let source = transport.register(MemoryKind::Host, len.next_multiple_of(4096)).expect("register");
    transport.write_region(source.id, 0, &random_bytes(len as usize, seed)).expect("fill");
    // The receiver may not listen yet (another VM still booting): a refused dial is retried.
    let (peer, until) = (PeerEndpoint::Dial(env("DIAL").parse().expect("DIAL")), deadline(120));
    let remote = loop {
        match block_on(transport.connect(peer, &[], until)) {
            Err(TransportError::Refused { .. }) if Instant::now() < until => continue,
            connected => break connected.expect("dial")[0],
        }
    };
    say("CONNECTED".into());
    let mut chunker = chunker(transport, 64 * 1024);
    let transfer = TransferRequest::single(&source, 0, &remote, 0, len).notify(7);
    if !outcome {
        let report = block_on(chunker.transfer(transport, transfer, deadline(300))).expect("transfer");
        say(format!("SENT {}", report.bytes));
        std::thread::sleep(Duration::from_secs(5));
        return;
    }
    let started = Instant::now();
    let limit = Duration::from_millis(env("DEADLINE_MS").parse().expect("DEADLINE_MS"));
    let result = block_on(chunker.transfer(transport, transfer, started + limit));
    let elapsed = started.elapsed().as_millis();
    match result {
        Ok(_) => say(format!("OUTCOME {elapsed} completed")),
        Err(e) => say(format!("OUTCOME {elapsed} failed after: {e}")),
    }
}
