//! What a TCP link waits on its peer for (the ack of each signalled write, the bytes of each
//! read), in the order it asked, and how long the peer may stay silent meanwhile before the
//! link counts it gone. An RC queue pair ends a connection whose peer stopped answering after
//! its retry timeout; without this, a peer that keeps the socket open and answers nothing would
//! hold our completions, and the destinations of our reads, for ever.
//!
//! Whatever waits here when the reader ends is the reader's to flush, once: the queue closes
//! then, and nothing joins it after.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Answers awaited from the peer, oldest first, at most `max` (what the peer's window of
/// queued answers admits).
#[derive(Debug)]
pub(crate) struct AnswerQueue<T> {
    waiting: Mutex<Waiting<T>>,
    max: usize,
}

/// The queue itself, locked: what a poster that asks several at once holds meanwhile.
#[derive(Debug)]
pub(crate) struct Waiting<T> {
    items: VecDeque<T>,
    /// Places taken by posts whose requests are queued and not asked yet (each ask takes one
    /// back as it joins `items`): they count against the window as the waiting ones do.
    reserved: usize,
    /// Drained for good: the reader ended, nothing will be answered.
    closed: bool,
}

impl<T> Waiting<T> {
    /// How many wait, or are reserved to.
    pub(crate) fn len(&self) -> usize {
        self.items.len() + self.reserved
    }

    /// `item` is about to be asked: recorded before its request leaves, so its answer cannot
    /// overtake it (taking its reservation, if it had one). When nothing else was waiting,
    /// `clock` restarts first, under the same lock: the reader never sees the item waiting on
    /// an old clock. Handed back once the queue was drained for good (nobody would answer it:
    /// the caller flushes it).
    pub(crate) fn push(&mut self, item: T, clock: &AnswerClock) -> Result<(), T> {
        if self.closed {
            return Err(item);
        }
        if self.items.is_empty() {
            clock.restart(Instant::now());
        }
        self.reserved = self.reserved.saturating_sub(1);
        self.items.push_back(item);
        Ok(())
    }

    /// Takes back the newest one if `is_it` says it is the caller's, whose request never left
    /// (the caller then flushes it or reports it unposted); `None` once the reader drained it
    /// (and flushed it).
    pub(crate) fn retract(&mut self, is_it: impl FnOnce(&T) -> bool) -> Option<T> {
        if self.items.back().is_some_and(is_it) {
            return self.items.pop_back();
        }
        None
    }
}

impl<T> AnswerQueue<T> {
    pub(crate) fn new(max: usize) -> AnswerQueue<T> {
        AnswerQueue {
            waiting: Mutex::new(Waiting { items: VecDeque::with_capacity(max), reserved: 0, closed: false }),
            max,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Waiting<T>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many more may be asked now (posts ask through [`AnswerQueue::reserve`]).
    #[cfg(test)]
    pub(crate) fn room(&self) -> usize {
        self.max.saturating_sub(self.lock().len())
    }

    /// Takes `count` places for requests about to be queued; `Err(room)` when fewer are free.
    pub(crate) fn reserve(&self, count: usize) -> Result<(), usize> {
        let mut waiting = self.lock();
        let room = self.max.saturating_sub(waiting.len());
        if count > room {
            return Err(room);
        }
        waiting.reserved += count;
        Ok(())
    }

    /// Gives back `count` places of requests that will never be asked (not queued after all,
    /// or flushed from the queue).
    pub(crate) fn unreserve(&self, count: usize) {
        let mut waiting = self.lock();
        waiting.reserved = waiting.reserved.saturating_sub(count);
    }

    /// See [`Waiting::push`].
    pub(crate) fn push(&self, item: T, clock: &AnswerClock) -> Result<(), T> {
        self.lock().push(item, clock)
    }

    /// What the oldest one says (what the next answer must match).
    pub(crate) fn front<R>(&self, look: impl FnOnce(&T) -> R) -> Option<R> {
        self.lock().items.front().map(look)
    }

    /// The oldest one, its answer admitted.
    pub(crate) fn pop_front(&self) -> Option<T> {
        self.lock().items.pop_front()
    }

    /// The oldest one if `is_it` says it is the one an admitted answer named; `None` when the
    /// reader's end drained it, or its sender took it back, after the answer was admitted.
    pub(crate) fn pop_front_if(&self, is_it: impl FnOnce(&T) -> bool) -> Option<T> {
        let mut waiting = self.lock();
        if waiting.items.front().is_some_and(is_it) {
            return waiting.items.pop_front();
        }
        None
    }

    /// See [`Waiting::retract`].
    pub(crate) fn retract(&self, is_it: impl FnOnce(&T) -> bool) -> Option<T> {
        self.lock().retract(is_it)
    }

    /// Whether anything waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().items.is_empty()
    }

    /// Everything still waiting, at the reader's end: none will be answered, and nothing
    /// joins after this.
    pub(crate) fn drain(&self) -> Vec<T> {
        let mut waiting = self.lock();
        waiting.closed = true;
        waiting.items.drain(..).collect()
    }
}

/// Silence tolerated while an answer is awaited: any frame from the peer counts as life (its
/// acks may queue behind its own large writes on a slow link).
pub(crate) const ANSWER_PATIENCE: Duration = Duration::from_secs(30);

/// When the peer last showed life, or when we started waiting on it, whichever is later.
///
/// Lock-free: the reader restarts it per frame, a poster when the first answer is awaited.
#[derive(Debug)]
pub(crate) struct AnswerClock {
    born: Instant,
    since_us: AtomicU64,
}

impl AnswerClock {
    pub(crate) fn new(born: Instant) -> AnswerClock {
        AnswerClock { born, since_us: AtomicU64::new(0) }
    }

    /// The peer showed life at `now`, or an answer is awaited from `now` with none before it.
    /// Never moves the clock back (two threads may restart it at once).
    pub(crate) fn restart(&self, now: Instant) {
        let us = now.saturating_duration_since(self.born).as_micros() as u64;
        self.since_us.fetch_max(us, Ordering::AcqRel);
    }

    /// How long the peer has been silent at `now` with an answer awaited (`awaiting`), once
    /// that is longer than `patience`.
    pub(crate) fn overdue(&self, now: Instant, awaiting: bool, patience: Duration) -> Option<Duration> {
        let now_us = now.saturating_duration_since(self.born).as_micros() as u64;
        let silent = Duration::from_micros(now_us.saturating_sub(self.since_us.load(Ordering::Acquire)));
        (awaiting && silent > patience).then_some(silent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_awaited_in_order_and_what_the_reader_drained_stays_its_own() {
        let (queue, clock) = (AnswerQueue::new(2), AnswerClock::new(Instant::now()));
        assert_eq!((queue.room(), queue.front(|wr_id| *wr_id)), (2, None));
        queue.push(4u64, &clock).unwrap();
        queue.push(5, &clock).unwrap();
        assert_eq!((queue.room(), queue.front(|wr_id| *wr_id)), (0, Some(4)));
        assert_eq!(queue.retract(|wr_id| *wr_id == 4), None, "only the newest is taken back");
        assert_eq!(queue.retract(|wr_id| *wr_id == 5), Some(5));
        assert_eq!(queue.pop_front_if(|wr_id| *wr_id == 5), None, "only the one named");
        assert_eq!(queue.pop_front_if(|wr_id| *wr_id == 4), Some(4));
        assert!(queue.is_empty());
        // Queued requests not asked yet count against the window until asked or given back.
        queue.reserve(2).unwrap();
        assert_eq!((queue.room(), queue.reserve(1)), (0, Err(0)));
        queue.push(6, &clock).unwrap();
        assert_eq!(queue.room(), 0, "the ask took its own place");
        queue.unreserve(1);
        assert_eq!(queue.room(), 1);
        assert_eq!(queue.drain(), vec![6]);
        assert_eq!(queue.push(7, &clock), Err(7), "asked after the reader ended: the asker flushes it");
        assert_eq!(queue.retract(|_| true), None, "drained: the reader flushed it");
    }

    #[test]
    fn only_silence_while_an_answer_is_awaited_is_overdue_and_any_life_restarts_it() {
        let born = Instant::now();
        let clock = AnswerClock::new(born);
        let patience = Duration::from_secs(30);
        let at = |secs| born + Duration::from_secs(secs);
        assert_eq!(clock.overdue(at(100), false, patience), None, "nothing awaited: silence is fine");
        // The first awaited answer starts the wait: the idle time before it does not count.
        clock.restart(at(100));
        assert_eq!(clock.overdue(at(129), true, patience), None);
        assert_eq!(clock.overdue(at(131), true, patience), Some(Duration::from_secs(31)));
        clock.restart(at(131));
        assert_eq!(clock.overdue(at(160), true, patience), None, "a frame from the peer is life");
        // A restart from a thread that read the time earlier does not move it back.
        clock.restart(at(120));
        assert_eq!(clock.overdue(at(160), true, patience), None);
    }
}
