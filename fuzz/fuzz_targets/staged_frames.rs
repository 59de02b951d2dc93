//! Arbitrary frame sequences into the staged link's protocol session (`Session`, its rules in
//! `Inbox`), with this side's own signalled writes and reads interleaved: every write it takes
//! lies inside an exposed region, is non-empty and within the message limit, and owes an ack
//! exactly when signalled; every ack completes the oldest signalled write still waiting, once;
//! every read request lies inside an exposed region (TCP only); a control frame is TCP's only
//! and of a bounded length; every read answer hands back the
//! oldest read still waiting, of its length; a refused frame takes nothing off what waits; the
//! end flushes exactly what still waited. A ring slot's words are admitted
//! (`Inbox::admit_slot`) exactly when their decoded frame is a placed write asking no ack, as
//! the same write. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_hint_staged::protocol::{Awaited, Inbound, Inbox};
use rdma_hint_staged::session::{NotRecorded, Received, Session};
use rdma_hint_staged::wire::{ChannelKind, Frame, FrameKind, HEADER_BYTES, HEADER_WORDS, MAX_CONTROL_FRAME};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

const EXPOSED: [(u32, u64); 3] = [(0, 4096), (3, 1 << 20), (7, 1)];
const MAX_MSG: u64 = 1 << 16;
const WINDOW: usize = 8;

fn inside_exposed(region: u32, offset: u64, len: u64) -> bool {
    let (_, region_len) = EXPOSED.iter().find(|(id, _)| *id == region).expect("an exposed region");
    len > 0 && len <= MAX_MSG && offset.checked_add(len).is_some_and(|end| end <= *region_len)
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, frames)) = data.split_first() else { return };
    let channel = if control & 1 == 0 { ChannelKind::Tcp } else { ChannelKind::Shm };
    let inbox = Arc::new(Inbox::new(channel, &EXPOSED, MAX_MSG));
    let start = Instant::now();
    let mut session = Session::<(u64, u64)>::new(inbox.clone(), WINDOW, start);
    // What the session must be waiting for, kept here the plain way.
    let mut awaiting: VecDeque<u64> = VecDeque::new();
    let mut reading: VecDeque<(u64, u64)> = VecDeque::new();
    let mut next_tag = 0u64;
    for (index, chunk) in frames.chunks_exact(HEADER_BYTES).enumerate() {
        let now = start + Duration::from_millis(index as u64);
        // The control byte's other bits say before which frames this side sent a signalled
        // write (tagged 0, 1, 2...), while the window has room.
        if control >> (1 + index % 7) & 1 == 1 {
            match session.sent_writes([next_tag].into_iter(), now) {
                Ok(()) => awaiting.push_back(next_tag),
                Err(refused) => {
                    assert_eq!(refused, NotRecorded::Full { room: 0 });
                    assert_eq!(awaiting.len(), WINDOW);
                }
            }
            next_tag += 1;
        }
        // And before which it asked for a read (tagged likewise, 64 B, then 4 KiB...).
        if control >> (1 + (index + 3) % 7) & 1 == 1 && session.reserve_reads(1).is_ok() {
            let read = (next_tag, 64 << (reading.len() % 4 * 3));
            session.asked_read(read, now).expect("a live session records reads");
            reading.push_back(read);
            next_tag += 1;
        }
        assert_eq!(session.awaits_answers(), !(awaiting.is_empty() && reading.is_empty()));
        let mut header = [0u8; HEADER_BYTES];
        header.copy_from_slice(chunk);
        let words: [u64; HEADER_WORDS] = std::array::from_fn(|at| {
            u64::from_le_bytes(header[at * 8..at * 8 + 8].try_into().expect("8 bytes"))
        });
        let slot = inbox.admit_slot(words).ok();
        let placed =
            Frame::decode(&header).ok().and_then(|frame| match inbox.admit(&frame, Awaited::default()) {
                Ok(write @ Inbound::Write { payload_follows: false, ack: None, .. }) => Some(write),
                _ => None,
            });
        assert_eq!(slot, placed, "a slot's words and its decoded frame disagree");
        let Ok(frame) = Frame::decode(&header) else { continue };
        let checked = session.check(&frame);
        let received = session.receive(&frame, now);
        // The answers this side awaits next are taken, whatever came before them.
        let owed_answer = channel == ChannelKind::Tcp
            && match frame.kind {
                FrameKind::Ack => awaiting.front() == Some(&frame.wr_id),
                FrameKind::ReadData => reading.front() == Some(&(frame.wr_id, frame.len)),
                FrameKind::Write | FrameKind::ReadRequest | FrameKind::Control => false,
            };
        assert!(!owed_answer || received.is_ok(), "the awaited answer {frame:?} was refused");
        match received {
            Ok(Received::Write { region, offset, len, owed, acked }) => {
                assert!(inside_exposed(region, offset, len));
                assert!(
                    matches!(checked, Ok(Inbound::Write { payload_follows, .. }) if payload_follows == (channel == ChannelKind::Tcp))
                );
                assert_eq!(owed.ack.map(|ack| ack.wr_id), (frame.flags & 1 != 0).then_some(frame.wr_id));
                // Carried acks complete exactly the oldest writes awaited, once each.
                assert!(usize::from(acked) <= awaiting.len(), "{acked} acks carried for {} writes", awaiting.len());
                session.acknowledged(acked, |done| {
                    assert_eq!(awaiting.pop_front(), Some(done.wr_id), "a carried ack out of order");
                });
            }
            Ok(Received::Completed(done)) => {
                assert_eq!(channel, ChannelKind::Tcp);
                assert_eq!(awaiting.pop_front(), Some(done.wr_id), "an ack for a write that is not next");
            }
            Ok(Received::ReadRequest { region, offset, len, answer }) => {
                assert_eq!(channel, ChannelKind::Tcp);
                assert!(inside_exposed(region, offset, len));
                assert_eq!((answer.wr_id, answer.len), (frame.wr_id, len));
            }
            Ok(Received::ReadData(read)) => {
                assert_eq!(channel, ChannelKind::Tcp);
                assert_eq!(reading.pop_front(), Some(read), "an answer to a read that is not next");
            }
            Ok(Received::Control { len }) => {
                assert_eq!(channel, ChannelKind::Tcp, "a control frame on the shm ring");
                assert!((1..=MAX_CONTROL_FRAME).contains(&len), "a control frame of {len} B");
            }
            Err(reason) => assert!(reason.starts_with("protocol error"), "{reason}"),
        }
    }
    let ended = session.end();
    let flushed: Vec<u64> = ended.flushed.iter().map(|done| done.wr_id).collect();
    assert_eq!(flushed, Vec::from(awaiting), "the end flushes exactly the writes still waiting");
    assert_eq!(ended.reads, Vec::from(reading), "and hands back exactly the reads still waiting");
    assert!(session.sent_write(next_tag, start).is_err(), "nothing is recorded after the end");
});
