//! Establishing the OOB TCP connection within a deadline.

use crate::auth::{authenticate_by, Role};
use crate::codec::Deadlined;
use crate::token::Token;
use rdma_hint_backend_core::wait::off_thread;
use rdma_hint_core::{PeerEndpoint, TransportError};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an accepted connection may take to authenticate and send its hello before it is
/// dropped: a silent or slow connection never holds a listener for the connect's deadline.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Accepted connections authenticating at once; more are closed at once until one finishes.
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// Connections one pass of the accept loop takes before it looks at finished handshakes.
const ACCEPTS_PER_PASS: usize = 32;

/// How a transport meets its peer: an optional listener bound ahead of time (so the peer can be
/// told the port before `connect`), then per connect the stream, dialled or accepted,
/// [`authenticate`](crate::authenticate)d, and the hellos exchanged, on a thread of its own ([`Rendezvous::meet`]).
///
/// A listener on an address other than loopback needs a token, unless
/// [`Rendezvous::allow_unauthenticated_remote`] says otherwise.
#[derive(Debug, Default)]
pub struct Rendezvous {
    listener: Mutex<Option<Arc<Listener>>>,
    /// A listener the caller bound and shares with other transports (never replaced).
    shared: Mutex<Option<Arc<Listener>>>,
    token: Option<Token>,
    unauthenticated_remote: bool,
}

impl Rendezvous {
    /// A rendezvous for another lane of the same connection: the same token and remote
    /// policy, no listener (each lane binds or dials its own).
    pub fn for_lane(&self) -> Rendezvous {
        Rendezvous {
            token: self.token.clone(),
            unauthenticated_remote: self.unauthenticated_remote,
            ..Rendezvous::default()
        }
    }

    /// Peers must prove they hold `token` (and this side proves it too), see [`authenticate`](crate::authenticate).
    pub fn set_token(&mut self, token: Token) {
        self.token = Some(token);
    }

    /// Whether peers must prove a token.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Lets this side listen on a non-loopback address without a token: anyone who can reach
    /// it may then connect and write into the regions it exposes.
    pub fn allow_unauthenticated_remote(&mut self) {
        self.unauthenticated_remote = true;
    }

    /// Binds the listener now (port 0 picks a free port) and returns its address. With a
    /// [shared listener](Rendezvous::share_listener), returns that one's address when `address`
    /// names it (or asks for any port on its IP) and refuses any other.
    pub fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(shared) = shared {
            let bound = shared.local_addr();
            return if address == bound || (address.port() == 0 && address.ip() == bound.ip()) {
                Ok(bound)
            } else {
                Err(TransportError::InvalidArgument {
                    what: "listen address",
                    why: format!("{address}: this transport accepts on the shared listener at {bound}"),
                })
            };
        }
        let listener = self.new_listener(address)?;
        let bound = listener.local_addr();
        *self.listener.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(listener));
        Ok(bound)
    }

    /// Accepts on `listener`, bound by the caller and shared with other transports (a server
    /// that serves peers one after another keeps one port), instead of binding one of its own.
    /// The address rule of [`Rendezvous::bind`] applies: set the token first.
    pub fn share_listener(&self, listener: Arc<Listener>) -> Result<(), TransportError> {
        self.check_listen_address(listener.local_addr())?;
        *self.shared.lock().unwrap_or_else(PoisonError::into_inner) = Some(listener);
        Ok(())
    }

    fn check_listen_address(&self, address: SocketAddr) -> Result<(), TransportError> {
        if !address.ip().is_loopback() && self.token.is_none() && !self.unauthenticated_remote {
            return Err(TransportError::InvalidArgument {
                what: "listen address",
                why: format!(
                    "{address} is reachable from other hosts: set a token, or allow unauthenticated peers explicitly"
                ),
            });
        }
        Ok(())
    }

    fn new_listener(&self, address: SocketAddr) -> Result<Listener, TransportError> {
        self.check_listen_address(address)?;
        Listener::bind(address)
    }

    /// Meets the peer within `deadline`, all on a thread of its own (the awaiting task's thread
    /// never blocks, and two `meet`s joined in one task both progress): `hello` builds this
    /// side's hello and the set-up to run after it; then it dials the peer, or accepts on the
    /// listener bound by [`Rendezvous::bind`] (binding the address now if none was);
    /// [`authenticate`](crate::authenticate)s; sends the hello and reads the peer's with `decode`; then runs the
    /// set-up with the decoded hello.
    ///
    /// A listener authenticates every connection it accepts concurrently, each within
    /// [`HANDSHAKE_TIMEOUT`], and takes the first whose hello decodes; the others (silent,
    /// garbage, wrong token) are logged and dropped, and only if none succeeded by the
    /// deadline is the last one's error returned.
    ///
    /// ```
    /// use rdma_hint_core::{PeerEndpoint, TransportError};
    /// use rdma_hint_backend_core::blocking::block_on;
    /// use rdma_hint_oob::Rendezvous;
    /// use std::io::Read;
    /// use std::time::{Duration, Instant};
    ///
    /// let deadline = Instant::now() + Duration::from_secs(5);
    /// let (listening, dialling) = (Rendezvous::default(), Rendezvous::default());
    /// let address = listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    /// let decode = |stream: &mut dyn Read| -> Result<[u8; 2], TransportError> {
    ///     let mut theirs = [0u8; 2];
    ///     stream.read_exact(&mut theirs)?;
    ///     Ok(theirs)
    /// };
    /// let hello = |ours: &'static [u8]| {
    ///     move || Ok((ours.to_vec(), |_: &mut std::net::TcpStream, theirs: [u8; 2]| Ok(theirs)))
    /// };
    /// let accepting = std::thread::spawn(move || {
    ///     block_on(listening.meet(PeerEndpoint::Listen(address), deadline, hello(b"hi"), decode))
    /// });
    /// let dialled = block_on(dialling.meet(PeerEndpoint::Dial(address), deadline, hello(b"yo"), decode));
    /// assert_eq!(&accepting.join().unwrap().unwrap().1, b"yo");
    /// assert_eq!(&dialled.unwrap().1, b"hi");
    /// ```
    pub async fn meet<H, R, P, S, D>(
        &self,
        peer: PeerEndpoint,
        deadline: Instant,
        hello: P,
        decode: D,
    ) -> Result<(TcpStream, R), TransportError>
    where
        H: Send + 'static,
        R: Send + 'static,
        P: FnOnce() -> Result<(Vec<u8>, S), TransportError> + Send + 'static,
        S: FnOnce(&mut TcpStream, H) -> Result<R, TransportError>,
        D: Fn(&mut dyn Read) -> Result<H, TransportError> + Send + Sync + 'static,
    {
        let listener = self.listener_for(peer)?;
        let token = self.token.clone();
        off_thread("oob", "the connection's handshake", deadline, move || {
            let (ours, setup) = hello()?;
            let hello = Arc::new(Greeting { token, ours, decode });
            // Held until the setup below is done (a listener serving one peer at a time).
            let mut busy = None;
            let (mut stream, theirs) = match (peer, listener) {
                (PeerEndpoint::Dial(address), _) => {
                    let stream = dial(address, deadline)?;
                    prepare(&stream, deadline)?;
                    let theirs = hello.greet(&stream, Role::Dialer, deadline)?;
                    (stream, theirs)
                }
                (PeerEndpoint::Listen(_), Some(listener)) => {
                    let picked = accept_first(&listener, &hello, deadline)?;
                    if listener.one_at_a_time.load(Ordering::Acquire) {
                        busy = Some(listener.turn_away_while_busy());
                    }
                    picked
                }
                (PeerEndpoint::Listen(address), None) => {
                    return Err(TransportError::InvalidArgument {
                        what: "listen address",
                        why: format!("no listener for {address}"),
                    })
                }
            };
            prepare(&stream, deadline)?;
            let result = setup(&mut stream, theirs)?;
            drop(busy);
            Ok((stream, result))
        })
        .await?
    }

    /// The listener a `Listen` connect accepts on (bound now if [`Rendezvous::bind`] was not
    /// called); it stays bound for the next connect.
    fn listener_for(&self, peer: PeerEndpoint) -> Result<Option<Arc<Listener>>, TransportError> {
        match peer {
            PeerEndpoint::Dial(_) => Ok(None),
            PeerEndpoint::Listen(address) => {
                let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner).clone();
                if let Some(shared) = shared {
                    self.bind(address)?;
                    return Ok(Some(shared));
                }
                let mut slot = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
                match &*slot {
                    Some(listener) if address.port() == 0 || listener.local_addr() == address => {
                        Ok(Some(listener.clone()))
                    }
                    _ => {
                        let listener = Arc::new(self.new_listener(address)?);
                        *slot = Some(listener.clone());
                        Ok(Some(listener))
                    }
                }
            }
        }
    }
}

/// What each candidate connection goes through before it may become the connection.
struct Greeting<D> {
    token: Option<Token>,
    ours: Vec<u8>,
    decode: D,
}

impl<D, H> Greeting<D>
where
    D: Fn(&mut dyn Read) -> Result<H, TransportError>,
{
    /// Authenticates, sends this side's hello, decodes the peer's, all by `deadline` however
    /// the peer paces its bytes. Failures are logged with the peer's address.
    fn greet(&self, stream: &TcpStream, role: Role, deadline: Instant) -> Result<H, TransportError> {
        let peer = stream.peer_addr().map_or_else(|_| "unknown".to_string(), |a| a.to_string());
        authenticate_by(stream, self.token.as_ref(), role, deadline)?;
        let mut bounded = Deadlined::new(stream, deadline);
        bounded.write_all(&self.ours)?;
        (self.decode)(&mut bounded)
            .inspect_err(|e| tracing::warn!(%peer, error = %e, "rejected peer (hello)"))
    }
}

/// Accepts until one connection authenticates and sends a hello that decodes, each candidate
/// on its own thread within [`HANDSHAKE_TIMEOUT`] of its arrival. When
/// [`MAX_PENDING_HANDSHAKES`] are pending, the oldest is cut off to make room: a legitimate
/// peer authenticates in well under a millisecond, so a flood must outpace that to crowd it out.
fn accept_first<D, H>(
    listener: &Listener,
    greeting: &Arc<Greeting<D>>,
    deadline: Instant,
) -> Result<(TcpStream, H), TransportError>
where
    H: Send + 'static,
    D: Fn(&mut dyn Read) -> Result<H, TransportError> + Send + Sync + 'static,
{
    let started = Instant::now();
    let (results, finished) = std::sync::mpsc::channel::<Result<(TcpStream, H), TransportError>>();
    // Candidates still authenticating, oldest first: a clone of each stream (to cut it off)
    // and whether its thread is done.
    let mut pending: VecDeque<(TcpStream, Arc<AtomicBool>)> = VecDeque::new();
    let mut last_failure = None;
    loop {
        match finished.recv_timeout(Duration::from_millis(2)) {
            Ok(Ok(won)) => return Ok(won),
            Ok(Err(e)) => last_failure = Some(e),
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(last_failure.unwrap_or(TransportError::DeadlineExceeded {
                what: "a peer to connect",
                waited_ms: started.elapsed().as_millis() as u64,
            }));
        }
        // A finished candidate's clone would keep its connection open: drop it now.
        pending.retain(|(_, done)| !done.load(Ordering::Acquire));
        // A bounded number per pass: under a flood of connections the loop still comes back
        // to collect a finished handshake and to check the deadline.
        for _ in 0..ACCEPTS_PER_PASS {
            let Some(stream) = listener.try_accept()? else { break };
            if pending.len() >= MAX_PENDING_HANDSHAKES {
                if let Some((oldest, _)) = pending.pop_front() {
                    tracing::warn!(
                        peer = ?oldest.peer_addr().ok(),
                        "oob: {MAX_PENDING_HANDSHAKES} handshakes pending; the oldest was cut off"
                    );
                    let _ = oldest.shutdown(std::net::Shutdown::Both);
                }
            }
            let Ok(watch) = stream.try_clone() else { continue };
            let done = Arc::new(AtomicBool::new(false));
            pending.push_back((watch, done.clone()));
            let limit = deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
            let (greeting, results) = (greeting.clone(), results.clone());
            let spawned = std::thread::Builder::new().name("oob-handshake".into()).spawn(move || {
                let outcome = greeting.greet(&stream, Role::Listener, limit).map(|theirs| (stream, theirs));
                done.store(true, Ordering::Release);
                // The loop may have finished already: then this connection is simply dropped.
                let _ = results.send(outcome);
            });
            if spawned.is_err() {
                pending.pop_back();
            }
        }
    }
}

/// A bound OOB listener. Bind it before telling the peer where to dial, then [`accept`](Listener::accept).
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
    address: SocketAddr,
    /// Whether a connect on it turns everyone else away from the moment it picked its peer
    /// ([`Listener::serve_one_at_a_time`]).
    one_at_a_time: AtomicBool,
}

impl Listener {
    /// Binds `address` (port 0 picks a free port).
    pub fn bind(address: SocketAddr) -> Result<Listener, TransportError> {
        let inner = TcpListener::bind(address)?;
        let address = inner.local_addr()?;
        inner.set_nonblocking(true)?;
        Ok(Listener { inner, address, one_at_a_time: AtomicBool::new(false) })
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
    fn try_accept(&self) -> Result<Option<TcpStream>, TransportError> {
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
