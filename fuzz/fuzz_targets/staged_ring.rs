//! Arbitrary contents of the staged shm ring (the peer writes it at any time: its consumer
//! count and every slot, sequence words included) into the receiver's `ring::take` and
//! the writer's `Producer::room`: every announcement taken is a placed write inside an exposed
//! region, non-empty and within the message limit, never more than the ring holds; never a
//! panic.
#![no_main]

#[path = "common/words.rs"]
mod words;

use libfuzzer_sys::fuzz_target;
use rdma_hint_staged::protocol::{Inbound, Inbox};
use rdma_hint_staged::ring::{take, Consumer, OwnedRing, Producer, RING_SLOTS, SEQUENCE_WORD, SLOT_WORDS};
use rdma_hint_staged::wire::ChannelKind;
use words::{sequence, word};

const EXPOSED: [(u32, u64); 3] = [(0, 4096), (3, 1 << 20), (7, 1)];
const MAX_MSG: u64 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let (tail, max, slots) = (word(&data[..8]), data[8] as usize, &data[9..]);
    let ring = OwnedRing::default();
    ring.set_tail(tail);
    for (index, chunk) in slots.chunks(SLOT_WORDS * 8).enumerate() {
        let mut words = [0u64; SLOT_WORDS];
        for (slot_word, bytes) in words.iter_mut().zip(chunk.chunks(8)) {
            *slot_word = word(bytes);
        }
        words[SEQUENCE_WORD] = sequence(words[SEQUENCE_WORD], index as u64 + 1);
        ring.set_slot(index as u64, words);
    }
    // More than the ring holds: the writer must read the consumer's count the input set.
    let _ = Producer::default().room(&ring.view(), u64::MAX);
    let inbox = Inbox::new(ChannelKind::Shm, &EXPOSED, MAX_MSG);
    let mut taken = 0usize;
    let result = take(&mut Consumer::default(), &ring.view(), &inbox, max, |write| {
        let Inbound::Write { region, offset, len, payload_follows, ack, .. } = write else {
            panic!("an acknowledgement taken off the ring");
        };
        let (_, region_len) = EXPOSED.iter().find(|(id, _)| *id == region).expect("an exposed region");
        assert!(len > 0 && len <= MAX_MSG && offset.checked_add(len).is_some_and(|end| end <= *region_len));
        assert!(!payload_follows && ack.is_none());
        taken += 1;
        Ok(())
    });
    match result {
        Ok(count) => assert!(count == taken && count <= max && count as u64 <= RING_SLOTS),
        Err(reason) => assert!(reason.starts_with("protocol error"), "{reason}"),
    }
});
