//! The notice ring: where a peer that reaches this side's memory directly (UCX maps the
//! segment, `ucp_rkey_ptr`) announces its writes with immediate, instead of an active message.
//! The backend core's single-producer single-consumer ring ([`rdma_hint_backend_core::ring`]) in memory
//! this side allocated with `ucp_mem_map` and exposed (its packed rkey in the hello); a slot
//! holds a notice: imm and region in its first word, the length in its second. The writer
//! copies its bytes into the peer's mapping, then publishes a slot; the receiver takes slots
//! off in the thread that waits for arrivals, with no UCX call in between. A receiver that is
//! about to sleep on its worker's event fd marks the ring, and a writer that sees the mark
//! sends a short active message to wake it.
//!
//! The ring is memory the peer writes at any time: besides the ring's own numbering, every
//! notice is checked against the regions this side exposed, so a bad ring is a protocol
//! error, never an arrival for memory the peer may not write. The fuzz target `ucx_ring`
//! drives [`take`] with arbitrary ring contents.
//!
//! ```
//! use rdma_hint_core::{Arrival, RegionId};
//! use rdma_hint_ucx::ring::{publish, take, Consumer, OwnedRing, Producer};
//!
//! let ring = OwnedRing::default();
//! let notice = Arrival { imm: 7, region: RegionId(0), len: 4096 };
//! let mut producer = Producer::default();
//! assert!(producer.room(&ring.view(), 1).unwrap() >= 1);
//! publish(&mut producer, &ring.view(), &notice);
//!
//! let mut taken = [Arrival::EMPTY; 4];
//! let exposed = |id: u32, len: u64| id == 0 && len <= 4096;
//! let count = take(&mut Consumer::default(), &ring.view(), &exposed, &mut taken);
//! assert_eq!(count, Ok(1));
//! assert_eq!(taken[0], notice);
//! ```

pub use rdma_hint_backend_core::ring::{
    awake, nothing_after, Consumer, OwnedRing, Producer, RingView, PAYLOAD_WORDS, RING_BYTES, RING_SLOTS,
    SEQUENCE_WORD, SLOT_WORDS,
};
use rdma_hint_backend_core::ring::{Slot, SLEEPING_AT, SLOTS_AT, TAIL_AT, WAKE_AT};
use rdma_hint_core::{Arrival, RegionId};
use std::sync::atomic::{AtomicU32, AtomicU64};

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

/// Publishes `notice` in the next slot; [`Producer::room`] said there is one.
pub fn publish(producer: &mut Producer, ring: &RingView<'_>, notice: &Arrival) {
    producer.publish(ring, &[u64::from(notice.imm) | (u64::from(notice.region.0) << 32), notice.len]);
}

/// Takes notices into `out` (at most a ring's worth), in order, each checked with `exposed`
/// (whether this side exposed a region of that id that large: the region must be one, the
/// length at most the region's); returns how many. A wrongly numbered slot or a notice for
/// memory the peer may not write is an `Err` whose text starts with `protocol error`, and
/// leaves that slot untaken.
pub fn take(
    consumer: &mut Consumer,
    ring: &RingView<'_>,
    exposed: &dyn Fn(u32, u64) -> bool,
    out: &mut [Arrival],
) -> Result<usize, String> {
    let mut count = 0;
    let admit = |[first, len]: [u64; 2]| {
        let notice = Arrival { imm: first as u32, region: RegionId((first >> 32) as u32), len };
        if exposed(notice.region.0, len) {
            Ok(notice)
        } else {
            Err(format!(
                "protocol error: a notice of {len} B for region {} that this side did not expose that large",
                notice.region.0
            ))
        }
    };
    consumer.take(ring, out.len(), admit, |notice| {
        out[count] = notice;
        count += 1;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGIONS: [(u32, u64); 2] = [(0, 1 << 20), (5, 4096)];

    fn exposed(id: u32, len: u64) -> bool {
        REGIONS.iter().any(|&(exposed, region_len)| exposed == id && len <= region_len)
    }

    #[test]
    fn every_field_of_a_notice_comes_through() {
        let ring = OwnedRing::default();
        let sent = Arrival { imm: u32::MAX, region: RegionId(5), len: 4096 };
        publish(&mut Producer::default(), &ring.view(), &sent);
        let mut out = [Arrival::EMPTY; 2];
        assert_eq!(take(&mut Consumer::default(), &ring.view(), &exposed, &mut out), Ok(1));
        assert_eq!(out[0], sent);
    }

    #[test]
    fn a_notice_for_memory_the_peer_may_not_write_is_a_protocol_error_and_not_taken() {
        let first = |region: u32| u64::from(region) << 32;
        for (word0, len) in [(first(1), 8), (first(5), 4097), (first(0), (1 << 20) + 1), (first(u32::MAX), 0)]
        {
            let ring = OwnedRing::default();
            let mut words = [0u64; SLOT_WORDS];
            (words[0], words[1], words[SEQUENCE_WORD]) = (word0, len, 1);
            ring.set_slot(0, words);
            let mut consumer = Consumer::default();
            let mut out = [Arrival::EMPTY; 4];
            let refused = take(&mut consumer, &ring.view(), &exposed, &mut out).unwrap_err();
            assert!(refused.starts_with("protocol error"), "{refused}");
            assert_eq!(consumer.taken(), 0, "a refused notice is not taken");
        }
    }
}
