//! Establishing the OOB TCP connection within a deadline.

use rdma_hint_core::wait::off_thread;
use rdma_hint_core::{PeerEndpoint, TransportError};
use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How a transport meets its peer: an optional listener bound ahead of time (so the peer can be
/// told the port before `connect`), then one stream per connect, dialled or accepted, and the
/// hello exchange on it, on a thread of its own ([`Rendezvous::meet`]).
#[derive(Debug, Default)]
pub struct Rendezvous {
    listener: Mutex<Option<Listener>>,
}

impl Rendezvous {
    /// Binds the listener now (port 0 picks a free port) and returns its address.
    pub fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        let listener = Listener::bind(address)?;
        let bound = listener.local_addr();
        *self.listener.lock().unwrap_or_else(PoisonError::into_inner) = Some(listener);
        Ok(bound)
    }

    /// Dials the peer, or accepts it on the listener bound by [`Rendezvous::bind`] (binding
    /// `address` now if none was), within `deadline`, with the stream [`prepare`]d; then runs
    /// `exchange` on it (send this side's hello, decode and admit the peer's). All on a thread of
    /// its own: the awaiting task's thread never
    /// blocks, and two `meet`s joined in one task (listening and dialling) both progress.
    ///
    /// ```
    /// use rdma_hint_core::{blocking::block_on, PeerEndpoint, TransportError};
    /// use rdma_hint_oob::Rendezvous;
    /// use std::io::{Read, Write};
    /// use std::time::{Duration, Instant};
    ///
    /// let deadline = Instant::now() + Duration::from_secs(5);
    /// let (listening, dialling) = (Rendezvous::default(), Rendezvous::default());
    /// let address = listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    /// let hello = |stream: &mut std::net::TcpStream| -> Result<[u8; 2], TransportError> {
    ///     stream.write_all(b"hi")?;
    ///     let mut theirs = [0u8; 2];
    ///     stream.read_exact(&mut theirs)?;
    ///     Ok(theirs)
    /// };
    /// let accepting = std::thread::spawn(move || {
    ///     block_on(listening.meet(PeerEndpoint::Listen(address), deadline, hello))
    /// });
    /// let dialled = block_on(dialling.meet(PeerEndpoint::Dial(address), deadline, hello));
    /// let accepted = accepting.join().unwrap();
    /// assert_eq!(&accepted.unwrap().1, b"hi");
    /// assert_eq!(&dialled.unwrap().1, b"hi");
    /// ```
    pub async fn meet<R, F>(
        &self,
        peer: PeerEndpoint,
        deadline: Instant,
        exchange: F,
    ) -> Result<(TcpStream, R), TransportError>
    where
        R: Send + 'static,
        F: FnOnce(&mut TcpStream) -> Result<R, TransportError> + Send + 'static,
    {
        let listener = self.listener_for(peer)?;
        off_thread("oob", move || {
            let mut stream = establish(peer, listener, deadline)?;
            let theirs = exchange(&mut stream)?;
            Ok((stream, theirs))
        })
        .await?
    }

    /// The listener a `Listen` connect accepts on (bound now if [`Rendezvous::bind`] was not called).
    fn listener_for(&self, peer: PeerEndpoint) -> Result<Option<Listener>, TransportError> {
        match peer {
            PeerEndpoint::Dial(_) => Ok(None),
            PeerEndpoint::Listen(address) => {
                match self.listener.lock().unwrap_or_else(PoisonError::into_inner).take() {
                    Some(listener) => Ok(Some(listener)),
                    None => Listener::bind(address).map(Some),
                }
            }
        }
    }
}

fn establish(
    peer: PeerEndpoint,
    listener: Option<Listener>,
    deadline: Instant,
) -> Result<TcpStream, TransportError> {
    let stream = match (peer, listener) {
        (PeerEndpoint::Listen(_), Some(listener)) => listener.accept(deadline)?,
        (PeerEndpoint::Listen(address), None) => Listener::bind(address)?.accept(deadline)?,
        (PeerEndpoint::Dial(address), _) => dial(address, deadline)?,
    };
    prepare(&stream, deadline)?;
    Ok(stream)
}

/// A bound OOB listener. Bind it before telling the peer where to dial, then [`accept`](Listener::accept).
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
    address: SocketAddr,
}

impl Listener {
    /// Binds `address` (port 0 picks a free port).
    pub fn bind(address: SocketAddr) -> Result<Listener, TransportError> {
        let inner = TcpListener::bind(address)?;
        let address = inner.local_addr()?;
        inner.set_nonblocking(true)?;
        Ok(Listener { inner, address })
    }

    /// The bound address (with the port the kernel picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Waits for one peer until `deadline`; the returned stream is blocking.
    pub fn accept(&self, deadline: Instant) -> Result<TcpStream, TransportError> {
        let started = Instant::now();
        loop {
            match self.inner.accept() {
                Ok((stream, peer)) => {
                    tracing::debug!(%peer, "oob: accepted");
                    stream.set_nonblocking(false)?;
                    return Ok(stream);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(TransportError::DeadlineExceeded {
                            what: "a peer to connect",
                            waited_ms: started.elapsed().as_millis() as u64,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// How long [`dial`] keeps retrying an address that refuses every attempt before it answers
/// [`TransportError::Refused`]: long enough for a peer that is starting, short enough that a
/// wrong address or port fails fast. A caller whose peer may start later retries on `Refused`.
pub const REFUSED_GRACE: Duration = Duration::from_secs(3);

/// Dials `address` until it accepts or `deadline` passes (the peer may still be starting). An
/// address that refused every attempt for [`REFUSED_GRACE`] (or until the deadline, if that is
/// sooner) is [`TransportError::Refused`].
pub fn dial(address: SocketAddr, deadline: Instant) -> Result<TcpStream, TransportError> {
    let started = Instant::now();
    let mut refused_since: Option<Instant> = None;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let refused_too_long = refused_since.is_some_and(|since| since.elapsed() >= REFUSED_GRACE);
        if remaining.is_zero() || refused_too_long {
            if refused_since.is_some() {
                return Err(TransportError::Refused { address });
            }
            return Err(TransportError::DeadlineExceeded {
                what: "the peer to accept",
                waited_ms: started.elapsed().as_millis() as u64,
            });
        }
        match TcpStream::connect_timeout(&address, remaining) {
            Ok(stream) => return Ok(stream),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                refused_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(20).min(remaining))
            }
            Err(e) if e.kind() == ErrorKind::TimedOut => refused_since = None,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Bounds the stream's reads and writes by `deadline` and turns off Nagle, for the exchange.
pub fn prepare(stream: &TcpStream, deadline: Instant) -> Result<(), TransportError> {
    let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    stream.set_read_timeout(Some(remaining))?;
    stream.set_write_timeout(Some(remaining))?;
    stream.set_nodelay(true)?;
    Ok(())
}

/// The last step of an exchange: send `ready`, then expect the peer's same byte. A peer that
/// rejected our hello closes instead, which becomes a [`TransportError::Handshake`] saying so.
pub fn confirm(stream: &mut TcpStream, ready: u8) -> Result<(), TransportError> {
    stream.write_all(&[ready])?;
    let mut byte = [0u8; 1];
    match crate::WireReader::new(&mut *stream).exact(&mut byte) {
        Ok(()) if byte[0] == ready => Ok(()),
        Ok(()) => Err(TransportError::Handshake(format!(
            "expected the ready byte {ready:#04x}, got {:#04x}",
            byte[0]
        ))),
        Err(TransportError::PeerGone(_)) => Err(TransportError::Handshake(
            "the peer closed the connection instead of confirming: it rejected our hello".into(),
        )),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_and_dial_honour_their_deadlines() {
        let listener = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let started = Instant::now();
        let err = listener.accept(Instant::now() + Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, TransportError::DeadlineExceeded { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let port = listener.local_addr().port();
        drop(listener);
        let err = dial(SocketAddr::from(([127, 0, 0, 1], port)), Instant::now() + Duration::from_millis(100))
            .unwrap_err();
        assert!(matches!(err, TransportError::Refused { .. }), "{err}");
        let started = Instant::now();
        let err = dial(SocketAddr::from(([127, 0, 0, 1], port)), Instant::now() + Duration::from_secs(60))
            .unwrap_err();
        assert!(matches!(err, TransportError::Refused { .. }), "{err}");
        assert!(
            started.elapsed() < REFUSED_GRACE + Duration::from_secs(5),
            "refused fails fast, not at the deadline"
        );
    }
}
