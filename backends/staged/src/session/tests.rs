//! Two sessions joined by in-memory wires: every frame one side sends, the other receives, and
//! the bytes each write or read moves are checked where they land.

use super::*;
use crate::wire::{ChannelKind, FLAG_IMM, FLAG_SIGNALLED};
use held_acks::AckTiming;

/// The one region each side exposes.
const REGION_BYTES: u64 = 4096;
/// Answers of each kind awaited at once.
const WINDOW: usize = 4;

/// A read of the tests: its tag, its length, and where in its side's memory its bytes go.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    wr_id: u64,
    len: u64,
    at: u64,
}

impl AwaitedRead for Read {
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    fn asked_bytes(&self) -> u64 {
        self.len
    }
}

/// One side: its session, its exposed region's bytes, and what it was told.
struct Side {
    session: Session<Read>,
    memory: Vec<u8>,
    completions: Vec<Completion>,
    arrivals: Vec<Arrival>,
    /// Whether its acks may be held for its answers to carry (the link: `BusyPoll`).
    may_hold: bool,
}

/// Two sides; `wires[i]` carries what side `i` sent, header and payload, in order.
struct Pair {
    sides: [Side; 2],
    wires: [VecDeque<(Frame, Vec<u8>)>; 2],
    now: Instant,
}

impl Pair {
    fn new() -> Pair {
        let now = Instant::now();
        let side = |fill: u8| Side {
            session: Session::new(
                Arc::new(Inbox::new(ChannelKind::Tcp, &[(0, REGION_BYTES)], 1 << 20)),
                WINDOW,
                now,
            ),
            memory: vec![fill; REGION_BYTES as usize],
            completions: Vec::new(),
            arrivals: Vec::new(),
            may_hold: false,
        };
        Pair { sides: [side(0xa0), side(0xb0)], wires: Default::default(), now }
    }

    /// Side `from` writes `data` at `offset` of its peer's region.
    fn write(
        &mut self,
        from: usize,
        wr_id: u64,
        offset: u64,
        data: &[u8],
        signalled: bool,
        imm: Option<u32>,
    ) {
        if signalled {
            self.sides[from].session.sent_write(wr_id, self.now).unwrap();
        }
        let flags = if signalled { FLAG_SIGNALLED } else { 0 } | if imm.is_some() { FLAG_IMM } else { 0 };
        let frame = Frame {
            imm: imm.unwrap_or(0),
            ..frame(FrameKind::Write, flags, offset, data.len() as u64, wr_id)
        };
        // The acks this side owes ride in its write.
        let held = self.sides[from].session.held_acks();
        let carried = held.write_leaving(self.now);
        held.went(usize::from(carried));
        self.wires[from].push_back((frame.carrying(carried), data.to_vec()));
    }

    /// Side `from` reads `len` bytes at `offset` of its peer's region into its own memory at `at`.
    fn read(&mut self, from: usize, wr_id: u64, offset: u64, len: u64, at: u64) {
        let session = &mut self.sides[from].session;
        session.reserve_reads(1).unwrap();
        session.asked_read(Read { wr_id, len, at }, self.now).unwrap();
        self.wires[from].push_back((frame(FrameKind::ReadRequest, 0, offset, len, wr_id), Vec::new()));
    }

    /// Side `to` takes the next frame its peer sent, and does what it asks.
    fn deliver(&mut self, to: usize) -> Result<(), String> {
        let (frame, payload) = self.wires[1 - to].pop_front().expect("a frame on the wire");
        let now = self.now;
        let side = &mut self.sides[to];
        match side.session.receive(&frame, now)? {
            Received::Write { offset, len, owed, acked, .. } => {
                assert_eq!(payload.len() as u64, len);
                side.memory[offset as usize..(offset + len) as usize].copy_from_slice(&payload);
                side.session.acknowledged(acked, |done| side.completions.push(done));
                let send_now = owed.ack.is_some_and(|ack| {
                    side.session.held_acks().owe(ack, side.may_hold, now) == AckTiming::SendNow
                });
                side.arrivals.extend(owed.arrival);
                if send_now {
                    self.send_owed_acks(to);
                }
            }
            Received::Completed(done) => side.completions.push(done),
            Received::ReadRequest { offset, len, answer, .. } => {
                let bytes = side.memory[offset as usize..(offset + len) as usize].to_vec();
                self.wires[to].push_back((answer, bytes));
            }
            Received::ReadData(read) => {
                assert_eq!(payload.len() as u64, read.len);
                side.memory[read.at as usize..(read.at + read.len) as usize].copy_from_slice(&payload);
                side.completions.push(Completion { wr_id: read.wr_id, status: CompletionStatus::Success });
            }
            Received::Control { .. } => unreachable!("these sessions send no control frames"),
        }
        Ok(())
    }

    /// Side `from` sends every ack it owes as a frame of its own.
    fn send_owed_acks(&mut self, from: usize) {
        let held = self.sides[from].session.held_acks();
        let frames: Vec<Frame> = held.owed().copied().collect();
        held.went(frames.len());
        self.wires[from].extend(frames.into_iter().map(|ack| (ack, Vec::new())));
    }

    /// Delivers until both wires are empty.
    fn settle(&mut self) {
        while !(self.wires[0].is_empty() && self.wires[1].is_empty()) {
            for to in [1, 0] {
                if !self.wires[1 - to].is_empty() {
                    self.deliver(to).unwrap();
                }
            }
        }
    }
}

/// A frame about region 0.
fn frame(kind: FrameKind, flags: u8, offset: u64, len: u64, wr_id: u64) -> Frame {
    Frame { kind, flags, status: 0, region: 0, offset, len, wr_id, imm: 0 }
}

fn success(wr_id: u64) -> Completion {
    Completion { wr_id, status: CompletionStatus::Success }
}

fn flushed(wr_id: u64) -> Completion {
    Completion { wr_id, status: CompletionStatus::Failed { code: FLUSHED } }
}

#[test]
fn writes_land_in_order_and_each_signalled_one_completes_once_after_its_ack() {
    let mut pair = Pair::new();
    pair.write(0, 1, 0, &[1; 100], true, None);
    pair.write(0, 2, 100, &[2; 50], false, Some(20));
    pair.write(0, 3, 4000, &[3; 96], true, Some(30));
    pair.write(1, 9, 8, &[9; 8], true, Some(90));
    pair.settle();
    let [writer, receiver] = &pair.sides;
    assert_eq!(&receiver.memory[..100], &[1; 100][..]);
    assert_eq!(&receiver.memory[100..150], &[2; 50][..]);
    assert_eq!(&receiver.memory[150..4000], &vec![0xb0; 3850][..], "nothing outside the writes moved");
    assert_eq!(&receiver.memory[4000..], &[3; 96][..]);
    assert_eq!(writer.completions, [success(1), success(3)], "unsignalled writes complete nothing");
    let imms: Vec<u32> = receiver.arrivals.iter().map(|arrival| arrival.imm).collect();
    assert_eq!(imms, [20, 30]);
    assert_eq!(receiver.arrivals[1], Arrival { imm: 30, region: RegionId(0), len: 96 });
    // Both directions at once: the receiver's own write completed on its side.
    assert_eq!(&writer.memory[8..16], &[9u8; 8][..]);
    assert_eq!(writer.arrivals, [Arrival { imm: 90, region: RegionId(0), len: 8 }]);
    assert_eq!(receiver.completions, [success(9)]);
    assert!(!writer.session.awaits_answers() && !receiver.session.awaits_answers());
}

/// A side that answers each write with a write sends its acks inside the answers: after the
/// first, no ack travels as a frame of its own, and every write still completes once, in
/// order. Once it stops answering, the ack it holds goes on its own after `HOLD`.
#[test]
fn acks_ride_in_the_answers_of_a_side_that_answers_and_go_alone_once_it_stops() {
    let mut pair = Pair::new();
    pair.sides.iter_mut().for_each(|side| side.may_hold = true);
    let mut lone_acks = 0;
    let lone =
        |wire: &VecDeque<(Frame, Vec<u8>)>| wire.iter().filter(|(f, _)| f.kind == FrameKind::Ack).count();
    for round in 0..8u64 {
        pair.write(0, 10 + round, 0, &[round as u8; 16], true, Some(1));
        lone_acks += lone(&pair.wires[0]);
        while !pair.wires[0].is_empty() {
            pair.deliver(1).unwrap();
        }
        pair.write(1, 20 + round, 0, &[round as u8 + 100; 16], true, Some(2));
        lone_acks += lone(&pair.wires[1]);
        while !pair.wires[1].is_empty() {
            pair.deliver(0).unwrap();
        }
    }
    assert!(lone_acks <= 2, "{lone_acks} acks went as frames of their own (the first of each side may)");
    let [writer, answerer] = &pair.sides;
    let ours: Vec<u64> = writer.completions.iter().map(|done| done.wr_id).collect();
    assert_eq!(ours, (10..18).collect::<Vec<_>>(), "each write of side 0 completes once, in order");
    assert_eq!(answerer.completions.len(), 7, "side 1's last answer waits for side 0's next write");
    assert_eq!(&answerer.memory[..16], &[7; 16][..]);
    assert_eq!(&writer.memory[..16], &[107; 16][..]);
    // Side 0 stops answering: its ack for side 1's last write goes alone once overdue.
    pair.wires[0].clear();
    let held = pair.sides[0].session.held_acks();
    assert!(!held.overdue(pair.now));
    assert!(held.overdue(pair.now + held_acks::HOLD));
    pair.send_owed_acks(0);
    pair.settle();
    assert_eq!(pair.sides[1].completions.last(), Some(&success(27)));
}

/// A write carrying more acks than our writes await is a protocol error, not a completion.
#[test]
fn a_write_carrying_an_ack_nobody_awaits_breaks_the_session() {
    let mut pair = Pair::new();
    pair.write(0, 1, 0, &[1; 8], true, None);
    pair.settle();
    let forged = frame(FrameKind::Write, 0, 0, 8, 2).carrying(1);
    pair.wires[1].push_back((forged, vec![2; 8]));
    assert!(pair.deliver(0).unwrap_err().starts_with("protocol error"));
    assert_eq!(pair.sides[0].completions, [success(1)]);
}

#[test]
fn a_signalled_write_with_an_immediate_owes_its_ack_and_its_arrival() {
    let mut pair = Pair::new();
    pair.write(0, 5, 0, &[5; 8], true, Some(55));
    let (frame, _) = pair.wires[0].pop_front().unwrap();
    let now = pair.now;
    let received = pair.sides[1].session.receive(&frame, now).unwrap();
    let Received::Write { owed, .. } = received else { panic!("{received:?}") };
    assert_eq!(owed.ack, Some(Frame::ack(0, 5)));
    assert_eq!(owed.arrival, Some(Arrival { imm: 55, region: RegionId(0), len: 8 }));
}

#[test]
fn reads_fetch_exposed_bytes_in_the_order_they_were_asked() {
    let mut pair = Pair::new();
    for (at, byte) in pair.sides[1].memory.iter_mut().enumerate() {
        *byte = (at % 251) as u8;
    }
    pair.read(0, 1, 0, 512, 1024);
    pair.read(0, 2, 3000, 1096, 2048);
    pair.settle();
    let [reader, owner] = &pair.sides;
    assert_eq!(&reader.memory[1024..1536], &owner.memory[..512]);
    assert_eq!(&reader.memory[2048..3144], &owner.memory[3000..]);
    assert_eq!(&reader.memory[..1024], &[0xa0; 1024][..], "nothing outside the reads moved");
    assert_eq!(reader.completions, [success(1), success(2)]);
    assert!(owner.completions.is_empty() && !reader.session.awaits_answers());
}

#[test]
fn the_end_flushes_what_still_waits_once_and_records_nothing_after() {
    let mut pair = Pair::new();
    pair.write(0, 1, 0, &[1; 8], true, None);
    pair.write(0, 2, 8, &[2; 8], true, None);
    pair.read(0, 3, 0, 16, 0);
    // The peer places the first write and its ack comes back; then the link breaks.
    pair.deliver(1).unwrap();
    pair.deliver(0).unwrap();
    assert_eq!(pair.sides[0].completions, [success(1)]);
    let ended = pair.sides[0].session.end();
    assert_eq!(ended, Ended { flushed: vec![flushed(2)], reads: vec![Read { wr_id: 3, len: 16, at: 0 }] });
    let session = &mut pair.sides[0].session;
    assert_eq!(session.sent_write(4, pair.now), Err(NotRecorded::Closed));
    assert_eq!(session.sent_writes([5, 6].into_iter(), pair.now), Err(NotRecorded::Closed));
    assert_eq!(
        session.asked_read(Read { wr_id: 5, len: 8, at: 0 }, pair.now),
        Err(Read { wr_id: 5, len: 8, at: 0 })
    );
    assert!(!session.retract_write(2), "flushed: it had its one completion");
    // The peer's late ack for the flushed write completes nothing a second time.
    pair.deliver(1).unwrap();
    let late = pair.deliver(0).unwrap_err();
    assert!(late.starts_with("protocol error"), "{late}");
    assert_eq!(pair.sides[0].session.end(), Ended { flushed: vec![], reads: vec![] });
}

#[test]
fn only_silence_while_an_answer_is_awaited_is_overdue_and_any_life_restarts_it() {
    let mut pair = Pair::new();
    let born = pair.now;
    let at = |secs| born + Duration::from_secs(secs);
    let session = &mut pair.sides[0].session;
    assert_eq!(session.overdue(at(100), ANSWER_PATIENCE), None, "nothing awaited: silence is fine");
    // The first awaited answer starts the wait: the idle time before it does not count.
    session.sent_write(1, at(100)).unwrap();
    assert_eq!(session.overdue(at(129), ANSWER_PATIENCE), None);
    assert_eq!(session.overdue(at(131), ANSWER_PATIENCE), Some(Duration::from_secs(31)));
    // A second answer awaited does not restart the first one's wait.
    session.reserve_reads(1).unwrap();
    session.asked_read(Read { wr_id: 2, len: 8, at: 0 }, at(131)).unwrap();
    assert_eq!(session.overdue(at(131), ANSWER_PATIENCE), Some(Duration::from_secs(31)));
    session.heard(at(131));
    assert_eq!(session.overdue(at(160), ANSWER_PATIENCE), None, "a frame from the peer is life");
    // Life seen by a thread that read the time earlier does not move it back.
    session.heard(at(120));
    assert_eq!(session.overdue(at(162), ANSWER_PATIENCE), Some(Duration::from_secs(31)));
}

#[test]
fn a_malformed_peer_is_a_protocol_error_that_takes_nothing_off_what_waits() {
    let mut pair = Pair::new();
    pair.write(0, 1, 0, &[1; 8], true, None);
    pair.write(0, 2, 0, &[2; 8], true, None);
    pair.read(0, 3, 0, 64, 0);
    let bad = [
        frame(FrameKind::Write, 0, 4090, 8, 7),
        frame(FrameKind::Write, 0, 0, 0, 7),
        Frame { region: 1, ..frame(FrameKind::Write, 0, 0, 8, 7) },
        frame(FrameKind::Ack, 0, 0, 0, 2),
        frame(FrameKind::Ack, 0, 0, 0, 99),
        frame(FrameKind::ReadData, 0, 0, 65, 3),
        frame(FrameKind::ReadData, 0, 0, 64, 4),
        frame(FrameKind::ReadRequest, 0, 4095, 2, 7),
    ];
    let session = &mut pair.sides[0].session;
    for frame in bad {
        let refused = session.receive(&frame, pair.now).unwrap_err();
        assert!(refused.starts_with("protocol error"), "{frame:?}: {refused}");
    }
    // What waited still waits, in order: the honest answers still complete their own.
    assert_eq!(session.receive(&Frame::ack(0, 1), pair.now), Ok(Received::Completed(success(1))));
    assert_eq!(session.receive(&Frame::ack(0, 2), pair.now), Ok(Received::Completed(success(2))));
    let answer = frame(FrameKind::ReadData, 0, 0, 64, 3);
    assert_eq!(session.receive(&answer, pair.now), Ok(Received::ReadData(Read { wr_id: 3, len: 64, at: 0 })));
    assert!(!session.awaits_answers());
}

#[test]
fn a_failed_write_at_the_peer_completes_with_its_status() {
    let mut pair = Pair::new();
    pair.sides[0].session.sent_write(8, pair.now).unwrap();
    let failed = Frame { status: 12, ..Frame::ack(0, 8) };
    let done = pair.sides[0].session.receive(&failed, pair.now).unwrap();
    assert_eq!(
        done,
        Received::Completed(Completion { wr_id: 8, status: CompletionStatus::Failed { code: 12 } })
    );
}

#[test]
fn the_window_counts_waiting_reserved_and_retracted_answers() {
    let mut pair = Pair::new();
    let now = pair.now;
    let session = &mut pair.sides[0].session;
    // A batch is recorded whole or not at all.
    session.sent_writes(0..WINDOW as u64 - 1, now).unwrap();
    assert_eq!(session.sent_writes([10, 11].into_iter(), now), Err(NotRecorded::Full { room: 1 }));
    session.sent_writes([3].into_iter(), now).unwrap();
    assert_eq!(session.sent_writes([12].into_iter(), now), Err(NotRecorded::Full { room: 0 }));
    // The sender thread's own writes are bounded by its queue, not here.
    session.sent_write(4, now).unwrap();
    // A write whose frame never left is taken back by its tag, wherever it waits.
    assert!(session.retract_write(1));
    assert!(!session.retract_write(1), "taken back once");
    assert!(session.retract_write(4) && session.retract_write(3));
    assert_eq!(session.sent_writes([12, 13, 14].into_iter(), now), Err(NotRecorded::Full { room: 2 }));
    session.sent_writes([12, 13].into_iter(), now).unwrap();
    // Reads queued and not asked yet count against the window until asked or given back.
    session.reserve_reads(3).unwrap();
    assert_eq!(session.reserve_reads(2), Err(1));
    session.asked_read(Read { wr_id: 10, len: 8, at: 0 }, now).unwrap();
    assert_eq!(session.reserve_reads(2), Err(1), "the ask took its own place");
    session.unreserve_reads(2);
    session.reserve_reads(3).unwrap();
    assert_eq!(session.reserve_reads(1), Err(0));
}
