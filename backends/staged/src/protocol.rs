//! What an incoming frame may ask of this side, decided without touching memory or sockets:
//! the link's reader thread applies only what [`Inbox::admit`] allowed, and the fuzz target
//! `staged_frames` drives it with arbitrary frame sequences.

use crate::wire::{
    ChannelKind, Frame, FrameKind, FLAG_ACKS, FLAG_IMM, FLAG_PLACED, FLAG_SIGNALLED, HEADER_WORDS,
    MAX_REGIONS,
};
use std::sync::atomic::{AtomicU64, Ordering};

/// One admitted frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// Place a write of `len` bytes at `offset` in the exposed region `region` (whose
    /// payload follows on the socket when `payload_follows`), then deliver `arrival` (an
    /// immediate) and acknowledge `ack` (a writer's tag) if present.
    Write {
        /// Target region id.
        region: u32,
        /// Offset in it.
        offset: u64,
        /// Bytes.
        len: u64,
        /// TCP: the bytes follow the header; shm: already placed.
        payload_follows: bool,
        /// Immediate to deliver.
        arrival: Option<u32>,
        /// Writer's tag to acknowledge.
        ack: Option<u64>,
        /// TCP: acks the write carries, for as many of our oldest signalled writes.
        acked: u16,
    },
    /// A signalled write of ours landed.
    Ack {
        /// Our tag.
        wr_id: u64,
        /// 0 for success.
        status: u16,
    },
    /// TCP: send `len` bytes at `offset` of the exposed region `region` back as the answer
    /// to the peer's read `wr_id`.
    ReadRequest {
        /// Source region id (this side's).
        region: u32,
        /// Offset in it.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The peer's tag.
        wr_id: u64,
    },
    /// TCP: the bytes of our oldest read still waiting follow: place them where it asked.
    ReadData {
        /// Our tag.
        wr_id: u64,
        /// Bytes that follow.
        len: u64,
    },
    /// TCP: one control frame of `len` bytes follows (a region exposed or withdrawn, or an
    /// answer), for the link's control channel to check.
    Control {
        /// Bytes that follow.
        len: u64,
    },
}

/// What this side is waiting for from its peer when a frame comes in: the tag of the oldest
/// signalled write of ours still waiting for its acknowledgement, and the tag and length of
/// the oldest read of ours still waiting for its bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Awaited {
    /// The next acknowledgement's tag.
    pub ack: Option<u64>,
    /// Acknowledgements awaited in all (a write may carry up to this many).
    pub acks: usize,
    /// The next read answer's tag and length.
    pub read: Option<(u64, u64)>,
}

/// The receiving side's rules: the channel, the regions the peer may write (length by id, as
/// exposed and withdrawn while the link runs) and the largest message. An acknowledgement must
/// name the oldest signalled write of ours still waiting for one (TCP keeps frames in order), so
/// a peer can neither complete a write twice nor complete one it has not placed yet.
#[derive(Debug)]
pub struct Inbox {
    channel: ChannelKind,
    /// Each id's exposed length, 0 when not exposed: read without a lock on the ring's path.
    exposed: Box<[AtomicU64]>,
    max_msg_bytes: u64,
}

impl Inbox {
    /// Rules for `channel` with `exposed` regions as `(id, len)` (ids past [`MAX_REGIONS`],
    /// which no table hands out, are never exposed).
    pub fn new(channel: ChannelKind, exposed: &[(u32, u64)], max_msg_bytes: u64) -> Inbox {
        let inbox =
            Inbox { channel, exposed: (0..MAX_REGIONS).map(|_| AtomicU64::new(0)).collect(), max_msg_bytes };
        for (id, len) in exposed {
            inbox.expose(*id, *len);
        }
        inbox
    }

    /// Region `id` of `len` bytes may be written and read by the peer from now on.
    pub fn expose(&self, id: u32, len: u64) {
        if let Some(slot) = self.exposed.get(id as usize) {
            slot.store(len, Ordering::Release);
        }
    }

    /// Region `id` is withdrawn: a frame that names it from now on is a protocol error.
    pub fn withdraw(&self, id: u32) {
        if let Some(slot) = self.exposed.get(id as usize) {
            slot.store(0, Ordering::Release);
        }
    }

    /// Admits `frame`, given what this side is waiting for ([`Awaited`]); anything else is a
    /// protocol error whose text starts with `protocol error`.
    pub fn admit(&self, frame: &Frame, awaited: Awaited) -> Result<Inbound, String> {
        match frame.kind {
            FrameKind::Write => self.write(frame, awaited),
            FrameKind::ReadRequest => self.read_request(frame),
            FrameKind::ReadData => match awaited.read {
                Some((wr_id, len))
                    if self.channel == ChannelKind::Tcp && (frame.wr_id, frame.len) == (wr_id, len) =>
                {
                    Ok(Inbound::ReadData { wr_id, len })
                }
                Some((wr_id, len)) if self.channel == ChannelKind::Tcp => Err(format!(
                    "protocol error: {} B answering read {} where read {wr_id} of {len} B is next",
                    frame.len, frame.wr_id
                )),
                _ => Err("protocol error: an answer to a read that was never asked".into()),
            },
            FrameKind::Ack => match awaited.ack {
                Some(wr_id) if self.channel == ChannelKind::Tcp && frame.wr_id == wr_id => {
                    Ok(Inbound::Ack { wr_id, status: frame.status })
                }
                Some(wr_id) if self.channel == ChannelKind::Tcp => Err(format!(
                    "protocol error: acknowledgement for write {} where write {wr_id} is next",
                    frame.wr_id
                )),
                _ => Err("protocol error: acknowledgement for a write that was never sent".into()),
            },
            FrameKind::Control if self.channel == ChannelKind::Tcp => Ok(Inbound::Control { len: frame.len }),
            FrameKind::Control => {
                Err("protocol error: a control frame on the shm channel's ring (they travel on its socket)"
                    .into())
            }
        }
    }

    /// Admits a shm ring slot's header words: the placed write [`Inbox::admit`] admits for
    /// their frame when it asks for no acknowledgement (the one thing a slot may hold), or
    /// the protocol error that says why not.
    ///
    /// The common slot is checked on the words themselves (the ring's hot path); anything
    /// else takes the full decode, which gives the verdict and its reason.
    pub fn admit_slot(&self, words: [u64; HEADER_WORDS]) -> Result<Inbound, String> {
        match self.common_slot(words) {
            Some(write) => Ok(write),
            None => self.admit_slot_decoded(words),
        }
    }

    /// The common slot, a placed write asking no ack, checked on its words: `None` for
    /// anything else, which the full decode judges.
    fn common_slot(&self, words: [u64; HEADER_WORDS]) -> Option<Inbound> {
        let [first, offset, len, _, last] = words;
        let flags = (first >> 8) as u8;
        let region = (first >> 32) as u32;
        let shaped = self.channel == ChannelKind::Shm
            && first as u8 == FrameKind::Write as u8
            && flags & !(FLAG_PLACED | FLAG_IMM) == 0
            && flags & FLAG_PLACED != 0
            && (first >> 16) as u16 == 0
            && last >> 32 == 0;
        let fits = self.region_len(region).is_some_and(|region_len| self.fits(region_len, offset, len));
        (shaped && fits).then(|| Inbound::Write {
            region,
            offset,
            len,
            payload_follows: false,
            arrival: (flags & FLAG_IMM != 0).then_some(last as u32),
            ack: None,
            acked: 0,
        })
    }

    /// The length of exposed region `region`; `None` when it is not exposed.
    fn region_len(&self, region: u32) -> Option<u64> {
        let len = self.exposed.get(region as usize)?.load(Ordering::Acquire);
        (len > 0).then_some(len)
    }

    /// Whether a write of `len` bytes at `offset` lies in a region of `region_len` bytes, is
    /// not empty and is no larger than a message may be.
    fn fits(&self, region_len: u64, offset: u64, len: u64) -> bool {
        len != 0 && len <= self.max_msg_bytes && offset.checked_add(len).is_some_and(|end| end <= region_len)
    }

    #[cold]
    fn admit_slot_decoded(&self, words: [u64; HEADER_WORDS]) -> Result<Inbound, String> {
        let frame = Frame::from_words(words).map_err(|e| format!("protocol error: a ring slot: {e}"))?;
        match self.admit(&frame, Awaited::default())? {
            write @ Inbound::Write { payload_follows: false, ack: None, acked: 0, .. } => Ok(write),
            other => Err(format!("protocol error: a ring slot asks for {other:?}")),
        }
    }

    /// A read request: TCP only, inside a region this side exposed, no larger than a message.
    fn read_request(&self, frame: &Frame) -> Result<Inbound, String> {
        if self.channel != ChannelKind::Tcp {
            return Err("protocol error: a read request on the shm channel (reads map the region)".into());
        }
        let Some(region_len) = self.region_len(frame.region) else {
            return Err(format!("protocol error: read from region {} which is not exposed", frame.region));
        };
        if !self.fits(region_len, frame.offset, frame.len) {
            return Err(format!(
                "protocol error: read {}+{} B outside region {} ({region_len} B)",
                frame.offset, frame.len, frame.region
            ));
        }
        Ok(Inbound::ReadRequest {
            region: frame.region,
            offset: frame.offset,
            len: frame.len,
            wr_id: frame.wr_id,
        })
    }

    fn write(&self, frame: &Frame, awaited: Awaited) -> Result<Inbound, String> {
        let Some(region_len) = self.region_len(frame.region) else {
            return Err(format!("protocol error: write to region {} which is not exposed", frame.region));
        };
        if !self.fits(region_len, frame.offset, frame.len) {
            return Err(format!(
                "protocol error: write {}+{} B outside region {} ({region_len} B)",
                frame.offset, frame.len, frame.region
            ));
        }
        let payload_follows = match (self.channel, frame.flags & FLAG_PLACED != 0) {
            (ChannelKind::Tcp, false) => true,
            (ChannelKind::Shm, true) => false,
            _ => return Err("protocol error: write framing does not match the channel".into()),
        };
        let acked = frame.acks_carried();
        if frame.flags & FLAG_ACKS != 0
            && (self.channel != ChannelKind::Tcp || usize::from(acked) > awaited.acks)
        {
            return Err(format!(
                "protocol error: a write carries {acked} acks where {} of our writes wait for one",
                awaited.acks
            ));
        }
        Ok(Inbound::Write {
            region: frame.region,
            offset: frame.offset,
            len: frame.len,
            payload_follows,
            arrival: (frame.flags & FLAG_IMM != 0).then_some(frame.imm),
            ack: (frame.flags & FLAG_SIGNALLED != 0).then_some(frame.wr_id),
            acked,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(region: u32, offset: u64, len: u64, flags: u8) -> Frame {
        Frame { kind: FrameKind::Write, flags, status: 0, region, offset, len, wr_id: 7, imm: 9 }
    }

    #[test]
    fn only_writes_inside_exposed_regions_and_owed_acks_pass() {
        let inbox = Inbox::new(ChannelKind::Tcp, &[(0, 4096), (2, 8192)], 1 << 20);
        let none = Awaited::default();
        assert!(inbox.admit(&write(0, 0, 4096, FLAG_IMM), none).is_ok());
        assert!(inbox.admit(&write(2, 4096, 4096, 0), none).is_ok());
        for bad in [write(1, 0, 1, 0), write(0, 4095, 2, 0), write(0, u64::MAX, 2, 0), write(0, 0, 0, 0)] {
            assert!(inbox.admit(&bad, none).unwrap_err().starts_with("protocol error"), "{bad:?}");
        }
        assert!(inbox.admit(&write(0, 0, 16, FLAG_PLACED), none).is_err(), "shm framing on tcp");
        let ack = Frame::ack(0, 3);
        let awaiting = |wr_id| Awaited { ack: Some(wr_id), acks: 1, read: None };
        assert!(inbox.admit(&ack, none).is_err(), "never asked for");
        assert!(inbox.admit(&ack, awaiting(3)).is_ok());
        assert!(inbox.admit(&ack, awaiting(4)).is_err(), "not the write that is next");
    }

    fn read(kind: FrameKind, region: u32, offset: u64, len: u64, wr_id: u64) -> Frame {
        Frame { kind, flags: 0, status: 0, region, offset, len, wr_id, imm: 0 }
    }

    /// A write may carry acks for as many of our signalled writes as wait for one, on TCP
    /// only: a peer can neither complete a write it never got nor one twice.
    #[test]
    fn a_write_carries_no_more_acks_than_our_writes_await() {
        let inbox = Inbox::new(ChannelKind::Tcp, &[(0, 4096)], 1 << 20);
        let waiting = |acks| Awaited { ack: (acks > 0).then_some(7), acks, read: None };
        let carrying = write(0, 0, 64, FLAG_IMM).carrying(2);
        assert!(matches!(inbox.admit(&carrying, waiting(2)), Ok(Inbound::Write { acked: 2, .. })));
        assert!(matches!(inbox.admit(&carrying, waiting(5)), Ok(Inbound::Write { acked: 2, .. })));
        for acks in [0, 1] {
            let refused = inbox.admit(&carrying, waiting(acks)).unwrap_err();
            assert!(refused.starts_with("protocol error"), "{refused}");
        }
        assert!(matches!(inbox.admit(&write(0, 0, 64, 0), waiting(2)), Ok(Inbound::Write { acked: 0, .. })));
        let shm = Inbox::new(ChannelKind::Shm, &[(0, 4096)], 1 << 20);
        assert!(
            shm.admit(&write(0, 0, 64, FLAG_PLACED).carrying(1), waiting(1)).is_err(),
            "shm completes locally"
        );
    }

    /// A peer reads only what this side exposed, and answers only the read that is next, at
    /// its length: it can neither read past a region nor place bytes nobody asked for.
    #[test]
    fn reads_ask_only_for_exposed_bytes_and_answers_match_the_oldest_read() {
        let inbox = Inbox::new(ChannelKind::Tcp, &[(0, 4096), (2, 8192)], 1 << 20);
        let none = Awaited::default();
        let asked = read(FrameKind::ReadRequest, 2, 4096, 4096, 7);
        assert_eq!(
            inbox.admit(&asked, none),
            Ok(Inbound::ReadRequest { region: 2, offset: 4096, len: 4096, wr_id: 7 })
        );
        for (region, offset, len) in
            [(1, 0, 1), (0, 4095, 2), (0, u64::MAX, 2), (0, 0, 0), (2, 0, (1 << 20) + 1)]
        {
            let bad = read(FrameKind::ReadRequest, region, offset, len, 7);
            assert!(inbox.admit(&bad, none).unwrap_err().starts_with("protocol error"), "{bad:?}");
        }
        let shm = Inbox::new(ChannelKind::Shm, &[(0, 4096)], 1 << 20);
        assert!(shm.admit(&read(FrameKind::ReadRequest, 0, 0, 64, 1), none).is_err(), "reads map over shm");
        let answer = read(FrameKind::ReadData, 0, 0, 4096, 9);
        let reading = |wr_id, len| Awaited { ack: None, acks: 0, read: Some((wr_id, len)) };
        assert!(inbox.admit(&answer, none).is_err(), "never asked for");
        assert_eq!(inbox.admit(&answer, reading(9, 4096)), Ok(Inbound::ReadData { wr_id: 9, len: 4096 }));
        assert!(inbox.admit(&answer, reading(8, 4096)).is_err(), "not the read that is next");
        assert!(inbox.admit(&answer, reading(9, 64)).is_err(), "more bytes than were asked for");
    }

    /// Control frames travel on TCP's socket only (never on the shm ring), and a region exposed
    /// after connect is admitted until its withdrawal, then refused like one never exposed.
    #[test]
    fn control_frames_are_tcps_and_a_withdrawn_region_is_refused() {
        let none = Awaited::default();
        let tcp = Inbox::new(ChannelKind::Tcp, &[(0, 4096)], 1 << 20);
        assert_eq!(tcp.admit(&Frame::control(64), none), Ok(Inbound::Control { len: 64 }));
        let shm = Inbox::new(ChannelKind::Shm, &[(0, 4096)], 1 << 20);
        assert!(shm.admit(&Frame::control(64), none).unwrap_err().starts_with("protocol error"));
        assert!(shm.admit_slot(Frame::control(64).to_words()).unwrap_err().starts_with("protocol error"));

        assert!(tcp.admit(&write(5, 0, 1, 0), none).is_err(), "not exposed yet");
        tcp.expose(5, 8192);
        assert!(tcp.admit(&write(5, 4096, 4096, 0), none).is_ok());
        assert!(tcp.admit(&read(FrameKind::ReadRequest, 5, 0, 8192, 1), none).is_ok());
        assert!(tcp.admit(&write(5, 4096, 4097, 0), none).is_err(), "past the exposed length");
        tcp.withdraw(5);
        assert!(tcp.admit(&write(5, 0, 1, 0), none).unwrap_err().starts_with("protocol error"));
        assert!(tcp.admit(&read(FrameKind::ReadRequest, 5, 0, 1, 1), none).is_err());
        assert!(tcp.admit(&write(0, 0, 4096, 0), none).is_ok(), "the connect's region stays");
        tcp.expose(u32::MAX, 1);
        assert!(tcp.admit(&write(u32::MAX, 0, 1, 0), none).is_err(), "an id no table hands out");
    }

    #[test]
    fn a_ring_slot_checked_on_its_words_gets_the_full_decodes_verdict() {
        // Near misses of the common slot in every field, and noise: the words' check must
        // admit exactly what the decode admits, as the same write.
        let inbox = Inbox::new(ChannelKind::Shm, &[(0, 4096), (2, 1 << 20)], 1 << 16);
        let tcp = Inbox::new(ChannelKind::Tcp, &[(0, 4096)], 1 << 16);
        let mut cases = Vec::new();
        for region in [0, 1, 2, 3, u32::MAX] {
            for (offset, len) in
                [(0, 8), (4088, 8), (4089, 8), (0, 0), (0, 1 << 16), (0, (1 << 16) + 1), (u64::MAX, 2)]
            {
                for flags in
                    [FLAG_PLACED, FLAG_PLACED | FLAG_IMM, FLAG_IMM, 0, FLAG_PLACED | FLAG_SIGNALLED, 0x80]
                {
                    let mut words = write(region, offset, len, flags).to_words();
                    cases.push(words);
                    words[0] |= 3 << 16; // a status
                    cases.push(words);
                    words[4] |= 1 << 40; // reserved bytes
                    cases.push(words);
                    words[0] = (words[0] & !0xff) | 2; // an ack's kind
                    cases.push(words);
                }
            }
        }
        // Random slots around the common one: small regions, offsets and lengths, any flags.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..10_000 {
            let (a, b) = (next(), next());
            let frame = write((a % 4) as u32, (a >> 8) % 8192, (a >> 24) % 8192, (a >> 40) as u8 & 0x0f);
            let mut words = frame.to_words();
            words[4] |= u64::from(b % 4 == 0) * (b & 0xffff_ffff_0000_0000);
            words[0] |= (u64::from(b % 3 == 0) * ((b >> 8) & 0xffff)) << 16;
            cases.push(words);
        }
        let mut checked_on_words = 0;
        for words in cases {
            for rules in [&inbox, &tcp] {
                let full = rules.admit_slot_decoded(words);
                if let Some(write) = rules.common_slot(words) {
                    assert_eq!(Ok(write), full, "{words:x?}");
                    checked_on_words += 1;
                }
                assert_eq!(rules.admit_slot(words), full, "{words:x?}");
            }
        }
        assert!(checked_on_words > 100, "the cases reach the words' check ({checked_on_words} times)");
    }
}
