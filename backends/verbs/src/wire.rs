//! The verbs backend's part of the one hello ([`rdma_hint_oob::Hello`]: the QP exchange), with
//! strict decoding.
//!
//! Its connection blob (28 B, little-endian): LID u16 · QP number u32 (< 2²⁴) · starting PSN
//! u32 (< 2²⁴) · GID (16 bytes) · path MTU u8 (`ibv_mtu`, 1…5) · reads served at once u8 (the
//! responder resources, ≥ 1: the peer's reads in flight are at most this). Each region's descriptor
//! carries its address and its rkey (u32, 4 B) as the key. The hello follows the mutual
//! authentication of `rdma_hint_oob::authenticate`: no rkey reaches a peer that has not proven
//! the token. After both QPs reach RTS each side sends one [`READY`] byte; a side that rejected
//! the peer closes the socket instead.

use bytes::{Buf, BufMut};
use rdma_hint_core::TransportError;
use rdma_hint_oob::{handshake_error, Backend, HelloLimits, RegionDescriptor, WireReader};
use std::io::Read;

/// Regions one side may expose (the transport-wide limit).
pub use rdma_hint_backend_core::MAX_REGIONS;
/// The byte each side sends once its QP is ready to send.
pub const READY: u8 = 0x56;
/// The connection blob's bytes: LID, QP number, PSN, GID, MTU, reads served.
const CONNECTION_BYTES: usize = 2 + 4 + 4 + 16 + 1 + 1;
/// What a verbs hello (and a control frame's descriptor) may carry: the QP's addressing in the
/// blob, a 4-byte rkey per region.
pub const LIMITS: HelloLimits =
    HelloLimits { max_connection_bytes: CONNECTION_BYTES, max_key_bytes: 4, known_flags: 0 };

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

impl ExposedRegion {
    /// The region as the one hello and the control channel carry it: its rkey as the key.
    pub fn descriptor(&self) -> RegionDescriptor {
        RegionDescriptor {
            id: self.id,
            len: self.len,
            address: self.address,
            flags: 0,
            key: self.rkey.to_le_bytes().to_vec(),
        }
    }

    /// The peer's region from its descriptor (checked by the shared decoder): a key of 4 bytes.
    pub fn from_descriptor(region: &RegionDescriptor) -> Result<ExposedRegion, TransportError> {
        let rkey: [u8; 4] = region.key.as_slice().try_into().map_err(|_| {
            handshake_error(format!("region {}: an rkey of {} B, not 4", region.id, region.key.len()))
        })?;
        Ok(ExposedRegion {
            id: region.id,
            address: region.address,
            len: region.len,
            rkey: u32::from_le_bytes(rkey),
        })
    }
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
    /// RDMA READs of the peer this side serves at once (its QP's `max_dest_rd_atomic`): the
    /// peer keeps no more in flight (its `max_rd_atomic`).
    pub reads_served: u8,
    /// Regions the peer may write.
    pub regions: Vec<ExposedRegion>,
}

impl Hello {
    /// Encodes the hello.
    ///
    /// ```
    /// use rdma_hint_verbs::wire::{ExposedRegion, Hello};
    /// let hello = Hello { lid: 0, qpn: 17, psn: 4242, gid: [0; 16], mtu: 5, reads_served: 16,
    ///     regions: vec![ExposedRegion { id: 0, address: 0x1000, len: 4096, rkey: 7 }] };
    /// assert_eq!(Hello::decode(&mut &hello.encode()[..]).unwrap(), hello);
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let mut connection = Vec::with_capacity(CONNECTION_BYTES);
        connection.put_u16_le(self.lid);
        connection.put_u32_le(self.qpn);
        connection.put_u32_le(self.psn);
        connection.put_slice(&self.gid);
        connection.put_u8(self.mtu);
        connection.put_u8(self.reads_served);
        let regions = self.regions.iter().map(ExposedRegion::descriptor).collect();
        rdma_hint_oob::Hello { backend: Backend::Verbs, connection, regions }.encode()
    }

    /// Reads and validates a hello: the shared checks, then the QP's addressing and a 4-byte
    /// rkey per region.
    pub fn decode(reader: &mut impl Read) -> Result<Hello, TransportError> {
        let hello = rdma_hint_oob::Hello::decode(reader, Backend::Verbs, &LIMITS)?;
        if hello.connection.len() != CONNECTION_BYTES {
            return Err(handshake_error(format!(
                "the connection blob is {} B where a QP's addressing takes {CONNECTION_BYTES} B",
                hello.connection.len()
            )));
        }
        let mut reader = WireReader::new(&hello.connection[..]);
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
        let reads_served = reader.u8()?;
        if reads_served == 0 {
            return Err(handshake_error("the peer serves no RDMA READs at once (0 responder resources)"));
        }
        let regions = hello.regions.iter().map(ExposedRegion::from_descriptor).collect::<Result<_, _>>()?;
        Ok(Hello { lid, qpn, psn, gid, mtu, reads_served, regions })
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
            reads_served: 16,
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
            (Hello { reads_served: 0, ..hello() }, "no RDMA READs"),
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
        let connection = hello().encode()[13..13 + CONNECTION_BYTES].to_vec();
        let short_key = RegionDescriptor { id: 0, len: 4096, address: 0x1000, flags: 0, key: vec![1, 2, 3] };
        let shared = rdma_hint_oob::Hello { backend: Backend::Verbs, connection, regions: vec![short_key] };
        assert!(decode(&shared.encode()).unwrap_err().to_string().contains("not 4"));
        let short_blob = rdma_hint_oob::Hello { connection: vec![0; 27], regions: vec![], ..shared };
        assert!(decode(&short_blob.encode()).unwrap_err().to_string().contains("27 B"));
    }

    /// The hello's byte layout, field by field (what peers read), and the decoder reads
    /// exactly one hello: the ready byte behind it on the socket stays there.
    #[test]
    fn layout_is_fixed_and_decoding_reads_no_further() {
        let hello = hello();
        let mut expected = b"RDMAHINT".to_vec();
        expected.extend_from_slice(&rdma_hint_oob::WIRE_VERSION.to_le_bytes());
        expected.push(Backend::Verbs as u8);
        expected.extend_from_slice(&(CONNECTION_BYTES as u16).to_le_bytes());
        expected.extend_from_slice(&hello.lid.to_le_bytes());
        expected.extend_from_slice(&hello.qpn.to_le_bytes());
        expected.extend_from_slice(&hello.psn.to_le_bytes());
        expected.extend_from_slice(&hello.gid);
        expected.push(hello.mtu);
        expected.push(hello.reads_served);
        expected.extend_from_slice(&1u16.to_le_bytes());
        let region = hello.regions[0];
        expected.extend_from_slice(&region.id.to_le_bytes());
        expected.extend_from_slice(&region.len.to_le_bytes());
        expected.extend_from_slice(&region.address.to_le_bytes());
        expected.push(0);
        expected.extend_from_slice(&4u16.to_le_bytes());
        expected.extend_from_slice(&region.rkey.to_le_bytes());
        assert_eq!(hello.encode(), expected);
        let both = [expected, vec![READY]].concat();
        let mut rest = &both[..];
        assert_eq!(Hello::decode(&mut rest).unwrap(), hello);
        assert_eq!(rest, &[READY][..]);
    }
}
