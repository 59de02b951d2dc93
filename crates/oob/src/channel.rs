//! The out-of-band socket once a connection is up, for the backends whose data does not use
//! it (verbs, UCX, staged shm): the one reader of its bytes ([`ControlReader`]), so the peer's
//! goodbye, its vanishing, its requests (a region exposed or withdrawn) and its answers to ours
//! are told apart, and the one writer of control frames. A backend whose data shares the socket
//! (staged TCP) carries the frames itself ([`ControlChannel::carried`]) and hands the channel
//! what it takes off the socket ([`ControlChannel::take_in`]).
//!
//! Whoever watches the socket (a backend's event or progress thread, a post that looks at the
//! peer) calls [`ControlChannel::peer_left`], which takes in what the socket holds; the
//! backend's thread then acts on the peer's requests ([`ControlChannel::next_request`]) and
//! answers them. This side's own requests go out with [`ControlChannel::ask`] and are awaited
//! with [`ControlChannel::answer`].

use crate::control::{Control, ControlReader, Refusal};
use crate::hello::HelloLimits;
use crate::liveness::PeerLoss;
use rdma_hint_backend_core::wait::{wait, Notifier};
use rdma_hint_core::{TransportError, WaitMode};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Requests of this side awaiting the peer's answer, at most; and requests of the peer taken
/// in and not yet acted on past which the socket is not read further (one read's worth more
/// may be held), so a peer that floods waits on its own socket buffer.
pub const MAX_OUTSTANDING: usize = 64;

/// Bytes taken off the socket per read.
const READ_BYTES: usize = 2048;

/// How long a send waits between tries while the peer's socket buffer is full.
const SEND_RETRY: Duration = Duration::from_millis(1);

/// One side's control channel: the out-of-band socket once a connection is up, for the
/// backends whose data does not use it. Whoever watches the socket calls
/// [`peer_left`](Self::peer_left), which takes in what it holds; the backend then acts on the
/// peer's requests ([`next_request`](Self::next_request)) and answers them; this side's own
/// requests go out with [`ask`](Self::ask) and are awaited with [`answer`](Self::answer).
///
/// ```
/// use rdma_hint_oob::{Control, ControlChannel, HelloLimits};
/// use rdma_hint_core::WaitMode;
/// use rdma_hint_backend_core::blocking::block_on;
/// use std::net::{TcpListener, TcpStream};
/// use std::time::{Duration, Instant};
///
/// let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// let dialed = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
/// let limits = HelloLimits { max_connection_bytes: 0, max_key_bytes: 8, known_flags: 0 };
/// let ours = ControlChannel::new(dialed, limits).unwrap();
/// let theirs = ControlChannel::new(listener.accept().unwrap().0, limits).unwrap();
/// let deadline = Instant::now() + Duration::from_secs(5);
///
/// let seq = ours.ask(|seq| Control::Withdraw { seq, id: 3 }, deadline).unwrap();
/// let answering = std::thread::spawn(move || loop {
///     assert!(theirs.peer_left().is_none());
///     if let Some(Control::Withdraw { seq, id: 3 }) = theirs.next_request() {
///         theirs.send(&Control::Done { seq, refused: None }, deadline).unwrap();
///         return theirs;
///     }
///     std::thread::sleep(Duration::from_millis(1));
/// });
/// let drive = || {
///     ours.peer_left();
/// };
/// assert_eq!(block_on(ours.answer(seq, WaitMode::Adaptive, deadline, drive)).unwrap(), None);
/// let theirs = answering.join().unwrap();
/// ours.say_goodbye();
/// std::thread::sleep(Duration::from_millis(20));
/// assert!(theirs.peer_left().is_some_and(|loss| loss.clean));
/// ```
#[derive(Debug)]
pub struct ControlChannel {
    wire: Wire,
    /// What a descriptor may carry (kept for [`withdrawn_by`](Self::withdrawn_by)'s look).
    limits: HelloLimits,
    state: Mutex<State>,
    /// Held for one whole frame, so frames of two threads never interleave.
    writing: Mutex<()>,
    /// Woken when an answer comes, or the peer is gone.
    answers: Notifier,
}

/// Where a channel's frames travel.
enum Wire {
    /// A socket of the channel's own, which it reads and writes (non-blocking).
    Socket(TcpStream),
    /// A link's data socket, which its backend reads and writes: the backend hands the channel
    /// the control frames it takes off it, and carries ours (a frame's bytes, by a deadline).
    Carried(Box<CarrySend>),
}

/// How a backend carries one control frame's bytes to the peer by a deadline.
type CarrySend = dyn Fn(&[u8], Instant) -> Result<(), TransportError> + Send + Sync;

impl std::fmt::Debug for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wire::Socket(stream) => f.debug_tuple("Socket").field(stream).finish(),
            Wire::Carried(_) => f.write_str("Carried"),
        }
    }
}

#[derive(Debug)]
struct State {
    reader: ControlReader,
    /// The peer's requests (expose, withdraw), in order.
    requests: VecDeque<Control>,
    /// Whether the peer's requests are taken in: a closed link's channel only watches for the
    /// peer's end, and drops what it asks.
    serving: bool,
    /// This side's requests awaiting an answer: the sequence number and, once come, the answer.
    asked: Vec<Asked>,
    /// The next request's number: numbers before it were asked (an answer to one nobody
    /// waits for any more is late, and dropped), numbers from it on were not.
    next_seq: u32,
    loss: Option<PeerLoss>,
}

#[derive(Debug)]
struct Asked {
    seq: u32,
    answer: Option<Option<Refusal>>,
    /// The region a withdrawal asks the peer to drop.
    withdrawing: Option<u32>,
}

impl ControlChannel {
    /// The channel over `stream` (made non-blocking), with descriptors checked within
    /// `limits`.
    pub fn new(stream: TcpStream, limits: HelloLimits) -> Result<ControlChannel, TransportError> {
        stream.set_nonblocking(true)?;
        Ok(ControlChannel::over(Wire::Socket(stream), limits))
    }

    /// A channel whose frames a backend carries on its own data socket: `send` carries one
    /// frame's bytes by a deadline, and the backend hands the channel every control frame it
    /// takes off the socket ([`take_in`](Self::take_in)) and tells it when the link ends
    /// ([`close`](Self::close)).
    ///
    /// ```
    /// use rdma_hint_oob::{Control, ControlChannel, HelloLimits};
    /// use std::sync::{Arc, Mutex};
    /// use std::time::{Duration, Instant};
    ///
    /// let limits = HelloLimits { max_connection_bytes: 0, max_key_bytes: 8, known_flags: 0 };
    /// let wire = Arc::new(Mutex::new(Vec::new()));
    /// let carried = wire.clone();
    /// let ours = ControlChannel::carried(limits, move |frame: &[u8], _deadline: Instant| {
    ///     carried.lock().unwrap().extend_from_slice(frame);
    ///     Ok(())
    /// });
    /// let theirs = ControlChannel::carried(limits, |_: &[u8], _: Instant| Ok(()));
    /// let deadline = Instant::now() + Duration::from_secs(1);
    /// ours.ask(|seq| Control::Withdraw { seq, id: 3 }, deadline).unwrap();
    /// assert!(theirs.take_in(&wire.lock().unwrap()).is_none());
    /// assert_eq!(theirs.next_request(), Some(Control::Withdraw { seq: 0, id: 3 }));
    /// theirs.close("the link ended");
    /// assert!(theirs.peer_left().is_some());
    /// ```
    pub fn carried(
        limits: HelloLimits,
        send: impl Fn(&[u8], Instant) -> Result<(), TransportError> + Send + Sync + 'static,
    ) -> ControlChannel {
        ControlChannel::over(Wire::Carried(Box::new(send)), limits)
    }

    fn over(wire: Wire, limits: HelloLimits) -> ControlChannel {
        ControlChannel {
            wire,
            limits,
            state: Mutex::new(State {
                reader: ControlReader::new(limits),
                requests: VecDeque::with_capacity(MAX_OUTSTANDING),
                serving: true,
                asked: Vec::with_capacity(MAX_OUTSTANDING),
                next_seq: 0,
                loss: None,
            }),
            writing: Mutex::new(()),
            answers: Notifier::default(),
        }
    }

    /// The channel's own socket, to sleep on its readiness (`poll`) or shut it down; `None`
    /// for a [carried](Self::carried) channel.
    pub fn stream(&self) -> Option<&TcpStream> {
        match &self.wire {
            Wire::Socket(stream) => Some(stream),
            Wire::Carried(_) => None,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in what the socket holds, then says whether the peer is gone: it said goodbye,
    /// closed without one, sent a frame the protocol does not allow, or the socket failed. Once
    /// gone, the same loss is answered every time and the socket is not read again.
    pub fn peer_left(&self) -> Option<PeerLoss> {
        let Wire::Socket(stream) = &self.wire else { return self.state().loss.clone() };
        let mut state = self.state();
        let answered_before = state.asked.iter().filter(|asked| asked.answer.is_some()).count();
        let mut buffer = [0u8; READ_BYTES];
        while state.loss.is_none() && state.requests.len() < MAX_OUTSTANDING {
            match (&*stream).read(&mut buffer) {
                Ok(0) => {
                    let why = "the peer's process vanished (its socket closed without a goodbye)";
                    state.loss = Some(PeerLoss { why: why.to_string(), clean: false, stopped: true });
                }
                Ok(read) => state.take_in(&buffer[..read]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // A reset is the peer's kernel closing its socket (it closed with our bytes
                // unread, or its process ended): a stop, as any other failure of the socket.
                Err(e) => {
                    let why = format!("out-of-band socket failed: {e}");
                    state.loss = Some(PeerLoss { why, clean: false, stopped: true });
                }
            }
        }
        let answered = state.asked.iter().filter(|asked| asked.answer.is_some()).count();
        let loss = state.loss.clone();
        drop(state);
        if loss.is_some() || answered > answered_before {
            self.answers.notify();
        }
        loss
    }

    /// Takes in control frames a [carried](Self::carried) channel's backend took off its
    /// socket, as [`peer_left`](Self::peer_left) takes in what its own socket holds; then says
    /// whether the peer is gone (a frame that breaks the rules, a goodbye, or more requests
    /// waiting than a peer may have outstanding: the backend ends the link).
    pub fn take_in(&self, bytes: &[u8]) -> Option<PeerLoss> {
        let mut state = self.state();
        state.take_in(bytes);
        if state.requests.len() > MAX_OUTSTANDING && state.loss.is_none() {
            let why = format!("the peer has more than {MAX_OUTSTANDING} requests waiting");
            state.loss = Some(PeerLoss::failure(why));
        }
        let loss = state.loss.clone();
        drop(state);
        self.answers.notify();
        loss
    }

    /// The region `bytes` (one whole control frame a [carried](Self::carried) channel's backend
    /// took off its socket, before [`take_in`](Self::take_in)) lets go: `Some(id)` when they are
    /// the peer's answer that it dropped region `id`, which this side asked it to withdraw. The
    /// backend stops admitting the peer's frames that name the region there, in the socket's
    /// order: a frame behind the answer is the peer's breach, not a write to let land.
    pub fn withdrawn_by(&self, bytes: &[u8]) -> Option<u32> {
        let mut done = None;
        let _ = ControlReader::new(self.limits).feed(bytes, &mut |message| {
            if let Control::Done { seq, refused: None | Some(Refusal::Unknown) } = message {
                done = Some(seq);
            }
        });
        let seq = done?;
        let state = self.state();
        state.asked.iter().find(|asked| asked.seq == seq && asked.answer.is_none())?.withdrawing
    }

    /// The link ended for `why` (this side's own reason, or the peer's loss the backend found):
    /// waits for answers end with it, and asks are refused.
    pub fn close(&self, why: &str) {
        self.end(why);
    }

    /// The link closed: the peer's requests are dropped from now on (nobody acts on them), so
    /// the socket is read on for the peer's end.
    pub fn stop_serving(&self) {
        let mut state = self.state();
        state.serving = false;
        state.requests.clear();
    }

    /// Whether requests of the peer's wait to be acted on (a look that takes no lock of the
    /// backend's first).
    pub fn has_requests(&self) -> bool {
        !self.state().requests.is_empty()
    }

    /// Sends a request ([`ask`](Self::ask)) and waits for its answer
    /// ([`answer`](Self::answer), with `drive`).
    pub async fn request(
        &self,
        make: impl FnOnce(u32) -> Control,
        mode: WaitMode,
        deadline: Instant,
        drive: impl FnMut() + Unpin,
    ) -> Result<Option<Refusal>, TransportError> {
        let seq = self.ask(make, deadline)?;
        self.answer(seq, mode, deadline, drive).await
    }

    /// The peer's oldest request not yet acted on ([`Control::Expose`] or
    /// [`Control::Withdraw`]); each must be answered with a [`Control::Done`] of its `seq`.
    pub fn next_request(&self) -> Option<Control> {
        self.state().requests.pop_front()
    }

    /// Sends the request `make` builds around a fresh sequence number and returns the number,
    /// for [`answer`](Self::answer). [`TransportError::QueueFull`] while
    /// [`MAX_OUTSTANDING`] requests await their answers.
    pub fn ask(&self, make: impl FnOnce(u32) -> Control, deadline: Instant) -> Result<u32, TransportError> {
        let seq = {
            let mut state = self.state();
            if let Some(loss) = &state.loss {
                return Err(TransportError::PeerGone(loss.why.clone()));
            }
            if state.asked.len() >= MAX_OUTSTANDING {
                return Err(TransportError::QueueFull { given: 1, max: MAX_OUTSTANDING as u32 });
            }
            let seq = state.next_seq;
            state.next_seq = seq.wrapping_add(1);
            state.asked.push(Asked { seq, answer: None, withdrawing: None });
            seq
        };
        let request = make(seq);
        if let Control::Withdraw { id, .. } = request {
            let mut state = self.state();
            if let Some(asked) = state.asked.iter_mut().find(|asked| asked.seq == seq) {
                asked.withdrawing = Some(id);
            }
        }
        if let Err(error) = self.send(&request, deadline) {
            self.state().asked.retain(|asked| asked.seq != seq);
            return Err(error);
        }
        Ok(seq)
    }

    /// Waits for the peer's answer to request `seq`: `None` when it did what was asked, the
    /// refusal otherwise. [`TransportError::PeerGone`] if the peer leaves first,
    /// [`TransportError::DeadlineExceeded`] if `deadline` passes (the answer, should it come
    /// later, is dropped).
    ///
    /// `drive` runs before every look: the backend's own look at the socket, which takes its
    /// bytes in ([`peer_left`](Self::peer_left)) and acts on the peer's requests, so that two
    /// sides asking at once each answer the other while they wait. Between looks the wait
    /// sleeps until whoever watches the socket takes an answer in.
    pub async fn answer(
        &self,
        seq: u32,
        mode: WaitMode,
        deadline: Instant,
        mut drive: impl FnMut() + Unpin,
    ) -> Result<Option<Refusal>, TransportError> {
        // Whatever ends the wait (an answer, a failure, a deadline, the future dropped), nobody
        // waits for `seq` afterwards: its answer, should it come then, is late.
        let _forget = Forget { channel: self, seq };
        wait(&self.answers, mode, deadline, "the peer's answer", || {
            drive();
            let mut state = self.state();
            if let Some(at) = state.asked.iter().position(|asked| asked.seq == seq && asked.answer.is_some())
            {
                return Ok(state.asked.swap_remove(at).answer);
            }
            match &state.loss {
                Some(loss) => Err(TransportError::PeerGone(loss.why.clone())),
                None => Ok(None),
            }
        })
        .await
    }

    /// Sends one frame whole, retrying while another frame is being sent or the socket buffer
    /// is full (a peer not reading its socket), until `deadline`. A frame cut short by the
    /// deadline would garble every frame after it: the channel then ends (the peer reads the
    /// socket's end).
    pub fn send(&self, control: &Control, deadline: Instant) -> Result<(), TransportError> {
        let mut frame = Vec::with_capacity(64);
        control.encode(&mut frame);
        let stream = match &self.wire {
            Wire::Socket(stream) => stream,
            Wire::Carried(carry) => return carry(&frame, deadline),
        };
        let out_of_time =
            || TransportError::DeadlineExceeded { what: "room on the out-of-band socket", waited_ms: 0 };
        let _writing = loop {
            match self.writing.try_lock() {
                Ok(writing) => break writing,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() >= deadline => {
                    return Err(out_of_time())
                }
                Err(std::sync::TryLockError::WouldBlock) => std::thread::sleep(SEND_RETRY),
            }
        };
        let mut rest = &frame[..];
        while !rest.is_empty() {
            match (&*stream).write(rest) {
                Ok(0) => return Err(TransportError::PeerGone("the out-of-band socket closed".into())),
                Ok(written) => rest = &rest[written..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(SEND_RETRY);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock && rest.len() == frame.len() => {
                    return Err(out_of_time())
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let why = "a control frame could not be sent whole in time (the peer stopped reading)";
                    self.end(why);
                    return Err(TransportError::PeerGone(why.into()));
                }
                Err(e) => return Err(TransportError::PeerGone(format!("out-of-band socket failed: {e}"))),
            }
        }
        Ok(())
    }

    /// Ends the channel from this side: the loss is recorded and the socket shut down.
    fn end(&self, why: &str) {
        let mut state = self.state();
        if state.loss.is_none() {
            state.loss = Some(PeerLoss::failure(why.to_string()));
        }
        drop(state);
        if let Wire::Socket(stream) = &self.wire {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        self.answers.notify();
    }

    /// Tells the peer this side closes on purpose. Best effort: a peer that already left, or a
    /// full socket buffer, loses nothing it needs.
    pub fn say_goodbye(&self) {
        // Never waits behind a send (its caller may hold a backend's lock): a frame being
        // written keeps the goodbye out, and the peer reads the socket's end instead.
        match &self.wire {
            Wire::Socket(stream) => {
                if let Ok(_writing) = self.writing.try_lock() {
                    let _ = (&*stream).write(&[crate::GOODBYE]);
                }
            }
            Wire::Carried(carry) => {
                let _ = carry(&[crate::GOODBYE], Instant::now());
            }
        }
    }
}

/// Takes request `seq` off what awaits an answer when its wait ends, however it ends.
struct Forget<'a> {
    channel: &'a ControlChannel,
    seq: u32,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.channel.state().asked.retain(|asked| asked.seq != self.seq);
    }
}

impl State {
    /// Decodes `bytes` and sorts what they hold; a frame that breaks the rules ends the
    /// connection (stray bytes say nothing of what the peer's process still does).
    fn take_in(&mut self, bytes: &[u8]) {
        let mut messages = Vec::new();
        let fed = self.reader.feed(bytes, &mut |message| messages.push(message));
        for message in messages {
            if self.loss.is_some() {
                break;
            }
            match message {
                Control::Goodbye => {
                    let why = "the peer closed the connection".to_string();
                    self.loss = Some(PeerLoss { why, clean: true, stopped: true });
                }
                Control::Done { seq, refused } => self.answered(seq, refused),
                request if self.serving => self.requests.push_back(request),
                _ => {}
            }
        }
        if let (Err(error), None) = (fed, &self.loss) {
            self.loss = Some(PeerLoss::failure(format!("the peer broke the control protocol: {error}")));
        }
    }

    fn answered(&mut self, seq: u32, refused: Option<Refusal>) {
        if let Some(asked) = self.asked.iter_mut().find(|asked| asked.seq == seq && asked.answer.is_none()) {
            asked.answer = Some(refused);
            return;
        }
        // A number before the next one was asked: its waiter gave up, or the peer answers
        // twice; either way nothing waits for it. One never asked is a breach.
        let asked_before = seq.wrapping_sub(self.next_seq) > u32::MAX / 2;
        if !asked_before {
            let why = format!("the peer answered request {seq}, which was never asked");
            self.loss = Some(PeerLoss::failure(why));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RegionDescriptor;
    use rdma_hint_backend_core::blocking::block_on;
    use std::net::TcpListener;

    const LIMITS: HelloLimits = HelloLimits { max_connection_bytes: 0, max_key_bytes: 8, known_flags: 0 };

    fn pair() -> (ControlChannel, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let dialed = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        (ControlChannel::new(accepted, LIMITS).unwrap(), dialed)
    }

    fn settle() {
        std::thread::sleep(Duration::from_millis(20));
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(200)
    }

    fn frame(control: Control) -> Vec<u8> {
        let mut bytes = Vec::new();
        control.encode(&mut bytes);
        bytes
    }

    #[test]
    fn silence_is_presence_and_requests_come_out_in_order() {
        let (channel, mut peer) = pair();
        assert_eq!(channel.peer_left(), None, "a live, silent peer is present");
        let descriptor = RegionDescriptor { id: 2, len: 64, address: 0, flags: 0, key: vec![] };
        peer.write_all(&frame(Control::Expose { seq: 5, descriptor: descriptor.clone() })).unwrap();
        peer.write_all(&frame(Control::Withdraw { seq: 6, id: 2 })).unwrap();
        settle();
        assert_eq!(channel.peer_left(), None);
        assert_eq!(channel.next_request(), Some(Control::Expose { seq: 5, descriptor }));
        assert_eq!(channel.next_request(), Some(Control::Withdraw { seq: 6, id: 2 }));
        assert_eq!(channel.next_request(), None);
    }

    #[test]
    fn goodbye_vanishing_and_stray_bytes_are_three_losses() {
        let (channel, mut peer) = pair();
        peer.write_all(&[crate::GOODBYE]).unwrap();
        settle();
        assert!(channel.peer_left().is_some_and(|loss| loss.clean && loss.stopped));
        assert!(channel.peer_left().is_some_and(|loss| loss.clean), "the loss is kept");

        let (channel, peer) = pair();
        drop(peer);
        settle();
        let loss = channel.peer_left().unwrap();
        assert!(!loss.clean && loss.stopped && loss.why.contains("vanished"), "{loss:?}");

        let (channel, mut peer) = pair();
        peer.write_all(b"x").unwrap();
        settle();
        let loss = channel.peer_left().unwrap();
        assert!(!loss.clean && !loss.stopped && loss.why.contains("control protocol"), "{loss:?}");
    }

    #[test]
    fn an_answer_nobody_asked_for_ends_the_connection() {
        let (channel, mut peer) = pair();
        peer.write_all(&frame(Control::Done { seq: 0, refused: None })).unwrap();
        settle();
        assert!(channel.peer_left().is_some_and(|loss| loss.why.contains("never asked")));
    }

    #[test]
    fn a_closed_links_channel_drops_requests_and_still_sees_the_end() {
        let (channel, mut peer) = pair();
        channel.stop_serving();
        let mut bytes = Vec::new();
        for seq in 0..4 * MAX_OUTSTANDING as u32 {
            bytes.extend(frame(Control::Withdraw { seq, id: 1 }));
        }
        bytes.push(crate::GOODBYE);
        peer.write_all(&bytes).unwrap();
        settle();
        assert!(channel.peer_left().is_some_and(|loss| loss.clean), "the goodbye behind the requests");
        assert!(!channel.has_requests());
    }

    #[test]
    fn a_peer_that_never_answers_costs_a_deadline_and_a_late_answer_is_dropped() {
        let (channel, mut peer) = pair();
        let seq = channel.ask(|seq| Control::Withdraw { seq, id: 1 }, soon()).unwrap();
        let waited = block_on(channel.answer(seq, WaitMode::Adaptive, soon(), || drop(channel.peer_left())));
        assert!(matches!(waited, Err(TransportError::DeadlineExceeded { .. })), "{waited:?}");
        peer.write_all(&frame(Control::Done { seq, refused: None })).unwrap();
        settle();
        assert_eq!(channel.peer_left(), None, "a late answer is no breach");
        assert!(channel.state().asked.is_empty());
        for _ in 0..MAX_OUTSTANDING {
            let seq = channel.ask(|seq| Control::Withdraw { seq, id: 1 }, soon()).unwrap();
            let waited = block_on(channel.answer(seq, WaitMode::Adaptive, Instant::now(), || ()));
            assert!(waited.is_err());
        }
        assert!(
            channel.ask(|seq| Control::Withdraw { seq, id: 1 }, soon()).is_ok(),
            "given-up requests do not count"
        );
    }

    #[test]
    fn a_refusal_comes_back_and_a_departure_ends_the_wait() {
        let (channel, mut peer) = pair();
        let seq = channel.ask(|seq| Control::Withdraw { seq, id: 1 }, soon()).unwrap();
        peer.write_all(&frame(Control::Done { seq, refused: Some(Refusal::Unknown) })).unwrap();
        let answer =
            block_on(channel.answer(seq, WaitMode::Adaptive, soon(), || drop(channel.peer_left()))).unwrap();
        assert_eq!(answer, Some(Refusal::Unknown));
        let seq = channel.ask(|seq| Control::Withdraw { seq, id: 1 }, soon()).unwrap();
        drop(peer);
        let waited = block_on(channel.answer(seq, WaitMode::Adaptive, soon(), || drop(channel.peer_left())));
        assert!(matches!(waited, Err(TransportError::PeerGone(_))), "{waited:?}");
        assert!(channel.ask(|seq| Control::Withdraw { seq, id: 1 }, soon()).is_err());
    }

    #[test]
    fn a_flood_of_requests_is_taken_in_only_as_it_is_acted_on() {
        let (channel, mut peer) = pair();
        let total = 4 * MAX_OUTSTANDING;
        let mut bytes = Vec::new();
        for seq in 0..total as u32 {
            bytes.extend(frame(Control::Withdraw { seq, id: 1 }));
        }
        assert!(bytes.len() > READ_BYTES);
        peer.write_all(&bytes).unwrap();
        settle();
        assert_eq!(channel.peer_left(), None);
        let held = channel.state().requests.len();
        assert!((MAX_OUTSTANDING..total).contains(&held), "{held} requests taken in at once");
        let mut taken = 0;
        while channel.next_request().is_some() {
            taken += 1;
            channel.peer_left();
        }
        assert_eq!(taken, total);
    }

    /// A carried channel's backend learns, before the answer is taken in, which region the
    /// peer's answer lets go: only an answer to this side's withdrawal that the peer did (or
    /// never held), and only while that withdrawal is awaited.
    #[test]
    fn only_an_awaited_withdrawals_answer_lets_a_region_go() {
        let channel = ControlChannel::carried(LIMITS, |_: &[u8], _: Instant| Ok(()));
        let withdrawing = channel.ask(|seq| Control::Withdraw { seq, id: 7 }, soon()).unwrap();
        let descriptor = RegionDescriptor { id: 2, len: 64, address: 0, flags: 0, key: vec![] };
        let exposing = channel.ask(|seq| Control::Expose { seq, descriptor }, soon()).unwrap();
        let done = |seq, refused| frame(Control::Done { seq, refused });
        assert_eq!(channel.withdrawn_by(&done(withdrawing, None)), Some(7));
        assert_eq!(channel.withdrawn_by(&done(withdrawing, Some(Refusal::Unknown))), Some(7));
        assert_eq!(channel.withdrawn_by(&done(withdrawing, Some(Refusal::Taken))), None, "refused");
        assert_eq!(channel.withdrawn_by(&done(exposing, None)), None, "an expose's answer");
        assert_eq!(channel.withdrawn_by(&done(99, None)), None, "never asked");
        assert_eq!(channel.withdrawn_by(&frame(Control::Withdraw { seq: 1, id: 7 })), None, "a request");
        assert_eq!(channel.withdrawn_by(b"garbage"), None);
        let waited = block_on(channel.answer(withdrawing, WaitMode::Adaptive, Instant::now(), || ()));
        assert!(waited.is_err(), "given up");
        assert_eq!(channel.withdrawn_by(&done(withdrawing, None)), None, "nobody awaits it any more");
    }

    #[test]
    fn outstanding_requests_are_bounded() {
        let (channel, _peer) = pair();
        for _ in 0..MAX_OUTSTANDING {
            channel.ask(|seq| Control::Withdraw { seq, id: 1 }, soon()).unwrap();
        }
        let refused = channel.ask(|seq| Control::Withdraw { seq, id: 1 }, soon());
        assert!(matches!(refused, Err(TransportError::QueueFull { .. })), "{refused:?}");
    }
}
