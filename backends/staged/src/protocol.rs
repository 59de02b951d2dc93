//! What an incoming frame may ask of this side, decided without touching memory or sockets:
//! the link's reader thread applies only what [`Inbox::admit`] allowed, and the fuzz target
//! `staged_frames` drives it with arbitrary frame sequences.

use crate::wire::{ChannelKind, Frame, FrameKind, FLAG_IMM, FLAG_PLACED, FLAG_SIGNALLED};

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
    },
    /// A signalled write of ours landed.
    Ack {
        /// Our tag.
        wr_id: u64,
        /// 0 for success.
        status: u16,
    },
}

/// The receiving side's rules: the channel, the regions the peer may write (length by id)
/// and the largest message. An acknowledgement must name the oldest signalled write of ours
/// still waiting for one (TCP keeps frames in order), so a peer can neither complete a write
/// twice nor complete one it has not placed yet.
#[derive(Debug, Clone)]
pub struct Inbox {
    channel: ChannelKind,
    exposed: Vec<Option<u64>>,
    max_msg_bytes: u64,
}

impl Inbox {
    /// Rules for `channel` with `exposed` regions as `(id, len)`.
    pub fn new(channel: ChannelKind, exposed: &[(u32, u64)], max_msg_bytes: u64) -> Inbox {
        let mut table: Vec<Option<u64>> = Vec::new();
        for (id, len) in exposed {
            let index = *id as usize;
            if table.len() <= index {
                table.resize(index + 1, None);
            }
            table[index] = Some(*len);
        }
        Inbox { channel, exposed: table, max_msg_bytes }
    }

    /// Admits `frame`, given the tag of the oldest signalled write of ours still waiting for
    /// its acknowledgement (`None`: none is); anything else is a protocol error whose text
    /// starts with `protocol error`.
    pub fn admit(&self, frame: &Frame, expected_ack: Option<u64>) -> Result<Inbound, String> {
        match frame.kind {
            FrameKind::Write => self.write(frame),
            FrameKind::Ack => match expected_ack {
                Some(wr_id) if self.channel == ChannelKind::Tcp && frame.wr_id == wr_id => {
                    Ok(Inbound::Ack { wr_id, status: frame.status })
                }
                Some(wr_id) if self.channel == ChannelKind::Tcp => Err(format!(
                    "protocol error: acknowledgement for write {} where write {wr_id} is next",
                    frame.wr_id
                )),
                _ => Err("protocol error: acknowledgement for a write that was never sent".into()),
            },
        }
    }

    fn write(&self, frame: &Frame) -> Result<Inbound, String> {
        let Some(Some(region_len)) = self.exposed.get(frame.region as usize).copied() else {
            return Err(format!("protocol error: write to region {} which is not exposed", frame.region));
        };
        let in_bounds = frame.offset.checked_add(frame.len).is_some_and(|end| end <= region_len);
        if !in_bounds || frame.len == 0 || frame.len > self.max_msg_bytes {
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
        Ok(Inbound::Write {
            region: frame.region,
            offset: frame.offset,
            len: frame.len,
            payload_follows,
            arrival: (frame.flags & FLAG_IMM != 0).then_some(frame.imm),
            ack: (frame.flags & FLAG_SIGNALLED != 0).then_some(frame.wr_id),
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
        assert!(inbox.admit(&write(0, 0, 4096, FLAG_IMM), None).is_ok());
        assert!(inbox.admit(&write(2, 4096, 4096, 0), None).is_ok());
        for bad in [write(1, 0, 1, 0), write(0, 4095, 2, 0), write(0, u64::MAX, 2, 0), write(0, 0, 0, 0)] {
            assert!(inbox.admit(&bad, None).unwrap_err().starts_with("protocol error"), "{bad:?}");
        }
        assert!(inbox.admit(&write(0, 0, 16, FLAG_PLACED), None).is_err(), "shm framing on tcp");
        let ack = Frame::ack(0, 3);
        assert!(inbox.admit(&ack, None).is_err(), "never asked for");
        assert!(inbox.admit(&ack, Some(3)).is_ok());
        assert!(inbox.admit(&ack, Some(4)).is_err(), "not the write that is next");
    }
}
