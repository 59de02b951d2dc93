//! The bound out-of-band listener, and the authenticated candidates it holds between the
//! connects of one lane group.

use rdma_hint_core::TransportError;
use std::any::Any;
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Authenticated candidates a listener holds at once for the connects of lane groups (a group
/// needs at most its lanes less one); more push the oldest out. Each needs the token, so only
/// an insider can fill it, and each holds a socket and a decoded hello (a UCX hello with every
/// region's key is megabytes).
const MAX_PARKED: usize = 16;

/// A candidate that authenticated and sent a hello that decoded, waiting for a connect of
/// its lane group to take it: the connect that accepted it had already picked another.
struct Parked {
    group: u64,
    since: Instant,
    candidate: Box<dyn Any + Send>,
}

/// A bound OOB listener. Bind it before telling the peer where to dial, then [`accept`](Listener::accept).
pub struct Listener {
    inner: TcpListener,
    address: SocketAddr,
    /// Whether a connect on it turns everyone else away from the moment it picked its peer
    /// ([`Listener::serve_one_at_a_time`]).
    one_at_a_time: AtomicBool,
    /// Candidates the connects of one lane group hand each other: the lanes of a connection
    /// accept on one listener at once, and a candidate one lane's connect authenticated after
    /// it had picked its own is another lane's peer, not a stray to drop.
    parked: Mutex<VecDeque<Parked>>,
    /// Handshakes under way on connections it accepted, whichever connect's loop accepted them.
    handshakes: Arc<AtomicUsize>,
}

/// One handshake under way on a listener's connection, counted until dropped.
pub(crate) struct Handshaking(Arc<AtomicUsize>);

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("address", &self.address).finish_non_exhaustive()
    }
}

impl Listener {
    /// Binds `address` (port 0 picks a free port).
    pub fn bind(address: SocketAddr) -> Result<Listener, TransportError> {
        let inner = TcpListener::bind(address)?;
        let address = inner.local_addr()?;
        inner.set_nonblocking(true)?;
        Ok(Listener {
            inner,
            address,
            one_at_a_time: AtomicBool::new(false),
            parked: Mutex::default(),
            handshakes: Arc::default(),
        })
    }

    /// Handshakes under way on this listener's connections.
    pub(crate) fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::Acquire)
    }

    /// Counts one more handshake under way, until the returned guard is dropped.
    pub(crate) fn handshaking(&self) -> Handshaking {
        self.handshakes.fetch_add(1, Ordering::AcqRel);
        Handshaking(self.handshakes.clone())
    }

    /// Whether [`Listener::serve_one_at_a_time`] was called.
    pub(crate) fn serves_one_at_a_time(&self) -> bool {
        self.one_at_a_time.load(Ordering::Acquire)
    }

    /// Holds `candidate`, authenticated and decoded by a connect of lane group `group`, for
    /// the next connect of that group to [take](Listener::take_parked); it is dropped (its
    /// peer sees the connection close) after [`HANDSHAKE_TIMEOUT`](crate::HANDSHAKE_TIMEOUT) untaken.
    pub(crate) fn park<T: Send + 'static>(&self, group: u64, candidate: T) {
        let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
        expire(&mut parked);
        if parked.len() >= MAX_PARKED {
            parked.pop_front();
            tracing::warn!(
                "oob: {MAX_PARKED} authenticated peers wait on this listener; the oldest was dropped"
            );
        }
        parked.push_back(Parked { group, since: Instant::now(), candidate: Box::new(candidate) });
    }

    /// Drops what `group` parked: its last accepting connect has ended, and nobody will take
    /// them (their peers hear the close now, not at their deadline).
    pub(crate) fn drop_parked(&self, group: u64) {
        let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
        parked.retain(|p| p.group != group);
    }

    /// Drops what `group` parked with type `T` that `unwanted` says no connect will take.
    pub(crate) fn drop_parked_where<T: Send + 'static>(&self, group: u64, unwanted: impl Fn(&T) -> bool) {
        let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
        parked.retain(|p| p.group != group || !p.candidate.downcast_ref::<T>().is_some_and(&unwanted));
    }

    /// The oldest candidate a connect of `group` parked with type `T` that `wanted` accepts,
    /// if any.
    pub(crate) fn take_parked<T: Send + 'static>(
        &self,
        group: u64,
        wanted: impl Fn(&T) -> bool,
    ) -> Option<T> {
        let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
        expire(&mut parked);
        let at = parked
            .iter()
            .position(|p| p.group == group && p.candidate.downcast_ref::<T>().is_some_and(&wanted))?;
        let taken = parked.remove(at)?;
        taken.candidate.downcast::<T>().ok().map(|candidate| *candidate)
    }

    /// For a server that serves one peer at a time on this listener: from the moment a
    /// connect has picked its authenticated peer until the connect returns (the rest of the
    /// handshake, a shm hand-off), anyone else who dials is told at once that the listener is
    /// busy ([`Listener::turn_away_while_busy`]), instead of waiting in the backlog while
    /// that peer takes its time. The server arms its own guard once the connect returns.
    pub fn serve_one_at_a_time(&self) {
        self.one_at_a_time.store(true, Ordering::Release);
    }

    /// The bound address (with the port the kernel picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Waits for one peer until `deadline`; the returned stream is blocking.
    pub fn accept(&self, deadline: Instant) -> Result<TcpStream, TransportError> {
        let started = Instant::now();
        loop {
            if let Some(stream) = self.try_accept()? {
                return Ok(stream);
            }
            if Instant::now() >= deadline {
                return Err(TransportError::DeadlineExceeded {
                    what: "a peer to connect",
                    waited_ms: started.elapsed().as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Turns away every connection that arrives until the guard is dropped, each told the
    /// listener is busy ([`TransportError::PeerBusy`] on its side, at once) instead of
    /// waiting in the backlog, unanswered, until its deadline. For a server that serves one
    /// peer at a time on a shared listener, while it serves one.
    ///
    /// ```
    /// use rdma_hint_oob::{authenticate, Listener, Role};
    /// use rdma_hint_core::TransportError;
    /// use std::sync::Arc;
    /// let listener = Arc::new(Listener::bind("127.0.0.1:0".parse().unwrap())?);
    /// let busy = listener.turn_away_while_busy();
    /// let mut late = std::net::TcpStream::connect(listener.local_addr())?;
    /// assert!(matches!(authenticate(&mut late, None, Role::Dialer), Err(TransportError::PeerBusy { .. })));
    /// drop(busy); // from here on, connections wait to be accepted again
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn turn_away_while_busy(self: &Arc<Self>) -> BusyGuard {
        let stop = Arc::new(AtomicBool::new(false));
        let (listener, stopped) = (self.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("oob-busy".into())
            .spawn(move || listener.turn_away_until(&stopped))
            .inspect_err(|e| tracing::warn!(error = %e, "oob: no thread to turn peers away; they wait"))
            .ok();
        BusyGuard { stop, thread }
    }

    fn turn_away_until(&self, stop: &AtomicBool) {
        // Turned-away streams, read until the peer closes (closing with its preamble unread
        // would reset the connection, and a reset can overtake the busy preamble), at most
        // for a moment and at most so many at once.
        const DRAINING: usize = 256;
        const LINGER: Duration = Duration::from_millis(200);
        let mut draining: VecDeque<(TcpStream, Instant)> = VecDeque::new();
        let mut scratch = [0u8; 256];
        while !stop.load(Ordering::Acquire) {
            for _ in 0..64 {
                let Ok(Some(stream)) = self.try_accept() else { break };
                let _ = stream.set_nonblocking(true);
                let _ = (&stream).write_all(&crate::auth::busy_preamble());
                let _ = stream.shutdown(std::net::Shutdown::Write);
                if draining.len() >= DRAINING {
                    draining.pop_front();
                }
                draining.push_back((stream, Instant::now()));
            }
            draining.retain(|(stream, since)| {
                let open = loop {
                    match (&*stream).read(&mut scratch) {
                        Ok(0) => break false,
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break true,
                        Err(_) => break false,
                    }
                };
                open && since.elapsed() < LINGER
            });
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// One pending connection (blocking), or `None` if nobody is waiting.
    pub(crate) fn try_accept(&self) -> Result<Option<TcpStream>, TransportError> {
        match self.inner.accept() {
            Ok((stream, peer)) => {
                tracing::debug!(%peer, "oob: accepted");
                stream.set_nonblocking(false)?;
                Ok(Some(stream))
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(None),
            // A connection reset before we took it is the peer's business, not the listener's.
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset) => {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// While alive, its listener turns every new connection away as busy
/// ([`Listener::turn_away_while_busy`]).
#[derive(Debug)]
pub struct BusyGuard {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Drops the candidates parked longer than a handshake may take.
fn expire(parked: &mut VecDeque<Parked>) {
    parked.retain(|p| p.since.elapsed() < crate::HANDSHAKE_TIMEOUT);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_candidates_are_bounded_kept_apart_by_group_and_type_and_dropped_with_their_group() {
        let listener = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        // More than the bound: the oldest go first.
        for k in 0..MAX_PARKED as u32 + 4 {
            listener.park(1, k);
        }
        listener.park(2, 99u32);
        listener.park(1, "another type");
        // Another group's, or another type's, is never taken.
        assert_eq!(listener.take_parked::<u64>(1, |_| true), None);
        assert_eq!(listener.take_parked::<u32>(3, |_| true), None);
        assert_eq!(listener.take_parked::<&str>(1, |_| true), Some("another type"));
        // The bound held (the 4 oldest and then the next 2 pushed out), and the rest come
        // oldest first.
        let mine: Vec<u32> = std::iter::from_fn(|| listener.take_parked::<u32>(1, |_| true)).collect();
        assert_eq!(mine, (6..MAX_PARKED as u32 + 4).collect::<Vec<_>>());
        listener.park(1, 7u32);
        listener.drop_parked(1);
        assert_eq!(listener.take_parked::<u32>(1, |_| true), None, "dropped with its group");
        assert_eq!(listener.take_parked::<u32>(2, |_| true), Some(99), "another group's stays");
    }
}
