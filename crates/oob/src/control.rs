//! What travels on the out-of-band socket once a connection is up, for the backends whose data
//! does not use it: regions exposed and withdrawn after connect, their answers, and the
//! goodbye. Pure: a [`ControlReader`] is fed the bytes a socket delivered and gives back whole
//! messages, each checked before anything acts on it (the [`ControlChannel`](crate::ControlChannel)
//! does the socket's I/O).
//!
//! Frame: tag u8 · body length u16 LE (≤ [`MAX_CONTROL_BODY`]) · body. The goodbye stays the
//! one byte [`GOODBYE`] it always was (no length, no body).
//!
//! ```
//! use rdma_hint_oob::{Control, ControlReader, HelloLimits, RegionDescriptor};
//! let limits = HelloLimits { max_connection_bytes: 0, max_key_bytes: 8, known_flags: 0 };
//! let descriptor = RegionDescriptor { id: 4, len: 4096, address: 0x1000, flags: 0, key: vec![1, 2] };
//! let mut bytes = Vec::new();
//! Control::Expose { seq: 1, descriptor }.encode(&mut bytes);
//! Control::Goodbye.encode(&mut bytes);
//! let mut reader = ControlReader::new(limits);
//! let mut seen = Vec::new();
//! reader.feed(&bytes[..5], &mut |message| seen.push(message)).unwrap(); // half a frame
//! assert!(seen.is_empty());
//! reader.feed(&bytes[5..], &mut |message| seen.push(message)).unwrap();
//! assert!(matches!(seen[..], [Control::Expose { seq: 1, .. }, Control::Goodbye]));
//! assert!(reader.feed(&[9], &mut |_| ()).is_err()); // no such message
//! ```

use crate::codec::{handshake_error, put_prefixed_u16, truncated};
use crate::hello::{HelloLimits, RegionDescriptor, MAX_REGION_ID};
use crate::liveness::GOODBYE;
use bytes::{Buf, BufMut};
use rdma_hint_core::TransportError;

/// A control frame's body, at most: a sequence number and one descriptor with the largest key
/// any backend sends.
pub const MAX_CONTROL_BODY: usize = 6 * 1024;

/// A frame's tag and length.
const HEADER_BYTES: usize = 3;

const TAG_EXPOSE: u8 = 1;
const TAG_WITHDRAW: u8 = 2;
const TAG_DONE: u8 = 3;

/// Why a peer did not load or drop what it was asked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It already holds a region of that id from this side, or as many as it may; or (a
    /// withdrawal) it was asked to withdraw that region too often while it waits to.
    Taken = 1,
    /// Its medium cannot reach the region (a key it cannot unpack, a mapping refused).
    Unreachable = 2,
    /// It was never told of that region.
    Unknown = 3,
}

impl Refusal {
    fn from_code(code: u8) -> Result<Option<Refusal>, TransportError> {
        Ok(Some(match code {
            0 => return Ok(None),
            1 => Refusal::Taken,
            2 => Refusal::Unreachable,
            3 => Refusal::Unknown,
            other => return Err(handshake_error(format!("a Done frame gives unknown refusal {other}"))),
        }))
    }

    /// The error the asking side returns: the peer would not `doing` (expose, withdraw)
    /// `region`.
    pub fn error(self, doing: &str, region: u32) -> TransportError {
        handshake_error(format!("the peer refused to {doing} region {region}: {}", self.why()))
    }

    /// What a refusal means.
    pub fn why(self) -> &'static str {
        match self {
            Refusal::Taken => "the peer holds a region of that id from this side, or as many as it may, or was asked too often",
            Refusal::Unreachable => "the peer's medium cannot reach the region",
            Refusal::Unknown => "the peer was never told of that region",
        }
    }
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Load this region (the peer may then write and read it) and answer [`Control::Done`]
    /// with `seq`.
    Expose {
        /// The exposing side's number for the request.
        seq: u32,
        /// The region.
        descriptor: RegionDescriptor,
    },
    /// Post nothing more to region `id`, let what was posted to it finish, drop it, then
    /// answer [`Control::Done`] with `seq`.
    Withdraw {
        /// The withdrawing side's number for the request.
        seq: u32,
        /// The region's id on the withdrawing side.
        id: u32,
    },
    /// Request `seq` is done, or (`refused`) was refused.
    Done {
        /// The request answered.
        seq: u32,
        /// Why not, when not.
        refused: Option<Refusal>,
    },
    /// The peer closes on purpose.
    Goodbye,
}

impl Control {
    /// Appends the frame's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut body = Vec::new();
        let tag = match self {
            Control::Goodbye => {
                out.put_u8(GOODBYE);
                return;
            }
            Control::Expose { seq, descriptor } => {
                body.put_u32_le(*seq);
                descriptor.encode(&mut body);
                TAG_EXPOSE
            }
            Control::Withdraw { seq, id } => {
                body.put_u32_le(*seq);
                body.put_u32_le(*id);
                TAG_WITHDRAW
            }
            Control::Done { seq, refused } => {
                body.put_u32_le(*seq);
                body.put_u8(refused.map_or(0, |why| why as u8));
                TAG_DONE
            }
        };
        out.put_u8(tag);
        put_prefixed_u16(out, &body);
    }
}

/// Takes control frames out of the bytes a socket delivers, in pieces of any size. It keeps at
/// most one unfinished frame (under [`MAX_CONTROL_BODY`] + 3 bytes) between calls.
#[derive(Debug)]
pub struct ControlReader {
    limits: HelloLimits,
    pending: Vec<u8>,
}

impl ControlReader {
    /// A reader that checks descriptors within `limits` (the backend's, as for its hello).
    pub fn new(limits: HelloLimits) -> ControlReader {
        ControlReader { limits, pending: Vec::with_capacity(HEADER_BYTES + MAX_CONTROL_BODY) }
    }

    /// Takes `bytes` and hands every whole frame they finish to `deliver`, in order. A frame
    /// that breaks the rules is an error: the connection ends (nothing after it is read).
    pub fn feed(&mut self, bytes: &[u8], deliver: &mut dyn FnMut(Control)) -> Result<(), TransportError> {
        let mut rest = bytes;
        while !rest.is_empty() {
            // Only what completes the frame under way is buffered: never more than one frame.
            let want = self.wanted()?;
            let take = want.saturating_sub(self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.pending.len() == self.wanted()? {
                let message = self.decode()?;
                self.pending.clear();
                deliver(message);
            }
        }
        Ok(())
    }

    /// The bytes the frame under way takes in all, as far as its first bytes say (its header
    /// until the length is in).
    fn wanted(&self) -> Result<usize, TransportError> {
        match self.pending[..] {
            [] => Ok(1),
            [GOODBYE, ..] => Ok(1),
            [tag, ..] if !matches!(tag, TAG_EXPOSE | TAG_WITHDRAW | TAG_DONE) => {
                Err(handshake_error(format!("control frame of unknown kind {tag:#x}")))
            }
            [_] | [_, _] => Ok(HEADER_BYTES),
            [_, low, high, ..] => {
                let len = usize::from(u16::from_le_bytes([low, high]));
                if len > MAX_CONTROL_BODY {
                    return Err(handshake_error(format!(
                        "control frame of {len} B exceeds {MAX_CONTROL_BODY} B"
                    )));
                }
                Ok(HEADER_BYTES + len)
            }
        }
    }

    /// The whole frame in `pending` as a message.
    fn decode(&self) -> Result<Control, TransportError> {
        let tag = self.pending[0];
        if tag == GOODBYE {
            return Ok(Control::Goodbye);
        }
        let mut body = &self.pending[HEADER_BYTES..];
        let seq = body.try_get_u32_le().map_err(truncated)?;
        let message = match tag {
            TAG_EXPOSE => {
                let descriptor =
                    RegionDescriptor::decode(&mut body, &self.limits).map_err(|error| match error {
                        TransportError::PeerGone(_) => {
                            handshake_error("an Expose frame ends inside its descriptor")
                        }
                        other => other,
                    })?;
                Control::Expose { seq, descriptor }
            }
            TAG_WITHDRAW => {
                let id = body.try_get_u32_le().map_err(truncated)?;
                if id >= MAX_REGION_ID {
                    return Err(handshake_error(format!("a withdrawal of region {id}, out of range")));
                }
                Control::Withdraw { seq, id }
            }
            _ => Control::Done { seq, refused: Refusal::from_code(body.try_get_u8().map_err(truncated)?)? },
        };
        if body.has_remaining() {
            return Err(handshake_error(format!("{} B after a control frame's fields", body.remaining())));
        }
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HelloLimits = HelloLimits { max_connection_bytes: 0, max_key_bytes: 16, known_flags: 1 };

    fn messages() -> Vec<Control> {
        let descriptor =
            RegionDescriptor { id: 9, len: 1 << 20, address: 0x7f00_0000_0000, flags: 1, key: vec![3; 16] };
        vec![
            Control::Expose { seq: 1, descriptor },
            Control::Withdraw { seq: 2, id: 9 },
            Control::Done { seq: 7, refused: None },
            Control::Goodbye,
            Control::Done { seq: u32::MAX, refused: Some(Refusal::Unreachable) },
        ]
    }

    fn read_all(bytes: &[u8], piece: usize) -> Result<Vec<Control>, TransportError> {
        let mut reader = ControlReader::new(LIMITS);
        let mut seen = Vec::new();
        for chunk in bytes.chunks(piece) {
            reader.feed(chunk, &mut |message| seen.push(message))?;
            assert!(reader.pending.len() < HEADER_BYTES + MAX_CONTROL_BODY, "more than one frame held");
        }
        Ok(seen)
    }

    fn refused(bytes: &[u8], says: &str) {
        match read_all(bytes, bytes.len().max(1)) {
            Err(TransportError::Handshake(why)) => assert!(why.contains(says), "{why}"),
            other => panic!("{bytes:?} must be refused ({says}), got {other:?}"),
        }
    }

    #[test]
    fn every_message_round_trips_in_pieces_of_any_size() {
        let mut bytes = Vec::new();
        messages().iter().for_each(|message| message.encode(&mut bytes));
        for piece in [1, 2, 3, 5, 64, bytes.len()] {
            assert_eq!(read_all(&bytes, piece).unwrap(), messages(), "pieces of {piece} B");
        }
    }

    #[test]
    fn a_frame_breaking_a_rule_is_refused_with_a_reason() {
        refused(&[0x42], "unknown kind");
        refused(&[TAG_DONE, 0xff, 0xff], "exceeds");
        let mut done = Vec::new();
        Control::Done { seq: 1, refused: None }.encode(&mut done);
        let mut unknown = done.clone();
        *unknown.last_mut().unwrap() = 9;
        refused(&unknown, "unknown refusal");
        let mut long = done.clone();
        long[1] += 1;
        long.push(0);
        refused(&long, "after a control frame");
        let mut short = done;
        short[1] -= 1;
        short.pop();
        refused(&short, "runs past the end");
        let mut withdraw = Vec::new();
        Control::Withdraw { seq: 1, id: MAX_REGION_ID }.encode(&mut withdraw);
        refused(&withdraw, "out of range");
    }

    #[test]
    fn a_descriptor_is_checked_as_in_a_hello() {
        let expose = |edit: fn(&mut RegionDescriptor)| {
            let Control::Expose { mut descriptor, .. } = messages().remove(0) else { unreachable!() };
            edit(&mut descriptor);
            let mut bytes = Vec::new();
            Control::Expose { seq: 1, descriptor }.encode(&mut bytes);
            bytes
        };
        refused(&expose(|r| r.len = 0), "outside");
        refused(&expose(|r| r.id = MAX_REGION_ID), "out of range");
        refused(&expose(|r| r.key = vec![0; 17]), "region key");
        refused(&expose(|r| r.flags = 2), "unknown flags");
        let mut cut = expose(|_| ());
        let body = u16::from_le_bytes([cut[1], cut[2]]) - 3;
        cut[1..3].copy_from_slice(&body.to_le_bytes());
        cut.truncate(cut.len() - 3);
        refused(&cut, "ends inside its descriptor");
    }

    #[test]
    fn nothing_after_a_refused_frame_is_delivered() {
        let mut bytes = vec![0x42];
        Control::Goodbye.encode(&mut bytes);
        let mut seen = Vec::new();
        let mut reader = ControlReader::new(LIMITS);
        assert!(reader.feed(&bytes, &mut |message| seen.push(message)).is_err());
        assert!(seen.is_empty());
    }
}
