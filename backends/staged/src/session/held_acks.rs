//! When this side's acks go (TCP), without I/O. An ack goes on the wire before the arrival of
//! its write is published, so an application that exits as soon as it sees the arrival strands
//! no completion of its peer. Where the application answers writes with writes (a ping-pong,
//! an RPC), that costs a frame and a system call each way on the critical path; there the ack
//! is held instead and rides in the answer ([`crate::wire::FLAG_ACKS`]), as TCP's delayed acks
//! ride in interactive traffic.
//!
//! Held only where the application's own polls move the socket (`BusyPoll`, the link decides):
//! an ack is held from the moment this side answered a write, whose ack went at once, within
//! [`HOLD`]; a held ack still waiting after [`HOLD`] goes at the next poll (or the reader
//! thread's next look), and acks go at once again until the application answers again.
//!
//! ```
//! use rdma_hint_staged::session::held_acks::{AckTiming, HeldAcks, HOLD};
//! use rdma_hint_staged::wire::Frame;
//! use std::time::Instant;
//!
//! let (mut acks, start) = (HeldAcks::default(), Instant::now());
//! // The first ack goes at once; the application answers its write right after...
//! assert_eq!(acks.owe(Frame::ack(0, 1), true, start), AckTiming::SendNow);
//! acks.went(1);
//! assert_eq!(acks.write_leaving(start), 0);
//! // ...so the next one is held, and the next answer carries it.
//! assert_eq!(acks.owe(Frame::ack(0, 2), true, start), AckTiming::Hold);
//! assert_eq!(acks.write_leaving(start), 1);
//! acks.went(1);
//! // An ack no answer carried goes once it waited `HOLD`, and holding stops.
//! assert_eq!(acks.owe(Frame::ack(0, 3), true, start), AckTiming::Hold);
//! assert!(!acks.overdue(start));
//! assert!(acks.overdue(start + HOLD));
//! acks.went(1);
//! assert_eq!(acks.owe(Frame::ack(0, 4), true, start + HOLD), AckTiming::SendNow);
//! ```

use crate::wire::Frame;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long an ack waits for an answer to ride in, at most (as long as the application polls),
/// and how soon after an ack that went at once an answer makes acks held.
pub const HOLD: Duration = Duration::from_micros(50);

/// Acks held at once, at most: one more goes at once with them (a write carries them all).
pub const MAX_HELD: usize = 16;

/// What to do with an ack just owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckTiming {
    /// Held: the next write carries it, or it goes once overdue.
    Hold,
    /// Every held ack goes now, this one last, before the write's arrival is published.
    SendNow,
}

/// The acks owed to the peer and not on the wire yet, oldest first, and whether the
/// application answers writes with writes.
#[derive(Debug, Default)]
pub struct HeldAcks {
    owed: VecDeque<Frame>,
    /// When the oldest ack still owed was owed.
    since: Option<Instant>,
    /// The application answered an arrival within [`HOLD`] of its ack: acks are held.
    answering: bool,
    /// When an ack last went at once.
    sent_at: Option<Instant>,
}

impl HeldAcks {
    /// A placed write owes `ack` at `now`; `may_hold` where the application's polls take the
    /// socket. The ack joins those owed (the caller sends every one of them on
    /// [`AckTiming::SendNow`], then calls [`HeldAcks::went`]).
    pub fn owe(&mut self, ack: Frame, may_hold: bool, now: Instant) -> AckTiming {
        self.owed.push_back(ack);
        self.since.get_or_insert(now);
        if may_hold && self.answering && self.owed.len() <= MAX_HELD {
            return AckTiming::Hold;
        }
        self.sent_at = Some(now);
        AckTiming::SendNow
    }

    /// A write of this side leaves at `now`: the acks it carries (every one owed). A write
    /// within [`HOLD`] of an ack that went at once is an answer: acks are held from now on.
    pub fn write_leaving(&mut self, now: Instant) -> u16 {
        if self.sent_at.is_some_and(|at| now.saturating_duration_since(at) <= HOLD) {
            self.answering = true;
        }
        self.owed.len() as u16
    }

    /// The `count` oldest acks owed went on the wire (in a write, or as frames).
    pub fn went(&mut self, count: usize) {
        self.owed.drain(..count.min(self.owed.len()));
        if self.owed.is_empty() {
            self.since = None;
        }
    }

    /// The acks owed, oldest first, to send as frames.
    pub fn owed(&self) -> impl ExactSizeIterator<Item = &Frame> {
        self.owed.iter()
    }

    /// When the oldest ack owed was owed (none owed: `None`).
    pub fn owed_since(&self) -> Option<Instant> {
        self.since
    }

    /// Whether acks owed have waited [`HOLD`] at `now` without a write to carry them: they go
    /// now, and acks go at once again until the application answers again.
    pub fn overdue(&mut self, now: Instant) -> bool {
        let overdue = self.since.is_some_and(|since| now.saturating_duration_since(since) >= HOLD);
        if overdue {
            self.answering = false;
        }
        overdue
    }

    /// The link ended: nothing owed goes any more.
    pub fn clear(&mut self) {
        self.owed.clear();
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answering makes acks held; they never pile past [`MAX_HELD`], and an application that
    /// stops answering gets its acks at once again after one overdue.
    #[test]
    fn acks_are_held_only_while_the_application_answers_and_never_past_the_cap() {
        let (mut acks, start) = (HeldAcks::default(), Instant::now());
        assert_eq!(acks.owe(Frame::ack(0, 0), true, start), AckTiming::SendNow, "nobody answered yet");
        acks.went(1);
        assert_eq!(acks.write_leaving(start + HOLD * 2), 0);
        assert_eq!(
            acks.owe(Frame::ack(0, 1), true, start),
            AckTiming::SendNow,
            "an answer after HOLD is no answer"
        );
        acks.went(1);
        assert_eq!(acks.write_leaving(start), 0);
        for wr_id in 2..2 + MAX_HELD as u64 {
            assert_eq!(acks.owe(Frame::ack(0, wr_id), true, start), AckTiming::Hold);
        }
        assert_eq!(acks.owe(Frame::ack(0, 99), true, start), AckTiming::SendNow, "the cap");
        assert_eq!(acks.owed().len(), MAX_HELD + 1);
        assert_eq!(acks.owed().next().map(|ack| ack.wr_id), Some(2), "oldest first");
        acks.went(MAX_HELD + 1);
        assert_eq!(acks.owed_since(), None);
        assert_eq!(
            acks.owe(Frame::ack(0, 100), false, start),
            AckTiming::SendNow,
            "not where polls take the socket"
        );
        acks.went(1);
        assert_eq!(acks.owe(Frame::ack(0, 101), true, start), AckTiming::Hold);
        assert!(!acks.overdue(start + HOLD / 2));
        assert!(acks.overdue(start + HOLD));
        acks.went(1);
        assert_eq!(acks.owe(Frame::ack(0, 102), true, start + HOLD), AckTiming::SendNow);
    }
}
