//! The TCP link's protocol as a state machine without I/O (quinn-proto's shape): what this side
//! waits on its peer for (the ack of each signalled write, the bytes of each read, in the order
//! it asked), what each incoming frame means given that, what it owes in return, and how long
//! the peer may stay silent meanwhile. No socket, thread, lock or clock is inside: the link
//! (crate::link) reads and writes the bytes, holds the session under its lock for a step at a
//! time, and passes the time in.
//!
//! An RC queue pair ends a connection whose peer stopped answering after its retry timeout;
//! [`Session::overdue`] is that rule here: a peer that keeps the socket open and answers
//! nothing cannot hold our completions, or the destinations of our reads, for ever. Whatever
//! waits when the link ends is flushed once, by [`Session::end`]; nothing joins after it.
//!
//! ```
//! use rdma_hint_staged::protocol::Inbox;
//! use rdma_hint_staged::session::{Received, Session};
//! use rdma_hint_staged::wire::{ChannelKind, Frame, FrameKind, FLAG_SIGNALLED};
//! use std::sync::Arc;
//! use std::time::Instant;
//!
//! let now = Instant::now();
//! let rules = |len| Arc::new(Inbox::new(ChannelKind::Tcp, &[(0, len)], 1 << 20));
//! let session = || Session::<(u64, u64)>::new(rules(64), 8, now);
//! let (mut writer, mut receiver) = (session(), session());
//! // The writer records its signalled write before the frame leaves...
//! writer.sent_write(7, now).unwrap();
//! let frame = Frame { kind: FrameKind::Write, flags: FLAG_SIGNALLED, status: 0, region: 0, offset: 0, len: 64, wr_id: 7, imm: 0 };
//! // ...the receiver places its 64 bytes and owes the ack...
//! let Ok(Received::Write { owed, .. }) = receiver.receive(&frame, now) else { panic!() };
//! // ...which completes the write, once.
//! let ack = owed.ack.unwrap();
//! assert!(matches!(writer.receive(&ack, now), Ok(Received::Completed(done)) if done.wr_id == 7));
//! assert!(writer.receive(&ack, now).unwrap_err().starts_with("protocol error"));
//! ```

use crate::protocol::{Awaited, Inbound, Inbox};
use crate::wire::{Frame, FrameKind};
use held_acks::HeldAcks;
use rdma_hint_core::{Arrival, Completion, CompletionStatus, RegionId};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Status code of work requests flushed because the connection broke (as `IBV_WC_WR_FLUSH_ERR`).
pub const FLUSHED: u32 = 5;

/// Silence tolerated while an answer is awaited: any frame from the peer counts as life (its
/// acks may queue behind its own large writes on a slow link).
pub const ANSWER_PATIENCE: Duration = Duration::from_secs(30);

/// A read of ours waiting for its bytes, as the session needs to know it: the link's own type
/// holds the destination too (its memory stays alive while the read waits).
pub trait AwaitedRead {
    /// The read's tag.
    fn wr_id(&self) -> u64;
    /// The bytes it asked for.
    fn asked_bytes(&self) -> u64;
}

impl AwaitedRead for (u64, u64) {
    fn wr_id(&self) -> u64 {
        self.0
    }
    fn asked_bytes(&self) -> u64 {
        self.1
    }
}

/// What a received frame asks of the link, in the order it must be done.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<R> {
    /// Place the write's `len` bytes (they follow the header) at `offset` of the exposed
    /// `region`, then complete the `acked` writes of ours it acknowledges
    /// ([`Session::acknowledged`]) and send what it `owed`.
    Write {
        /// Target region id (this side's).
        region: u32,
        /// Offset in it.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Its ack and its arrival, once placed.
        owed: Owed,
        /// Acks it carries for our oldest signalled writes.
        acked: u16,
    },
    /// A signalled write of ours landed (or failed at the peer): its completion.
    Completed(Completion),
    /// The peer reads: send `answer`, then `len` bytes at `offset` of our exposed `region`.
    ReadRequest {
        /// Source region id (this side's).
        region: u32,
        /// Offset in it.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The answer's header.
        answer: Frame,
    },
    /// The bytes of our oldest read follow (its length): place them, then complete it.
    ReadData(R),
    /// A control frame of `len` bytes follows: hand it to the link's control channel.
    Control {
        /// Bytes.
        len: u64,
    },
}

/// What a placed write owes: the ack goes on the wire before the arrival is published, so an
/// application that exits as soon as it sees the arrival does not strand the writer's
/// completions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owed {
    /// The writer asked for an ack.
    pub ack: Option<Frame>,
    /// The write carried an immediate.
    pub arrival: Option<Arrival>,
}

impl Owed {
    /// What an admitted write of `len` bytes into `region` owes, given its immediate and the
    /// writer's tag when it asked for an ack.
    pub fn of(region: u32, len: u64, arrival: Option<u32>, ack: Option<u64>) -> Owed {
        Owed {
            ack: ack.map(|wr_id| Frame::ack(region, wr_id)),
            arrival: arrival.map(|imm| Arrival { imm, region: RegionId(region), len }),
        }
    }
}

/// What waited when the link ended: nothing will answer it.
#[derive(Debug, PartialEq, Eq)]
pub struct Ended<R> {
    /// The flush completions of the signalled writes still waiting for their acks, oldest first.
    pub flushed: Vec<Completion>,
    /// The reads still waiting for their bytes, oldest first (the link lets their destinations
    /// go and flushes the signalled ones).
    pub reads: Vec<R>,
}

/// One side of a TCP link's protocol.
#[derive(Debug)]
pub struct Session<R> {
    inbox: Arc<Inbox>,
    /// Tags of the signalled writes sent and not yet acknowledged, oldest first: acks must come
    /// back for exactly these, in this order (TCP keeps frames in order).
    acks: VecDeque<u64>,
    /// Our reads waiting for their bytes, oldest first.
    reads: VecDeque<R>,
    /// Places taken by reads queued and not asked yet (each ask takes one back): they count
    /// against the window as the waiting ones do.
    reserved_reads: usize,
    /// Answers of each kind the peer's window admits at once.
    window: usize,
    /// When the peer last showed life, or when we started waiting on it, whichever is later.
    since: Instant,
    /// The acks this side owes the peer and has not sent yet.
    held: HeldAcks,
    ended: bool,
}

impl<R: AwaitedRead> Session<R> {
    /// A session that admits what `inbox` allows, with at most `window` acks and `window`
    /// reads awaited at once; `now` is its start.
    pub fn new(inbox: Arc<Inbox>, window: usize, now: Instant) -> Session<R> {
        Session {
            inbox,
            acks: VecDeque::with_capacity(window),
            reads: VecDeque::with_capacity(window),
            reserved_reads: 0,
            window,
            since: now,
            held: HeldAcks::default(),
            ended: false,
        }
    }

    /// What this side awaits from the peer next.
    fn awaited(&self) -> Awaited {
        Awaited {
            ack: self.acks.front().copied(),
            acks: self.acks.len(),
            read: self.reads.front().map(|read| (read.wr_id(), read.asked_bytes())),
        }
    }

    /// What `frame` would mean now, without taking anything: the protocol error that says why
    /// not, or the [`Inbound`] [`Session::receive`] would act on.
    pub fn check(&self, frame: &Frame) -> Result<Inbound, String> {
        self.inbox.admit(frame, self.awaited())
    }

    /// Takes `frame` (its header; any payload follows on the wire), received at `now`: what
    /// the link must do, or the protocol error that ends the link. An ack or an answer takes
    /// the write or read it names off what waits.
    pub fn receive(&mut self, frame: &Frame, now: Instant) -> Result<Received<R>, String> {
        let inbound = self.check(frame)?;
        self.heard(now);
        Ok(match inbound {
            Inbound::Write { region, offset, len, arrival, ack, acked, .. } => {
                Received::Write { region, offset, len, owed: Owed::of(region, len, arrival, ack), acked }
            }
            Inbound::Ack { wr_id, status } => {
                self.acks.pop_front();
                let status = match status {
                    0 => CompletionStatus::Success,
                    code => CompletionStatus::Failed { code: u32::from(code) },
                };
                Received::Completed(Completion { wr_id, status })
            }
            Inbound::ReadRequest { region, offset, len, wr_id } => {
                let answer = Frame {
                    kind: FrameKind::ReadData,
                    flags: 0,
                    status: 0,
                    region,
                    offset: 0,
                    len,
                    wr_id,
                    imm: 0,
                };
                Received::ReadRequest { region, offset, len, answer }
            }
            Inbound::ReadData { .. } => {
                Received::ReadData(self.reads.pop_front().expect("admitted only while a read waits"))
            }
            Inbound::Control { len } => Received::Control { len },
        })
    }

    /// The `count` acks a write carried (admitted: no more than wait) complete our oldest
    /// signalled writes, each handed to `done`; called once the write is off the socket.
    pub fn acknowledged(&mut self, count: u16, mut done: impl FnMut(Completion)) {
        for wr_id in self.acks.drain(..usize::from(count).min(self.acks.len())) {
            done(Completion { wr_id, status: CompletionStatus::Success });
        }
    }

    /// The acks owed and not sent yet (see [`held_acks`]).
    pub fn held_acks(&mut self) -> &mut HeldAcks {
        &mut self.held
    }

    /// The peer showed life at `now` (a frame's end: a long body is life too). Never moves
    /// the clock back.
    pub fn heard(&mut self, now: Instant) {
        self.since = self.since.max(now);
    }

    /// Whether an ack or a read's bytes are awaited from the peer.
    pub fn awaits_answers(&self) -> bool {
        !self.acks.is_empty() || !self.reads.is_empty()
    }

    /// How long the peer has been silent at `now` while an answer is awaited, once that is
    /// longer than `patience`.
    pub fn overdue(&self, now: Instant, patience: Duration) -> Option<Duration> {
        let silent = now.saturating_duration_since(self.since);
        (self.awaits_answers() && silent > patience).then_some(silent)
    }

    /// The first answer awaited starts the wait: the idle time before it does not count.
    fn start_waiting(&mut self, now: Instant) {
        if !self.awaits_answers() {
            self.heard(now);
        }
    }

    /// Signalled write `wr_id` is about to leave at `now` (the link's sender thread, whose
    /// queue is bounded by the window already): recorded before its frame goes, so its ack
    /// cannot overtake it. `Err` once the session ended (its link flushes it).
    pub fn sent_write(&mut self, wr_id: u64, now: Instant) -> Result<(), NotRecorded> {
        self.record(std::iter::once(wr_id), usize::MAX, now)
    }

    /// The signalled writes `wr_ids` of a batch a poster sends itself are about to leave at
    /// `now`: all recorded at once before the first frame goes, or none (`Full` when more
    /// than the window would then wait, with the room there is; `Closed` once the session
    /// ended).
    pub fn sent_writes(
        &mut self,
        wr_ids: impl Iterator<Item = u64> + Clone,
        now: Instant,
    ) -> Result<(), NotRecorded> {
        self.record(wr_ids, self.window, now)
    }

    fn record(
        &mut self,
        wr_ids: impl Iterator<Item = u64> + Clone,
        window: usize,
        now: Instant,
    ) -> Result<(), NotRecorded> {
        if self.ended {
            return Err(NotRecorded::Closed);
        }
        let room = window.saturating_sub(self.acks.len());
        if wr_ids.clone().count() > room {
            return Err(NotRecorded::Full { room });
        }
        self.start_waiting(now);
        self.acks.extend(wr_ids);
        Ok(())
    }

    /// Takes back signalled write `wr_id` whose frame never left (the newest recorded with that
    /// tag: a later one of another poster may follow it); false once [`Session::end`] flushed
    /// it (it had its one completion).
    pub fn retract_write(&mut self, wr_id: u64) -> bool {
        match self.acks.iter().rposition(|waiting| *waiting == wr_id) {
            Some(at) => self.acks.remove(at).is_some(),
            None => false,
        }
    }

    /// Takes places in the peer's window for `count` reads about to be queued; `Err(room)` when
    /// fewer are free.
    pub fn reserve_reads(&mut self, count: usize) -> Result<(), usize> {
        let room = self.window.saturating_sub(self.reads.len() + self.reserved_reads);
        if count > room {
            return Err(room);
        }
        self.reserved_reads += count;
        Ok(())
    }

    /// Gives back the places of `count` reads that will never be asked.
    pub fn unreserve_reads(&mut self, count: usize) {
        self.reserved_reads = self.reserved_reads.saturating_sub(count);
    }

    /// `read` is about to be asked at `now` (taking its reservation): recorded before its
    /// request leaves. Handed back once the session ended (its link flushes it).
    pub fn asked_read(&mut self, read: R, now: Instant) -> Result<(), R> {
        if self.ended {
            return Err(read);
        }
        self.start_waiting(now);
        self.reserved_reads = self.reserved_reads.saturating_sub(1);
        self.reads.push_back(read);
        Ok(())
    }

    /// The link ended: everything still awaited, to flush; nothing is recorded after this.
    pub fn end(&mut self) -> Ended<R> {
        self.ended = true;
        self.held.clear();
        let flushed = (self.acks.drain(..))
            .map(|wr_id| Completion { wr_id, status: CompletionStatus::Failed { code: FLUSHED } })
            .collect();
        Ended { flushed, reads: self.reads.drain(..).collect() }
    }
}

/// Why writes were not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRecorded {
    /// The session ended: nothing more is awaited (the link flushes them).
    Closed,
    /// The window has room for this many only.
    Full {
        /// Writes that would fit.
        room: usize,
    },
}

pub mod held_acks;
#[cfg(test)]
mod tests;
