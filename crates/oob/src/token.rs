//! Pre-shared tokens, compared in constant time.

use rdma_hint_core::TransportError;

/// Longest pre-shared token, in bytes.
pub const MAX_TOKEN_BYTES: usize = 64;

/// A pre-shared secret (1…64 bytes) both sides prove they hold (see [`authenticate`](crate::authenticate)).
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

    /// The token's bytes (the HMAC key; never sent).
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
