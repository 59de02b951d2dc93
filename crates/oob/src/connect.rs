//! Establishing the OOB TCP connection within a deadline.

use crate::auth::{authenticate_tagged, new_tag, ConnectionTag, Role};
use crate::codec::Deadlined;
use crate::listener::Listener;
use crate::token::Token;
use rdma_hint_backend_core::wait::off_thread;
use rdma_hint_core::{PeerEndpoint, TransportError};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
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
    /// What the lanes of one connection share: the listener, the token, the policy.
    group: Arc<LaneGroup>,
}

/// The lanes of one connection ([`Rendezvous::for_lane`]): one token and remote policy (a lane
/// cannot accept peers another lane would refuse), one listener, and the candidates each
/// accepted beyond its own, handed to the others.
#[derive(Debug)]
struct LaneGroup {
    id: u64,
    /// The listener a lane bound.
    listener: Mutex<Option<Arc<Listener>>>,
    /// A listener the caller bound and shares with other transports (never replaced).
    shared: Mutex<Option<Arc<Listener>>>,
    policy: Mutex<Policy>,
    /// Accepting connects of the group under way: when the last ends, what it parked goes.
    accepting: std::sync::atomic::AtomicUsize,
    /// Its lanes' tag, at the start of each one's authentication nonce.
    tag: ConnectionTag,
    /// The tag of the peer whose lanes its accepting connects take (set by the first to take
    /// one, cleared when the last ends): the lanes of one peer only.
    paired: Mutex<Option<ConnectionTag>>,
}

/// Who may connect.
#[derive(Debug, Default, Clone)]
struct Policy {
    token: Option<Token>,
    unauthenticated_remote: bool,
}

impl Default for LaneGroup {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        // Without the OS's randomness (which does not fail on Linux), a tag this process
        // alone makes: its id, the group's, and the time.
        let tag = new_tag().unwrap_or_else(|_| {
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            (u64::from(std::process::id()) << 40 ^ id << 20 ^ nanos.as_nanos() as u64).to_le_bytes()
        });
        LaneGroup {
            id,
            listener: Mutex::default(),
            shared: Mutex::default(),
            policy: Mutex::default(),
            accepting: Default::default(),
            tag,
            paired: Mutex::default(),
        }
    }
}

impl LaneGroup {
    fn policy(&self) -> Policy {
        self.policy.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// An accepting connect of a lane group under way on `listener`; the last one to end drops the
/// candidates the group parked there (a peer's lane nobody will take hears the close at once).
struct Accepting {
    group: Arc<LaneGroup>,
    listener: Arc<Listener>,
}

impl Accepting {
    fn new(group: &Arc<LaneGroup>, listener: &Arc<Listener>) -> Accepting {
        group.accepting.fetch_add(1, Ordering::AcqRel);
        Accepting { group: group.clone(), listener: listener.clone() }
    }
}

impl Drop for Accepting {
    fn drop(&mut self) {
        if self.group.accepting.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Under the pairing's lock, and only if no connect of the group started since: a
            // new one takes a candidate (and pairs) under this lock, after this reset.
            let mut paired = self.group.paired.lock().unwrap_or_else(PoisonError::into_inner);
            if self.group.accepting.load(Ordering::Acquire) == 0 {
                self.listener.drop_parked(self.group.id);
                *paired = None;
            }
        }
    }
}

impl Rendezvous {
    /// A rendezvous for another lane of the same connection: one token and remote policy for
    /// all (set on any lane, before or after this, it holds for every lane), and one listener
    /// (bound by any lane, or the caller's shared one), so that the peer's lanes all dial one
    /// address and the lanes' connects, run at once, each take one of them.
    pub fn for_lane(&self) -> Rendezvous {
        Rendezvous { group: self.group.clone() }
    }

    /// Peers must prove they hold `token` (and this side proves it too), see
    /// [`authenticate`](crate::authenticate). Every lane of the connection holds it.
    pub fn set_token(&mut self, token: Token) {
        self.group.policy.lock().unwrap_or_else(PoisonError::into_inner).token = Some(token);
    }

    /// Whether peers must prove a token.
    pub fn has_token(&self) -> bool {
        self.group.policy().token.is_some()
    }

    /// Lets this side listen on a non-loopback address without a token: anyone who can reach
    /// it may then connect and write into the regions it exposes.
    pub fn allow_unauthenticated_remote(&mut self) {
        self.group.policy.lock().unwrap_or_else(PoisonError::into_inner).unauthenticated_remote = true;
    }

    /// Binds the listener now (port 0 picks a free port) and returns its address. With a
    /// [shared listener](Rendezvous::share_listener), returns that one's address when `address`
    /// names it (or asks for any port on its IP) and refuses any other. The lanes of one
    /// connection share what any of them bound: a bind that names its address, or any port on
    /// its IP, returns it; another address replaces it.
    pub fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        let shared = self.group.shared.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(shared) = shared {
            let bound = shared.local_addr();
            return if names(address, bound) {
                Ok(bound)
            } else {
                Err(TransportError::InvalidArgument {
                    what: "listen address",
                    why: format!("{address}: this transport accepts on the shared listener at {bound}"),
                })
            };
        }
        let mut slot = self.group.listener.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(bound) = slot.as_ref().map(|listener| listener.local_addr()) {
            if names(address, bound) {
                self.check_listen_address(bound)?;
                return Ok(bound);
            }
        }
        let listener = self.new_listener(address)?;
        let bound = listener.local_addr();
        *slot = Some(Arc::new(listener));
        Ok(bound)
    }

    /// Accepts on `listener`, bound by the caller and shared with other transports (a server
    /// that serves peers one after another keeps one port), instead of binding one of its own.
    /// The address rule of [`Rendezvous::bind`] applies: set the token first.
    pub fn share_listener(&self, listener: Arc<Listener>) -> Result<(), TransportError> {
        self.check_listen_address(listener.local_addr())?;
        *self.group.shared.lock().unwrap_or_else(PoisonError::into_inner) = Some(listener);
        Ok(())
    }

    fn check_listen_address(&self, address: SocketAddr) -> Result<(), TransportError> {
        let policy = self.group.policy();
        if !address.ip().is_loopback() && policy.token.is_none() && !policy.unauthenticated_remote {
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
        let (token, group) = (self.group.policy().token, self.group.clone());
        // Counted before the handshake's thread starts, so that the lanes' connects, polled
        // one after another, all count before any can finish and drop what the group parked.
        let accepting = listener.as_ref().map(|listener| Accepting::new(&self.group, listener));
        off_thread("oob", "the connection's handshake", deadline, move || {
            let (ours, setup) = hello()?;
            let hello = Arc::new(Greeting { token, ours, decode, group });
            // Held until the setup below is done (a listener serving one peer at a time).
            let mut busy = None;
            let (mut stream, theirs) = match (peer, listener) {
                (PeerEndpoint::Dial(address), _) => {
                    let stream = dial(address, deadline)?;
                    prepare(&stream, deadline)?;
                    let (theirs, _) = hello.greet(&stream, Role::Dialer, deadline)?;
                    (stream, theirs)
                }
                (PeerEndpoint::Listen(_), Some(listener)) => {
                    let picked = accept_first(&listener, &hello, deadline);
                    drop(accepting);
                    let (stream, theirs) = picked?;
                    if listener.serves_one_at_a_time() {
                        busy = Some(listener.turn_away_while_busy());
                    }
                    // Only the peer picked hears this side's hello (what it exposes).
                    Deadlined::new(&stream, deadline).write_all(&hello.ours)?;
                    (stream, theirs)
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
                let shared = self.group.shared.lock().unwrap_or_else(PoisonError::into_inner).clone();
                if let Some(shared) = shared {
                    self.bind(address)?;
                    return Ok(Some(shared));
                }
                let mut slot = self.group.listener.lock().unwrap_or_else(PoisonError::into_inner);
                match &*slot {
                    Some(listener) if names(address, listener.local_addr()) => {
                        self.check_listen_address(listener.local_addr())?;
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
    /// The lane group of the connect greeting (candidates are parked for its lanes only, and
    /// its tag starts this side's nonce).
    group: Arc<LaneGroup>,
}

impl<D, H> Greeting<D>
where
    D: Fn(&mut dyn Read) -> Result<H, TransportError>,
{
    /// Authenticates and decodes the peer's hello, all by `deadline` however the peer paces
    /// its bytes; a dialler sends its own hello first, a listener sends its own only to the
    /// candidate it picks (after this), and a refusal saying why to one whose hello it
    /// refuses. Failures are logged with the peer's address.
    fn greet(
        &self,
        stream: &TcpStream,
        role: Role,
        deadline: Instant,
    ) -> Result<(H, ConnectionTag), TransportError> {
        let peer = stream.peer_addr().map_or_else(|_| "unknown".to_string(), |a| a.to_string());
        let their_tag = authenticate_tagged(stream, self.token.as_ref(), role, deadline, self.group.tag)?;
        let mut bounded = Deadlined::new(stream, deadline);
        if role == Role::Dialer {
            bounded.write_all(&self.ours)?;
            return crate::hello::hello_or_refusal(&mut bounded, |theirs| (self.decode)(theirs))
                .map(|theirs| (theirs, their_tag))
                .inspect_err(|e| tracing::warn!(%peer, error = %e, "rejected peer (hello)"));
        }
        let decoded = (self.decode)(&mut bounded);
        if let Err(e) = &decoded {
            tracing::warn!(%peer, error = %e, "rejected peer (hello)");
            // Why, in place of the hello it will not hear (a peer that left does not read it);
            // then closed for writing and drained a moment, so that closing with the peer's
            // bytes unread does not reset the connection before the refusal is read.
            if bounded.write_all(&crate::hello::encode_refusal(&e.to_string())).is_ok() {
                let _ = stream.shutdown(std::net::Shutdown::Write);
                let linger = deadline.min(Instant::now() + Duration::from_millis(200));
                let _ = std::io::copy(&mut Deadlined::new(stream, linger), &mut std::io::sink());
            }
        }
        decoded.map(|theirs| (theirs, their_tag))
    }
}

impl<D> Greeting<D> {
    /// A candidate a lane of this greeting's group parked, of the peer the group pairs with
    /// (any, before the group took one: that one's peer is then the group's).
    fn take_parked<H: Send + 'static>(&self, listener: &Listener) -> Option<(TcpStream, H)> {
        let mut paired = self.group.paired.lock().unwrap_or_else(PoisonError::into_inner);
        let (stream, theirs, tag) = listener
            .take_parked::<(TcpStream, H, ConnectionTag)>(self.group.id, |candidate| {
                pairs_with(*paired, candidate.2)
            })?;
        if paired.replace(tag).is_none() {
            // Another peer's lanes parked for the group can never be taken now: closed at
            // once (they hear it), and no longer taking room the peer's own lanes need.
            listener.drop_parked_where::<(TcpStream, H, ConnectionTag)>(self.group.id, |candidate| {
                candidate.2 != tag
            });
        }
        Some((stream, theirs))
    }

    /// Whether a candidate of `tag` can still be taken by the group (else it is closed, not
    /// parked).
    fn wanted(&self, tag: ConnectionTag) -> bool {
        pairs_with(*self.group.paired.lock().unwrap_or_else(PoisonError::into_inner), tag)
    }
}

/// Whether a lane of `tag` may join a group that `paired` with a peer (any, before it has).
fn pairs_with(paired: Option<ConnectionTag>, tag: ConnectionTag) -> bool {
    paired.is_none_or(|paired| paired == tag)
}

/// Accepts until one connection authenticates and sends a hello that decodes, each candidate
/// on its own thread within [`HANDSHAKE_TIMEOUT`] of its arrival. When
/// [`MAX_PENDING_HANDSHAKES`] are pending, the oldest is cut off to make room: a legitimate
/// peer authenticates in well under a millisecond, so a flood must outpace that to crowd it out.
///
/// A candidate that succeeds is parked on the listener and taken by whichever connect of the
/// greeting's lane group looks first: the lanes of one connection accept on one listener at
/// once, and one lane's connect may accept the peer's next lane before it took its own.
fn accept_first<D, H>(
    listener: &Arc<Listener>,
    greeting: &Arc<Greeting<D>>,
    deadline: Instant,
) -> Result<(TcpStream, H), TransportError>
where
    H: Send + 'static,
    D: Fn(&mut dyn Read) -> Result<H, TransportError> + Send + Sync + 'static,
{
    let started = Instant::now();
    // What each candidate's thread tells the loop: parked (`Ok`), or why it was refused.
    let (results, finished) = std::sync::mpsc::channel::<Result<(), TransportError>>();
    // Candidates still authenticating, oldest first: a clone of each stream (to cut it off)
    // and whether its thread is done.
    let mut pending: VecDeque<(TcpStream, Arc<AtomicBool>)> = VecDeque::new();
    let mut last_failure = None;
    loop {
        if let Some(won) = greeting.take_parked::<H>(listener) {
            return Ok(won);
        }
        match finished.recv_timeout(Duration::from_millis(2)) {
            Ok(Ok(())) => continue,
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
            // The bound is the listener's, whichever lane's loop accepted: lanes accepting on
            // one port at once do not multiply it.
            if listener.handshakes() >= MAX_PENDING_HANDSHAKES {
                match pending.pop_front() {
                    Some((oldest, _)) => {
                        tracing::warn!(
                            peer = ?oldest.peer_addr().ok(),
                            "oob: {MAX_PENDING_HANDSHAKES} handshakes pending; the oldest was cut off"
                        );
                        let _ = oldest.shutdown(std::net::Shutdown::Both);
                    }
                    None => {
                        tracing::warn!("oob: {MAX_PENDING_HANDSHAKES} handshakes pending on this listener; a new one was closed");
                        let _ = stream.shutdown(std::net::Shutdown::Both);
                        continue;
                    }
                }
            }
            let Ok(watch) = stream.try_clone() else { continue };
            let done = Arc::new(AtomicBool::new(false));
            pending.push_back((watch, done.clone()));
            let limit = deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
            let (greeting, results, listener) = (greeting.clone(), results.clone(), listener.clone());
            let handshaking = listener.handshaking();
            let spawned = std::thread::Builder::new().name("oob-handshake".into()).spawn(move || {
                let _handshaking = handshaking;
                let outcome = greeting.greet(&stream, Role::Listener, limit);
                done.store(true, Ordering::Release);
                // Parked even if this loop has finished: another lane's connect takes it.
                let told = outcome.and_then(|(theirs, tag)| {
                    if !greeting.wanted(tag) {
                        return Err(TransportError::Handshake(
                            "a lane of another peer than the one this connection took".into(),
                        ));
                    }
                    listener.park(greeting.group.id, (stream, theirs, tag));
                    Ok(())
                });
                let _ = results.send(told);
            });
            if spawned.is_err() {
                pending.pop_back();
            }
        }
    }
}

/// Whether a bind of `address` names the listener bound at `bound`: its address, or any port
/// on its IP.
fn names(address: SocketAddr, bound: SocketAddr) -> bool {
    address == bound || (address.port() == 0 && address.ip() == bound.ip())
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
    use rdma_hint_backend_core::blocking::block_on;

    fn decode(stream: &mut dyn Read) -> Result<[u8; 2], TransportError> {
        let mut theirs = [0u8; 2];
        stream.read_exact(&mut theirs)?;
        Ok(theirs)
    }

    /// A meet sending `ours`, answering with the peer's hello.
    fn meet(rendezvous: &Rendezvous, peer: PeerEndpoint, ours: [u8; 2]) -> Result<[u8; 2], TransportError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let hello = move || Ok((ours.to_vec(), |_: &mut TcpStream, theirs: [u8; 2]| Ok(theirs)));
        block_on(rendezvous.meet(peer, deadline, hello, decode)).map(|(_, theirs)| theirs)
    }

    #[test]
    fn the_lanes_of_a_connection_accept_on_one_address_at_once_and_pair_one_to_one() {
        let first = Rendezvous::default();
        let lanes: Vec<Rendezvous> =
            std::iter::once(first.for_lane()).chain((0..3).map(|_| first.for_lane())).collect();
        let address = lanes[0].bind("127.0.0.1:0".parse().unwrap()).unwrap();
        // Every lane shares the bound listener: a bind of any port on its IP names it.
        assert_eq!(lanes[3].bind("127.0.0.1:0".parse().unwrap()).unwrap(), address);
        let accepting: Vec<_> = lanes
            .into_iter()
            .enumerate()
            .map(|(k, lane)| {
                std::thread::spawn(move || {
                    (k as u8, meet(&lane, PeerEndpoint::Listen(address), [b'L', k as u8]))
                })
            })
            .collect();
        let peer = Rendezvous::default();
        let dialling: Vec<_> = (0..4u8)
            .map(|k| {
                let lane = peer.for_lane();
                std::thread::spawn(move || (k, meet(&lane, PeerEndpoint::Dial(address), [b'D', k])))
            })
            .collect();
        let mut heard_by_listener = std::collections::BTreeMap::new();
        for lane in accepting {
            let (k, theirs) = lane.join().unwrap();
            heard_by_listener.insert(k, theirs.expect("every listening lane connects"));
        }
        let mut heard_by_dialler = std::collections::BTreeMap::new();
        for lane in dialling {
            let (k, theirs) = lane.join().unwrap();
            heard_by_dialler.insert(k, theirs.expect("every dialling lane connects"));
        }
        // One to one: listening lane k heard dialler d exactly when dialler d heard lane k.
        for (k, theirs) in &heard_by_listener {
            assert_eq!(theirs[0], b'D');
            assert_eq!(
                heard_by_dialler[&theirs[1]],
                [b'L', *k],
                "{heard_by_listener:?} {heard_by_dialler:?}"
            );
        }
        let mut dialers: Vec<u8> = heard_by_listener.values().map(|theirs| theirs[1]).collect();
        dialers.sort_unstable();
        assert_eq!(dialers, [0, 1, 2, 3]);
    }

    /// Two peers dialling a listening connection of two lanes at once: its lanes pair with
    /// the lanes of one peer only (the first it took), never one lane of each, even when the
    /// other peer's lane arrives between them.
    #[test]
    fn a_connections_lanes_pair_with_the_lanes_of_one_peer_only() {
        let first = Rendezvous::default();
        let lanes = [first.for_lane(), first.for_lane()];
        let address = lanes[0].bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let accepting: Vec<_> = lanes
            .into_iter()
            .map(|lane| std::thread::spawn(move || meet(&lane, PeerEndpoint::Listen(address), *b"LL")))
            .collect();
        let peer_a = Rendezvous::default();
        let a1 = peer_a.for_lane();
        // A's first lane connects; then B's only lane arrives before A's second.
        assert_eq!(meet(&peer_a, PeerEndpoint::Dial(address), *b"A0").unwrap(), *b"LL");
        let peer_b = std::thread::spawn(move || {
            let (started, deadline) = (Instant::now(), Instant::now() + Duration::from_secs(30));
            let hello = move || Ok((b"B0".to_vec(), |_: &mut TcpStream, theirs: [u8; 2]| Ok(theirs)));
            let met =
                block_on(Rendezvous::default().meet(PeerEndpoint::Dial(address), deadline, hello, decode));
            (met, started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(meet(&a1, PeerEndpoint::Dial(address), *b"A1").unwrap(), *b"LL");
        let mut heard: Vec<[u8; 2]> =
            accepting.into_iter().map(|lane| lane.join().unwrap().unwrap()).collect();
        heard.sort_unstable();
        assert_eq!(heard, [*b"A0", *b"A1"], "a lane of each peer");
        let (met, took) = peer_b.join().unwrap();
        assert!(met.is_err(), "B's lane was taken by a connection that is A's");
        // Closed as soon as it authenticated, not left to its deadline.
        assert!(took < Duration::from_secs(15), "B's lane waited {took:?}");
    }

    #[test]
    fn the_lanes_of_a_connection_hold_one_token_whenever_it_is_set() {
        let mut first = Rendezvous::default();
        let lane = first.for_lane();
        first.set_token(Token::new(b"the group's token").unwrap());
        assert!(lane.has_token(), "a token set after the lane was opened holds for it too");
        let address = lane.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let accepting = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_millis(800);
            let hello = move || Ok((b"LL".to_vec(), |_: &mut TcpStream, theirs: [u8; 2]| Ok(theirs)));
            block_on(lane.meet(PeerEndpoint::Listen(address), deadline, hello, decode))
        });
        // A dialler without the token is refused by the lane opened before the token was set.
        let stranger = meet(&Rendezvous::default(), PeerEndpoint::Dial(address), *b"D0");
        assert!(stranger.is_err(), "{stranger:?}");
        assert!(accepting.join().unwrap().is_err(), "the lane took a peer without the token");
    }

    #[test]
    fn only_the_candidate_picked_hears_the_listeners_hello() {
        let listening = Rendezvous::default();
        let address = listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let accepting = std::thread::spawn(move || meet(&listening, PeerEndpoint::Listen(address), *b"LL"));
        // Two peers authenticate and send their hello; the listener takes one of them.
        let raw: Vec<TcpStream> = (0..2u8)
            .map(|k| {
                std::thread::spawn(move || {
                    let mut stream = TcpStream::connect(address).unwrap();
                    crate::authenticate(&mut stream, None, Role::Dialer).unwrap();
                    stream.write_all(&[b'D', k]).unwrap();
                    stream
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|dialling| dialling.join().unwrap())
            .collect();
        let theirs = accepting.join().unwrap().unwrap();
        let mut heard = Vec::new();
        for (k, mut stream) in raw.into_iter().enumerate() {
            stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            let mut byte = [0u8; 2];
            heard.push((k as u8, stream.read(&mut byte).ok().filter(|n| *n > 0).map(|_| byte)));
        }
        for (k, hello) in heard {
            if k == theirs[1] {
                assert_eq!(hello, Some(*b"LL"), "the picked peer hears the hello");
            } else {
                assert_eq!(hello, None, "a peer the listener did not pick heard {hello:?}");
            }
        }
    }

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
