//! The shm channel's announcements: the backend core's single-producer single-consumer ring
//! ([`rdma_hint_backend_core::ring`]) of frame headers in a sealed memfd that the receiving side
//! owns and hands its peer with its regions. The
//! writer copies straight into the peer's mapping and publishes one slot per write the peer
//! must hear of (an immediate, a bounce to copy on); the receiver takes slots off the ring in
//! the thread that waits for arrivals (`BusyPoll`: no thread hop, no system call per block),
//! or in its link's ring thread, which sleeps on a futex in the ring (`Adaptive`).
//!
//! The ring is memory the peer writes at any time. Every slot's sequence number is checked
//! against the one the reader expects next (or the lap before's), every slot is decoded and
//! then admitted by the same [`Inbox`] rules as a TCP frame, so a bad ring is a protocol error,
//! never an access outside a region; the fuzz target `staged_ring` drives [`take`] and
//! [`Producer::room`] with arbitrary ring contents.
//!
//! ```
//! use rdma_hint_staged::protocol::{Inbound, Inbox};
//! use rdma_hint_staged::ring::{publish, take, Consumer, OwnedRing, Producer};
//! use rdma_hint_staged::wire::{ChannelKind, Frame, FrameKind, FLAG_IMM, FLAG_PLACED};
//!
//! let ring = OwnedRing::default();
//! let write = Frame { kind: FrameKind::Write, flags: FLAG_PLACED | FLAG_IMM, status: 0,
//!                     region: 0, offset: 0, len: 4096, wr_id: 0, imm: 7 };
//! assert!(publish(&mut Producer::default(), &ring.view(), &write).unwrap());
//!
//! let inbox = Inbox::new(ChannelKind::Shm, &[(0, 4096)], 1 << 20);
//! let mut taken = Vec::new();
//! let count = take(&mut Consumer::default(), &ring.view(), &inbox, 16, |write| {
//!     taken.push(write);
//!     Ok(())
//! });
//! assert_eq!(count, Ok(1));
//! assert!(matches!(taken[0], Inbound::Write { arrival: Some(7), len: 4096, .. }));
//! ```

use crate::protocol::{Inbound, Inbox};
use crate::wire::{Frame, HEADER_WORDS};
pub use rdma_hint_backend_core::ring::{
    awake, nothing_after, Consumer, OwnedRing, Producer, RingView, PAYLOAD_WORDS, RING_BYTES, RING_SLOTS,
    SEQUENCE_WORD, SLOT_WORDS,
};
use rdma_hint_backend_core::ring::{Slot, SLEEPING_AT, SLOTS_AT, TAIL_AT, WAKE_AT};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

const _: () = assert!(HEADER_WORDS <= PAYLOAD_WORDS, "a header and its sequence word fit a slot");

/// The view of a ring at `base`.
///
/// # Safety
/// `base` must be 64-byte aligned and point to [`RING_BYTES`] bytes that stay mapped, and are
/// accessed only atomically, for `'a`.
pub(crate) unsafe fn view_at<'a>(base: *const u8) -> RingView<'a> {
    // SAFETY: every field lies inside the RING_BYTES the caller vouches for, at an offset
    // aligned for its type (the base is 64-byte aligned); atomics may be shared with another
    // process's mapping of the same pages, which is what they are for here.
    unsafe {
        RingView::new(
            &*base.add(TAIL_AT).cast::<AtomicU64>(),
            &*base.add(SLEEPING_AT).cast::<AtomicU32>(),
            &*base.add(WAKE_AT).cast::<AtomicU32>(),
            std::slice::from_raw_parts(base.add(SLOTS_AT).cast::<Slot>(), RING_SLOTS as usize),
        )
    }
}

/// Publishes `frame`'s header in the next slot unless the ring is full (`Ok(false)`, nothing
/// written); a broken ring is a protocol error. After a batch of these,
/// [`Producer::sleeper`] says whether to [`wake`] the consumer.
#[inline]
pub fn publish(producer: &mut Producer, ring: &RingView<'_>, frame: &Frame) -> Result<bool, String> {
    if producer.room(ring, 1)? == 0 {
        return Ok(false);
    }
    producer.publish(ring, &frame.to_words());
    Ok(true)
}

/// Takes up to `max` announcements (at most a ring's worth), each admitted by `inbox` and then
/// handed to `each`, in order; returns how many. A wrongly numbered, undecodable or refused
/// slot is an `Err` whose text starts with `protocol error`; an `Err` from `each` is passed on.
#[inline]
pub fn take(
    consumer: &mut Consumer,
    ring: &RingView<'_>,
    inbox: &Inbox,
    max: usize,
    each: impl FnMut(Inbound) -> Result<(), String>,
) -> Result<usize, String> {
    consumer.take(ring, max, |words: [u64; HEADER_WORDS]| inbox.admit_slot(words), each)
}

/// Marks the ring thread about to sleep and returns the futex value to sleep on, or `None`
/// when a slot arrived meanwhile (then it must not sleep), or the peer broke the ring (taking
/// reports it).
pub fn prepare_sleep(consumer: &Consumer, ring: &RingView<'_>) -> Option<u32> {
    let seen = ring.wake_word().load(Ordering::Acquire);
    consumer.prepare_sleep(ring).then_some(seen)
}

/// Sleeps on the ring's futex while it still holds `seen` (from [`prepare_sleep`]), `at_most`
/// long (a wake that never comes from a broken peer costs one timeout), then clears the
/// sleeping mark.
pub fn sleep(ring: &RingView<'_>, seen: u32, at_most: Duration) {
    let timeout = libc::timespec {
        tv_sec: at_most.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(at_most.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT (shared, not private: the word is in a mapping another process
    // shares) reads the aligned u32 behind the ring's wake word, which lives for the call, and
    // `timeout` is a valid timespec; the kernel returns at a wake, a changed value, a signal
    // or the timeout, each harmless here.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            ring.wake_word().as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &timeout as *const libc::timespec,
        );
    }
    awake(ring);
}

/// Wakes the ring thread sleeping on `ring` (after [`Producer::sleeper`], or to stop it).
pub fn wake(ring: &RingView<'_>) {
    ring.wake_word().fetch_add(1, Ordering::Release);
    // SAFETY: FUTEX_WAKE on the aligned u32 behind the ring's wake word, alive for the call; it
    // wakes at most one waiter and touches no memory.
    unsafe {
        libc::syscall(libc::SYS_futex, ring.wake_word().as_ptr(), libc::FUTEX_WAKE, 1);
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
        take(consumer, &ring.view(), &inbox(), usize::MAX, |write| match write {
            Inbound::Write { arrival, .. } => {
                imms.push(arrival.unwrap_or(u32::MAX));
                Ok(())
            }
            Inbound::Ack { .. }
            | Inbound::ReadRequest { .. }
            | Inbound::ReadData { .. }
            | Inbound::Control { .. } => {
                unreachable!("refused by take")
            }
        })?;
        Ok(imms)
    }

    #[test]
    fn slots_the_inbox_refuses_are_a_protocol_error() {
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
    fn a_full_ring_publishes_nothing_and_its_announcements_come_off_in_order() {
        let ring = OwnedRing::default();
        let mut producer = Producer::default();
        for imm in 0..RING_SLOTS as u32 {
            assert!(publish(&mut producer, &ring.view(), &placed(0, 8, imm)).unwrap());
        }
        assert!(!publish(&mut producer, &ring.view(), &placed(0, 8, u32::MAX)).unwrap(), "full");
        let taken = take_all(&mut Consumer::default(), &ring).unwrap();
        assert_eq!(taken, (0..RING_SLOTS as u32).collect::<Vec<_>>());
    }

    #[test]
    fn a_sleeper_is_seen_by_the_producer_and_a_pending_slot_keeps_it_awake() {
        let ring = OwnedRing::default();
        let (mut producer, consumer) = (Producer::default(), Consumer::default());
        let seen = prepare_sleep(&consumer, &ring.view()).expect("nothing pending: may sleep");
        assert!(publish(&mut producer, &ring.view(), &placed(0, 8, 1)).unwrap());
        assert!(producer.sleeper(&ring.view()), "the sleeper is seen");
        wake(&ring.view());
        // The value moved on: a sleep on the old one returns at once.
        let started = std::time::Instant::now();
        sleep(&ring.view(), seen, Duration::from_secs(5));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(prepare_sleep(&consumer, &ring.view()), None, "a slot is pending");
    }
}
