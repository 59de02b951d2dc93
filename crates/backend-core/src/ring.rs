//! A single-producer single-consumer ring of one-cache-line slots in memory two processes
//! share: how a writer that copies straight into its peer's memory tells the peer what landed,
//! with no system call and no thread between them. The staged backend's shm channel announces
//! its writes on one (frame headers), the UCX backend's direct writes their notices; each
//! backend maps the memory, says what a slot's words mean, and builds the [`RingView`].
//!
//! The ring is memory the peer writes at any time. The reader trusts nothing of it: a slot's
//! sequence word must hold the number the reader expects next (or the lap before's), its words
//! go through the backend's `admit` before anything is taken, and the consumer's count the
//! writer reads back must lie within a ring of what it published; anything else is an `Err`
//! whose text starts with `protocol error`.
//!
//! ```
//! use rdma_hint_backend_core::ring::{Consumer, OwnedRing, Producer};
//!
//! let ring = OwnedRing::default();
//! let mut producer = Producer::default();
//! assert!(producer.room(&ring.view(), 1).unwrap() >= 1);
//! producer.publish(&ring.view(), &[7]);
//!
//! let mut taken = Vec::new();
//! let count = Consumer::default().take(&ring.view(), 16, |[word]: [u64; 1]| Ok(word), |word| {
//!     taken.push(word);
//!     Ok(())
//! });
//! assert_eq!((count, taken), (Ok(1), vec![7]));
//! ```

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Slots the ring holds before a writer must wait for its reader.
pub const RING_SLOTS: u64 = 4096;
/// 64-bit words per slot: what the backend puts there, then the sequence word, in one cache
/// line. The reader polls the next slot's sequence word itself: a published slot costs it one
/// cache line from the writer, with no shared head counter to fetch first.
pub const SLOT_WORDS: usize = 8;
/// The slot's word that says which announcement it holds: `n + 1` for the `n`-th ever (counted
/// from 0), written last. A fresh ring is zeros: no slot holds anything yet.
pub const SEQUENCE_WORD: usize = SLOT_WORDS - 1;
/// Words of a slot the backend fills.
pub const PAYLOAD_WORDS: usize = SEQUENCE_WORD;
/// Byte offsets of the header, as both backends lay it out in shared memory: the consumer's
/// count on a cache line of its own (the writer reads it only when the ring looks full), then
/// the sleeping mark and a futex word on another, then the slots.
pub const TAIL_AT: usize = 0;
/// See [`TAIL_AT`].
pub const SLEEPING_AT: usize = 64;
/// See [`TAIL_AT`].
pub const WAKE_AT: usize = 68;
/// See [`TAIL_AT`].
pub const SLOTS_AT: usize = 128;
/// The ring's size in shared memory: header and slots, rounded up to whole pages.
pub const RING_BYTES: u64 = ((SLOTS_AT + RING_SLOTS as usize * SLOT_WORDS * 8) as u64).div_ceil(4096) * 4096;
const _: () = assert!(TAIL_AT + 8 <= SLEEPING_AT && SLEEPING_AT + 4 <= WAKE_AT && WAKE_AT + 4 <= SLOTS_AT);
const _: () = assert!(
    std::mem::size_of::<Slot>() == SLOT_WORDS * 8
        && SLOTS_AT.is_multiple_of(std::mem::align_of::<Slot>())
        && SLOTS_AT + RING_SLOTS as usize * std::mem::size_of::<Slot>() <= RING_BYTES as usize,
    "the slots lie within the ring's bytes, each on a cache line"
);

/// One slot: a cache line of words.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct Slot(pub [AtomicU64; SLOT_WORDS]);

/// The ring's shared words, wherever they live (a mapping two processes share, or
/// [`OwnedRing`] in tests).
#[derive(Debug, Clone, Copy)]
pub struct RingView<'a> {
    /// Slots taken, ever: written by the consumer only.
    tail: &'a AtomicU64,
    /// Non-zero while the consumer sleeps (or is about to).
    sleeping: &'a AtomicU32,
    /// A word a sleeper may wait on (a futex), bumped by whoever wakes it.
    wake: &'a AtomicU32,
    slots: &'a [Slot],
}

impl<'a> RingView<'a> {
    /// The view of a ring's words.
    ///
    /// # Panics
    /// When `slots` is not [`RING_SLOTS`] long.
    #[inline]
    pub fn new(
        tail: &'a AtomicU64,
        sleeping: &'a AtomicU32,
        wake: &'a AtomicU32,
        slots: &'a [Slot],
    ) -> RingView<'a> {
        assert_eq!(slots.len(), RING_SLOTS as usize, "a ring's slots");
        RingView { tail, sleeping, wake, slots }
    }

    /// The slot that holds the `index`-th announcement (modulo the ring).
    #[inline(always)]
    fn slot(&self, index: u64) -> &'a [AtomicU64; SLOT_WORDS] {
        &self.slots[(index % RING_SLOTS) as usize].0
    }

    /// The futex word, for a backend whose sleeper waits on it.
    pub fn wake_word(&self) -> &'a AtomicU32 {
        self.wake
    }

    /// Sets the consumer's taken count, as a peer may.
    pub fn set_tail(&self, tail: u64) {
        self.tail.store(tail, Ordering::Release);
    }

    /// Writes the raw words of slot `index` (modulo the ring), sequence word included, as a
    /// peer may.
    pub fn set_slot(&self, index: u64, words: [u64; SLOT_WORDS]) {
        for (word, value) in self.slot(index).iter().zip(words) {
            word.store(value, Ordering::Release);
        }
    }
}

/// A ring in this process's heap, for tests, doc examples, benchmarks and fuzz targets: its
/// counter, its marks and every slot on cache lines of their own, as in shared memory.
#[derive(Debug)]
pub struct OwnedRing {
    tail: Line<AtomicU64>,
    marks: Line<(AtomicU32, AtomicU32)>,
    slots: Box<[Slot]>,
}

#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Line<T>(T);

impl Default for OwnedRing {
    fn default() -> Self {
        OwnedRing {
            tail: Line::default(),
            marks: Line::default(),
            slots: (0..RING_SLOTS).map(|_| Slot::default()).collect(),
        }
    }
}

impl OwnedRing {
    /// The ring's view.
    pub fn view(&self) -> RingView<'_> {
        RingView::new(&self.tail.0, &self.marks.0 .0, &self.marks.0 .1, &self.slots)
    }

    /// Sets the consumer's taken count, as a peer may.
    pub fn set_tail(&self, tail: u64) {
        self.view().set_tail(tail);
    }

    /// Writes the raw words of slot `index`, as a peer may (see [`RingView::set_slot`]).
    pub fn set_slot(&self, index: u64, words: [u64; SLOT_WORDS]) {
        self.view().set_slot(index, words);
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
    #[inline]
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

    /// Publishes `payload` (at most [`PAYLOAD_WORDS`] words; the slot's others keep what they
    /// held) in the next slot; [`Producer::room`] said there is one. After a batch of these,
    /// [`Producer::sleeper`] says whether to wake the consumer.
    #[inline]
    pub fn publish(&mut self, ring: &RingView<'_>, payload: &[u64]) {
        debug_assert!(payload.len() <= PAYLOAD_WORDS, "a payload of {} words", payload.len());
        debug_assert!(self.head.wrapping_sub(self.known_tail) < RING_SLOTS, "published without room");
        let slot = ring.slot(self.head);
        for (word, value) in slot[..PAYLOAD_WORDS].iter().zip(payload) {
            word.store(*value, Ordering::Relaxed);
        }
        self.head = self.head.wrapping_add(1);
        // Last, and released: a reader that sees the number sees the payload (and the bytes
        // this thread copied before it) too.
        slot[SEQUENCE_WORD].store(self.head, Ordering::Release);
    }

    /// Whether the consumer sleeps (or is about to), after the slots published so far.
    #[inline]
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

    /// Takes up to `max` slots (at most a ring's worth), in order: each slot's first `N`
    /// payload words go through `admit` (an `Err` leaves the slot untaken and is passed on), the
    /// slot is released (so the producer may reuse it at once), then what `admit` made goes to
    /// `each` (whose `Err` is passed on). Returns how many were taken; a wrongly numbered slot
    /// is an `Err` whose text starts with `protocol error`.
    #[inline]
    pub fn take<const N: usize, A>(
        &mut self,
        ring: &RingView<'_>,
        max: usize,
        mut admit: impl FnMut([u64; N]) -> Result<A, String>,
        mut each: impl FnMut(A) -> Result<(), String>,
    ) -> Result<usize, String> {
        const { assert!(N <= PAYLOAD_WORDS, "a slot's payload words") };
        let max = max.min(RING_SLOTS as usize);
        let mut count = 0;
        while count < max && self.next_published(ring)? {
            let slot = ring.slot(self.tail);
            let admitted = admit(std::array::from_fn(|at| slot[at].load(Ordering::Relaxed)))?;
            // Released before it is applied: the slot's words are copied out already.
            self.tail = self.tail.wrapping_add(1);
            ring.tail.store(self.tail, Ordering::Release);
            count += 1;
            each(admitted)?;
        }
        Ok(count)
    }

    /// Slots taken off the ring so far.
    #[inline]
    pub fn taken(&self) -> u64 {
        self.tail
    }

    /// Marks the consumer about to sleep; `false` when a slot arrived meanwhile (or the peer
    /// broke the ring, which taking reports): then it must not sleep, and the mark is cleared.
    #[inline]
    pub fn prepare_sleep(&self, ring: &RingView<'_>) -> bool {
        ring.sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.next_published(ring) != Ok(false) {
            ring.sleeping.store(0, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// Clears the sleeping mark of [`Consumer::prepare_sleep`] once awake (the consumer's lock need
/// not be held: only the consumer's side writes the mark).
#[inline]
pub fn awake(ring: &RingView<'_>) {
    ring.sleeping.store(0, Ordering::Relaxed);
}

/// Whether the slot after `taken` announcements still holds the number of the one a lap
/// before (0 on the first lap): nothing new is on the ring. A peek without the [`Consumer`]
/// for waits that look often; the next number, or a wild one, is [`Consumer::take`]'s to judge.
#[inline]
pub fn nothing_after(ring: &RingView<'_>, taken: u64) -> bool {
    let sequence = ring.slot(taken)[SEQUENCE_WORD].load(Ordering::Acquire);
    sequence == taken.wrapping_add(1).saturating_sub(RING_SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take_all(consumer: &mut Consumer, ring: &OwnedRing) -> Result<Vec<u64>, String> {
        let mut words = Vec::new();
        consumer.take(
            &ring.view(),
            usize::MAX,
            |[word]: [u64; 1]| Ok(word),
            |word| {
                words.push(word);
                Ok(())
            },
        )?;
        Ok(words)
    }

    #[test]
    fn slots_arrive_in_order_across_the_wrap_and_a_full_ring_has_no_room() {
        let ring = OwnedRing::default();
        let (mut producer, mut consumer) = (Producer::default(), Consumer::default());
        let mut next = 0u64;
        for round in 0..3 {
            assert!(nothing_after(&ring.view(), consumer.taken()), "round {round}: all taken");
            for _ in 0..RING_SLOTS {
                assert!(producer.room(&ring.view(), 1).unwrap() >= 1);
                producer.publish(&ring.view(), &[next]);
                next += 1;
            }
            assert!(!nothing_after(&ring.view(), consumer.taken()), "round {round}: published");
            assert_eq!(producer.room(&ring.view(), 1), Ok(0), "round {round}: full");
            let first = round * RING_SLOTS;
            assert_eq!(
                take_all(&mut consumer, &ring).unwrap(),
                (first..first + RING_SLOTS).collect::<Vec<_>>()
            );
            assert_eq!(consumer.taken(), first + RING_SLOTS);
        }
        assert!(nothing_after(&ring.view(), consumer.taken()));
        assert_eq!(producer.room(&ring.view(), RING_SLOTS), Ok(RING_SLOTS));
    }

    #[test]
    fn a_wild_ring_is_a_protocol_error_on_either_side_and_a_refused_slot_is_not_taken() {
        // A slot numbered neither as the next announcement nor as the lap before's: ahead of
        // the producer, or a lap behind where the first lap holds zeros.
        for sequence in [2, RING_SLOTS + 1, u64::MAX] {
            let ring = OwnedRing::default();
            let mut words = [0u64; SLOT_WORDS];
            words[SEQUENCE_WORD] = sequence;
            ring.set_slot(0, words);
            let refused = take_all(&mut Consumer::default(), &ring).unwrap_err();
            assert!(refused.starts_with("protocol error"), "{sequence}: {refused}");
            assert!(!Consumer::default().prepare_sleep(&ring.view()), "{sequence}: no sleep");
            assert!(!nothing_after(&ring.view(), 0), "{sequence}: left to take to judge");
        }

        // A consumer count ahead of the producer's, read when the room it knows runs out.
        let ring = OwnedRing::default();
        let mut producer = Producer::default();
        ring.set_tail(5);
        assert_eq!(producer.room(&ring.view(), 1), Ok(RING_SLOTS), "the room known is enough");
        assert!(producer.room(&ring.view(), RING_SLOTS + 1).unwrap_err().starts_with("protocol error"));

        // What the backend's admit refuses stays on the ring.
        let ring = OwnedRing::default();
        Producer::default().publish(&ring.view(), &[1]);
        let mut consumer = Consumer::default();
        let refused = consumer.take(
            &ring.view(),
            1,
            |_: [u64; 1]| Err::<(), _>("protocol error: no".into()),
            |_| Ok(()),
        );
        assert_eq!(refused, Err("protocol error: no".into()));
        assert_eq!(consumer.taken(), 0);
    }

    #[test]
    fn a_sleeper_is_seen_by_the_producer_and_a_pending_slot_keeps_it_awake() {
        let ring = OwnedRing::default();
        let (mut producer, consumer) = (Producer::default(), Consumer::default());
        assert!(!producer.sleeper(&ring.view()));
        assert!(consumer.prepare_sleep(&ring.view()), "nothing pending: may sleep");
        producer.publish(&ring.view(), &[1]);
        assert!(producer.sleeper(&ring.view()), "the sleeper is seen");
        awake(&ring.view());
        assert!(!producer.sleeper(&ring.view()));
        assert!(!consumer.prepare_sleep(&ring.view()), "a slot is pending");
        assert!(!producer.sleeper(&ring.view()), "the mark is cleared when it may not sleep");
    }
}
