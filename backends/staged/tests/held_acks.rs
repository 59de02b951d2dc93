//! Acks held for an answer to carry (staged TCP in `BusyPoll`), against a hand-written peer
//! that makes this side hold one and then stops reading while a large write of ours waits on
//! it: the held ack's flush neither floods the sender thread's queue (which breaks the link as a
//! peer's overflow) nor holds the application's poll behind that write.

use rdma_hint_core::{Arrival, Completion, MemoryKind, PeerEndpoint, RegionId, Transport, WaitMode, WriteOp};
use rdma_hint_staged::wire::{
    ChannelKind, ExposedRegion, Frame, FrameKind, Hello, FLAG_ACKS, FLAG_IMM, FLAG_SIGNALLED, HEADER_BYTES,
};
use rdma_hint_staged::{StagedChannel, StagedTransport};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The peer's big region: larger than the socket's buffers hold.
const BIG: u64 = 32 << 20;

/// A peer that ping-pongs until this side's answer carries an ack, sends one more signalled
/// write (whose ack this side holds: nothing answers it), says so, then reads nothing for
/// `stall`.
fn peer(address: SocketAddr, target: u32, sent: mpsc::Sender<()>, stall: Duration) {
    let mut stream = TcpStream::connect(address).unwrap();
    // Every read of this peer has a deadline: a side that never answers fails the test.
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    rdma_hint_oob::authenticate(&mut stream, None, rdma_hint_oob::Role::Dialer).unwrap();
    let regions = vec![
        ExposedRegion { id: 0, len: 4096, notify_each_write: false },
        ExposedRegion { id: 1, len: BIG, notify_each_write: false },
    ];
    stream.write_all(&Hello { channel: ChannelKind::Tcp, regions, handoff: None }.encode()).unwrap();
    Hello::decode(&mut stream).unwrap();
    let write = |wr_id: u64, flags: u8| {
        let frame = Frame {
            kind: FrameKind::Write,
            flags,
            status: 0,
            region: target,
            offset: 0,
            len: 16,
            wr_id,
            imm: 1,
        };
        [frame.encode().as_slice(), &[wr_id as u8; 16]].concat()
    };
    let mut carried = false;
    for round in 0..200 {
        stream.write_all(&write(round, FLAG_SIGNALLED | FLAG_IMM)).unwrap();
        loop {
            let mut header = [0u8; HEADER_BYTES];
            stream.read_exact(&mut header).unwrap();
            let frame = Frame::decode(&header).unwrap();
            if frame.kind == FrameKind::Write {
                stream.read_exact(&mut vec![0u8; frame.len as usize]).unwrap();
                carried = frame.flags & FLAG_ACKS != 0;
                break;
            }
        }
        if carried {
            break;
        }
    }
    assert!(carried, "this side never held an ack for its answer to carry");
    stream.write_all(&write(1000, FLAG_SIGNALLED)).unwrap();
    sent.send(()).unwrap();
    std::thread::sleep(stall);
}

#[test]
fn an_overdue_held_ack_behind_a_stalled_write_neither_breaks_the_link_nor_holds_a_poll() {
    let transport = StagedTransport::new(StagedChannel::Tcp);
    transport.set_wait_mode(WaitMode::BusyPoll);
    let source = transport.register(MemoryKind::Host, 4096).unwrap();
    let target = transport.register(MemoryKind::Host, 4096).unwrap();
    let big = transport.register(MemoryKind::Host, BIG).unwrap();
    let address = transport.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let (sent, was_sent) = mpsc::channel();
    let target_id = target.id.0;
    let peer = std::thread::spawn(move || peer(address, target_id, sent, Duration::from_secs(3)));
    let deadline = Instant::now() + Duration::from_secs(10);
    rdma_hint_backend_core::blocking::block_on(transport.connect(
        PeerEndpoint::Listen(address),
        &[target.id],
        deadline,
    ))
    .unwrap();
    let (mut arrivals, mut completions) = ([Arrival::EMPTY; 4], [Completion::EMPTY; 4]);
    let answer = WriteOp { wr_id: 1, local: source.id, remote: RegionId(0), len: 16, ..WriteOp::EMPTY };
    // Answer every arrival until the peer made this side hold an ack it does not answer.
    while was_sent.try_recv().is_err() {
        for _ in 0..transport.poll_arrivals(&mut arrivals).unwrap() {
            transport.post_writes(&[answer]).unwrap();
        }
        let _ = transport.poll_completions(&mut completions);
        assert!(Instant::now() < deadline, "the peer never made this side hold an ack");
    }
    // A write the stalled peer will not take (it goes through the sender thread, which holds
    // the socket meanwhile), then polls while the held ack goes overdue, for longer than the
    // reader thread's ticks: each poll answers at once, and the link stays up.
    let taking = Instant::now();
    while taking.elapsed() < Duration::from_micros(20) {
        transport.poll_arrivals(&mut arrivals).unwrap();
    }
    let stalled = WriteOp { wr_id: 2, local: big.id, remote: RegionId(1), len: BIG, ..WriteOp::EMPTY };
    transport.post_writes(&[stalled]).unwrap();
    // The application is busy elsewhere meanwhile: the reader thread finds the ack overdue.
    std::thread::sleep(Duration::from_millis(30));
    let polling = Instant::now();
    let mut slowest = Duration::ZERO;
    while polling.elapsed() < Duration::from_secs(1) {
        let poll = Instant::now();
        let polled = transport.poll_arrivals(&mut arrivals);
        slowest = slowest.max(poll.elapsed());
        polled.unwrap_or_else(|e| panic!("the link broke after {:?} of polls: {e}", polling.elapsed()));
    }
    assert!(slowest < Duration::from_millis(500), "a poll waited {slowest:?} behind the stalled write");
    peer.join().unwrap();
}
