//! Bounded little-endian encoding and decoding of hellos, on top of [`bytes`].
//!
//! Encoders put fields with [`BufMut`] (`put_u16_le`, `put_u64_le`, `put_slice`, …) into a
//! `Vec<u8>`, starting with [`put_preamble`]; [`put_prefixed_u8`] and [`put_prefixed_u16`] add
//! the length-prefixed byte strings `bytes` has no call for. Decoders read a hello off the stream
//! in fixed-size pieces with [`WireReader::fields`], which takes the fields out of each piece with
//! [`Buf`]'s checked `try_get_*` calls on a `&[u8]` (never `get_*`, which panics on a short
//! buffer); length-prefixed strings come through [`WireReader::bytes_u8`] /
//! [`WireReader::bytes_u16`], which check the length against the caller's bound before they
//! allocate or read.

use bytes::{Buf, BufMut, TryGetError};
use rdma_hint_core::TransportError;
use std::io::{ErrorKind, Read};

/// A [`TransportError::Handshake`] with `why`.
pub fn handshake_error(why: impl Into<String>) -> TransportError {
    TransportError::Handshake(why.into())
}

/// A [`TransportError::Handshake`] for a `Buf::try_get_*` that found too few bytes left: what a
/// decoder returns instead of panicking when a field runs past the bytes it was given.
pub fn truncated(short: TryGetError) -> TransportError {
    handshake_error(format!(
        "a field of {} B runs past the end ({} B left)",
        short.requested, short.available
    ))
}

/// Reads a hello off a stream: fixed-size pieces parsed with [`Buf`], and length-bounded byte
/// strings.
///
/// EOF becomes [`TransportError::PeerGone`], a read timeout [`TransportError::DeadlineExceeded`].
/// It reads exactly the bytes asked for, never ahead (what follows a hello on the socket stays
/// there), and no read allocates more than the bound the caller gives.
///
/// ```
/// use bytes::Buf;
/// use rdma_hint_oob::WireReader;
/// let bytes = [7u8, 0x34, 0x12, 2, 0, 0xAA, 0xBB];
/// let mut reader = WireReader::new(&bytes[..]);
/// assert_eq!(reader.u8().unwrap(), 7);
/// assert_eq!(reader.fields::<2, _>(|piece| piece.try_get_u16_le()).unwrap(), 0x1234);
/// assert_eq!(reader.bytes_u16(2, "example").unwrap(), vec![0xAA, 0xBB]);
/// assert!(reader.u8().is_err()); // nothing left: the peer is gone
/// ```
#[derive(Debug)]
pub struct WireReader<R> {
    inner: R,
    /// When reading began: a deadline error says how long the peer was waited for.
    started: std::time::Instant,
}

impl<R: Read> WireReader<R> {
    /// Wraps a reader (a `TcpStream` with a read timeout, or a byte slice).
    pub fn new(inner: R) -> WireReader<R> {
        WireReader { inner, started: std::time::Instant::now() }
    }

    /// Fills `buffer` exactly.
    pub fn exact(&mut self, buffer: &mut [u8]) -> Result<(), TransportError> {
        let started = self.started;
        self.inner.read_exact(buffer).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => TransportError::PeerGone(format!("closed during the handshake ({e})")),
            ErrorKind::WouldBlock | ErrorKind::TimedOut => TransportError::DeadlineExceeded {
                what: "the peer's handshake",
                waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            },
            _ => TransportError::Io(e),
        })
    }

    /// Reads the next `N` bytes and takes fields out of them with `parse`, which gets them as a
    /// [`Buf`] (`&[u8]`) and should use the checked `try_get_*` calls: one that asks for more
    /// than the `N` bytes becomes a [`truncated`] error, not a panic.
    pub fn fields<const N: usize, T>(
        &mut self,
        parse: impl FnOnce(&mut &[u8]) -> Result<T, TryGetError>,
    ) -> Result<T, TransportError> {
        let mut piece = [0u8; N];
        self.exact(&mut piece)?;
        let mut rest = &piece[..];
        let value = parse(&mut rest).map_err(truncated)?;
        debug_assert!(!rest.has_remaining(), "{} B of a {N}-B piece left unparsed", rest.remaining());
        Ok(value)
    }

    /// Reads and checks the 8-byte magic and the u16 version every hello starts with; `who`
    /// names the expected peer in the error (e.g. "an rdma-hint UCX transport").
    pub fn preamble(&mut self, magic: [u8; 8], version: u16, who: &str) -> Result<(), TransportError> {
        let mut found = [0u8; 8];
        self.exact(&mut found)?;
        if found != magic {
            return Err(handshake_error(format!("bad magic: the peer is not {who}")));
        }
        let found = self.fields::<2, _>(|piece| piece.try_get_u16_le())?;
        if found != version {
            return Err(handshake_error(format!(
                "protocol version {found} is not spoken here (only {version})"
            )));
        }
        Ok(())
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, TransportError> {
        self.fields::<1, _>(|piece| piece.try_get_u8())
    }

    /// A byte string prefixed by a u8 length, refused above `max` bytes (before it is read).
    pub fn bytes_u8(&mut self, max: usize, what: &str) -> Result<Vec<u8>, TransportError> {
        let len = usize::from(self.u8()?);
        self.bounded(len, max, what)
    }

    /// A byte string prefixed by a little-endian u16 length, refused above `max` bytes (before
    /// it is read).
    pub fn bytes_u16(&mut self, max: usize, what: &str) -> Result<Vec<u8>, TransportError> {
        let len = usize::from(self.fields::<2, _>(|piece| piece.try_get_u16_le())?);
        self.bounded(len, max, what)
    }

    fn bounded(&mut self, len: usize, max: usize, what: &str) -> Result<Vec<u8>, TransportError> {
        if len > max {
            return Err(handshake_error(format!("{what} of {len} B exceeds {max} B")));
        }
        let mut bytes = vec![0u8; len];
        self.exact(&mut bytes)?;
        Ok(bytes)
    }
}

/// Puts the 8-byte magic and the little-endian u16 version every hello starts with: what
/// [`WireReader::preamble`] checks.
///
/// ```
/// use bytes::{Buf, BufMut};
/// use rdma_hint_oob::{put_preamble, put_prefixed_u8, WireReader};
/// let mut out = Vec::new();
/// put_preamble(&mut out, *b"EXAMPLE!", 3);
/// out.put_u32_le(42);
/// put_prefixed_u8(&mut out, b"token");
/// let mut reader = WireReader::new(&out[..]);
/// reader.preamble(*b"EXAMPLE!", 3, "an example").unwrap();
/// assert_eq!(reader.fields::<4, _>(|piece| piece.try_get_u32_le()).unwrap(), 42);
/// assert_eq!(reader.bytes_u8(64, "token").unwrap(), b"token");
/// ```
pub fn put_preamble(out: &mut impl BufMut, magic: [u8; 8], version: u16) {
    out.put_slice(&magic);
    out.put_u16_le(version);
}

/// Puts a byte string with a u8 length prefix (truncated to 255 bytes; callers bound it first):
/// what [`WireReader::bytes_u8`] reads.
pub fn put_prefixed_u8(out: &mut impl BufMut, bytes: &[u8]) {
    let len = u8::try_from(bytes.len()).unwrap_or(u8::MAX);
    out.put_u8(len);
    out.put_slice(&bytes[..usize::from(len)]);
}

/// Puts a byte string with a little-endian u16 length prefix (truncated to 65535 bytes; callers
/// bound it first): what [`WireReader::bytes_u16`] reads.
pub fn put_prefixed_u16(out: &mut impl BufMut, bytes: &[u8]) {
    let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    out.put_u16_le(len);
    out.put_slice(&bytes[..usize::from(len)]);
}

/// A stream whose every read and write must finish by one absolute `deadline`: each call gets
/// only the time that is left, so a peer that trickles a byte at a time cannot stretch a
/// handshake (a socket timeout alone restarts with every read).
#[derive(Debug)]
pub struct Deadlined<'a> {
    stream: &'a std::net::TcpStream,
    deadline: std::time::Instant,
}

impl<'a> Deadlined<'a> {
    /// `stream`, bounded by `deadline`.
    pub fn new(stream: &'a std::net::TcpStream, deadline: std::time::Instant) -> Deadlined<'a> {
        Deadlined { stream, deadline }
    }

    fn remaining(&self) -> std::io::Result<std::time::Duration> {
        match self.deadline.checked_duration_since(std::time::Instant::now()) {
            Some(left) if !left.is_zero() => Ok(left),
            _ => Err(ErrorKind::TimedOut.into()),
        }
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.remaining()?))?;
        (&*self.stream).read(buffer)
    }
}

impl std::io::Write for Deadlined<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        (&*self.stream).write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handshake that times out says how long it waited, not "after 0 ms".
    #[test]
    fn a_deadline_error_reports_the_time_waited() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(150);
        let mut reader = WireReader::new(Deadlined::new(&accepted, deadline));
        match reader.u8() {
            Err(TransportError::DeadlineExceeded { waited_ms, .. }) => {
                assert!(waited_ms >= 100, "waited {waited_ms} ms for a 150 ms deadline")
            }
            other => panic!("{other:?}"),
        }
        drop(silent);
    }

    const MAGIC: [u8; 8] = *b"TESTWIRE";

    /// A preamble, a u32, a u8-prefixed and a u16-prefixed string.
    fn message() -> Vec<u8> {
        let mut out = Vec::new();
        put_preamble(&mut out, MAGIC, 7);
        out.put_u32_le(0xdead_beef);
        put_prefixed_u8(&mut out, b"name");
        put_prefixed_u16(&mut out, &[5; 300]);
        out
    }

    fn decode(mut bytes: &[u8]) -> Result<(u32, Vec<u8>, Vec<u8>), TransportError> {
        let mut reader = WireReader::new(&mut bytes);
        reader.preamble(MAGIC, 7, "a test peer")?;
        let word = reader.fields::<4, _>(|piece| piece.try_get_u32_le())?;
        let name = reader.bytes_u8(64, "name")?;
        let blob = reader.bytes_u16(1024, "blob")?;
        assert!(bytes.is_empty(), "read exactly the message");
        Ok((word, name, blob))
    }

    #[test]
    fn the_byte_format_is_little_endian_and_round_trips() {
        let bytes = message();
        assert_eq!(&bytes[..14], b"TESTWIRE\x07\x00\xef\xbe\xad\xde");
        assert_eq!(&bytes[14..19], b"\x04name");
        assert_eq!(&bytes[19..21], &300u16.to_le_bytes());
        assert_eq!(decode(&bytes).unwrap(), (0xdead_beef, b"name".to_vec(), vec![5; 300]));
    }

    #[test]
    fn every_truncation_is_a_typed_error_never_a_panic() {
        let bytes = message();
        for cut in 0..bytes.len() {
            match decode(&bytes[..cut]) {
                Err(TransportError::PeerGone(_)) => {}
                other => panic!("truncated at {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn bad_preambles_and_lengths_are_refused_with_a_reason() {
        let mut bad_magic = message();
        bad_magic[0] ^= 1;
        assert!(decode(&bad_magic).unwrap_err().to_string().contains("bad magic"));
        let mut bad_version = message();
        bad_version[8] = 8;
        assert!(decode(&bad_version).unwrap_err().to_string().contains("protocol version 8"));
        // A length above the bound is refused before anything is read or allocated: no bytes
        // follow it, yet the error is the bound, not the peer going away.
        let err = WireReader::new(&[0xff, 0xff][..]).bytes_u16(1024, "blob").unwrap_err();
        assert!(err.to_string().contains("blob of 65535 B exceeds 1024 B"), "{err}");
        let err = WireReader::new(&[65][..]).bytes_u8(64, "name").unwrap_err();
        assert!(err.to_string().contains("name of 65 B exceeds 64 B"), "{err}");
    }

    #[test]
    fn a_parse_past_its_piece_is_a_typed_error() {
        let err =
            WireReader::new(&[1, 2, 3, 4][..]).fields::<2, _>(|piece| piece.try_get_u32_le()).unwrap_err();
        assert!(matches!(err, TransportError::Handshake(_)), "{err}");
        assert!(err.to_string().contains("4 B runs past the end (2 B left)"), "{err}");
    }

    #[test]
    fn prefixed_strings_are_cut_at_their_prefix_limit() {
        let mut out = Vec::new();
        put_prefixed_u8(&mut out, &[1; 300]);
        assert_eq!((out[0], out.len()), (255, 256));
        let mut out = Vec::new();
        put_prefixed_u16(&mut out, &vec![1; 70_000]);
        assert_eq!((&out[..2], out.len()), (&[0xff, 0xff][..], 65_537));
    }
}
