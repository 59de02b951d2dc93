//! The one hello every backend sends once the peer is authenticated: which backend speaks, its
//! connection blob, and a descriptor of every region it exposes, decoded strictly and bounded
//! before anything is allocated.
//!
//! Layout (little-endian): `b"RDMAHINT"` · [`WIRE_VERSION`] u16 · backend u8 · connection blob
//! (u16 length, then the backend's bytes) · region count u16 (≤ [`MAX_REGIONS`]) · per region a
//! [`RegionDescriptor`]: id u32, len u64, address u64, flags u8, key (u16 length, then bytes).
//!
//! What is generic is checked here (counts, ids, lengths, ranges, flags the backend does not
//! know, duplicates); what the blob and a key mean, each backend checks when it reads them.

use crate::codec::{handshake_error, put_preamble, put_prefixed_u16, WireReader};
use bytes::{Buf, BufMut};
use rdma_hint_backend_core::{MAX_REGIONS, MAX_REGION_BYTES};
use rdma_hint_core::TransportError;
use std::io::Read;

/// The hello's magic.
pub const HELLO_MAGIC: [u8; 8] = *b"RDMAHINT";

/// The one wire version every backend speaks (7: one hello for every backend, each region a
/// descriptor, where before each backend had its own hello and version; 8: the verbs blob says
/// how many of the peer's reads it serves at once; 9: control frames after the hello, for
/// regions exposed and withdrawn after connect; 10: the staged backend's too, its TCP `Control`
/// frames and its shm socket no longer silent; 11: the lanes of one connection carry its tag
/// in their authentication nonces, and a listening connection takes one peer's lanes only; 12: a
/// staged TCP write may carry acks for the peer's writes).
pub const WIRE_VERSION: u16 = 12;

/// What a listener sends instead of its hello to a peer whose hello it refused (it sends its
/// own only to the peer it picks, after that peer's): this magic, a u16 length, then why, in
/// UTF-8 (at most [`MAX_REFUSAL_BYTES`]), so the dialler says why, not only that the
/// connection closed.
pub const REFUSAL_MAGIC: [u8; 8] = *b"RDMANOPE";

/// The longest reason a refusal carries, bytes.
pub const MAX_REFUSAL_BYTES: usize = 256;

/// The refusal of a hello, with `why` cut to [`MAX_REFUSAL_BYTES`] on a character boundary.
pub(crate) fn encode_refusal(why: &str) -> Vec<u8> {
    let mut end = why.len().min(MAX_REFUSAL_BYTES);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = Vec::with_capacity(REFUSAL_MAGIC.len() + 2 + end);
    out.extend_from_slice(&REFUSAL_MAGIC);
    put_prefixed_u16(&mut out, &why.as_bytes()[..end]);
    out
}

/// Decodes the peer's hello with `decode`, unless the peer sent a refusal instead: then a
/// [`TransportError::Handshake`] carrying its reason (bounded; any bytes, shown lossily).
pub(crate) fn hello_or_refusal<H>(
    stream: &mut dyn Read,
    decode: impl FnOnce(&mut dyn Read) -> Result<H, TransportError>,
) -> Result<H, TransportError> {
    // Byte by byte, while they could still be a refusal's: a hello (of any length) is read
    // no further than where it parts from the refusal's magic, then handed over whole.
    let mut magic = [0u8; 8];
    for at in 0..REFUSAL_MAGIC.len() {
        WireReader::new(&mut *stream).exact(&mut magic[at..=at])?;
        if magic[at] != REFUSAL_MAGIC[at] {
            return decode(&mut Read::chain(&magic[..=at], stream));
        }
    }
    let mut reader = WireReader::new(stream);
    let mut len = [0u8; 2];
    reader.exact(&mut len)?;
    let len = u16::from_le_bytes(len) as usize;
    if len > MAX_REFUSAL_BYTES {
        return Err(handshake_error(format!("a refusal of {len} B (at most {MAX_REFUSAL_BYTES})")));
    }
    let mut why = vec![0u8; len];
    reader.exact(&mut why)?;
    // The peer's words, shown as printable ASCII only: no control, bidirectional or
    // invisible character reaches a terminal or a log line, and they are quoted as the peer's.
    let why: String = why.iter().map(|&b| if (0x20..0x7f).contains(&b) { b as char } else { '?' }).collect();
    Err(handshake_error(format!("the peer refused our hello, saying: \"{why}\"")))
}

/// Region ids a descriptor may carry: below this (a side holds [`MAX_REGIONS`] at once, and
/// reuses freed ids).
pub const MAX_REGION_ID: u32 = (MAX_REGIONS * 64) as u32;

/// A descriptor's fixed fields: id, len, address, flags.
const DESCRIPTOR_FIELDS_BYTES: usize = 4 + 8 + 8 + 1;

/// Which backend speaks: a hello from another is refused with both names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Host-staged shared memory or TCP.
    Staged = 1,
    /// UCX UCP.
    Ucx = 2,
    /// Raw ibverbs.
    Verbs = 3,
}

impl Backend {
    fn name(code: u8) -> &'static str {
        match code {
            1 => "staged",
            2 => "ucx",
            3 => "verbs",
            _ => "an unknown backend",
        }
    }
}

/// What a backend's hellos may carry, at most: the decoder's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloLimits {
    /// Bytes of the connection blob.
    pub max_connection_bytes: usize,
    /// Bytes of one region's key.
    pub max_key_bytes: usize,
    /// The region flag bits the backend knows; any other is refused.
    pub known_flags: u8,
}

/// One region as its owner describes it to a peer: what the peer needs to write or read it.
///
/// ```
/// use rdma_hint_oob::{HelloLimits, RegionDescriptor};
/// let limits = HelloLimits { max_connection_bytes: 64, max_key_bytes: 8, known_flags: 1 };
/// let region = RegionDescriptor { id: 3, len: 4096, address: 0x7f00_0000_0000, flags: 1, key: vec![9; 4] };
/// let mut bytes = Vec::new();
/// region.encode(&mut bytes);
/// assert_eq!(RegionDescriptor::decode(&mut &bytes[..], &limits).unwrap(), region);
/// let lying = RegionDescriptor { len: 0, ..region };
/// bytes.clear();
/// lying.encode(&mut bytes);
/// assert!(RegionDescriptor::decode(&mut &bytes[..], &limits).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionDescriptor {
    /// The region's id on its owner's side.
    pub id: u32,
    /// Length in bytes (1 B … 1 TiB).
    pub len: u64,
    /// Where the region starts in its owner's address space, where the medium needs it (0
    /// where it does not: the staged backend names regions by id only).
    pub address: u64,
    /// Backend-defined bits (the staged backend's "notify every write").
    pub flags: u8,
    /// What the peer's NIC or library needs to reach the region (an rkey, a packed UCX rkey),
    /// empty where nothing is needed.
    pub key: Vec<u8>,
}

impl RegionDescriptor {
    /// Appends the descriptor's bytes to `out`.
    pub fn encode(&self, out: &mut impl BufMut) {
        out.put_u32_le(self.id);
        out.put_u64_le(self.len);
        out.put_u64_le(self.address);
        out.put_u8(self.flags);
        put_prefixed_u16(out, &self.key);
    }

    /// Reads one descriptor and checks what is generic: the id's range, the length, that
    /// `address + len` does not wrap, flags the backend knows, the key's length.
    pub fn decode(reader: &mut impl Read, limits: &HelloLimits) -> Result<RegionDescriptor, TransportError> {
        RegionDescriptor::read(&mut WireReader::new(reader), limits)
    }

    fn read(
        reader: &mut WireReader<impl Read>,
        limits: &HelloLimits,
    ) -> Result<RegionDescriptor, TransportError> {
        let (id, len, address, flags) = reader.fields::<DESCRIPTOR_FIELDS_BYTES, _>(|piece| {
            Ok((
                piece.try_get_u32_le()?,
                piece.try_get_u64_le()?,
                piece.try_get_u64_le()?,
                piece.try_get_u8()?,
            ))
        })?;
        let key = reader.bytes_u16(limits.max_key_bytes, "region key")?;
        if id >= MAX_REGION_ID {
            return Err(handshake_error(format!("region id {id} is out of range")));
        }
        if len == 0 || len > MAX_REGION_BYTES {
            return Err(handshake_error(format!(
                "region {id} length {len} B is outside 1 B … {MAX_REGION_BYTES} B"
            )));
        }
        if address.checked_add(len).is_none() {
            return Err(handshake_error(format!("region {id} range {address:#x}+{len} wraps around")));
        }
        if flags & !limits.known_flags != 0 {
            return Err(handshake_error(format!("region {id} carries unknown flags {flags:#x}")));
        }
        Ok(RegionDescriptor { id, len, address, flags, key })
    }
}

/// One side's hello.
///
/// ```
/// use rdma_hint_oob::{Backend, Hello, HelloLimits, RegionDescriptor};
/// let limits = HelloLimits { max_connection_bytes: 64, max_key_bytes: 8, known_flags: 0 };
/// let region = RegionDescriptor { id: 0, len: 1 << 20, address: 0, flags: 0, key: Vec::new() };
/// let hello = Hello { backend: Backend::Staged, connection: vec![0], regions: vec![region] };
/// let bytes = hello.encode();
/// assert_eq!(Hello::decode(&mut &bytes[..], Backend::Staged, &limits).unwrap(), hello);
/// let refused = Hello::decode(&mut &bytes[..], Backend::Ucx, &limits).unwrap_err();
/// assert!(refused.to_string().contains("staged"), "{refused}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Who speaks.
    pub backend: Backend,
    /// The backend's connection bytes (a QP's number and GID, a UCX worker address, the shm
    /// hand-off socket), which that backend decodes and checks.
    pub connection: Vec<u8>,
    /// The regions this side exposes.
    pub regions: Vec<RegionDescriptor>,
}

impl Hello {
    /// The hello's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let regions: usize = self.regions.iter().map(|r| DESCRIPTOR_FIELDS_BYTES + 2 + r.key.len()).sum();
        let mut out = Vec::with_capacity(HELLO_MAGIC.len() + 2 + 1 + 2 + self.connection.len() + 2 + regions);
        put_preamble(&mut out, HELLO_MAGIC, WIRE_VERSION);
        out.put_u8(self.backend as u8);
        put_prefixed_u16(&mut out, &self.connection);
        out.put_u16_le(self.regions.len() as u16);
        for region in &self.regions {
            region.encode(&mut out);
        }
        out
    }

    /// Reads and checks a hello from `backend` within `limits`: magic, version, backend, every
    /// length before its bytes, every descriptor, no region twice. Reads no further than the
    /// hello.
    pub fn decode(
        reader: &mut impl Read,
        backend: Backend,
        limits: &HelloLimits,
    ) -> Result<Hello, TransportError> {
        let mut reader = WireReader::new(reader);
        reader.preamble(HELLO_MAGIC, WIRE_VERSION, "an rdma-hint transport")?;
        let speaks = reader.u8()?;
        if speaks != backend as u8 {
            return Err(handshake_error(format!(
                "the peer speaks {} where this side speaks {}: give both sides the same --backend",
                Backend::name(speaks),
                Backend::name(backend as u8)
            )));
        }
        let connection = reader.bytes_u16(limits.max_connection_bytes, "connection blob")?;
        let count = usize::from(reader.fields::<2, _>(|piece| piece.try_get_u16_le())?);
        if count > MAX_REGIONS {
            return Err(handshake_error(format!("{count} regions exceed the limit of {MAX_REGIONS}")));
        }
        let mut regions: Vec<RegionDescriptor> = Vec::with_capacity(count);
        for _ in 0..count {
            let region = RegionDescriptor::read(&mut reader, limits)?;
            if regions.iter().any(|seen| seen.id == region.id) {
                return Err(handshake_error(format!("region {} advertised twice", region.id)));
            }
            regions.push(region);
        }
        Ok(Hello { backend, connection, regions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HelloLimits = HelloLimits { max_connection_bytes: 32, max_key_bytes: 16, known_flags: 1 };

    #[test]
    fn a_refusal_says_why_bounded_and_without_control_characters() {
        let decode = |mut r: &mut dyn Read| Hello::decode(&mut r, Backend::Verbs, &LIMITS);
        // A hello passes through untouched.
        let bytes = hello().encode();
        assert_eq!(hello_or_refusal(&mut &bytes[..], decode).unwrap(), hello());
        // A refusal is a handshake error carrying the peer's reason.
        let refused = hello_or_refusal(&mut &encode_refusal("use --channel tcp")[..], decode).unwrap_err();
        assert!(
            refused.to_string().contains("refused our hello, saying: \"use --channel tcp\""),
            "{refused}"
        );
        // Cut to the bound on a character boundary; escapes, bidirectional overrides and any
        // other byte that is not printable ASCII shown as `?`.
        let long = format!("\u{1b}[2J\u{202e}{}", "é".repeat(300));
        let encoded = encode_refusal(&long);
        assert!(encoded.len() <= REFUSAL_MAGIC.len() + 2 + MAX_REFUSAL_BYTES);
        let shown = hello_or_refusal(&mut &encoded[..], decode).unwrap_err().to_string();
        assert!(shown.is_ascii() && !shown.contains('\u{1b}') && shown.contains("?[2J???"), "{shown}");
        // A length past the bound is refused before anything is allocated for it.
        let mut oversized = REFUSAL_MAGIC.to_vec();
        oversized.extend_from_slice(&u16::MAX.to_le_bytes());
        let err = hello_or_refusal(&mut &oversized[..], decode).unwrap_err();
        assert!(err.to_string().contains("a refusal of 65535 B"), "{err}");
        // A refusal cut short is a typed error too.
        let err = hello_or_refusal(&mut &encode_refusal("why")[..11], decode).unwrap_err();
        assert!(matches!(err, TransportError::Handshake(_) | TransportError::PeerGone(_)), "{err}");
    }

    fn hello() -> Hello {
        Hello {
            backend: Backend::Verbs,
            connection: vec![7; 27],
            regions: vec![
                RegionDescriptor { id: 0, len: 4096, address: 0x1000, flags: 1, key: vec![1, 2, 3, 4] },
                RegionDescriptor { id: 9, len: 1 << 30, address: 0x7f00_0000_0000, flags: 0, key: vec![] },
            ],
        }
    }

    fn decode(bytes: &[u8]) -> Result<Hello, TransportError> {
        Hello::decode(&mut &bytes[..], Backend::Verbs, &LIMITS)
    }

    fn refused(hello: &Hello, says: &str) {
        match decode(&hello.encode()) {
            Err(TransportError::Handshake(why)) => assert!(why.contains(says), "{why}"),
            other => panic!("{hello:?} must be refused ({says}), got {other:?}"),
        }
    }

    #[test]
    fn round_trips_and_every_truncation_is_a_typed_error() {
        let bytes = hello().encode();
        assert_eq!(decode(&bytes).unwrap(), hello());
        for cut in 0..bytes.len() {
            assert!(matches!(decode(&bytes[..cut]), Err(TransportError::PeerGone(_))), "cut at {cut}");
        }
    }

    #[test]
    fn reads_no_further_than_the_hello() {
        let mut bytes = hello().encode();
        let end = bytes.len();
        bytes.extend_from_slice(b"after");
        let mut reader = &bytes[..];
        Hello::decode(&mut reader, Backend::Verbs, &LIMITS).unwrap();
        assert_eq!(reader, b"after", "read {} bytes past the hello", end - (bytes.len() - reader.len()));
    }

    #[test]
    fn malformed_descriptors_are_refused_with_a_reason() {
        let with = |edit: fn(&mut RegionDescriptor)| {
            let mut hello = hello();
            edit(&mut hello.regions[1]);
            hello
        };
        refused(&with(|r| r.id = MAX_REGION_ID), "out of range");
        refused(&with(|r| r.id = 0), "advertised twice");
        refused(&with(|r| r.len = 0), "outside");
        refused(&with(|r| r.len = MAX_REGION_BYTES + 1), "outside");
        refused(&with(|r| r.address = u64::MAX - 10), "wraps");
        refused(&with(|r| r.flags = 2), "unknown flags");
        refused(&with(|r| r.key = vec![0; 17]), "region key");
    }

    #[test]
    fn another_backend_a_long_blob_or_too_many_regions_is_refused() {
        let staged = Hello { backend: Backend::Staged, ..hello() };
        refused(&staged, "the peer speaks staged where this side speaks verbs");
        refused(&Hello { connection: vec![0; 33], ..hello() }, "connection blob");
        let mut many = hello().encode();
        let count_at = HELLO_MAGIC.len() + 2 + 1 + 2 + 27;
        many[count_at..count_at + 2].copy_from_slice(&((MAX_REGIONS + 1) as u16).to_le_bytes());
        assert!(decode(&many).unwrap_err().to_string().contains("exceed the limit"));
        let mut old = hello().encode();
        old[8..10].copy_from_slice(&6u16.to_le_bytes());
        assert!(decode(&old).is_err(), "an older wire version is refused");
    }
}
