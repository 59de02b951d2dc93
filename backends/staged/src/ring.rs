//! The shm channel's announcements: a single-producer single-consumer ring of frame headers
//! in a sealed memfd that the receiving side owns and hands its peer with its regions. The
//! writer copies straight into the peer's mapping and publishes one slot per write the peer
//! must hear of (an immediate, a bounce to copy on); the receiver takes slots off the ring in
//! the thread that waits for arrivals (`BusyPoll`: no thread hop, no system call per block),
//! or in its link's ring thread, which sleeps on a futex in the ring (`Adaptive`).
//!
//! The ring is memory the peer writes at any time. Every slot's sequence number is checked
//! against the one the reader expects next (or the lap before's), every slot is decoded and
//! then admitted by the same [`Inbox`] rules as a TCP frame, so a bad ring is a protocol error,
//! never an access outside a region; the fuzz target `staged_ring` drives [`Consumer::take`]
//! and [`Producer::room`] with arbitrary ring contents.
//!
//! ```
//! use rdma_hint_staged::protocol::{Inbound, Inbox};
//! use rdma_hint_staged::ring::{Consumer, OwnedRing, Producer};
//! use rdma_hint_staged::wire::{ChannelKind, Frame, FrameKind, FLAG_IMM, FLAG_PLACED};
//!
//! let ring = OwnedRing::default();
//! let write = Frame { kind: FrameKind::Write, flags: FLAG_PLACED | FLAG_IMM, status: 0,
//!                     region: 0, offset: 0, len: 4096, wr_id: 0, imm: 7 };
//! assert!(Producer::default().publish(&ring.view(), &write).unwrap());
//!
//! let inbox = Inbox::new(ChannelKind::Shm, &[(0, 4096)], 1 << 20);
//! let mut taken = Vec::new();
//! let count = Consumer::default().take(&ring.view(), &inbox, 16, |write| {
//!     taken.push(write);
//!     Ok(())
//! });
//! assert_eq!(count, Ok(1));
//! assert!(matches!(taken[0], Inbound::Write { arrival: Some(7), len: 4096, .. }));
//! ```

use crate::protocol::{Inbound, Inbox};
use crate::wire::{Frame, HEADER_WORDS};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Announcements the ring holds before a writer must wait for its reader.
pub const RING_SLOTS: u64 = 4096;
/// 64-bit words per slot: a frame header, then its sequence word, in one cache line. The
/// reader polls the next slot's sequence word itself: a published announcement costs it one
/// cache line from the writer, with no shared head counter to fetch first.
pub const SLOT_WORDS: usize = 8;
/// The slot's word that says which announcement it holds: `n + 1` for the `n`-th ever (counted
/// from 0), written last. A fresh ring is zeros: no slot holds anything yet.
pub const SEQUENCE_WORD: usize = SLOT_WORDS - 1;
const _: () = assert!(HEADER_WORDS < SEQUENCE_WORD, "a header and its sequence word fit a slot");
/// Byte offsets of the header fields: the consumer's counter on a cache line of its own (the
/// writer reads it only when the ring looks full), then the sleeping mark and the futex word.
const TAIL_AT: usize = 0;
const SLEEPING_AT: usize = 64;
const WAKE_AT: usize = 68;
const SLOTS_AT: usize = 128;
/// The ring's memfd size: header and slots, rounded up to whole pages.
pub const RING_BYTES: u64 = ((SLOTS_AT + RING_SLOTS as usize * SLOT_WORDS * 8) as u64).div_ceil(4096) * 4096;

/// The ring's shared words, wherever they live (a peer's mapping, or [`OwnedRing`] in tests).
#[derive(Debug, Clone, Copy)]
pub struct RingView<'a> {
    /// Slots taken, ever: written by the consumer only.
    tail: &'a AtomicU64,
    /// Non-zero while the consumer's ring thread sleeps (or is about to) on `wake`.
    sleeping: &'a AtomicU32,
    /// The futex word: the producer bumps it before waking the sleeper.
    wake: &'a AtomicU32,
    slots: &'a [AtomicU64],
}

impl<'a> RingView<'a> {
    /// The view of a ring at `base`.
    ///
    /// # Safety
    /// `base` must be 64-byte aligned and point to [`RING_BYTES`] bytes that stay mapped, and
    /// are accessed only atomically, for `'a`.
    pub(crate) unsafe fn at(base: *const u8) -> RingView<'a> {
        // SAFETY: every field lies inside the RING_BYTES the caller vouches for, at an offset
        // aligned for its type (the base is 64-byte aligned); atomics may be shared with another
        // process's mapping of the same pages, which is what they are for here.
        unsafe {
            RingView {
                tail: &*base.add(TAIL_AT).cast::<AtomicU64>(),
                sleeping: &*base.add(SLEEPING_AT).cast::<AtomicU32>(),
                wake: &*base.add(WAKE_AT).cast::<AtomicU32>(),
                slots: std::slice::from_raw_parts(
                    base.add(SLOTS_AT).cast::<AtomicU64>(),
                    RING_SLOTS as usize * SLOT_WORDS,
                ),
            }
        }
    }

    /// The slot that holds the `index`-th announcement (modulo the ring).
    fn slot(&self, index: u64) -> &'a [AtomicU64] {
        let at = (index % RING_SLOTS) as usize * SLOT_WORDS;
        &self.slots[at..at + SLOT_WORDS]
    }
}

/// A ring in this process's heap, for tests, doc examples and the fuzz target: the same bytes,
/// laid out as in the memfd (header words and slots on cache lines of their own).
#[derive(Debug)]
pub struct OwnedRing {
    lines: Box<[CacheLine]>,
}

#[derive(Debug)]
#[repr(C, align(64))]
struct CacheLine([AtomicU64; 8]);

impl Default for OwnedRing {
    fn default() -> Self {
        let lines = (0..RING_BYTES / 64).map(|_| CacheLine(Default::default())).collect();
        OwnedRing { lines }
    }
}

impl OwnedRing {
    /// The ring's view.
    pub fn view(&self) -> RingView<'_> {
        // SAFETY: the lines are RING_BYTES of 64-byte aligned atomics owned by `self`, alive for
        // the borrow and touched only through atomics.
        unsafe { RingView::at(self.lines.as_ptr().cast()) }
    }

    /// Sets the consumer's taken count, as a peer may.
    pub fn set_tail(&self, tail: u64) {
        self.view().tail.store(tail, Ordering::Release);
    }

    /// Writes the raw words of slot `index` (modulo the ring), sequence word included, as a
    /// peer may.
    pub fn set_slot(&self, index: u64, words: [u64; SLOT_WORDS]) {
        for (word, value) in self.view().slot(index).iter().zip(words) {
            word.store(value, Ordering::Release);
        }
    }
}

/// The writing side's state: its own count of published slots (the ring's copy is the
/// consumer's to read, never to trust back).
#[derive(Debug, Default)]
pub struct Producer {
    head: u64,
    /// The consumer's count as last read: the room it implies is never more than the truth,
    /// so the writer reads the consumer's cache line only when that room runs out.
    known_tail: u64,
}

impl Producer {
    /// Free slots now, at least `wanted` where there are (the consumer's count is read again
    /// only when the last one read leaves fewer); a consumer count ahead of ours, or more than
    /// the ring behind, is the peer breaking the protocol.
    pub fn room(&mut self, ring: &RingView<'_>, wanted: u64) -> Result<u64, String> {
        let known = RING_SLOTS - self.head.wrapping_sub(self.known_tail);
        if known >= wanted {
            return Ok(known);
        }
        let tail = ring.tail.load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > RING_SLOTS {
            return Err(format!(
                "protocol error: the peer's ring says {tail} announcements were taken of {} published",
                self.head
            ));
        }
        self.known_tail = tail;
        Ok(RING_SLOTS - used)
    }

    /// Publishes `frame` in the next slot unless the ring is full (`Ok(false)`, nothing
    /// written). After a batch of these, [`Producer::sleeper`] says whether to [`wake`] the
    /// consumer.
    pub fn publish(&mut self, ring: &RingView<'_>, frame: &Frame) -> Result<bool, String> {
        if self.room(ring, 1)? == 0 {
            return Ok(false);
        }
        let slot = ring.slot(self.head);
        for (word, value) in slot.iter().zip(frame.to_words()) {
            word.store(value, Ordering::Relaxed);
        }
        self.head = self.head.wrapping_add(1);
        // Last, and released: a reader that sees the number sees the header before it.
        slot[SEQUENCE_WORD].store(self.head, Ordering::Release);
        Ok(true)
    }

    /// Whether the consumer's ring thread sleeps (or is about to), after the slots published
    /// so far: then [`wake`] it.
    pub fn sleeper(&self, ring: &RingView<'_>) -> bool {
        // Pairs with the fence in `Consumer::prepare_sleep`: either the sleeper sees the new
        // slot, or this side sees it sleeping.
        fence(Ordering::SeqCst);
        ring.sleeping.load(Ordering::Relaxed) != 0
    }
}

/// The reading side's state: its own count of slots taken.
#[derive(Debug, Default)]
pub struct Consumer {
    tail: u64,
}

impl Consumer {
    /// Whether the next slot holds the next announcement. Its sequence word holds that
    /// announcement's number, or the number of the one a lap before (or 0 on the first lap);
    /// any other value is the peer breaking the protocol.
    // Inlined into the take: its result came back through memory and stalled every look.
    #[inline(always)]
    fn next_published(&self, ring: &RingView<'_>) -> Result<bool, String> {
        let sequence = ring.slot(self.tail)[SEQUENCE_WORD].load(Ordering::Acquire);
        let next = self.tail.wrapping_add(1);
        if sequence == next {
            return Ok(true);
        }
        if sequence == next.saturating_sub(RING_SLOTS) {
            return Ok(false);
        }
        Err(format!(
            "protocol error: a ring slot numbered {sequence} where announcement {next} or none belongs"
        ))
    }

    /// Takes up to `max` announcements (at most a ring's worth), each admitted by `inbox` and
    /// then handed to `each`, in order; returns how many. A wrongly numbered, undecodable or
    /// refused slot is an `Err` whose text starts with `protocol error`; an `Err` from `each`
    /// is passed on. Slots are released as they are taken, so the producer may reuse them at
    /// once.
    pub fn take(
        &mut self,
        ring: &RingView<'_>,
        inbox: &Inbox,
        max: usize,
        mut each: impl FnMut(Inbound) -> Result<(), String>,
    ) -> Result<usize, String> {
        let max = max.min(RING_SLOTS as usize);
        let mut count = 0;
        while count < max && self.next_published(ring)? {
            let slot = ring.slot(self.tail);
            let words = std::array::from_fn(|at| slot[at].load(Ordering::Relaxed));
            let write = inbox.admit_slot(words)?;
            // Released before it is applied: the slot's bytes are copied out already.
            self.tail = self.tail.wrapping_add(1);
            ring.tail.store(self.tail, Ordering::Release);
            count += 1;
            each(write)?;
        }
        Ok(count)
    }

    /// Announcements taken off the ring so far.
    pub fn taken(&self) -> u64 {
        self.tail
    }

    /// Marks the ring thread about to sleep and returns the futex value to sleep on, or `None`
    /// when a slot arrived meanwhile (then it must not sleep), or the peer broke the ring
    /// (taking reports it).
    pub fn prepare_sleep(&self, ring: &RingView<'_>) -> Option<u32> {
        let seen = ring.wake.load(Ordering::Acquire);
        ring.sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.next_published(ring) != Ok(false) {
            ring.sleeping.store(0, Ordering::Relaxed);
            return None;
        }
        Some(seen)
    }
}

/// Whether the slot after `taken` announcements still holds the number of the one a lap
/// before (0 on the first lap): nothing new is on the ring. A peek without the [`Consumer`]
/// for waits that look often; the next number, or a wild one, is [`Consumer::take`]'s to judge.
pub fn nothing_after(ring: &RingView<'_>, taken: u64) -> bool {
    let sequence = ring.slot(taken)[SEQUENCE_WORD].load(Ordering::Acquire);
    sequence == taken.wrapping_add(1).saturating_sub(RING_SLOTS)
}

/// Sleeps on the ring's futex while it still holds `seen` (from [`Consumer::prepare_sleep`]), `at_most` long (a wake that
/// never comes from a broken peer costs one timeout), then clears the sleeping mark.
pub fn sleep(ring: &RingView<'_>, seen: u32, at_most: Duration) {
    let timeout = libc::timespec {
        tv_sec: at_most.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(at_most.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT (shared, not private: the word is in a mapping another process
    // shares) reads the aligned u32 behind `ring.wake`, which lives for the call, and
    // `timeout` is a valid timespec; the kernel returns at a wake, a changed value, a
    // signal or the timeout, each harmless here.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            ring.wake.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &timeout as *const libc::timespec,
        );
    }
    ring.sleeping.store(0, Ordering::Relaxed);
}

/// Wakes the ring thread sleeping on `ring` (after [`Producer::sleeper`], or to stop it).
pub fn wake(ring: &RingView<'_>) {
    ring.wake.fetch_add(1, Ordering::Release);
    // SAFETY: FUTEX_WAKE on the aligned u32 behind `ring.wake`, alive for the call; it wakes at
    // most one waiter and touches no memory.
    unsafe {
        libc::syscall(libc::SYS_futex, ring.wake.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ChannelKind, FrameKind, FLAG_IMM, FLAG_PLACED, FLAG_SIGNALLED, HEADER_BYTES};

    fn placed(offset: u64, len: u64, imm: u32) -> Frame {
        Frame {
            kind: FrameKind::Write,
            flags: FLAG_PLACED | FLAG_IMM,
            status: 0,
            region: 0,
            offset,
            len,
            wr_id: 0,
            imm,
        }
    }

    fn inbox() -> Inbox {
        Inbox::new(ChannelKind::Shm, &[(0, 1 << 20)], 1 << 20)
    }

    fn take_all(consumer: &mut Consumer, ring: &OwnedRing) -> Result<Vec<u32>, String> {
        let mut imms = Vec::new();
        consumer.take(&ring.view(), &inbox(), usize::MAX, |write| match write {
            Inbound::Write { arrival, .. } => {
                imms.push(arrival.unwrap_or(u32::MAX));
                Ok(())
            }
            Inbound::Ack { .. } => unreachable!("refused by take"),
        })?;
        Ok(imms)
    }

    #[test]
    fn announcements_arrive_in_order_across_the_wrap_and_a_full_ring_refuses_more() {
        let ring = OwnedRing::default();
        let (mut producer, mut consumer) = (Producer::default(), Consumer::default());
        let mut next = 0u32;
        for round in 0..3 {
            assert!(nothing_after(&ring.view(), consumer.taken()), "round {round}: all taken");
            for _ in 0..RING_SLOTS {
                assert!(producer.publish(&ring.view(), &placed(0, 8, next)).unwrap());
                next += 1;
            }
            assert!(!nothing_after(&ring.view(), consumer.taken()), "round {round}: published");
            assert!(!producer.publish(&ring.view(), &placed(0, 8, 0)).unwrap(), "round {round}: full");
            let taken = take_all(&mut consumer, &ring).unwrap();
            let first = round * RING_SLOTS as u32;
            assert_eq!(taken, (first..first + RING_SLOTS as u32).collect::<Vec<_>>());
            assert_eq!(consumer.taken(), u64::from(first) + RING_SLOTS);
        }
        assert!(nothing_after(&ring.view(), consumer.taken()));
        assert_eq!(producer.room(&ring.view(), RING_SLOTS), Ok(RING_SLOTS));
    }

    #[test]
    fn a_wild_ring_is_a_protocol_error_on_either_side() {
        // A slot numbered neither as the next announcement nor as the lap before's: ahead of
        // the producer, or a lap behind where the first lap holds zeros.
        for sequence in [2, RING_SLOTS + 1, u64::MAX] {
            let ring = OwnedRing::default();
            let mut words = [0u64; SLOT_WORDS];
            words[..HEADER_WORDS].copy_from_slice(&placed(0, 8, 0).to_words());
            words[SEQUENCE_WORD] = sequence;
            ring.set_slot(0, words);
            let refused = take_all(&mut Consumer::default(), &ring).unwrap_err();
            assert!(refused.starts_with("protocol error"), "{sequence}: {refused}");
            assert_eq!(Consumer::default().prepare_sleep(&ring.view()), None, "{sequence}: no sleep");
            assert!(!nothing_after(&ring.view(), 0), "{sequence}: left to take to judge");
        }

        // A consumer count ahead of the producer's, read when the room it knows runs out.
        let ring = OwnedRing::default();
        let mut producer = Producer::default();
        ring.set_tail(5);
        assert_eq!(producer.room(&ring.view(), 1), Ok(RING_SLOTS), "the room known is enough");
        assert!(producer.room(&ring.view(), RING_SLOTS + 1).unwrap_err().starts_with("protocol error"));

        // Slots the rules refuse: outside the region, an ack asked for, framing of TCP, noise.
        let outside = placed(1 << 20, 1, 0).encode();
        let signalled = Frame { flags: FLAG_PLACED | FLAG_SIGNALLED, ..placed(0, 8, 0) }.encode();
        let tcp = Frame { flags: 0, ..placed(0, 8, 0) }.encode();
        for bytes in [outside, signalled, tcp, [0xa5; HEADER_BYTES]] {
            let ring = OwnedRing::default();
            let mut words = [0u64; SLOT_WORDS];
            for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
                *word = u64::from_le_bytes(chunk.try_into().unwrap());
            }
            words[SEQUENCE_WORD] = 1;
            ring.set_slot(0, words);
            let refused = take_all(&mut Consumer::default(), &ring).unwrap_err();
            assert!(refused.starts_with("protocol error"), "{refused}");
        }
    }

    #[test]
    fn a_sleeper_is_seen_by_the_producer_and_a_pending_slot_keeps_it_awake() {
        let ring = OwnedRing::default();
        let (mut producer, consumer) = (Producer::default(), Consumer::default());
        let seen = consumer.prepare_sleep(&ring.view()).expect("nothing pending: may sleep");
        assert!(producer.publish(&ring.view(), &placed(0, 8, 1)).unwrap());
        assert!(producer.sleeper(&ring.view()), "the sleeper is seen");
        wake(&ring.view());
        // The value moved on: a sleep on the old one returns at once.
        let started = std::time::Instant::now();
        sleep(&ring.view(), seen, Duration::from_secs(5));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(consumer.prepare_sleep(&ring.view()), None, "a slot is pending");
    }
}
