//! # rdma-hint-oob
//!
//! The out-of-band (OOB) TCP exchange that sets up every rdma-hint connection: one side
//! binds a [`Listener`] (loopback unless told otherwise), the other [`dial`]s, both with deadlines; each
//! sends one hello and decodes the peer's with a [`WireReader`] that bounds every length it
//! reads. An optional pre-shared [`Token`] is compared in constant time. Backends keep the
//! socket open after the exchange as a liveness signal: its EOF means the peer process is gone.
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

mod codec;
mod connect;
mod liveness;
mod token;

pub use codec::{handshake_error, WireReader, WireWriter};
pub use connect::{confirm, dial, prepare, Listener, Rendezvous, REFUSED_GRACE};
pub use liveness::{peer_left, say_goodbye, PeerLoss, GOODBYE};
pub use token::{admit, swap_hellos, Token, MAX_TOKEN_BYTES};
