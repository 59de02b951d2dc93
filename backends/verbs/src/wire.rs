//! The out-of-band hello of the verbs backend (the QP exchange), with strict decoding.
//!
//! Each side sends one hello (little-endian): `b"RDMAHVRB"` · version u16 · LID u16 · QP number
//! u32 (< 2²⁴) · starting PSN u32 (< 2²⁴) · GID (16 bytes) · path MTU u8 (`ibv_mtu`, 1…5) ·
//! region count u16 (≤ 1024) · per region: id u32, address u64, len u64, rkey u32. It follows
//! the mutual authentication of `rdma_hint_oob::authenticate`: no rkey reaches a peer that has
//! not proven the token. After both QPs reach RTS each side sends one [`READY`] byte; a side
//! that rejected the peer closes the socket instead.

use bytes::{Buf, BufMut};
use rdma_hint_backend_core::MAX_REGION_BYTES;
use rdma_hint_core::TransportError;
use rdma_hint_oob::{handshake_error, put_preamble, WireReader};
use std::io::Read;

/// Hello magic.
pub const MAGIC: [u8; 8] = *b"RDMAHVRB";
/// The only protocol version spoken (2: the token moved out of the hello into the
/// authentication before it).
pub const VERSION: u16 = 2;
/// Regions one side may expose (the transport-wide limit).
pub use rdma_hint_backend_core::MAX_REGIONS;
/// The byte each side sends once its QP is ready to send.
pub const READY: u8 = 0x56;
/// Size of one region in a hello in bytes: id u32, address u64, len u64, rkey u32.
const REGION_BYTES: usize = 4 + 8 + 8 + 4;

/// A region one side exposes for RDMA WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExposedRegion {
    /// Region id on the exposing side.
    pub id: u32,
    /// Virtual address of byte 0.
    pub address: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key of its remote-write registration.
    pub rkey: u32,
}

/// One side's hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First packet sequence number.
    pub psn: u32,
    /// GID of the port (RoCE address).
    pub gid: [u8; 16],
    /// Active MTU as `ibv_mtu` (1 = 256 B … 5 = 4096 B).
    pub mtu: u8,
    /// Regions the peer may write.
    pub regions: Vec<ExposedRegion>,
}

impl Hello {
    /// Encodes the hello.
    ///
    /// ```
    /// use rdma_hint_verbs::wire::{ExposedRegion, Hello};
    /// let hello = Hello { lid: 0, qpn: 17, psn: 4242, gid: [0; 16], mtu: 5,
    ///     regions: vec![ExposedRegion { id: 0, address: 0x1000, len: 4096, rkey: 7 }] };
    /// assert_eq!(Hello::decode(&mut &hello.encode()[..]).unwrap(), hello);
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(MAGIC.len() + 2 + 2 + 4 + 4 + 16 + 1 + 2 + self.regions.len() * REGION_BYTES);
        put_preamble(&mut out, MAGIC, VERSION);
        out.put_u16_le(self.lid);
        out.put_u32_le(self.qpn);
        out.put_u32_le(self.psn);
        out.put_slice(&self.gid);
        out.put_u8(self.mtu);
        out.put_u16_le(self.regions.len() as u16);
        for region in &self.regions {
            out.put_u32_le(region.id);
            out.put_u64_le(region.address);
            out.put_u64_le(region.len);
            out.put_u32_le(region.rkey);
        }
        out
    }

    /// Reads and validates a hello: magic, version, 24-bit QPN and PSN, MTU code, region count
    /// and every region (unique ids, non-empty, non-wrapping ranges).
    pub fn decode(reader: &mut impl Read) -> Result<Hello, TransportError> {
        let mut reader = WireReader::new(reader);
        reader.preamble(MAGIC, VERSION, "an rdma-hint verbs transport")?;
        let (lid, qpn, psn) = reader.fields::<{ 2 + 4 + 4 }, _>(|piece| {
            Ok((piece.try_get_u16_le()?, piece.try_get_u32_le()?, piece.try_get_u32_le()?))
        })?;
        if qpn >= 1 << 24 || qpn == 0 {
            return Err(handshake_error(format!("QP number {qpn} is not a 24-bit QPN")));
        }
        if psn >= 1 << 24 {
            return Err(handshake_error(format!("PSN {psn} exceeds 24 bits")));
        }
        let mut gid = [0u8; 16];
        reader.exact(&mut gid)?;
        let mtu = reader.u8()?;
        if !(1..=5).contains(&mtu) {
            return Err(handshake_error(format!("MTU code {mtu} is not an ibv_mtu (1…5)")));
        }
        let count = usize::from(reader.fields::<2, _>(|piece| piece.try_get_u16_le())?);
        if count > MAX_REGIONS {
            return Err(handshake_error(format!("{count} regions exceed the limit of {MAX_REGIONS}")));
        }
        let mut regions: Vec<ExposedRegion> = Vec::with_capacity(count);
        for _ in 0..count {
            let region = reader.fields::<REGION_BYTES, _>(|piece| {
                Ok(ExposedRegion {
                    id: piece.try_get_u32_le()?,
                    address: piece.try_get_u64_le()?,
                    len: piece.try_get_u64_le()?,
                    rkey: piece.try_get_u32_le()?,
                })
            })?;
            let id = region.id;
            if id as usize >= MAX_REGIONS * 64 {
                return Err(handshake_error(format!("region id {id} is out of range")));
            }
            if regions.iter().any(|r| r.id == id) {
                return Err(handshake_error(format!("region {id} advertised twice")));
            }
            if region.len == 0 || region.len > MAX_REGION_BYTES {
                return Err(handshake_error(format!(
                    "region {id} length {} B is outside 1 B … {MAX_REGION_BYTES} B",
                    region.len
                )));
            }
            if region.address.checked_add(region.len).is_none() {
                return Err(handshake_error(format!("region {id} range wraps around")));
            }
            regions.push(region);
        }
        Ok(Hello { lid, qpn, psn, gid, mtu, regions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            lid: 0,
            qpn: 0x11,
            psn: 0x00ab_cdef,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1],
            mtu: 5,
            regions: vec![ExposedRegion { id: 0, address: 0x7f00_0000_0000, len: 1 << 20, rkey: 0x1234 }],
        }
    }

    fn decode(bytes: &[u8]) -> Result<Hello, TransportError> {
        Hello::decode(&mut &bytes[..])
    }

    #[test]
    fn round_trips_and_rejects_malformed_fields() {
        let good = hello().encode();
        assert_eq!(decode(&good).unwrap(), hello());
        // Every truncation is a typed error (the peer went away mid-hello), never a panic.
        for cut in 0..good.len() {
            match decode(&good[..cut]) {
                Err(TransportError::PeerGone(_)) => {}
                other => panic!("truncated at {cut}: {other:?}"),
            }
        }
        let cases: Vec<(Hello, &str)> = vec![
            (Hello { qpn: 1 << 24, ..hello() }, "24-bit QPN"),
            (Hello { qpn: 0, ..hello() }, "24-bit QPN"),
            (Hello { psn: 1 << 24, ..hello() }, "PSN"),
            (Hello { mtu: 6, ..hello() }, "MTU code 6"),
            (Hello { regions: vec![hello().regions[0], hello().regions[0]], ..hello() }, "twice"),
            (Hello { regions: vec![ExposedRegion { len: 0, ..hello().regions[0] }], ..hello() }, "length 0"),
            (
                Hello { regions: vec![ExposedRegion { address: u64::MAX, ..hello().regions[0] }], ..hello() },
                "wraps",
            ),
        ];
        for (hello, expected) in cases {
            let err = decode(&hello.encode()).unwrap_err().to_string();
            assert!(err.contains(expected), "{err} does not mention {expected}");
        }
        let mut bad_magic = good.clone();
        bad_magic[3] ^= 0x20;
        assert!(decode(&bad_magic).unwrap_err().to_string().contains("magic"));
    }

    /// The hello's byte layout, field by field (what older peers read), and the decoder reads
    /// exactly one hello: the ready byte behind it on the socket stays there.
    #[test]
    fn layout_is_fixed_and_decoding_reads_no_further() {
        let hello = hello();
        let mut expected = b"RDMAHVRB".to_vec();
        expected.extend_from_slice(&VERSION.to_le_bytes());
        expected.extend_from_slice(&hello.lid.to_le_bytes());
        expected.extend_from_slice(&hello.qpn.to_le_bytes());
        expected.extend_from_slice(&hello.psn.to_le_bytes());
        expected.extend_from_slice(&hello.gid);
        expected.push(hello.mtu);
        expected.extend_from_slice(&1u16.to_le_bytes());
        let region = hello.regions[0];
        expected.extend_from_slice(&region.id.to_le_bytes());
        expected.extend_from_slice(&region.address.to_le_bytes());
        expected.extend_from_slice(&region.len.to_le_bytes());
        expected.extend_from_slice(&region.rkey.to_le_bytes());
        assert_eq!(hello.encode(), expected);
        let both = [expected, vec![READY]].concat();
        let mut rest = &both[..];
        assert_eq!(Hello::decode(&mut rest).unwrap(), hello);
        assert_eq!(rest, &[READY][..]);
    }
}
