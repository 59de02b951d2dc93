//! Arbitrary contents of the UCX notice ring (the peer writes it at any time: its consumer
//! count and every slot, sequence words included) into the receiver's `ring::take` and
//! the writer's `Producer::room`: every notice taken names an exposed region and a length
//! within it, never more than the ring holds or `out` takes; never a panic.
#![no_main]

#[path = "common/words.rs"]
mod words;

use libfuzzer_sys::fuzz_target;
use rdma_hint_core::Arrival;
use rdma_hint_ucx::ring::{
    publish, take, Consumer, OwnedRing, Producer, RING_SLOTS, SEQUENCE_WORD, SLOT_WORDS,
};
use words::{sequence, word};

const EXPOSED: [(u32, u64); 3] = [(0, 4096), (3, 1 << 20), (7, 1)];

fn exposed(id: u32, len: u64) -> bool {
    EXPOSED.iter().any(|&(exposed, region_len)| exposed == id && len <= region_len)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    // The high bit of the count byte: start a lap in, past a ring's worth taken, so the "lap
    // before" numbers are live ones.
    let (tail, max, laps, slots) =
        (word(&data[..8]), (data[8] & 0x7f) as usize, u64::from(data[8] >> 7), &data[9..]);
    let ring = OwnedRing::default();
    let (mut producer, mut consumer) = (Producer::default(), Consumer::default());
    if laps > 0 {
        let mut lap = vec![Arrival::EMPTY; RING_SLOTS as usize];
        for imm in 0..RING_SLOTS as u32 {
            publish(
                &mut producer,
                &ring.view(),
                &Arrival { imm, region: rdma_hint_core::RegionId(0), len: 1 },
            );
        }
        assert_eq!(take(&mut consumer, &ring.view(), &exposed, &mut lap), Ok(RING_SLOTS as usize));
    }
    ring.set_tail(tail);
    for (index, chunk) in slots.chunks(SLOT_WORDS * 8).enumerate() {
        let mut words = [0u64; SLOT_WORDS];
        for (slot_word, bytes) in words.iter_mut().zip(chunk.chunks(8)) {
            *slot_word = word(bytes);
        }
        words[SEQUENCE_WORD] = sequence(words[SEQUENCE_WORD], laps * RING_SLOTS + index as u64 + 1);
        ring.set_slot(index as u64, words);
    }
    // More than the ring holds, then one: the writer must read the consumer's count the input
    // set.
    let _ = producer.room(&ring.view(), u64::MAX);
    let _ = producer.room(&ring.view(), 1);
    let mut out = vec![Arrival::EMPTY; max];
    match take(&mut consumer, &ring.view(), &exposed, &mut out) {
        Ok(count) => {
            assert!(count <= max && count as u64 <= RING_SLOTS);
            for notice in &out[..count] {
                let (_, region_len) =
                    EXPOSED.iter().find(|(id, _)| *id == notice.region.0).expect("an exposed region");
                assert!(notice.len <= *region_len);
            }
        }
        Err(reason) => assert!(reason.starts_with("protocol error"), "{reason}"),
    }
});
