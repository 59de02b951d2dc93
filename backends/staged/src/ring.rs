//! The shm channel's announcements: a single-producer single-consumer ring of frame headers
//! in a sealed memfd that the receiving side owns and hands its peer with its regions. The
//! writer copies straight into the peer's mapping and publishes one slot per write the peer
//! must hear of (an immediate, a bounce to copy on); the receiver takes slots off the ring in
//! the thread that waits for arrivals (`BusyPoll`: no thread hop, no system call per block),
//! or in its link's ring thread, which sleeps on a futex in the ring (`Adaptive`).
//!
//! The ring is memory the peer writes at any time. Every index it holds is checked against
//! the ring's size, every slot is decoded and then admitted by the same [`Inbox`] rules as a
//! TCP frame, so a bad ring is a protocol error, never an access outside a region; the fuzz
//! target `staged_ring` drives [`Consumer::take`] with arbitrary ring contents.
//!
//! ```
//! use rdma_hint_staged::protocol::{Inbound, Inbox};
//! use rdma_hint_staged::ring::{Consumer, OwnedRing, Producer};
//! use rdma_hint_staged::wire::{ChannelKind, Frame, FrameKind, FLAG_IMM, FLAG_PLACED};
//!
//! let ring = OwnedRing::default();
//! let write = Frame { kind: FrameKind::Write, flags: FLAG_PLACED | FLAG_IMM, status: 0,
//!                     region: 0, offset: 0, len: 4096, wr_id: 0, imm: 7 };
//! assert!(Producer::default().publish(&ring.view(), &write).unwrap().published);
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
use crate::wire::{Frame, HEADER_BYTES};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Announcements the ring holds before a writer must wait for its reader.
pub const RING_SLOTS: u64 = 4096;
/// 64-bit words per slot: one frame header.
pub const SLOT_WORDS: usize = HEADER_BYTES / 8;
/// Byte offsets of the header fields, each on a cache line of its own: the producer's and
/// the consumer's counters do not share one.
const HEAD_AT: usize = 0;
const TAIL_AT: usize = 64;
const SLEEPING_AT: usize = 128;
const WAKE_AT: usize = 132;
const SLOTS_AT: usize = 192;
/// The ring's memfd size: header and slots, rounded up to whole pages.
pub const RING_BYTES: u64 = ((SLOTS_AT + RING_SLOTS as usize * HEADER_BYTES) as u64).div_ceil(4096) * 4096;

/// The ring's shared words, wherever they live (a peer's mapping, or [`OwnedRing`] in tests).
#[derive(Debug, Clone, Copy)]
pub struct RingView<'a> {
    /// Slots published, ever: written by the producer only.
    head: &'a AtomicU64,
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
                head: &*base.add(HEAD_AT).cast::<AtomicU64>(),
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

    /// Whether slots wait to be taken (a peer's wild head counts: taking reports it).
    pub fn has_pending(&self) -> bool {
        self.head.load(Ordering::Acquire) != self.tail.load(Ordering::Relaxed)
    }

    fn slot(&self, index: u64) -> &'a [AtomicU64] {
        let at = (index % RING_SLOTS) as usize * SLOT_WORDS;
        &self.slots[at..at + SLOT_WORDS]
    }
}

/// A ring in this process's heap, for tests, doc examples and the fuzz target.
#[derive(Debug)]
pub struct OwnedRing {
    head: AtomicU64,
    tail: AtomicU64,
    sleeping: AtomicU32,
    wake: AtomicU32,
    slots: Box<[AtomicU64]>,
}

impl Default for OwnedRing {
    fn default() -> Self {
        OwnedRing {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            sleeping: AtomicU32::new(0),
            wake: AtomicU32::new(0),
            slots: (0..RING_SLOTS as usize * SLOT_WORDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl OwnedRing {
    /// The ring's view.
    pub fn view(&self) -> RingView<'_> {
        RingView {
            head: &self.head,
            tail: &self.tail,
            sleeping: &self.sleeping,
            wake: &self.wake,
            slots: &self.slots,
        }
    }

    /// Sets the producer's published count, as a peer may (tests of a wild ring).
    pub fn set_head(&self, head: u64) {
        self.head.store(head, Ordering::Release);
    }

    /// Sets the consumer's taken count, as a peer may.
    pub fn set_tail(&self, tail: u64) {
        self.tail.store(tail, Ordering::Release);
    }

    /// Writes the raw words of slot `index` (modulo the ring), as a peer may.
    pub fn set_slot(&self, index: u64, words: [u64; SLOT_WORDS]) {
        for (word, value) in self.view().slot(index).iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
    }
}

/// What one [`Producer::publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The slot is on the ring; `false`: the ring is full, nothing was written.
    pub published: bool,
    /// The consumer's ring thread sleeps: call [`wake`] after the batch.
    pub wake: bool,
}

/// The writing side's state: its own count of published slots (the ring's copy is the
/// consumer's to read, never to trust back).
#[derive(Debug, Default)]
pub struct Producer {
    head: u64,
}

impl Producer {
    /// Free slots now; a consumer count ahead of ours, or more than the ring behind, is the
    /// peer breaking the protocol.
    pub fn room(&self, ring: &RingView<'_>) -> Result<u64, String> {
        let tail = ring.tail.load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > RING_SLOTS {
            return Err(format!(
                "protocol error: the peer's ring says {tail} announcements were taken of {} published",
                self.head
            ));
        }
        Ok(RING_SLOTS - used)
    }

    /// Publishes `frame` in the next slot unless the ring is full.
    pub fn publish(&mut self, ring: &RingView<'_>, frame: &Frame) -> Result<Published, String> {
        if self.room(ring)? == 0 {
            return Ok(Published { published: false, wake: false });
        }
        let bytes = frame.encode();
        for (word, chunk) in ring.slot(self.head).iter().zip(bytes.chunks_exact(8)) {
            word.store(u64::from_le_bytes(chunk.try_into().expect("8-byte chunks")), Ordering::Relaxed);
        }
        self.head = self.head.wrapping_add(1);
        ring.head.store(self.head, Ordering::Release);
        // Pairs with the fence in `Consumer::prepare_sleep`: either the sleeper sees the new
        // head, or this side sees it sleeping.
        fence(Ordering::SeqCst);
        Ok(Published { published: true, wake: ring.sleeping.load(Ordering::Relaxed) != 0 })
    }
}

/// The reading side's state: its own count of slots taken.
#[derive(Debug, Default)]
pub struct Consumer {
    tail: u64,
}

impl Consumer {
    /// Takes up to `max` announcements, each admitted by `inbox` and then handed to `each`, in
    /// order; returns how many. A wild head, an undecodable slot or one the rules refuse is an
    /// `Err` whose text starts with `protocol error`; an `Err` from `each` is passed on. Slots
    /// are released as they are taken, so the producer may reuse them at once.
    pub fn take(
        &mut self,
        ring: &RingView<'_>,
        inbox: &Inbox,
        max: usize,
        mut each: impl FnMut(Inbound) -> Result<(), String>,
    ) -> Result<usize, String> {
        let head = ring.head.load(Ordering::Acquire);
        let pending = head.wrapping_sub(self.tail);
        if pending > RING_SLOTS {
            return Err(format!(
                "protocol error: the peer's ring claims {pending} announcements where it holds {RING_SLOTS}"
            ));
        }
        let count = pending.min(max as u64);
        for _ in 0..count {
            let mut bytes = [0u8; HEADER_BYTES];
            for (chunk, word) in bytes.chunks_exact_mut(8).zip(ring.slot(self.tail)) {
                chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
            }
            let frame = Frame::decode(&bytes).map_err(|e| format!("protocol error: a ring slot: {e}"))?;
            let write = match inbox.admit(&frame, None)? {
                write @ Inbound::Write { payload_follows: false, ack: None, .. } => write,
                other => return Err(format!("protocol error: a ring slot asks for {other:?}")),
            };
            // Released before it is applied: the slot's bytes are copied out already.
            self.tail = self.tail.wrapping_add(1);
            ring.tail.store(self.tail, Ordering::Release);
            each(write)?;
        }
        Ok(count as usize)
    }

    /// Marks the ring thread about to sleep and returns the futex value to sleep on, or `None`
    /// when slots arrived meanwhile (then it must not sleep).
    pub fn prepare_sleep(&self, ring: &RingView<'_>) -> Option<u32> {
        let seen = ring.wake.load(Ordering::Acquire);
        ring.sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if ring.head.load(Ordering::Acquire) != self.tail {
            ring.sleeping.store(0, Ordering::Relaxed);
            return None;
        }
        Some(seen)
    }
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

/// Wakes the ring thread sleeping on `ring` (after [`Published::wake`], or to stop it).
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
    use crate::wire::{ChannelKind, FrameKind, FLAG_IMM, FLAG_PLACED, FLAG_SIGNALLED};

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
            for _ in 0..RING_SLOTS {
                assert!(producer.publish(&ring.view(), &placed(0, 8, next)).unwrap().published);
                next += 1;
            }
            assert!(
                !producer.publish(&ring.view(), &placed(0, 8, 0)).unwrap().published,
                "round {round}: full"
            );
            let taken = take_all(&mut consumer, &ring).unwrap();
            let first = round * RING_SLOTS as u32;
            assert_eq!(taken, (first..first + RING_SLOTS as u32).collect::<Vec<_>>());
        }
        assert_eq!(producer.room(&ring.view()), Ok(RING_SLOTS));
    }

    #[test]
    fn a_wild_ring_is_a_protocol_error_on_either_side() {
        let ring = OwnedRing::default();
        ring.set_head(RING_SLOTS + 1);
        assert!(take_all(&mut Consumer::default(), &ring).unwrap_err().starts_with("protocol error"));

        let ring = OwnedRing::default();
        ring.set_tail(5);
        assert!(Producer::default().room(&ring.view()).unwrap_err().starts_with("protocol error"));

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
            ring.set_slot(0, words);
            ring.set_head(1);
            let refused = take_all(&mut Consumer::default(), &ring).unwrap_err();
            assert!(refused.starts_with("protocol error"), "{refused}");
        }
    }

    #[test]
    fn a_sleeper_is_seen_by_the_producer_and_a_pending_slot_keeps_it_awake() {
        let ring = OwnedRing::default();
        let (mut producer, consumer) = (Producer::default(), Consumer::default());
        let seen = consumer.prepare_sleep(&ring.view()).expect("nothing pending: may sleep");
        assert!(producer.publish(&ring.view(), &placed(0, 8, 1)).unwrap().wake, "the sleeper is seen");
        wake(&ring.view());
        // The value moved on: a sleep on the old one returns at once.
        let started = std::time::Instant::now();
        sleep(&ring.view(), seen, Duration::from_secs(5));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(consumer.prepare_sleep(&ring.view()), None, "a slot is pending");
    }
}
