//! A peer that lies about the memory it lets this side write directly, or breaks the notice
//! ring: the attack is the test, written against the real UCX mappings of two transports on
//! loopback shared memory (only the hello is forged, as an authenticated insider could).

use super::{attach, UcxTransport};
use crate::ring::{SEQUENCE_WORD, SLOT_WORDS};
use crate::wire::Hello;
use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_backend_core::BlockingTransport;
use rdma_hint_core::{Arrival, MemoryKind, PeerEndpoint, RegionId, Transport, TransportError, WriteOp};
use std::time::{Duration, Instant};

const TOKEN: &[u8] = b"rdma-hint ucx attack tests";

fn open() -> UcxTransport {
    assert!(std::env::var_os("UCX_NET_DEVICES").is_some(), "run the UCX tests with UCX_NET_DEVICES=lo");
    UcxTransport::open(Some("shm,self")).expect("UCX").with_token(TOKEN).expect("token")
}

fn deadline(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

/// What `victim` makes of `hello` as its peer's: the attach's verdict, and the lanes it reports.
fn attach_to(victim: &UcxTransport, hello: &Hello) -> Result<String, TransportError> {
    attach(&victim.shared, &victim.domain, &victim.signals, hello, &[])
}

/// A peer exposing one 64 KiB region, and its honest hello.
fn honest_peer() -> (UcxTransport, Hello) {
    let peer = open();
    let region = peer.register(MemoryKind::Host, 64 * 1024).unwrap();
    let hello = peer.hello(&[region.id]).unwrap();
    assert!(hello.ring.is_some(), "a shared-memory side offers a notice ring");
    (peer, hello)
}

#[test]
fn an_honest_peer_is_written_directly() {
    let (_peer, hello) = honest_peer();
    let lanes = attach_to(&open(), &hello).expect("the honest hello is accepted");
    assert!(lanes.contains("copies into the peer's mapped memory"), "{lanes}");
}

#[test]
fn a_region_longer_than_the_segment_behind_it_is_refused() {
    let (_peer, mut hello) = honest_peer();
    // The copy would run past the 64 KiB segment, into whatever this process mapped after it.
    hello.regions[0].len = 1 << 30;
    let refused = attach_to(&open(), &hello).unwrap_err().to_string();
    assert!(refused.contains("past the segment"), "{refused}");
    let (_peer, mut hello) = honest_peer();
    let ring = hello.ring.as_mut().unwrap();
    // A ring whose last slots lie past the segment: 4 KiB into it, its end is beyond.
    ring.address += 4096;
    let refused = attach_to(&open(), &hello).unwrap_err().to_string();
    assert!(refused.contains("notice ring") && refused.contains("past the segment"), "{refused}");
}

#[test]
fn a_peer_naming_this_sides_own_memory_is_refused() {
    let victim = open();
    // Memory the victim never exposed: its packed rkey names the victim's own segment.
    let private = victim.register(MemoryKind::Host, 64 * 1024).unwrap();
    let own = victim.hello(&[private.id]).unwrap();
    let (_peer, honest) = honest_peer();
    let as_region = Hello { regions: own.regions.clone(), ..honest.clone() };
    let refused = attach_to(&victim, &as_region).unwrap_err().to_string();
    assert!(refused.contains("own memory"), "{refused}");
    let victim = open();
    victim.register(MemoryKind::Host, 4096).unwrap();
    let own = victim.hello(&[RegionId(0)]).unwrap();
    let as_ring = Hello { ring: own.ring.clone(), ..honest };
    let refused = attach_to(&victim, &as_ring).unwrap_err().to_string();
    assert!(refused.contains("own memory"), "{refused}");
}

/// `receiver` exposes a region to `sender`, written directly; the region's id.
fn connected(receiver: &UcxTransport, sender: &UcxTransport) -> RegionId {
    let target = receiver.register(MemoryKind::Host, 64 * 1024).unwrap();
    let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    std::thread::scope(|scope| {
        let accepting = scope
            .spawn(|| block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline(20))));
        block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline(20))).expect("dial");
        accepting.join().unwrap().expect("accept");
    });
    assert!(sender.connected_lanes().unwrap().contains("copies into"), "{:?}", sender.connected_lanes());
    target.id
}

#[test]
fn a_broken_notice_ring_ends_the_connection_with_a_protocol_error() {
    let slot = |first: u64, len: u64, sequence: u64| {
        let mut words = [0u64; SLOT_WORDS];
        (words[0], words[1], words[SEQUENCE_WORD]) = (first, len, sequence);
        words
    };
    // A wild sequence number, a region never exposed, a length past the region.
    for (what, words) in [
        ("wild number", slot(0, 8, 77)),
        ("unexposed region", slot(9 << 32, 8, 1)),
        ("too long", slot(0, 64 * 1024 + 1, 1)),
    ] {
        let (receiver, sender) = (open(), open());
        let target = connected(&receiver, &sender);
        // A good write first: it arrives, and its bytes landed.
        let source = sender.register(MemoryKind::Host, 4096).unwrap();
        sender.write_region(source.id, 0, &[0x5a; 4096]).unwrap();
        let write = WriteOp { local: source.id, remote: target, len: 4096, imm: Some(1), ..WriteOp::EMPTY };
        sender.post_writes(&[write]).unwrap();
        let mut arrivals = [Arrival::EMPTY; 4];
        let got = receiver.wait_arrivals_blocking(&mut arrivals, deadline(10)).unwrap();
        assert_eq!(&arrivals[..got], &[Arrival { imm: 1, region: target, len: 4096 }], "{what}");
        let mut landed = vec![0u8; 4096];
        receiver.read_region(target, 0, &mut landed).unwrap();
        assert!(landed.iter().all(|&b| b == 0x5a), "{what}: the bytes landed");
        // Then the peer writes the next slot of the receiver's ring itself.
        receiver.signals.ring.get().unwrap().view().set_slot(1, words);
        let broken = receiver.poll_arrivals(&mut arrivals).unwrap_err();
        assert!(
            matches!(&broken, TransportError::PeerGone(why) if why.starts_with("protocol error")),
            "{what}: {broken}"
        );
        let later = receiver.wait_arrivals_blocking(&mut arrivals, deadline(5)).unwrap_err();
        assert!(matches!(later, TransportError::PeerGone(_)), "{what}: then gone, not a hang: {later}");
        // A peer that goes on publishing after that is not heard: the end stays the end.
        receiver.signals.ring.get().unwrap().view().set_slot(1, slot(0, 8, 2));
        let after = receiver.poll_arrivals(&mut arrivals);
        assert!(matches!(after, Err(TransportError::PeerGone(_))), "{what}: {after:?}");
    }
}

#[test]
fn a_receiver_that_takes_nothing_fills_its_ring_and_the_writer_is_told_so() {
    let (receiver, sender) = (open(), open());
    // Only the receiver's own waits take notices (its progress thread would queue a ring's
    // worth more for tasks asleep on the arrival queue).
    receiver.set_wait_mode(rdma_hint_core::WaitMode::BusyPoll);
    let target = connected(&receiver, &sender);
    let source = sender.register(MemoryKind::Host, 4096).unwrap();
    let notify =
        |imm: u32| WriteOp { local: source.id, remote: target, len: 8, imm: Some(imm), ..WriteOp::EMPTY };
    for imm in 0..crate::ring::RING_SLOTS as u32 {
        sender.post_writes(&[notify(imm)]).unwrap_or_else(|e| panic!("notice {imm}: {e}"));
    }
    let full = sender.post_writes(&[notify(u32::MAX)]).unwrap_err();
    assert!(matches!(full, TransportError::QueueFull { .. }), "{full}");
    // Told at once: a post never waits for the peer (the transfer engine rings small posts
    // holding its own lock). A hundred refusals that each waited even 5 ms would take 500.
    let asked = Instant::now();
    for _ in 0..100 {
        let again = sender.post_writes(&[notify(u32::MAX)]).unwrap_err();
        assert!(matches!(again, TransportError::QueueFull { .. }), "{again}");
    }
    assert!(asked.elapsed() < Duration::from_millis(250), "refusals waited: {:?}", asked.elapsed());
    // Nothing of the refused write was announced; once the receiver takes, the writer goes on.
    let mut arrivals = vec![Arrival::EMPTY; 64];
    let got = receiver.poll_arrivals(&mut arrivals).unwrap();
    assert_eq!(
        arrivals[..got].iter().map(|a| a.imm).collect::<Vec<_>>(),
        (0..got as u32).collect::<Vec<_>>()
    );
    sender.post_writes(&[notify(u32::MAX - 1)]).expect("room again");
    let mut imms = Vec::new();
    while imms.last() != Some(&(u32::MAX - 1)) {
        let got = receiver.wait_arrivals_blocking(&mut arrivals, deadline(10)).unwrap();
        imms.extend(arrivals[..got].iter().map(|a| a.imm));
    }
    assert_eq!(imms.len() as u64, crate::ring::RING_SLOTS - 64 + 1);
    assert!(!imms.contains(&u32::MAX), "the refused write never arrives");
}

/// An `Adaptive` receiver's waits take notices off the ring themselves while its progress
/// thread, woken by the writer, moves others into the arrival queue: they still arrive in the
/// order they were written.
#[test]
fn notices_arrive_in_order_while_a_wait_and_the_progress_thread_both_take() {
    let (receiver, sender) = (open(), open());
    let target = connected(&receiver, &sender);
    let source = sender.register(MemoryKind::Host, 4096).unwrap();
    const WRITES: u32 = 20_000;
    std::thread::scope(|scope| {
        let taking = scope.spawn(|| {
            let mut arrivals = [Arrival::EMPTY; 16];
            let mut imms = Vec::with_capacity(WRITES as usize);
            while imms.len() < WRITES as usize {
                let got = receiver.wait_arrivals_blocking(&mut arrivals, deadline(20)).expect("arrivals");
                imms.extend(arrivals[..got].iter().map(|a| a.imm));
            }
            imms
        });
        for imm in 0..WRITES {
            let write =
                WriteOp { local: source.id, remote: target, len: 8, imm: Some(imm), ..WriteOp::EMPTY };
            while let Err(e) = sender.post_writes(&[write]) {
                assert!(matches!(e, TransportError::QueueFull { .. }), "{e}");
            }
            // Pauses let the receiver's wait fall asleep, so its progress thread takes too.
            if imm % 64 == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let imms = taking.join().unwrap();
        let first_out_of_order = imms.iter().enumerate().find(|&(at, &imm)| imm != at as u32);
        assert_eq!(first_out_of_order, None, "notices out of order");
    });
}

/// Lanes of one connection unpack the same regions' keys once each: every lane's mapping is
/// its own, so each is written directly, and the bytes of both land.
#[test]
fn every_lane_of_a_connection_is_written_directly() {
    let (receiver, sender) = (open(), open());
    let target = connected(&receiver, &sender);
    let (second_receiver, second_sender) = (receiver.open_lane().unwrap(), sender.open_lane().unwrap());
    let address = second_receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    std::thread::scope(|scope| {
        let accepting = scope.spawn(|| {
            block_on(second_receiver.connect(PeerEndpoint::Listen(address), &[target], deadline(20)))
        });
        block_on(second_sender.connect(PeerEndpoint::Dial(address), &[], deadline(20))).expect("dial");
        accepting.join().unwrap().expect("accept");
    });
    let lanes = second_sender.connected_lanes().unwrap();
    assert!(lanes.contains("copies into"), "{lanes}");
    let source = sender.register(MemoryKind::Host, 8192).unwrap();
    sender.write_region(source.id, 0, &[1; 4096]).unwrap();
    sender.write_region(source.id, 4096, &[2; 4096]).unwrap();
    let write = |offset: u64, imm: u32| WriteOp {
        local: source.id,
        local_offset: offset,
        remote: target,
        remote_offset: offset,
        len: 4096,
        imm: Some(imm),
        ..WriteOp::EMPTY
    };
    sender.post_writes(&[write(0, 1)]).unwrap();
    second_sender.post_writes(&[write(4096, 2)]).unwrap();
    let mut arrivals = [Arrival::EMPTY; 1];
    assert_eq!(receiver.wait_arrivals_blocking(&mut arrivals, deadline(10)).unwrap(), 1);
    assert_eq!(arrivals[0].imm, 1);
    assert_eq!(second_receiver.wait_arrivals_blocking(&mut arrivals, deadline(10)).unwrap(), 1);
    assert_eq!(arrivals[0].imm, 2);
    let mut landed = vec![0u8; 8192];
    receiver.read_region(target, 0, &mut landed).unwrap();
    assert!(landed[..4096].iter().all(|&b| b == 1) && landed[4096..].iter().all(|&b| b == 2));
}
