//! The notice ring: where a peer that reaches this side's memory directly (UCX maps the
//! segment, `ucp_rkey_ptr`) announces its writes with immediate, instead of an active message.
//! A single-producer single-consumer ring of one-cache-line slots in memory this side
//! allocated with `ucp_mem_map` and exposed (its packed rkey in the hello). The writer copies
//! its bytes into the peer's mapping, then publishes a slot; the receiver takes slots off in
//! the thread that waits for arrivals, with no UCX call in between. A receiver that is about
//! to sleep on its worker's event fd marks the ring, and a writer that sees the mark sends a
//! short active message to wake it.
//!
//! The ring is memory the peer writes at any time: every slot's sequence number is checked
//! against the one the reader expects next (or the lap before's), and every notice against
//! the regions this side exposed, so a bad ring is a protocol error, never an arrival for
//! memory the peer may not write. The fuzz target `ucx_ring` drives [`Consumer::take`] and
//! [`Producer::room`] with arbitrary ring contents.
//!
//! ```
//! use rdma_hint_core::{Arrival, RegionId};
//! use rdma_hint_ucx::ring::{Consumer, OwnedRing, Producer};
//!
//! let ring = OwnedRing::default();
//! let notice = Arrival { imm: 7, region: RegionId(0), len: 4096 };
//! let mut producer = Producer::default();
//! assert_eq!(producer.room(&ring.view(), 1), Ok(true));
//! producer.publish(&ring.view(), &notice);
//!
//! let mut taken = [Arrival::EMPTY; 4];
//! let count = Consumer::default().take(&ring.view(), &[(0, 4096)], &mut taken);
//! assert_eq!(count, Ok(1));
//! assert_eq!(taken[0], notice);
//! ```

use rdma_hint_core::{Arrival, RegionId};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Notices the ring holds before a writer must wait for its reader.
pub const RING_SLOTS: u64 = 4096;
/// 64-bit words per slot: the notice (imm and region, then length), then its sequence word,
/// in one cache line: a published notice costs the reader one line from the writer.
pub const SLOT_WORDS: usize = 8;
/// The slot's word that says which notice it holds: `n + 1` for the `n`-th ever (counted from
/// 0), written last. A fresh ring is zeros: no slot holds anything yet.
pub const SEQUENCE_WORD: usize = SLOT_WORDS - 1;
/// Byte offsets of the header: the consumer's count on a cache line of its own (the writer
/// reads it only when the ring looks full), then the sleeping mark on another.
const TAIL_AT: usize = 0;
const SLEEPING_AT: usize = 64;
const SLOTS_AT: usize = 128;
/// The ring's size: header and slots, rounded up to whole pages.
pub const RING_BYTES: u64 = ((SLOTS_AT + RING_SLOTS as usize * SLOT_WORDS * 8) as u64).div_ceil(4096) * 4096;

/// The ring's shared words, wherever they live (this side's memory, the peer's mapping, or
/// [`OwnedRing`] in tests).
#[derive(Debug, Clone, Copy)]
pub struct RingView<'a> {
    /// Notices taken, ever: written by the consumer only.
    tail: &'a AtomicU64,
    /// Non-zero while the consumer may sleep on its worker's event fd.
    sleeping: &'a AtomicU32,
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
                slots: std::slice::from_raw_parts(
                    base.add(SLOTS_AT).cast::<AtomicU64>(),
                    RING_SLOTS as usize * SLOT_WORDS,
                ),
            }
        }
    }

    /// The slot that holds the `index`-th notice (modulo the ring).
    fn slot(&self, index: u64) -> &'a [AtomicU64] {
        let at = (index % RING_SLOTS) as usize * SLOT_WORDS;
        &self.slots[at..at + SLOT_WORDS]
    }

    /// Writes the raw words of slot `index` (modulo the ring), sequence word included, as a
    /// peer may.
    pub fn set_slot(&self, index: u64, words: [u64; SLOT_WORDS]) {
        for (word, value) in self.slot(index).iter().zip(words) {
            word.store(value, Ordering::Release);
        }
    }
}

/// A ring in this process's heap, for tests, doc examples and the fuzz target: the same bytes,
/// laid out as in UCX's segment.
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

    /// Writes the raw words of slot `index`, as a peer may (see [`RingView::set_slot`]).
    pub fn set_slot(&self, index: u64, words: [u64; SLOT_WORDS]) {
        self.view().set_slot(index, words);
    }
}

/// The writing side's state: its own count of published notices (the ring's copy is the
/// consumer's to read, never to trust back).
#[derive(Debug, Default)]
pub struct Producer {
    head: u64,
    /// The consumer's count as last read: the room it implies is never more than the truth,
    /// so the writer reads the consumer's cache line only when that room runs out.
    known_tail: u64,
}

impl Producer {
    /// Whether `wanted` slots are free (the consumer's count is read again only when the last
    /// one read leaves fewer); a consumer count ahead of ours, or more than the ring behind,
    /// is the peer breaking the protocol.
    pub fn room(&mut self, ring: &RingView<'_>, wanted: u64) -> Result<bool, String> {
        if RING_SLOTS - self.head.wrapping_sub(self.known_tail) >= wanted {
            return Ok(true);
        }
        let tail = ring.tail.load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > RING_SLOTS {
            return Err(format!(
                "protocol error: the peer's notice ring says {tail} notices were taken of {} published",
                self.head
            ));
        }
        self.known_tail = tail;
        Ok(RING_SLOTS - used >= wanted)
    }

    /// Publishes `notice` in the next slot; [`Producer::room`] said there is one. After a
    /// batch of these, [`Producer::sleeper`] says whether to wake the consumer.
    pub fn publish(&mut self, ring: &RingView<'_>, notice: &Arrival) {
        let slot = ring.slot(self.head);
        slot[0].store(u64::from(notice.imm) | (u64::from(notice.region.0) << 32), Ordering::Relaxed);
        slot[1].store(notice.len, Ordering::Relaxed);
        self.head = self.head.wrapping_add(1);
        // Last, and released: a reader that sees the number sees the notice (and the bytes
        // this thread copied before it) too.
        slot[SEQUENCE_WORD].store(self.head, Ordering::Release);
    }

    /// Whether the consumer may be asleep on its event fd after the notices published so far.
    pub fn sleeper(&self, ring: &RingView<'_>) -> bool {
        // Pairs with the fence in `Consumer::prepare_sleep`: either the sleeper sees the new
        // slot, or this side sees it sleeping.
        fence(Ordering::SeqCst);
        ring.sleeping.load(Ordering::Relaxed) != 0
    }
}

/// The reading side's state: its own count of notices taken.
#[derive(Debug, Default)]
pub struct Consumer {
    tail: u64,
}

impl Consumer {
    /// Whether the next slot holds the next notice. Its sequence word holds that notice's
    /// number, or the number of the one a lap before (or 0 on the first lap); any other value
    /// is the peer breaking the protocol.
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
        Err(format!("protocol error: a notice slot numbered {sequence} where notice {next} or none belongs"))
    }

    /// Takes notices into `out` (at most a ring's worth), in order, each checked against
    /// `exposed` (`(region id, length)` of what this side exposed: the region must be one, its
    /// length at most the region's); returns how many. A wrongly numbered slot or a notice for
    /// memory the peer may not write is an `Err` whose text starts with `protocol error`.
    /// Slots are released as they are taken, so the producer may reuse them at once.
    pub fn take(
        &mut self,
        ring: &RingView<'_>,
        exposed: &[(u32, u64)],
        out: &mut [Arrival],
    ) -> Result<usize, String> {
        let max = out.len().min(RING_SLOTS as usize);
        let mut count = 0;
        while count < max && self.next_published(ring)? {
            let slot = ring.slot(self.tail);
            let (first, len) = (slot[0].load(Ordering::Relaxed), slot[1].load(Ordering::Relaxed));
            let notice = Arrival { imm: first as u32, region: RegionId((first >> 32) as u32), len };
            if !exposed.iter().any(|&(id, region_len)| id == notice.region.0 && len <= region_len) {
                return Err(format!(
                    "protocol error: a notice of {len} B for region {} that this side did not expose that large",
                    notice.region.0
                ));
            }
            self.tail = self.tail.wrapping_add(1);
            ring.tail.store(self.tail, Ordering::Release);
            out[count] = notice;
            count += 1;
        }
        Ok(count)
    }

    /// Notices taken off the ring so far.
    pub fn taken(&self) -> u64 {
        self.tail
    }

    /// Marks the consumer about to sleep; `false` when a slot arrived meanwhile (or the peer
    /// broke the ring, which taking reports): then it must not sleep, and the mark is cleared.
    pub fn prepare_sleep(&self, ring: &RingView<'_>) -> bool {
        ring.sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.next_published(ring) != Ok(false) {
            ring.sleeping.store(0, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Clears the sleeping mark once awake.
    pub fn woke(&self, ring: &RingView<'_>) {
        ring.sleeping.store(0, Ordering::Relaxed);
    }
}

/// Whether the slot after `taken` notices still holds the number of the one a lap before (0
/// on the first lap): nothing new is on the ring. A peek without the [`Consumer`] for waits
/// that look often; the next number, or a wild one, is [`Consumer::take`]'s to judge.
pub fn nothing_after(ring: &RingView<'_>, taken: u64) -> bool {
    let sequence = ring.slot(taken)[SEQUENCE_WORD].load(Ordering::Acquire);
    sequence == taken.wrapping_add(1).saturating_sub(RING_SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSED: [(u32, u64); 2] = [(0, 1 << 20), (5, 4096)];

    fn notice(imm: u32) -> Arrival {
        Arrival { imm, region: RegionId(0), len: 8 }
    }

    fn take_all(consumer: &mut Consumer, ring: &OwnedRing) -> Result<Vec<u32>, String> {
        let mut out = [Arrival::EMPTY; RING_SLOTS as usize];
        let count = consumer.take(&ring.view(), &EXPOSED, &mut out)?;
        Ok(out[..count].iter().map(|a| a.imm).collect())
    }

    #[test]
    fn notices_arrive_in_order_across_the_wrap_and_a_full_ring_has_no_room() {
        let ring = OwnedRing::default();
        let (mut producer, mut consumer) = (Producer::default(), Consumer::default());
        let mut next = 0u32;
        for round in 0..3 {
            assert!(nothing_after(&ring.view(), consumer.taken()), "round {round}: all taken");
            for _ in 0..RING_SLOTS {
                assert_eq!(producer.room(&ring.view(), 1), Ok(true));
                producer.publish(&ring.view(), &notice(next));
                next += 1;
            }
            assert!(!nothing_after(&ring.view(), consumer.taken()), "round {round}: published");
            assert_eq!(producer.room(&ring.view(), 1), Ok(false), "round {round}: full");
            let taken = take_all(&mut consumer, &ring).unwrap();
            let first = round * RING_SLOTS as u32;
            assert_eq!(taken, (first..first + RING_SLOTS as u32).collect::<Vec<_>>());
            assert_eq!(consumer.taken(), u64::from(first) + RING_SLOTS);
        }
        assert!(nothing_after(&ring.view(), consumer.taken()));
        assert_eq!(producer.room(&ring.view(), RING_SLOTS), Ok(true));
        assert_eq!(producer.room(&ring.view(), RING_SLOTS + 1), Ok(false));
    }

    #[test]
    fn every_field_of_a_notice_comes_through() {
        let ring = OwnedRing::default();
        let sent = Arrival { imm: u32::MAX, region: RegionId(5), len: 4096 };
        Producer::default().publish(&ring.view(), &sent);
        let mut out = [Arrival::EMPTY; 2];
        assert_eq!(Consumer::default().take(&ring.view(), &EXPOSED, &mut out), Ok(1));
        assert_eq!(out[0], sent);
    }

    #[test]
    fn a_wild_ring_is_a_protocol_error_on_either_side() {
        // A slot numbered neither as the next notice nor as the lap before's.
        for sequence in [2, RING_SLOTS + 1, u64::MAX] {
            let ring = OwnedRing::default();
            let mut words = [0u64; SLOT_WORDS];
            words[1] = 8;
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
        assert_eq!(producer.room(&ring.view(), 1), Ok(true), "the room known is enough");
        assert!(producer.room(&ring.view(), RING_SLOTS + 1).unwrap_err().starts_with("protocol error"));

        // Notices for memory the peer may not write: a region not exposed, or longer than it.
        let first = |region: u32| u64::from(region) << 32;
        for (word0, len) in [(first(1), 8), (first(5), 4097), (first(0), (1 << 20) + 1), (first(u32::MAX), 0)]
        {
            let ring = OwnedRing::default();
            let mut words = [0u64; SLOT_WORDS];
            (words[0], words[1], words[SEQUENCE_WORD]) = (word0, len, 1);
            ring.set_slot(0, words);
            let mut consumer = Consumer::default();
            let refused = take_all(&mut consumer, &ring).unwrap_err();
            assert!(refused.starts_with("protocol error"), "{refused}");
            assert_eq!(consumer.taken(), 0, "a refused notice is not taken");
        }
    }

    #[test]
    fn a_sleeper_is_seen_by_the_producer_and_a_pending_slot_keeps_it_awake() {
        let ring = OwnedRing::default();
        let (mut producer, consumer) = (Producer::default(), Consumer::default());
        assert!(!producer.sleeper(&ring.view()));
        assert!(consumer.prepare_sleep(&ring.view()), "nothing pending: may sleep");
        producer.publish(&ring.view(), &notice(1));
        assert!(producer.sleeper(&ring.view()), "the sleeper is seen");
        consumer.woke(&ring.view());
        assert!(!producer.sleeper(&ring.view()));
        assert!(!consumer.prepare_sleep(&ring.view()), "a slot is pending");
        assert!(!producer.sleeper(&ring.view()), "the mark is cleared when it may not sleep");
    }
}
