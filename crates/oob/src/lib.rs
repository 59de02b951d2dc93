//! # rdma-hint-oob
//!
//! The out-of-band (OOB) TCP exchange that sets up every rdma-hint connection: one side
//! binds a [`Listener`] (loopback unless told otherwise), the other [`dial`]s, both with deadlines; each
//! [`authenticate`]s first (an optional pre-shared [`Token`] proven by HMAC over fresh nonces,
//! never sent), then sends one hello and decodes the peer's with a [`WireReader`] that bounds
//! every length it reads. Backends keep the socket open after the exchange as their
//! [`ControlChannel`]: regions exposed and withdrawn after connect travel on it as [`Control`]
//! frames, a [`GOODBYE`] byte means the peer closed on purpose, EOF that its process is gone.
//!
//! ```
//! use rdma_hint_oob::{dial, Listener};
//! use std::time::{Duration, Instant};
//!
//! let deadline = Instant::now() + Duration::from_secs(5);
//! let listener = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
//! let address = listener.local_addr();
//! let dialer = std::thread::spawn(move || dial(address, deadline).unwrap());
//! let accepted = listener.accept(deadline).unwrap();
//! let dialed = dialer.join().unwrap();
//! assert_eq!(accepted.peer_addr().unwrap(), dialed.local_addr().unwrap());
//! ```
#![forbid(unsafe_code)]

mod auth;
mod channel;
mod codec;
mod connect;
mod control;
mod exposing;
mod hello;
mod listener;
mod liveness;
mod token;

pub use auth::{authenticate, authenticate_by, Role, AUTH_MAGIC};
pub use channel::{ControlChannel, MAX_OUTSTANDING};
pub use codec::{
    handshake_error, put_preamble, put_prefixed_u16, put_prefixed_u8, truncated, Deadlined, WireReader,
};
pub use connect::{
    confirm, dial, prepare, Rendezvous, HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES, REFUSED_GRACE,
};
pub use control::{Control, ControlReader, Refusal, MAX_CONTROL_BODY};
pub use exposing::Asking;
pub use hello::{
    Backend, Hello, HelloLimits, RegionDescriptor, HELLO_MAGIC, MAX_REFUSAL_BYTES, MAX_REGION_ID,
    REFUSAL_MAGIC, WIRE_VERSION,
};
pub use listener::{BusyGuard, Listener};
pub use liveness::{PeerLoss, GOODBYE};
pub use token::{Token, MAX_TOKEN_BYTES};

#[doc(hidden)]
pub use rdma_hint_core::TransportError as __TransportError;

/// A transport whose peers must prove a pre-shared token; what [`token_setters!`] implements.
/// Generic code (the facade's `open`) applies options through it.
pub trait Gated: Sized {
    /// See the backend's inherent `with_token`.
    fn with_token(self, token: &[u8]) -> Result<Self, rdma_hint_core::TransportError>;
    /// See the backend's inherent `allow_unauthenticated_remote`.
    fn allow_unauthenticated_remote(self) -> Self;
    /// See the backend's inherent `with_listener`.
    fn with_listener(
        self,
        listener: std::sync::Arc<Listener>,
    ) -> Result<Self, rdma_hint_core::TransportError>;
}

/// The token setters of a transport that meets its peer through a [`Rendezvous`] in its field
/// `rendezvous`; `$hello` says what its hello carries (what the token protects).
///
/// ```
/// use rdma_hint_oob::Rendezvous;
/// struct Example { rendezvous: Rendezvous }
/// rdma_hint_oob::token_setters!(Example, "nothing here");
/// let example = Example { rendezvous: Rendezvous::default() }.with_token(b"a cluster's token").unwrap();
/// assert!(example.rendezvous.has_token());
/// assert!(Example { rendezvous: Rendezvous::default() }.with_token(b"").is_err());
/// ```
#[macro_export]
macro_rules! token_setters {
    ($transport:ty, $hello:literal) => {
        impl $transport {
            #[doc = concat!(
                "Requires the peer to prove it holds `token` (1…64 bytes, pre-shared out of band) ",
                "before any hello (", $hello, ") is exchanged, and proves it in turn; the token never ",
                "crosses the wire (see [`rdma_hint_oob::authenticate`]). A refused peer is logged ",
                "with its address."
            )]
            pub fn with_token(mut self, token: &[u8]) -> Result<Self, $crate::__TransportError> {
                self.rendezvous.set_token($crate::Token::new(token)?);
                Ok(self)
            }

            /// Lets [`Transport::bind`](rdma_hint_core::Transport::bind) listen on a
            /// non-loopback address without a token (refused otherwise): anyone who reaches it
            /// may connect and write into the exposed regions.
            pub fn allow_unauthenticated_remote(mut self) -> Self {
                self.rendezvous.allow_unauthenticated_remote();
                self
            }

            /// Accepts its peer on `listener` (bound by the caller, kept across transports so
            /// that a server serving peers one after another holds its port throughout)
            /// instead of binding its own; the address rule of
            /// [`allow_unauthenticated_remote`](Self::allow_unauthenticated_remote) applies, so
            /// set the token first.
            pub fn with_listener(
                self,
                listener: std::sync::Arc<$crate::Listener>,
            ) -> Result<Self, $crate::__TransportError> {
                self.rendezvous.share_listener(listener)?;
                Ok(self)
            }
        }

        impl $crate::Gated for $transport {
            fn with_token(self, token: &[u8]) -> Result<Self, $crate::__TransportError> {
                <$transport>::with_token(self, token)
            }

            fn allow_unauthenticated_remote(self) -> Self {
                <$transport>::allow_unauthenticated_remote(self)
            }

            fn with_listener(
                self,
                listener: std::sync::Arc<$crate::Listener>,
            ) -> Result<Self, $crate::__TransportError> {
                <$transport>::with_listener(self, listener)
            }
        }
    };
}
