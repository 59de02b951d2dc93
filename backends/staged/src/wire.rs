//! The staged backend's part of the one hello, and its data frames, with strict decoding.
//!
//! The hello is the shared one ([`rdma_hint_oob::Hello`], after the mutual authentication of
//! `rdma_hint_oob::authenticate`: no hello reaches a peer that has not proven the token). Its
//! connection blob: channel u8 · on the shm channel only, the hand-off socket: name length u8
//! and abstract socket name (empty from the dialling side) and a 32-byte one-time cookie (see
//! `handoff`). Each region's descriptor carries no address and no key; flag bit 0 says notify
//! every write (see [`ExposedRegion::notify_each_write`]). The regions' memfds then cross the
//! hand-off socket in hello order.
//!
//! Frames (fixed 40-byte header, then `len` payload bytes for `Write`, `ReadData` and `Control`
//! on the TCP channel): kind u8 · flags u8 · status u16 · region u32 · offset u64 · len u64 ·
//! wr_id u64 · imm u32 · reserved u32 (zero). A `Control` frame carries one frame of the shared
//! control protocol (`rdma_hint_oob::Control`: a region exposed or withdrawn after connect, an
//! answer); on the shm channel those travel alone on the socket, and a region's memfd crosses the
//! hand-off socket before its `Expose` (matched by the file's inode, the descriptor's key).

use crate::handoff::{is_handoff_name, COOKIE_BYTES};
use bytes::BufMut;
use rdma_hint_core::TransportError;
use rdma_hint_oob::{
    handshake_error as handshake, put_prefixed_u8, Backend, HelloLimits, RegionDescriptor, WireReader,
    MAX_CONTROL_BODY,
};
use std::io::Read;

/// Regions one side may expose (the transport-wide limit).
pub use rdma_hint_backend_core::MAX_REGIONS;
/// Size of a frame header in bytes.
pub const HEADER_BYTES: usize = 40;
/// A frame header's 64-bit words.
pub const HEADER_WORDS: usize = HEADER_BYTES / 8;
/// Region flag: the writer notifies every write (see [`ExposedRegion::notify_each_write`]).
pub const REGION_NOTIFY_EACH_WRITE: u8 = 1;
/// What a region exposed after connect may carry: the flag, and on the shm channel its memfd's
/// inode (8 bytes) as the key.
pub const CONTROL_LIMITS: HelloLimits =
    HelloLimits { max_connection_bytes: 0, max_key_bytes: 8, known_flags: REGION_NOTIFY_EACH_WRITE };
/// The largest `Control` frame's body: one control frame, header included.
pub const MAX_CONTROL_FRAME: u64 = 3 + MAX_CONTROL_BODY as u64;
/// Longest hand-off socket name accepted, in bytes.
const MAX_HANDOFF_NAME_BYTES: usize = 64;
/// What a staged hello may carry: the channel and a hand-off socket, no region keys.
const LIMITS: HelloLimits = HelloLimits {
    max_connection_bytes: 1 + 1 + MAX_HANDOFF_NAME_BYTES + COOKIE_BYTES,
    max_key_bytes: 0,
    known_flags: REGION_NOTIFY_EACH_WRITE,
};

/// How payloads travel after the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    /// Payload bytes follow each `Write` frame on the socket.
    Tcp = 0,
    /// Payload is copied into the peer's mapped shm region; frames only notify.
    Shm = 1,
}

/// A region one side exposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposedRegion {
    /// Region id on the exposing side.
    pub id: u32,
    /// Length in bytes.
    pub len: u64,
    /// shm channel: the mapping the peer gets is a bounce buffer in front of caller memory,
    /// so the writer sends a placed-frame for every write, and this side copies the bytes on.
    pub notify_each_write: bool,
}

/// Where the accepting side of a shm connection hands its regions over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    /// Abstract Unix socket name (`rdma-hint-…`).
    pub socket: String,
    /// What the dialling side presents on that socket.
    pub cookie: [u8; COOKIE_BYTES],
}

/// One side's handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Channel the side speaks.
    pub channel: ChannelKind,
    /// Regions the peer may write.
    pub regions: Vec<ExposedRegion>,
    /// The shm hand-off socket, from the accepting side on the shm channel.
    pub handoff: Option<Handoff>,
}

impl Hello {
    /// Encodes the hello.
    pub fn encode(&self) -> Vec<u8> {
        let mut connection = Vec::with_capacity(LIMITS.max_connection_bytes);
        connection.put_u8(self.channel as u8);
        if self.channel == ChannelKind::Shm {
            match &self.handoff {
                Some(handoff) => {
                    put_prefixed_u8(&mut connection, handoff.socket.as_bytes());
                    connection.put_slice(&handoff.cookie);
                }
                None => {
                    put_prefixed_u8(&mut connection, &[]);
                    connection.put_bytes(0, COOKIE_BYTES);
                }
            }
        }
        let regions = (self.regions.iter())
            .map(|region| RegionDescriptor {
                id: region.id,
                len: region.len,
                address: 0,
                flags: if region.notify_each_write { REGION_NOTIFY_EACH_WRITE } else { 0 },
                key: Vec::new(),
            })
            .collect();
        rdma_hint_oob::Hello { backend: Backend::Staged, connection, regions }.encode()
    }

    /// Reads and validates a hello: the shared checks, then the channel and the hand-off
    /// socket, every byte of the blob accounted for.
    pub fn decode(reader: &mut impl Read) -> Result<Hello, TransportError> {
        let hello = rdma_hint_oob::Hello::decode(reader, Backend::Staged, &LIMITS)?;
        let mut blob = &hello.connection[..];
        let (channel, handoff) = connection(&mut blob).map_err(|error| match error {
            TransportError::PeerGone(_) => handshake("the connection blob ends early"),
            other => other,
        })?;
        if !blob.is_empty() {
            return Err(handshake(format!("{} B after the connection blob's fields", blob.len())));
        }
        let regions = (hello.regions.into_iter())
            .map(|region| match region.address {
                0 => Ok(ExposedRegion {
                    id: region.id,
                    len: region.len,
                    notify_each_write: region.flags & REGION_NOTIFY_EACH_WRITE != 0,
                }),
                _ => {
                    Err(handshake(format!("region {} names an address; staged regions have none", region.id)))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Hello { channel, regions, handoff })
    }
}

/// The connection blob's channel and, on shm, its hand-off socket.
fn connection(blob: &mut &[u8]) -> Result<(ChannelKind, Option<Handoff>), TransportError> {
    let mut reader = WireReader::new(blob);
    let channel = match reader.u8()? {
        0 => ChannelKind::Tcp,
        1 => ChannelKind::Shm,
        other => return Err(handshake(format!("unknown channel kind {other}"))),
    };
    if channel == ChannelKind::Tcp {
        return Ok((channel, None));
    }
    let socket = reader.bytes_u8(MAX_HANDOFF_NAME_BYTES, "hand-off socket name")?;
    let mut cookie = [0u8; COOKIE_BYTES];
    reader.exact(&mut cookie)?;
    if socket.is_empty() {
        if cookie != [0; COOKIE_BYTES] {
            return Err(handshake("a cookie without a hand-off socket"));
        }
        return Ok((channel, None));
    }
    let socket = String::from_utf8(socket).map_err(|_| handshake("hand-off socket name is not UTF-8"))?;
    if !is_handoff_name(&socket) {
        return Err(handshake(format!("hand-off socket {socket:?} is not an rdma-hint socket")));
    }
    Ok((channel, Some(Handoff { socket, cookie })))
}

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A write; on TCP its payload follows.
    Write = 1,
    /// A signalled write landed: completes `wr_id` on the writer.
    Ack = 2,
    /// TCP: the peer asks for `len` bytes at `offset` of region `region`, which this side
    /// exposed; `wr_id` is the peer's tag, echoed in the [`FrameKind::ReadData`] that answers.
    ReadRequest = 3,
    /// TCP: the bytes a read request asked for, `len` of them after the header, for the
    /// reader's read `wr_id` (answers come in the order the requests went).
    ReadData = 4,
    /// TCP: one control frame of `len` bytes (at most [`MAX_CONTROL_FRAME`]) follows; every
    /// other field is zero.
    Control = 5,
}

/// Flag: the writer wants an `Ack`.
pub const FLAG_SIGNALLED: u8 = 1;
/// Flag: `imm` is valid and must be delivered as an arrival.
pub const FLAG_IMM: u8 = 2;
/// Flag (shm channel): the payload is already in the mapped region; no bytes follow.
pub const FLAG_PLACED: u8 = 4;
/// Flag (TCP write): `status` is a count of acks carried, each completing the receiver's
/// oldest signalled write still waiting for one (each landed): the acks of a peer that answers
/// a write with a write ride in the answer instead of a frame and a system call each.
pub const FLAG_ACKS: u8 = 8;
const KNOWN_FLAGS: u8 = FLAG_SIGNALLED | FLAG_IMM | FLAG_PLACED | FLAG_ACKS;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Kind.
    pub kind: FrameKind,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Completion status for `Ack` (0 = success); for a write with [`FLAG_ACKS`], the acks it
    /// carries (at least one); 0 in every other frame.
    pub status: u16,
    /// Target region id (on the receiver).
    pub region: u32,
    /// Offset in the target region.
    pub offset: u64,
    /// Payload length.
    pub len: u64,
    /// Writer's tag.
    pub wr_id: u64,
    /// Immediate value (with `FLAG_IMM`).
    pub imm: u32,
}

impl Frame {
    /// The acknowledgement of write `wr_id` into `region` (status 0: it landed).
    ///
    /// ```
    /// use rdma_hint_staged::wire::{Frame, FrameKind};
    /// let ack = Frame::ack(0, 77);
    /// assert_eq!((ack.kind, ack.wr_id, ack.len), (FrameKind::Ack, 77, 0));
    /// assert_eq!(Frame::decode(&ack.encode()).unwrap(), ack);
    /// ```
    pub fn ack(region: u32, wr_id: u64) -> Frame {
        Frame { kind: FrameKind::Ack, flags: 0, status: 0, region, offset: 0, len: 0, wr_id, imm: 0 }
    }

    /// The header of a control frame of `len` bytes.
    pub fn control(len: u64) -> Frame {
        Frame { kind: FrameKind::Control, flags: 0, status: 0, region: 0, offset: 0, len, wr_id: 0, imm: 0 }
    }

    /// This write carrying `acks` acks (none: unchanged).
    pub fn carrying(self, acks: u16) -> Frame {
        match acks {
            0 => self,
            acks => Frame { flags: self.flags | FLAG_ACKS, status: acks, ..self },
        }
    }

    /// The acks a write carries (0 for every other frame).
    pub fn acks_carried(&self) -> u16 {
        if self.kind == FrameKind::Write && self.flags & FLAG_ACKS != 0 {
            self.status
        } else {
            0
        }
    }

    /// Encodes into a fixed header.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        for (chunk, word) in out.chunks_exact_mut(8).zip(self.to_words()) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The header as the little-endian words of its bytes: kind u8 · flags u8 · status u16 ·
    /// region u32 | offset u64 | len u64 | wr_id u64 | imm u32 · reserved u32 (0). The shm ring
    /// stores these words as they are: no byte array between a frame and a slot.
    pub fn to_words(&self) -> [u64; HEADER_WORDS] {
        [
            u64::from(self.kind as u8)
                | u64::from(self.flags) << 8
                | u64::from(self.status) << 16
                | u64::from(self.region) << 32,
            self.offset,
            self.len,
            self.wr_id,
            u64::from(self.imm),
        ]
    }

    /// Decodes a header, rejecting unknown kinds, unknown flags and non-zero reserved bytes.
    /// Range checks against regions happen where the regions are known.
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> Result<Frame, TransportError> {
        let mut words = [0u64; HEADER_WORDS];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *word = u64::from_le_bytes(chunk.try_into().expect("8-byte chunks"));
        }
        Frame::from_words(words)
    }

    /// [`Frame::decode`] of the header's words (see [`Frame::to_words`]).
    pub fn from_words(words: [u64; HEADER_WORDS]) -> Result<Frame, TransportError> {
        let [first, offset, len, wr_id, last] = words;
        let kind = match first as u8 {
            1 => FrameKind::Write,
            2 => FrameKind::Ack,
            3 => FrameKind::ReadRequest,
            4 => FrameKind::ReadData,
            5 => FrameKind::Control,
            other => return Err(handshake(format!("unknown frame kind {other}"))),
        };
        let flags = (first >> 8) as u8;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(handshake(format!("unknown frame flags {flags:#04x}")));
        }
        if last >> 32 != 0 {
            return Err(handshake("reserved frame bytes are not zero"));
        }
        let frame = Frame {
            kind,
            flags,
            status: (first >> 16) as u16,
            region: (first >> 32) as u32,
            offset,
            len,
            wr_id,
            imm: last as u32,
        };
        if kind == FrameKind::Ack && (flags != 0 || frame.len != 0) {
            return Err(handshake("an ack carries no flags and no payload"));
        }
        if kind == FrameKind::Write && (flags & FLAG_ACKS != 0) != (frame.status != 0) {
            return Err(handshake("a write's status counts the acks it carries, and only with their flag"));
        }
        if matches!(kind, FrameKind::ReadRequest | FrameKind::ReadData) && (flags != 0 || frame.status != 0) {
            return Err(handshake("a read's frames carry no flags and no status"));
        }
        if kind == FrameKind::Control
            && (frame != Frame::control(len) || !(1..=MAX_CONTROL_FRAME).contains(&len))
        {
            return Err(handshake(format!(
                "a control frame carries 1 to {MAX_CONTROL_FRAME} B and nothing else in its header"
            )));
        }
        Ok(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(channel: ChannelKind) -> Hello {
        Hello {
            channel,
            regions: vec![
                ExposedRegion { id: 0, len: 4096, notify_each_write: false },
                ExposedRegion { id: 3, len: 1 << 30, notify_each_write: true },
            ],
            handoff: (channel == ChannelKind::Shm)
                .then(|| Handoff { socket: "rdma-hint-0123abcd".into(), cookie: [7; COOKIE_BYTES] }),
        }
    }

    #[test]
    fn hello_round_trips() {
        for channel in [ChannelKind::Tcp, ChannelKind::Shm] {
            let bytes = hello(channel).encode();
            assert_eq!(Hello::decode(&mut bytes.as_slice()).unwrap(), hello(channel));
        }
    }

    /// Where the fields of an encoded hello sit: after the preamble (10 B), the backend (1 B)
    /// and the blob's length (2 B) comes the blob, then the region count, then descriptors of
    /// 23 B each (id, len, address, flags, an empty key's length).
    fn blob_at() -> usize {
        8 + 2 + 1 + 2
    }

    fn count_at(hello: &Hello) -> usize {
        let blob = match hello.channel {
            ChannelKind::Tcp => 1,
            ChannelKind::Shm => 1 + 1 + hello.handoff.as_ref().map_or(0, |h| h.socket.len()) + COOKIE_BYTES,
        };
        blob_at() + blob
    }

    /// A peer setting region flags this version does not define is refused, not ignored: the
    /// bits could mean a placement this side would not do.
    #[test]
    fn unknown_region_flags_are_rejected() {
        let hello = hello(ChannelKind::Tcp);
        let mut bytes = hello.encode();
        let first_flags = count_at(&hello) + 2 + 4 + 8 + 8;
        assert_eq!(bytes[first_flags], 0);
        bytes[first_flags] = 0x80;
        let error = Hello::decode(&mut bytes.as_slice()).unwrap_err();
        assert!(error.to_string().contains("unknown flags"), "{error}");
    }

    #[test]
    fn malformed_hellos_are_rejected() {
        let shm = hello(ChannelKind::Shm);
        let good = shm.encode();
        let count = count_at(&shm);
        let mut cases: Vec<(Vec<u8>, &str)> = Vec::new();
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        cases.push((bad_magic, "magic"));
        let mut bad_version = good.clone();
        bad_version[8] = 11; // the version before this one
        cases.push((bad_version, "version"));
        let mut bad_channel = good.clone();
        bad_channel[blob_at()] = 7;
        cases.push((bad_channel, "channel"));
        let mut too_many = good.clone();
        too_many[count..count + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        cases.push((too_many, "count"));
        let mut zero_len = good.clone();
        zero_len[count + 2 + 4..count + 2 + 12].copy_from_slice(&0u64.to_le_bytes());
        cases.push((zero_len, "zero length"));
        let mut with_address = good.clone();
        with_address[count + 2 + 12] = 1;
        cases.push((with_address, "an address"));
        let mut evil_name = good.clone();
        let at = blob_at() + 2;
        evil_name[at..at + 3].copy_from_slice(b"../");
        cases.push((evil_name, "socket name"));
        cases.push((good[..good.len() - 1].to_vec(), "truncated"));
        cases.push((Vec::new(), "empty"));
        let mut duplicate = hello(ChannelKind::Tcp);
        duplicate.regions[1].id = 0;
        cases.push((duplicate.encode(), "duplicate"));
        let tcp = hello(ChannelKind::Tcp);
        let mut long_blob = tcp.encode();
        long_blob[blob_at() - 2..blob_at()].copy_from_slice(&2u16.to_le_bytes());
        long_blob.insert(blob_at() + 1, 0);
        cases.push((long_blob, "a byte after the blob's fields"));
        for (case, what) in &cases {
            assert!(Hello::decode(&mut case.as_slice()).is_err(), "{what} accepted");
        }
    }

    /// Every truncated hello, on either channel, is a typed error (the peer went away mid-hello),
    /// never a panic.
    #[test]
    fn every_truncated_hello_is_a_typed_error() {
        for channel in [ChannelKind::Tcp, ChannelKind::Shm] {
            let good = hello(channel).encode();
            for cut in 0..good.len() {
                match Hello::decode(&mut &good[..cut]) {
                    Err(TransportError::PeerGone(_)) => {}
                    other => panic!("{channel:?} hello truncated at {cut}: {other:?}"),
                }
            }
        }
    }

    /// The decoder reads exactly one hello: the frames behind it on the socket stay there.
    #[test]
    fn decoding_reads_no_further_than_the_hello() {
        let good = hello(ChannelKind::Shm).encode();
        let both = [good, vec![0xAB; HEADER_BYTES]].concat();
        let mut rest = &both[..];
        Hello::decode(&mut rest).unwrap();
        assert_eq!(rest, &[0xAB; HEADER_BYTES][..]);
    }

    /// The frame header's byte layout, field by field (what older peers read).
    #[test]
    fn frame_layout_is_fixed() {
        let frame = Frame {
            kind: FrameKind::Write,
            flags: FLAG_SIGNALLED | FLAG_PLACED | FLAG_ACKS,
            status: 0x0102,
            region: 0x0304_0506,
            offset: 0x0708_090a_0b0c_0d0e,
            len: 0x1011_1213_1415_1617,
            wr_id: 0x2021_2223_2425_2627,
            imm: 0x3031_3233,
        };
        let mut expected = vec![1, FLAG_SIGNALLED | FLAG_PLACED | FLAG_ACKS];
        expected.extend_from_slice(&frame.status.to_le_bytes());
        expected.extend_from_slice(&frame.region.to_le_bytes());
        expected.extend_from_slice(&frame.offset.to_le_bytes());
        expected.extend_from_slice(&frame.len.to_le_bytes());
        expected.extend_from_slice(&frame.wr_id.to_le_bytes());
        expected.extend_from_slice(&frame.imm.to_le_bytes());
        expected.extend_from_slice(&[0; 4]);
        assert_eq!(frame.encode().to_vec(), expected);
        assert_eq!(Frame::decode(&frame.encode()).unwrap(), frame);
        // `Frame::decode` takes exactly `HEADER_BYTES` by type: a short header cannot reach it.
    }

    #[test]
    fn frames_round_trip_and_reject_garbage() {
        let frame = Frame {
            kind: FrameKind::Write,
            flags: FLAG_SIGNALLED | FLAG_IMM,
            status: 0,
            region: 3,
            offset: 4096,
            len: 65536,
            wr_id: 1 << 33 | 7,
            imm: 42,
        };
        assert_eq!(Frame::decode(&frame.encode()).unwrap(), frame);
        let mut bytes = frame.encode();
        bytes[0] = 9;
        assert!(Frame::decode(&bytes).is_err());
        let mut bytes = frame.encode();
        bytes[1] = 0x80;
        assert!(Frame::decode(&bytes).is_err());
        let mut bytes = frame.encode();
        bytes[39] = 1;
        assert!(Frame::decode(&bytes).is_err());
        let ack = Frame { kind: FrameKind::Ack, flags: FLAG_IMM, ..frame };
        assert!(Frame::decode(&ack.encode()).is_err());
    }

    /// A write's status is the count of acks it carries, present exactly when its flag is:
    /// a status without the flag (or the flag without acks) is garbage, not an ack.
    #[test]
    fn a_write_carries_acks_only_under_their_flag() {
        let write = Frame {
            kind: FrameKind::Write,
            flags: FLAG_IMM,
            status: 0,
            region: 1,
            offset: 0,
            len: 8,
            wr_id: 3,
            imm: 4,
        };
        assert_eq!(write.carrying(0), write);
        let carrying = write.carrying(3);
        assert_eq!((carrying.flags, carrying.status, carrying.acks_carried()), (FLAG_IMM | FLAG_ACKS, 3, 3));
        assert_eq!(Frame::decode(&carrying.encode()).unwrap(), carrying);
        assert_eq!(write.acks_carried(), 0);
        for bad in [Frame { status: 2, ..write }, Frame { flags: FLAG_IMM | FLAG_ACKS, ..write }] {
            assert!(Frame::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        let ack = Frame::ack(1, 3);
        assert!(
            Frame::decode(&Frame { flags: FLAG_ACKS, status: 1, ..ack }.encode()).is_err(),
            "only writes carry acks"
        );
    }

    /// A control frame's header holds its length, bounded before anything is read for it, and
    /// nothing else.
    #[test]
    fn a_control_frame_carries_a_bounded_body_and_nothing_else() {
        for len in [1, 64, MAX_CONTROL_FRAME] {
            let frame = Frame::control(len);
            assert_eq!(Frame::decode(&frame.encode()).unwrap(), frame);
        }
        let control = Frame::control(8);
        for bad in [
            Frame::control(0),
            Frame::control(MAX_CONTROL_FRAME + 1),
            Frame::control(u64::MAX),
            Frame { region: 1, ..control },
            Frame { offset: 1, ..control },
            Frame { flags: FLAG_IMM, ..control },
            Frame { status: 1, ..control },
            Frame { wr_id: 3, ..control },
            Frame { imm: 3, ..control },
        ] {
            assert!(Frame::decode(&bad.encode()).is_err(), "{bad:?}");
        }
    }
}
