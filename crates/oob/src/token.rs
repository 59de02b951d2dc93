//! Pre-shared tokens, compared in constant time.

use rdma_hint_core::TransportError;

/// Longest pre-shared token, in bytes.
pub const MAX_TOKEN_BYTES: usize = 64;

/// A pre-shared secret (1…64 bytes) both sides present in their hello.
///
/// ```
/// use rdma_hint_oob::Token;
/// let token = Token::new(b"secret").unwrap();
/// assert!(token.matches(b"secret"));
/// assert!(!token.matches(b"secreT"));
/// assert!(!token.matches(b"secret!"));
/// assert!(Token::new(b"").is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({} B, redacted)", self.0.len())
    }
}

impl Token {
    /// Checks the length (1…[`MAX_TOKEN_BYTES`]).
    pub fn new(bytes: &[u8]) -> Result<Token, TransportError> {
        if bytes.is_empty() || bytes.len() > MAX_TOKEN_BYTES {
            return Err(TransportError::InvalidArgument {
                what: "token",
                why: format!("a token has 1…{MAX_TOKEN_BYTES} bytes, this one {}", bytes.len()),
            });
        }
        Ok(Token(bytes.to_vec()))
    }

    /// The token's bytes, to send.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether `presented` equals this token. Takes the same time for every presented value of
    /// a given length, so a peer cannot guess the token byte by byte.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let expected = &self.0;
        let mut difference = presented.len() ^ expected.len();
        for (index, byte) in expected.iter().enumerate() {
            difference |= usize::from(byte ^ presented.get(index).copied().unwrap_or(!byte));
        }
        difference == 0
    }
}

/// Admits a peer that presented `presented` when this side expects `expected` (no token
/// configured: everyone). A refusal is logged with the peer's address and is a
/// [`TransportError::Unauthorized`].
pub fn admit(expected: Option<&Token>, presented: &[u8], peer: &str) -> Result<(), TransportError> {
    match expected {
        Some(token) if !token.matches(presented) => {
            tracing::warn!(%peer, "rejected peer (wrong or missing token)");
            Err(TransportError::Unauthorized { peer: peer.to_string() })
        }
        _ => Ok(()),
    }
}

/// Sends `ours` (an encoded hello), decodes the peer's with `decode` and admits it by the token
/// `presented` takes from it. A hello that does not decode, or a wrong token, is logged with
/// the peer's address under `backend` and is the error.
pub fn swap_hellos<H>(
    stream: &mut std::net::TcpStream,
    ours: &[u8],
    decode: impl FnOnce(&mut std::net::TcpStream) -> Result<H, TransportError>,
    expected: Option<&Token>,
    presented: impl FnOnce(&H) -> &[u8],
    backend: &'static str,
) -> Result<H, TransportError> {
    use std::io::Write;
    stream.write_all(ours)?;
    let peer = stream.peer_addr().map_or_else(|_| "unknown".to_string(), |a| a.to_string());
    let hello = decode(stream).inspect_err(|e| {
        tracing::warn!(%peer, error = %e, backend, "rejected peer (hello)");
    })?;
    admit(expected, presented(&hello), &peer)?;
    Ok(hello)
}
