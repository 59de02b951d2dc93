//! The out-of-band socket as a liveness signal once a connection is up: a side that closes on
//! purpose sends [`GOODBYE`] first, so its peer can tell a clean close (logged quietly) from a
//! process that vanished (a warning). The [`ControlChannel`](crate::ControlChannel) reads it.

/// The one byte a side sends on the out-of-band socket when it closes on purpose.
pub const GOODBYE: u8 = 0xb7;

/// Why the peer is gone, as read from the out-of-band socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLoss {
    /// A sentence for logs and errors.
    pub why: String,
    /// The peer said [`GOODBYE`]: it closed on purpose, nothing went wrong.
    pub clean: bool,
    /// The peer has stopped using the connection: it said goodbye, or its socket closed or
    /// failed. A breach of the protocol ends the connection too, but says nothing of what the
    /// peer's process still does (over shared memory it may still write what was exposed to it).
    pub stopped: bool,
}

impl PeerLoss {
    /// A loss this side detected itself (a failed operation, a breach of the protocol): nothing
    /// says the peer stopped.
    pub fn failure(why: String) -> PeerLoss {
        PeerLoss { why, clean: false, stopped: false }
    }
}
