//! Bounded little-endian encoding and decoding of hellos.

use rdma_hint_transport::TransportError;
use std::io::{ErrorKind, Read};

/// A [`TransportError::Handshake`] with `why`.
pub fn handshake_error(why: impl Into<String>) -> TransportError {
    TransportError::Handshake(why.into())
}

/// Reads fixed-width little-endian fields and length-bounded byte strings from a hello.
///
/// EOF becomes [`TransportError::PeerGone`], a read timeout [`TransportError::DeadlineExceeded`].
/// No read allocates more than the bound the caller gives.
///
/// ```
/// use rdma_hint_oob::WireReader;
/// let bytes = [7u8, 2, 0, 0xAA, 0xBB];
/// let mut reader = WireReader::new(&bytes[..]);
/// assert_eq!(reader.u8().unwrap(), 7);
/// assert_eq!(reader.bytes_u16(2, "example").unwrap(), vec![0xAA, 0xBB]);
/// assert!(reader.u8().is_err()); // nothing left: the peer is gone
/// ```
#[derive(Debug)]
pub struct WireReader<R> {
    inner: R,
}

impl<R: Read> WireReader<R> {
    /// Wraps a reader (a `TcpStream` with a read timeout, or a byte slice).
    pub fn new(inner: R) -> WireReader<R> {
        WireReader { inner }
    }

    /// Fills `buffer` exactly.
    pub fn exact(&mut self, buffer: &mut [u8]) -> Result<(), TransportError> {
        self.inner.read_exact(buffer).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => TransportError::PeerGone(format!("closed during the handshake ({e})")),
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                TransportError::DeadlineExceeded { what: "the peer's handshake", waited_ms: 0 }
            }
            _ => TransportError::Io(e),
        })
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], TransportError> {
        let mut bytes = [0u8; N];
        self.exact(&mut bytes)?;
        Ok(bytes)
    }

    /// Reads and checks the 8-byte magic and the u16 version every hello starts with; `who`
    /// names the expected peer in the error (e.g. "an rdma-hint UCX transport").
    pub fn preamble(&mut self, magic: [u8; 8], version: u16, who: &str) -> Result<(), TransportError> {
        let mut found = [0u8; 8];
        self.exact(&mut found)?;
        if found != magic {
            return Err(handshake_error(format!("bad magic: the peer is not {who}")));
        }
        let found = self.u16()?;
        if found != version {
            return Err(handshake_error(format!(
                "protocol version {found} is not spoken here (only {version})"
            )));
        }
        Ok(())
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, TransportError> {
        Ok(self.array::<1>()?[0])
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> Result<u16, TransportError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32, TransportError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64, TransportError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A byte string prefixed by a u8 length, refused above `max` bytes.
    pub fn bytes_u8(&mut self, max: usize, what: &str) -> Result<Vec<u8>, TransportError> {
        let len = usize::from(self.u8()?);
        self.bounded(len, max, what)
    }

    /// A byte string prefixed by a u16 length, refused above `max` bytes.
    pub fn bytes_u16(&mut self, max: usize, what: &str) -> Result<Vec<u8>, TransportError> {
        let len = usize::from(self.u16()?);
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

/// Builds a hello: the mirror of [`WireReader`].
///
/// ```
/// use rdma_hint_oob::{WireReader, WireWriter};
/// let mut writer = WireWriter::default();
/// writer.u32(42).bytes_u8(b"token");
/// let bytes = writer.finish();
/// let mut reader = WireReader::new(&bytes[..]);
/// assert_eq!(reader.u32().unwrap(), 42);
/// assert_eq!(reader.bytes_u8(64, "token").unwrap(), b"token");
/// ```
#[derive(Debug, Default)]
pub struct WireWriter {
    out: Vec<u8>,
}

impl WireWriter {
    /// Raw bytes, no length prefix.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut WireWriter {
        self.out.extend_from_slice(bytes);
        self
    }

    /// One byte.
    pub fn u8(&mut self, value: u8) -> &mut WireWriter {
        self.raw(&[value])
    }

    /// A little-endian u16.
    pub fn u16(&mut self, value: u16) -> &mut WireWriter {
        self.raw(&value.to_le_bytes())
    }

    /// A little-endian u32.
    pub fn u32(&mut self, value: u32) -> &mut WireWriter {
        self.raw(&value.to_le_bytes())
    }

    /// A little-endian u64.
    pub fn u64(&mut self, value: u64) -> &mut WireWriter {
        self.raw(&value.to_le_bytes())
    }

    /// A byte string with a u8 length prefix (truncated to 255 bytes; callers bound it first).
    pub fn bytes_u8(&mut self, bytes: &[u8]) -> &mut WireWriter {
        let bytes = &bytes[..bytes.len().min(usize::from(u8::MAX))];
        self.u8(bytes.len() as u8).raw(bytes)
    }

    /// A byte string with a u16 length prefix (truncated to 65535 bytes; callers bound it first).
    pub fn bytes_u16(&mut self, bytes: &[u8]) -> &mut WireWriter {
        let bytes = &bytes[..bytes.len().min(usize::from(u16::MAX))];
        self.u16(bytes.len() as u16).raw(bytes)
    }

    /// The encoded bytes.
    pub fn finish(self) -> Vec<u8> {
        self.out
    }
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
