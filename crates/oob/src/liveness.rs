//! The out-of-band socket as a liveness signal once a connection is up: a side that closes on
//! purpose sends [`GOODBYE`] first, so its peer can tell a clean close (logged quietly) from a
//! process that vanished (a warning).

use std::io::{ErrorKind, Write};
use std::net::TcpStream;

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
    /// failed. Stray bytes end the connection too, but say nothing of what the peer's process
    /// still does (over shared memory it may still write what was exposed to it).
    pub stopped: bool,
}

impl PeerLoss {
    /// A loss this side detected itself (a failed operation): nothing says the peer stopped.
    pub fn failure(why: String) -> PeerLoss {
        PeerLoss { why, clean: false, stopped: false }
    }
}

/// Tells the peer this side closes on purpose. Best effort: a peer that already left, or a
/// full socket buffer, loses nothing it needs.
pub fn say_goodbye(stream: &TcpStream) {
    let _ = (&*stream).write(&[GOODBYE]);
}

/// `Some(loss)` when the (non-blocking) out-of-band socket says the peer is gone: it said
/// goodbye, closed without one, sent bytes the protocol does not allow, or the socket failed.
pub fn peer_left(stream: &TcpStream) -> Option<PeerLoss> {
    let mut byte = [0u8; 1];
    let (why, clean, stopped) = match stream.peek(&mut byte) {
        Ok(0) => {
            ("the peer's process vanished (its socket closed without a goodbye)".to_string(), false, true)
        }
        Ok(_) if byte[0] == GOODBYE => ("the peer closed the connection".to_string(), true, true),
        Ok(_) => ("the peer sent unexpected bytes on the out-of-band socket".to_string(), false, false),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => return None,
        // A reset is the peer's kernel closing its socket (it closed with our bytes unread, or
        // its process ended). Any other error counts as a stop too: reading it clears it, and
        // the next look at the socket (ours or a clone's) reads the end of the stream.
        Err(e) => (format!("out-of-band socket failed: {e}"), false, true),
    };
    Some(PeerLoss { why, clean, stopped })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let dialed = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        accepted.set_nonblocking(true).unwrap();
        (dialed, accepted)
    }

    #[test]
    fn a_goodbye_is_a_clean_close_and_silence_is_not() {
        let (ours, theirs) = pair();
        assert_eq!(peer_left(&theirs), None, "a live, silent peer is present");
        say_goodbye(&ours);
        drop(ours);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(peer_left(&theirs).is_some_and(|loss| loss.clean && loss.stopped));

        let (ours, theirs) = pair();
        drop(ours);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let loss = peer_left(&theirs).unwrap();
        assert!(!loss.clean && loss.stopped && loss.why.contains("vanished"), "{loss:?}");

        let (mut ours, theirs) = pair();
        ours.write_all(b"x").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let loss = peer_left(&theirs).unwrap();
        assert!(
            !loss.clean && !loss.stopped,
            "stray bytes say nothing of what the peer still does: {loss:?}"
        );
    }
}
