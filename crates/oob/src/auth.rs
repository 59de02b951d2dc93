//! Mutual authentication, the first bytes on every out-of-band connection: no hello (regions,
//! rkeys, worker addresses, shm handles) leaves this process before the peer proved it holds
//! the pre-shared token, and the token itself never crosses the wire.
//!
//! Both sides send `b"RDHAUTH1"` · flags u8 (bit 0: this side has a token) · a 32-byte nonce
//! (its connection's 8-byte tag, then 24 bytes fresh from the OS). When both have a token,
//! each then sends
//! `HMAC-SHA-256(token, "rdma-hint/auth/v1" · sender role · sender nonce · receiver nonce)` and
//! checks the peer's in constant time. The role byte (`D` dialer, `L` listener) stops a reply
//! being reflected back; fresh nonces on both sides stop a recorded one being replayed. A side
//! with a token refuses a peer without one, and the other way round, each saying which.
//!
//! The tag is the same on every lane of one connection: a listening connection of several
//! lanes takes the lanes of one peer only, by its tag, however other peers' lanes interleave
//! with them.
//!
//! A listener that is busy with another peer sends the preamble with flag bit 1 (busy), a
//! zero nonce and nothing else, and closes: the dialler answers
//! [`TransportError::PeerBusy`] at once instead of waiting in the backlog until its deadline.
//!
//! What it does not give: secrecy or integrity of the bytes after it (use a trusted network or
//! a tunnel between hosts), or protection of a weak token against offline guessing by someone
//! who recorded an exchange.

use crate::codec::{Deadlined, WireReader};
use crate::token::Token;
use hmac::{Hmac, Mac};
use rdma_hint_core::TransportError;
use sha2::Sha256;
use std::io::Write;
use std::net::TcpStream;

/// First bytes of the authentication preamble.
pub const AUTH_MAGIC: [u8; 8] = *b"RDHAUTH1";
const NONCE_BYTES: usize = 32;
/// Bytes of a connection's tag, at the start of each of its lanes' nonces.
pub(crate) const TAG_BYTES: usize = 8;

/// The lanes of one connection, as the nonces of their authentication say.
pub(crate) type ConnectionTag = [u8; TAG_BYTES];
const MAC_BYTES: usize = 32;
const CONTEXT: &[u8] = b"rdma-hint/auth/v1";
const HAS_TOKEN: u8 = 1;
const BUSY: u8 = 2;

/// Which end of the out-of-band connection this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This side dialled.
    Dialer,
    /// This side accepted.
    Listener,
}

impl Role {
    fn byte(self) -> u8 {
        match self {
            Role::Dialer => b'D',
            Role::Listener => b'L',
        }
    }

    fn peer(self) -> Role {
        match self {
            Role::Dialer => Role::Listener,
            Role::Listener => Role::Dialer,
        }
    }
}

fn mac(token: &Token, sender: Role, sender_nonce: &[u8], receiver_nonce: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length; a token is 1…64 bytes.
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(token.as_bytes()).expect("HMAC accepts any key length");
    mac.update(CONTEXT);
    mac.update(&[sender.byte()]);
    mac.update(sender_nonce);
    mac.update(receiver_nonce);
    mac
}

/// Runs the preamble on `stream` as `role` within [`HANDSHAKE_TIMEOUT`](crate::HANDSHAKE_TIMEOUT),
/// with `token` (`None`: none configured, and the peer must have none either). On success both
/// sides hold the same token, or neither has one.
///
/// ```
/// use rdma_hint_oob::{authenticate, Role, Token};
/// use std::net::{TcpListener, TcpStream};
///
/// let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// let address = listener.local_addr().unwrap();
/// let token = Token::new(b"pre-shared").unwrap();
/// let theirs = token.clone();
/// let dialer = std::thread::spawn(move || {
///     let mut stream = TcpStream::connect(address).unwrap();
///     authenticate(&mut stream, Some(&theirs), Role::Dialer)
/// });
/// let (mut accepted, _) = listener.accept().unwrap();
/// assert!(authenticate(&mut accepted, Some(&token), Role::Listener).is_ok());
/// assert!(dialer.join().unwrap().is_ok());
/// ```
pub fn authenticate(stream: &mut TcpStream, token: Option<&Token>, role: Role) -> Result<(), TransportError> {
    authenticate_by(stream, token, role, std::time::Instant::now() + crate::HANDSHAKE_TIMEOUT)
}

/// [`authenticate`], finished by `deadline` however the peer paces its bytes.
pub fn authenticate_by(
    stream: &TcpStream,
    token: Option<&Token>,
    role: Role,
    deadline: std::time::Instant,
) -> Result<(), TransportError> {
    authenticate_tagged(stream, token, role, deadline, new_tag()?).map(drop)
}

/// A fresh connection tag.
pub(crate) fn new_tag() -> Result<ConnectionTag, TransportError> {
    let mut tag = [0u8; TAG_BYTES];
    fill_random(&mut tag)?;
    Ok(tag)
}

/// `out` filled from the OS's randomness.
fn fill_random(out: &mut [u8]) -> Result<(), TransportError> {
    getrandom::fill(out).map_err(|e| TransportError::Io(std::io::Error::other(e.to_string())))
}

/// [`authenticate_by`] with this side's nonce starting with `tag`; the peer's tag.
pub(crate) fn authenticate_tagged(
    stream: &TcpStream,
    token: Option<&Token>,
    role: Role,
    deadline: std::time::Instant,
    tag: ConnectionTag,
) -> Result<ConnectionTag, TransportError> {
    let peer = stream.peer_addr().map_or_else(|_| "unknown".to_string(), |a| a.to_string());
    let refuse = |why: &str| {
        tracing::warn!(%peer, why, "rejected peer (authentication)");
        TransportError::Unauthorized { peer: format!("{peer} ({why})") }
    };
    let mut stream = Deadlined::new(stream, deadline);
    let mut ours = [0u8; NONCE_BYTES];
    ours[..TAG_BYTES].copy_from_slice(&tag);
    fill_random(&mut ours[TAG_BYTES..])?;
    let mut preamble = Vec::with_capacity(AUTH_MAGIC.len() + 1 + NONCE_BYTES);
    preamble.extend_from_slice(&AUTH_MAGIC);
    preamble.push(if token.is_some() { HAS_TOKEN } else { 0 });
    preamble.extend_from_slice(&ours);
    stream.write_all(&preamble)?;

    let mut reader = WireReader::new(&mut stream);
    let mut magic = [0u8; 8];
    reader.exact(&mut magic)?;
    if magic != AUTH_MAGIC {
        return Err(refuse("not an rdma-hint peer (no authentication preamble)"));
    }
    let flags = reader.u8()?;
    if flags == BUSY && role == Role::Dialer {
        tracing::debug!(%peer, "the listener is busy");
        return Err(TransportError::PeerBusy { peer });
    }
    if flags & !HAS_TOKEN != 0 {
        return Err(refuse("unknown authentication flags"));
    }
    let mut theirs = [0u8; NONCE_BYTES];
    reader.exact(&mut theirs)?;
    if theirs == ours {
        return Err(refuse("the peer echoed this side's nonce"));
    }
    let their_tag: ConnectionTag = theirs[..TAG_BYTES].try_into().expect("a nonce starts with a tag");
    let token = match (token, flags & HAS_TOKEN != 0) {
        (None, false) => return Ok(their_tag),
        (Some(_), false) => return Err(refuse("this side requires a token; the peer has none")),
        (None, true) => return Err(refuse("the peer requires a token; this side has none")),
        (Some(token), true) => token,
    };
    let proof = mac(token, role, &ours, &theirs).finalize().into_bytes();
    stream.write_all(&proof)?;
    let mut presented = [0u8; MAC_BYTES];
    WireReader::new(&mut stream).exact(&mut presented)?;
    mac(token, role.peer(), &theirs, &ours).verify_slice(&presented).map_err(|_| refuse("wrong token"))?;
    Ok(their_tag)
}

/// What a busy listener sends before it closes (see the module doc).
pub(crate) fn busy_preamble() -> [u8; 8 + 1 + NONCE_BYTES] {
    let mut preamble = [0u8; 8 + 1 + NONCE_BYTES];
    preamble[..8].copy_from_slice(&AUTH_MAGIC);
    preamble[8] = BUSY;
    preamble
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    fn run(
        dialer: Option<&[u8]>,
        listener: Option<&[u8]>,
    ) -> (Result<(), TransportError>, Result<(), TransportError>) {
        let bound = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = bound.local_addr().unwrap();
        let dial_token = dialer.map(|t| Token::new(t).unwrap());
        let dialing = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(address).unwrap();
            stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
            authenticate(&mut stream, dial_token.as_ref(), Role::Dialer)
        });
        let (mut accepted, _) = bound.accept().unwrap();
        accepted.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let listen_token = listener.map(|t| Token::new(t).unwrap());
        let listened = authenticate(&mut accepted, listen_token.as_ref(), Role::Listener);
        drop(accepted);
        (dialing.join().unwrap(), listened)
    }

    #[test]
    fn both_sides_must_agree_on_the_token() {
        let (d, l) = run(Some(b"secret"), Some(b"secret"));
        assert!(d.is_ok() && l.is_ok(), "{d:?} {l:?}");
        let (d, l) = run(None, None);
        assert!(d.is_ok() && l.is_ok());
        let (d, l) = run(Some(b"secret"), Some(b"secreT"));
        assert!(matches!(l, Err(TransportError::Unauthorized { .. })), "{l:?}");
        assert!(matches!(d, Err(TransportError::Unauthorized { .. })), "{d:?}");
        let (_, l) = run(None, Some(b"secret"));
        assert!(matches!(l, Err(TransportError::Unauthorized { .. })), "{l:?}");
        let (d, _) = run(Some(b"secret"), None);
        assert!(matches!(d, Err(TransportError::Unauthorized { .. })), "{d:?}");
    }

    /// What a listener with a token sends to anyone who connects: its preamble and, only after
    /// the peer's preamble said it has a token, a MAC. Never the token.
    #[test]
    fn the_token_never_crosses_the_wire() {
        let token = b"do-not-leak-this-token";
        let bound = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = bound.local_addr().unwrap();
        let listening = std::thread::spawn(move || {
            let (mut accepted, _) = bound.accept().unwrap();
            accepted.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
            authenticate(&mut accepted, Some(&Token::new(token).unwrap()), Role::Listener)
        });
        let mut attacker = TcpStream::connect(address).unwrap();
        let mut fake = AUTH_MAGIC.to_vec();
        fake.push(HAS_TOKEN);
        fake.extend_from_slice(&[9u8; NONCE_BYTES]);
        fake.extend_from_slice(&[0u8; MAC_BYTES]);
        attacker.write_all(&fake).unwrap();
        let mut seen = Vec::new();
        attacker.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let _ = attacker.read_to_end(&mut seen);
        assert!(matches!(listening.join().unwrap(), Err(TransportError::Unauthorized { .. })));
        assert!(seen.len() <= 8 + 1 + NONCE_BYTES + MAC_BYTES, "{} B", seen.len());
        assert!(!seen.windows(token.len()).any(|w| w == token), "the token was sent");
    }
}
