//! Arbitrary frame sequences into the staged receiver's protocol rules (`Inbox`): every write
//! it admits lies inside an exposed region, is non-empty and within the message limit, and
//! every acknowledgement it admits is for the oldest signalled write still waiting, every read
//! request lies inside an exposed region (TCP only) and every read answer is for the oldest read
//! still waiting, of its length; a ring
//! slot's words are admitted (`Inbox::admit_slot`) exactly when their decoded frame is a placed
//! write asking no ack, as the same write; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_hint_staged::protocol::{Awaited, Inbound, Inbox};
use rdma_hint_staged::wire::{ChannelKind, Frame, HEADER_BYTES, HEADER_WORDS};

const EXPOSED: [(u32, u64); 3] = [(0, 4096), (3, 1 << 20), (7, 1)];
const MAX_MSG: u64 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&control, frames)) = data.split_first() else { return };
    let channel = if control & 1 == 0 { ChannelKind::Tcp } else { ChannelKind::Shm };
    let inbox = Inbox::new(channel, &EXPOSED, MAX_MSG);
    let mut awaiting = std::collections::VecDeque::new();
    let mut reading = std::collections::VecDeque::new();
    let mut next_tag = 0u64;
    for (index, chunk) in frames.chunks_exact(HEADER_BYTES).enumerate() {
        // The control byte's other bits say before which frames this side "sent" a signalled
        // write (tagged 0, 1, 2...).
        if control >> (1 + index % 7) & 1 == 1 {
            awaiting.push_back(next_tag);
            next_tag += 1;
        }
        // And before which this side asked for a read (tagged likewise, 64 B, then 4 KiB...).
        if control >> (1 + (index + 3) % 7) & 1 == 1 {
            reading.push_back((next_tag, 64 << (reading.len() % 4 * 3)));
            next_tag += 1;
        }
        let mut header = [0u8; HEADER_BYTES];
        header.copy_from_slice(chunk);
        let words: [u64; HEADER_WORDS] = std::array::from_fn(|at| {
            u64::from_le_bytes(header[at * 8..at * 8 + 8].try_into().expect("8 bytes"))
        });
        let slot = inbox.admit_slot(words).ok();
        let placed = Frame::decode(&header).ok().and_then(|frame| match inbox.admit(&frame, Awaited::default()) {
            Ok(write @ Inbound::Write { payload_follows: false, ack: None, .. }) => Some(write),
            _ => None,
        });
        assert_eq!(slot, placed, "a slot's words and its decoded frame disagree");
        let Ok(frame) = Frame::decode(&header) else { continue };
        let awaited = Awaited { ack: awaiting.front().copied(), read: reading.front().copied() };
        match inbox.admit(&frame, awaited) {
            Ok(Inbound::Write { region, offset, len, payload_follows, .. }) => {
                let (_, region_len) =
                    EXPOSED.iter().find(|(id, _)| *id == region).expect("an exposed region");
                assert!(
                    len > 0
                        && len <= MAX_MSG
                        && offset.checked_add(len).is_some_and(|end| end <= *region_len)
                );
                assert_eq!(payload_follows, channel == ChannelKind::Tcp);
            }
            Ok(Inbound::Ack { wr_id, .. }) => {
                assert_eq!(channel, ChannelKind::Tcp);
                assert_eq!(awaiting.pop_front(), Some(wr_id), "an ack for a write that is not next");
            }
            Ok(Inbound::ReadRequest { region, offset, len, .. }) => {
                assert_eq!(channel, ChannelKind::Tcp);
                let (_, region_len) =
                    EXPOSED.iter().find(|(id, _)| *id == region).expect("an exposed region");
                assert!(
                    len > 0
                        && len <= MAX_MSG
                        && offset.checked_add(len).is_some_and(|end| end <= *region_len)
                );
            }
            Ok(Inbound::ReadData { wr_id, len }) => {
                assert_eq!(channel, ChannelKind::Tcp);
                assert_eq!(reading.pop_front(), Some((wr_id, len)), "an answer to a read that is not next");
            }
            Err(reason) => assert!(reason.starts_with("protocol error"), "{reason}"),
        }
    }
});
