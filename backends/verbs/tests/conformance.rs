//! The shared `Transport` contract (tests/conformance) over Soft-RoCE, and what only an RDMA
//! NIC has: capabilities queried from the device, a link that goes down under the QP. These
//! need an RDMA device, so they are `#[ignore]`d (reported as ignored, never as passed); the VM
//! harness (`scripts/vm/verbs-tests.sh`, which CI runs) runs them with `--ignored` where
//! `RXE_DEV` names the rxe device and `RXE_NETDEV` the netdev under it.

use rdma_hint_chunker::{Transfer, TransferError};
use rdma_hint_conformance::{chunker, pair, suite, Backend, Scale};
use rdma_hint_verbs::VerbsTransport;
use std::time::{Duration, Instant};

/// The rxe device the VM harness set up.
fn rxe() -> String {
    std::env::var("RXE_DEV")
        .expect("no RXE_DEV: these tests run inside the Soft-RoCE VM (scripts/vm/verbs-tests.sh)")
}

struct SoftRoce;

impl Backend for SoftRoce {
    type Transport = VerbsTransport;

    fn open(&self, token: Option<&[u8]>) -> VerbsTransport {
        let transport = VerbsTransport::open(Some(&rxe())).expect("the rxe device");
        match token {
            Some(token) => transport.with_token(token).expect("token"),
            None => transport,
        }
    }

    /// An emulated NIC in a VM moves about 20 MB/s.
    fn scale(&self) -> Scale {
        Scale { ladder_max_bytes: 4 << 20, long_transfer_bytes: 32 << 20, report_within_s: 20 }
    }
}

suite! {
    #[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
    rxe: SoftRoce,
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

#[test]
#[ignore = "needs the Soft-RoCE VM: scripts/vm/verbs-tests.sh runs it"]
fn the_link_going_down_mid_transfer_fails_the_sender_in_time() {
    let netdev =
        std::env::var("RXE_NETDEV").expect("RXE_NETDEV: the netdev under rxe (set by the VM harness)");
    let len = 64 << 20;
    let p = pair(&SoftRoce, len, "127.0.0.1:0".parse().unwrap());
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
    let result = rdma_hint_transport::blocking::block_on(chunker(&p.sender, 64 * 1024).write(
        &p.sender,
        Transfer::new(&p.source, &p.remote, len),
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
