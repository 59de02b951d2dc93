//! The UCX backend's part of the one hello ([`rdma_hint_oob::Hello`]), with strict decoding.
//!
//! Its connection blob: the worker address (u16 length, 1 … 16 KiB, opaque UCP bytes) · notice
//! ring u8 (0: none, 1: one follows) · its address u64 and packed rkey (u16 length, 1 … 4 KiB;
//! [`RING_BYTES`] long). Each region's descriptor carries its address and its packed rkey as
//! the key. The hello follows the mutual authentication of `rdma_hint_oob::authenticate`: no
//! worker address or rkey reaches a peer that has not proven the token. After both hellos were
//! accepted and the endpoint exists, each side sends one [`READY`] byte; a side that rejected
//! the peer closes the socket instead.

use bytes::{Buf, BufMut};
use rdma_hint_core::TransportError;
use rdma_hint_oob::{handshake_error, put_prefixed_u16, Backend, HelloLimits, RegionDescriptor, WireReader};
use std::io::Read;

pub use crate::ring::RING_BYTES;

/// Regions one side may expose (the transport-wide limit).
pub use rdma_hint_backend_core::MAX_REGIONS;
/// Longest UCP worker address accepted, in bytes.
pub const MAX_WORKER_ADDRESS_BYTES: usize = 16 * 1024;
/// Longest packed rkey accepted, in bytes.
pub const MAX_RKEY_BYTES: usize = 4 * 1024;
/// The byte each side sends once its endpoint to the peer is ready.
pub const READY: u8 = 0x52;
/// What a UCX hello (and a control frame's descriptor) may carry: a worker address and a ring
/// in the blob, packed rkeys as keys.
pub const LIMITS: HelloLimits = HelloLimits {
    max_connection_bytes: 2 + MAX_WORKER_ADDRESS_BYTES + 1 + 8 + 2 + MAX_RKEY_BYTES,
    max_key_bytes: MAX_RKEY_BYTES,
    known_flags: 0,
};

/// Checks a region the peer exposed (its descriptor passed the shared decoder's checks of
/// id, length and flags): an address, and a packed rkey UCX may be handed. The descriptor's key
/// is the region's `ucp_rkey_pack` output, and its address byte 0's on the exposing side.
pub fn check_region(region: &RegionDescriptor) -> Result<(), TransportError> {
    let id = region.id;
    if region.address == 0 {
        return Err(handshake_error(format!("region {id} at address 0 is not addressable")));
    }
    check_packed_rkey(&region.key).map_err(|why| handshake_error(format!("region {id}: {why}")))
}

/// The ring a side takes notices on (see [`crate::ring`]): the peer may write it directly when
/// UCX maps it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposedRing {
    /// Virtual address of its byte 0 on the exposing side.
    pub address: u64,
    /// `ucp_rkey_pack` output for it.
    pub rkey: Vec<u8>,
}

/// A packed worker address starts with a header byte and a 64-bit UUID (ucp/wireup/address.c).
pub const MIN_WORKER_ADDRESS_BYTES: usize = 9;
/// The header byte's low nibble is the address format version.
const ADDRESS_VERSION_MASK: u8 = 0x0f;
/// Zeros after a peer's address: `ucp_ep_create` takes a pointer and no length, so a truncated
/// address is parsed into zeros, not past the buffer.
pub const WORKER_ADDRESS_PADDING: usize = 64 * 1024;

/// What can be checked of a peer's packed worker address without UCX's private format: its
/// length, and the header's format version, which must be the one `ours` (this worker's own
/// address) carries, since both ends run the same UCX. Returns a copy followed by
/// [`WORKER_ADDRESS_PADDING`] zero bytes, ready for `ucp_ep_create`.
///
/// ```
/// use rdma_hint_ucx::wire::screen_worker_address;
/// let ours = [0x01, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9];
/// assert!(screen_worker_address(&[0x01, 9, 9, 9, 9, 9, 9, 9, 9, 0], &ours).is_ok());
/// assert!(screen_worker_address(&[0x07, 9, 9, 9, 9, 9, 9, 9, 9, 0], &ours).is_err(), "another format");
/// assert!(screen_worker_address(&[0x01, 9], &ours).is_err(), "truncated");
/// ```
pub fn screen_worker_address(address: &[u8], ours: &[u8]) -> Result<Vec<u8>, TransportError> {
    let refuse = |why: String| handshake_error(format!("the peer's worker address: {why}"));
    if address.len() < MIN_WORKER_ADDRESS_BYTES {
        return Err(refuse(format!("{} B is shorter than a header and a UUID", address.len())));
    }
    let version = |bytes: &[u8]| bytes.first().map(|b| b & ADDRESS_VERSION_MASK);
    if version(address) != version(ours) {
        return Err(refuse(format!(
            "format version {:?} where this UCX packs {:?}",
            version(address),
            version(ours)
        )));
    }
    let mut padded = Vec::with_capacity(address.len() + WORKER_ADDRESS_PADDING);
    padded.extend_from_slice(address);
    padded.resize(address.len() + WORKER_ADDRESS_PADDING, 0);
    Ok(padded)
}

/// One side's hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// `ucp_worker_get_address` output.
    pub worker_address: Vec<u8>,
    /// Regions the peer may write and read, each with its packed rkey as the key.
    pub regions: Vec<RegionDescriptor>,
    /// Where the peer may announce its writes, when this side offers a ring.
    pub ring: Option<ExposedRing>,
}

impl Hello {
    /// Encodes the hello.
    ///
    /// ```
    /// use rdma_hint_oob::RegionDescriptor;
    /// use rdma_hint_ucx::wire::Hello;
    /// let rkey = vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    /// let hello = Hello {
    ///     worker_address: vec![1, 2, 3],
    ///     regions: vec![RegionDescriptor { id: 0, len: 4096, address: 0x1000, flags: 0, key: rkey }],
    ///     ring: None,
    /// };
    /// assert_eq!(Hello::decode(&mut &hello.encode()[..]).unwrap(), hello);
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let ring = self.ring.as_ref().map_or(0, |ring| 8 + 2 + ring.rkey.len());
        let mut connection = Vec::with_capacity(2 + self.worker_address.len() + 1 + ring);
        put_prefixed_u16(&mut connection, &self.worker_address);
        match &self.ring {
            None => connection.put_u8(0),
            Some(ring) => {
                connection.put_u8(1);
                connection.put_u64_le(ring.address);
                put_prefixed_u16(&mut connection, &ring.rkey);
            }
        }
        rdma_hint_oob::Hello { backend: Backend::Ucx, connection, regions: self.regions.clone() }.encode()
    }

    /// Reads and validates a hello: the shared checks, then the worker address, every region's
    /// address and packed rkey, and the ring, every byte of the blob accounted for.
    pub fn decode(reader: &mut impl Read) -> Result<Hello, TransportError> {
        let hello = rdma_hint_oob::Hello::decode(reader, Backend::Ucx, &LIMITS)?;
        let mut blob = &hello.connection[..];
        let (worker_address, ring) = connection(&mut blob).map_err(|error| match error {
            TransportError::PeerGone(_) => handshake_error("the connection blob ends early"),
            other => other,
        })?;
        if !blob.is_empty() {
            return Err(handshake_error(format!("{} B after the connection blob's fields", blob.len())));
        }
        hello.regions.iter().try_for_each(check_region)?;
        Ok(Hello { worker_address, regions: hello.regions, ring })
    }
}

/// The connection blob's worker address and notice ring.
fn connection(blob: &mut &[u8]) -> Result<(Vec<u8>, Option<ExposedRing>), TransportError> {
    let mut reader = WireReader::new(blob);
    let worker_address = reader.bytes_u16(MAX_WORKER_ADDRESS_BYTES, "worker address")?;
    if worker_address.is_empty() {
        return Err(handshake_error("empty worker address"));
    }
    let ring = match reader.fields::<1, _>(|piece| piece.try_get_u8())? {
        0 => None,
        1 => {
            let address = reader.fields::<8, _>(|piece| piece.try_get_u64_le())?;
            let rkey = reader.bytes_u16(MAX_RKEY_BYTES, "the ring's packed rkey")?;
            if address == 0 || !address.is_multiple_of(64) || address.checked_add(RING_BYTES).is_none() {
                return Err(handshake_error(format!("notice ring at {address:#x} is not addressable")));
            }
            check_packed_rkey(&rkey).map_err(|why| handshake_error(format!("notice ring: {why}")))?;
            Some(ExposedRing { address, rkey })
        }
        other => return Err(handshake_error(format!("notice ring marker {other} is neither 0 nor 1"))),
    };
    Ok((worker_address, ring))
}

/// Checks a packed rkey's layout before UCX sees it: `ucp_ep_rkey_unpack` takes no length and
/// trusts the bytes, so a short or inconsistent key from a peer would make it read past the
/// buffer. UCX 1.12–1.13 pack `md_map` (u64) · memory type (u8, 0 = host) · for each bit of
/// `md_map`: a size byte and that many bytes of transport key; nothing may follow.
///
/// ```
/// use rdma_hint_ucx::wire::check_packed_rkey;
/// assert!(check_packed_rkey(&[0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_ok()); // two mds, empty keys
/// assert!(check_packed_rkey(&[0xff; 7]).is_err());
/// ```
pub fn check_packed_rkey(rkey: &[u8]) -> Result<(), String> {
    let mut rest = rkey;
    let md_map = rest
        .try_get_u64_le()
        .map_err(|_| format!("packed rkey of {} B is shorter than its md map", rkey.len()))?;
    if md_map == 0 {
        return Err("packed rkey names no memory domain".into());
    }
    let memory_type = rest.try_get_u8().map_err(|_| "packed rkey ends before its memory type".to_string())?;
    if memory_type != 0 {
        return Err(format!("packed rkey is for memory type {memory_type}, only host memory (0) is exposed"));
    }
    for md in 0..md_map.count_ones() {
        let size = rest
            .try_get_u8()
            .map_err(|_| format!("packed rkey ends before the key of memory domain #{md}"))?;
        // `advance` panics past the end: check first.
        if rest.remaining() < usize::from(size) {
            return Err(format!("packed rkey key #{md} runs past the end"));
        }
        rest.advance(usize::from(size));
    }
    if rest.has_remaining() {
        return Err(format!("packed rkey has {} B after its last key", rest.remaining()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What UCX 1.13 packs for a host region on `shm,self`: md_map 0b1001, two empty keys.
    const RKEY: [u8; 11] = [9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

    fn hello() -> Hello {
        Hello {
            worker_address: vec![7; 300],
            regions: vec![
                RegionDescriptor { id: 0, len: 1 << 20, address: 0x7000_0000, flags: 0, key: RKEY.to_vec() },
                RegionDescriptor {
                    id: 3,
                    len: 4096,
                    address: 0x9000_0000,
                    flags: 0,
                    key: vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 7, 7],
                },
            ],
            ring: Some(ExposedRing { address: 0xa000_0000, rkey: RKEY.to_vec() }),
        }
    }

    /// [`hello`] with its region's packed rkey replaced.
    fn with_rkey(rkey: Vec<u8>) -> Hello {
        Hello { regions: vec![RegionDescriptor { key: rkey, ..hello().regions[0].clone() }], ..hello() }
    }

    fn with_ring(address: u64, rkey: Vec<u8>) -> Hello {
        Hello { ring: Some(ExposedRing { address, rkey }), ..hello() }
    }

    fn decode(bytes: &[u8]) -> Result<Hello, TransportError> {
        Hello::decode(&mut &bytes[..])
    }

    #[test]
    fn round_trips() {
        let hello = hello();
        assert_eq!(decode(&hello.encode()).unwrap(), hello);
        let without_ring = Hello { ring: None, ..hello };
        assert_eq!(decode(&without_ring.encode()).unwrap(), without_ring);
    }

    #[test]
    fn malformed_hellos_are_rejected_with_a_reason() {
        let good = hello().encode();
        let mut bad_magic = good.clone();
        bad_magic[0] ^= 1;
        assert!(decode(&bad_magic).unwrap_err().to_string().contains("magic"));
        let mut bad_version = good.clone();
        bad_version[8] = 11; // the version before this one
        assert!(decode(&bad_version).unwrap_err().to_string().contains("version"));
        // Every truncation is a typed error (the peer went away mid-hello), never a panic.
        for cut in 0..good.len() {
            match decode(&good[..cut]) {
                Err(TransportError::PeerGone(_)) => {}
                other => panic!("truncated at {cut}: {other:?}"),
            }
        }
        let cases: Vec<(Hello, &str)> = vec![
            (Hello { worker_address: vec![], ..hello() }, "empty worker address"),
            (Hello { worker_address: vec![0; MAX_WORKER_ADDRESS_BYTES + 1], ..hello() }, "worker address of"),
            (
                Hello { regions: vec![hello().regions[0].clone(), hello().regions[0].clone()], ..hello() },
                "twice",
            ),
            (
                Hello { regions: vec![RegionDescriptor { len: 0, ..hello().regions[0].clone() }], ..hello() },
                "length 0",
            ),
            (
                Hello {
                    regions: vec![RegionDescriptor { address: u64::MAX - 10, ..hello().regions[0].clone() }],
                    ..hello()
                },
                "wraps around",
            ),
            (
                Hello {
                    regions: vec![RegionDescriptor { address: 0, ..hello().regions[0].clone() }],
                    ..hello()
                },
                "not addressable",
            ),
            (with_rkey(vec![]), "shorter than its md map"),
            (with_rkey(vec![3, 0, 0, 0, 0, 0, 0, 0, 0, 0]), "ends before the key"),
            (with_rkey(vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 9, 1]), "runs past the end"),
            (with_rkey(vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]), "after its last key"),
            (with_rkey(vec![1, 0, 0, 0, 0, 0, 0, 0, 3, 0]), "memory type 3"),
            (with_ring(0, RKEY.to_vec()), "not addressable"),
            (with_ring(0xa000_0008, RKEY.to_vec()), "not addressable"),
            (with_ring(u64::MAX - 63, RKEY.to_vec()), "not addressable"),
            (with_ring(0xa000_0000, vec![1, 0, 0]), "notice ring: packed rkey"),
            (
                Hello {
                    regions: vec![RegionDescriptor { id: u32::MAX, ..hello().regions[0].clone() }],
                    ..hello()
                },
                "out of range",
            ),
        ];
        for (hello, expected) in cases {
            let err = decode(&hello.encode()).unwrap_err().to_string();
            assert!(err.contains(expected), "{err} does not mention {expected}");
        }
        let mut too_many =
            rdma_hint_oob::Hello { backend: Backend::Ucx, connection: vec![1, 0, 1, 0], regions: Vec::new() }
                .encode();
        let count_at = too_many.len() - 2;
        too_many[count_at..].copy_from_slice(&(MAX_REGIONS as u16 + 1).to_le_bytes());
        assert!(decode(&too_many).unwrap_err().to_string().contains("exceed"));
        let bad_marker =
            rdma_hint_oob::Hello { backend: Backend::Ucx, connection: vec![1, 0, 1, 2], regions: Vec::new() }
                .encode();
        assert!(decode(&bad_marker).unwrap_err().to_string().contains("marker 2"));
        let trailing = rdma_hint_oob::Hello {
            backend: Backend::Ucx,
            connection: vec![1, 0, 1, 0, 9],
            regions: Vec::new(),
        }
        .encode();
        assert!(decode(&trailing).unwrap_err().to_string().contains("after the connection blob"));
    }

    /// Every truncated packed rkey is refused with a reason, never a panic.
    #[test]
    fn every_truncated_rkey_is_refused() {
        let rkey = [3, 0, 0, 0, 0, 0, 0, 0, 0, 2, 7, 7, 1, 9];
        assert!(check_packed_rkey(&rkey).is_ok());
        for cut in 0..rkey.len() {
            assert!(check_packed_rkey(&rkey[..cut]).is_err(), "truncated at {cut} accepted");
        }
    }

    /// The decoder reads exactly one hello: the ready byte behind it on the socket stays there.
    #[test]
    fn decoding_reads_no_further_than_the_hello() {
        let both = [hello().encode(), vec![READY]].concat();
        let mut rest = &both[..];
        assert_eq!(Hello::decode(&mut rest).unwrap(), hello());
        assert_eq!(rest, &[READY][..]);
    }
}
