//! Fault injection over real UCX transports: deadlines shorter than the transfer, a receiver
//! that closes mid-transfer, restart and reconnect on the same port.

mod common;

use common::{chunker, deadline, loopback, pair, round_trip, SCOPES};
use rdma_hint_chunker::{Transfer, TransferError};
use rdma_hint_transport::TransportError;
use std::time::{Duration, Instant};

#[test]
fn a_deadline_shorter_than_the_transfer_stops_it_in_time() {
    for tls in SCOPES {
        let len = 256 << 20;
        let p = pair(tls, len, loopback());
        let mut chunker = chunker(&p.sender, 4096);
        let started = Instant::now();
        let result = rdma_hint_transport::blocking::block_on(chunker.write(
            &p.sender,
            Transfer::new(&p.source, &p.remote, len),
            started + Duration::from_millis(20),
        ));
        let elapsed = started.elapsed();
        match result {
            Err(TransferError::DeadlineExceeded { confirmed_bytes, len: asked }) => {
                assert!(confirmed_bytes < asked, "{tls}")
            }
            other => panic!("{tls}: expected the deadline, got {other:?}"),
        }
        assert!(elapsed < Duration::from_secs(2), "{tls}: stopped after {elapsed:?}");
    }
}

/// The receiving transport is dropped while the sender writes: the sender ends with a typed
/// error well before its deadline and never reports the transfer complete.
#[test]
fn a_receiver_that_closes_mid_transfer_fails_the_sender_in_time() {
    for tls in SCOPES {
        let len = 256 << 20;
        let p = pair(tls, len, loopback());
        let mut chunker = chunker(&p.sender, 4096);
        let receiver = p.receiver;
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(receiver);
        });
        let started = Instant::now();
        let result = rdma_hint_transport::blocking::block_on(chunker.write(
            &p.sender,
            Transfer::new(&p.source, &p.remote, len),
            started + Duration::from_secs(20),
        ));
        closer.join().unwrap();
        match result {
            Err(TransferError::Transport {
                source: TransportError::PeerGone(_) | TransportError::Completion { .. },
                confirmed_bytes,
            }) => assert!(confirmed_bytes < len, "{tls}"),
            other => panic!("{tls}: expected the peer to be reported gone, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{tls}: took {:?}", started.elapsed());
    }
}

#[test]
fn sender_and_receiver_restart_and_reconnect_on_the_same_port() {
    for tls in SCOPES {
        let address = std::net::TcpListener::bind(loopback()).unwrap().local_addr().unwrap();
        for cycle in 0..3u8 {
            let p = pair(tls, 1 << 20, address);
            let mut chunker = chunker(&p.sender, 64 * 1024);
            round_trip(&p, &mut chunker, 1 << 20, cycle + 1, u32::from(cycle));
        }
    }
    let _ = deadline(0);
}
