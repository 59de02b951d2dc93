//! The out-of-band hello of the verbs backend (the QP exchange), with strict decoding.
//!
//! Each side sends one hello (little-endian): `b"RDMAHVRB"` · version u16 · LID u16 · QP number
//! u32 (< 2²⁴) · starting PSN u32 (< 2²⁴) · GID (16 bytes) · path MTU u8 (`ibv_mtu`, 1…5) ·
//! region count u16 (≤ 1024) · per region: id u32, address u64, len u64, rkey u32. It follows
//! the mutual authentication of `rdma_hint_oob::authenticate`: no rkey reaches a peer that has
//! not proven the token. After both QPs reach RTS each side sends one [`READY`] byte; a side
//! that rejected the peer closes the socket instead.

use crate::region::MAX_REGION_BYTES;
use rdma_hint_oob::{handshake_error, WireReader, WireWriter};
use rdma_hint_transport::TransportError;
use std::io::Read;

/// Hello magic.
pub const MAGIC: [u8; 8] = *b"RDMAHVRB";
/// The only protocol version spoken (2: the token moved out of the hello into the
/// authentication before it).
pub const VERSION: u16 = 2;
/// Regions one side may expose.
pub const MAX_REGIONS: usize = 1024;
/// The byte each side sends once its QP is ready to send.
pub const READY: u8 = 0x56;

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
        let mut out = WireWriter::default();
        out.raw(&MAGIC).u16(VERSION).u16(self.lid).u32(self.qpn).u32(self.psn).raw(&self.gid).u8(self.mtu);
        out.u16(self.regions.len() as u16);
        for region in &self.regions {
            out.u32(region.id).u64(region.address).u64(region.len).u32(region.rkey);
        }
        out.finish()
    }

    /// Reads and validates a hello: magic, version, 24-bit QPN and PSN, MTU code, region count
    /// and every region (unique ids, non-empty, non-wrapping ranges).
    pub fn decode(reader: &mut impl Read) -> Result<Hello, TransportError> {
        let mut reader = WireReader::new(reader);
        reader.preamble(MAGIC, VERSION, "an rdma-hint verbs transport")?;
        let lid = reader.u16()?;
        let qpn = reader.u32()?;
        let psn = reader.u32()?;
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
        let count = usize::from(reader.u16()?);
        if count > MAX_REGIONS {
            return Err(handshake_error(format!("{count} regions exceed the limit of {MAX_REGIONS}")));
        }
        let mut regions: Vec<ExposedRegion> = Vec::with_capacity(count);
        for _ in 0..count {
            let region = ExposedRegion {
                id: reader.u32()?,
                address: reader.u64()?,
                len: reader.u64()?,
                rkey: reader.u32()?,
            };
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
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "truncated at {cut} accepted");
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

    /// The fuzz seeds are valid hellos of the current version (so the fuzzer starts past the
    /// preamble).
    #[test]
    fn fuzz_seeds_decode() {
        let seed: &[u8] = include_bytes!("../../../fuzz/seeds/verbs_wire/one_region");
        let hello = Hello::decode(&mut &seed[..]).expect("one_region decodes");
        assert_eq!(hello.encode(), seed, "one_region round-trips");
    }
}
