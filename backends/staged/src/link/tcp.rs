//! The TCP channel's reading side: the reader thread and the application's own polls take
//! frames off the socket, the link's [`Session`] says what each means, and this does it
//! (places payloads and answers, completes writes, hands the sender what is owed); and the
//! posting thread's own sends in `BusyPoll`.

use super::sender::{deliver, write_frame};
use super::*;

impl Link {
    /// TCP: takes places in the peer's window of answers for `count` reads about to be
    /// queued (queued and asked reads count alike), or says how many fit.
    pub(crate) fn reserve_reads(&self, count: usize) -> Result<(), TransportError> {
        self.shared
            .session()
            .reserve_reads(count)
            .map_err(|room| TransportError::QueueFull { given: count as u32, max: room as u32 })
    }

    /// TCP: gives back the places of `count` reads that were not queued after all.
    pub(crate) fn unreserve_reads(&self, count: usize) {
        self.shared.session().unreserve_reads(count);
    }
}

/// A read whose answer will never come (the link ended): its destination let go, no longer in
/// flight, and flushed if it was to complete.
pub(super) fn unanswered(shared: &Shared, read: PendingRead) {
    let (wr_id, signalled) = (read.wr_id, read.signalled);
    retire_read(shared, read);
    if signalled {
        let _ = shared
            .completions
            .try_send(Completion { wr_id, status: CompletionStatus::Failed { code: FLUSHED } });
    }
}

/// Places the answer to our oldest read (`read`, which the session took for it), then
/// completes it.
fn place_answer(
    shared: &Shared,
    read: PendingRead,
    socket: &mut TcpStream,
    staging: &mut Staging,
) -> Result<(), String> {
    if let Err(e) = read.local.over_socket(Direction::Receive, read.local_offset, read.len, socket, staging) {
        unanswered(shared, read);
        return Err(format!("the peer vanished mid-answer: {e}"));
    }
    let (wr_id, signalled) = (read.wr_id, read.signalled);
    retire_read(shared, read);
    if signalled {
        return shared.complete(Completion { wr_id, status: CompletionStatus::Success });
    }
    Ok(())
}

/// A read done with: its destination is let go before its completion says so (a release right
/// after the completion finds no link thread holding the memory), and it leaves the ops in
/// flight.
fn retire_read(shared: &Shared, read: PendingRead) {
    drop(read);
    shared.lane.in_flight.fetch_sub(1, Ordering::AcqRel);
}

/// TCP: takes frames off the socket until it closes or the peer breaks the protocol; returns
/// why it stopped. In `Adaptive` mode it sleeps until the socket is readable; in `BusyPoll` it
/// looks every [`RING_TICK`] and leaves the socket to an application that polls it itself,
/// taking only what that poll cannot (a frame not wholly there yet, one bound for GPU memory).
pub(super) fn read_loop(shared: &Shared, watched: &TcpStream) -> String {
    let mut staging = Staging::default();
    loop {
        if let Some(reason) = shared.lane.gone.why() {
            return reason.to_string();
        }
        // Acks held for an answer that did not come, where the application stopped polling.
        if let Err(reason) = shared.send_overdue_acks(Instant::now(), false) {
            return reason;
        }
        let overdue = shared.session().overdue(Instant::now(), ANSWER_PATIENCE);
        if let Some(silent) = overdue {
            return format!(
                "the peer sent nothing for {} s while acks or reads waited on it",
                silent.as_secs()
            );
        }
        if shared.wait_mode.get() == WaitMode::BusyPoll {
            // Woken early by a wait that found a frame it leaves to this thread.
            std::thread::park_timeout(RING_TICK);
            let app_polls = shared.app_polled_within(APP_POLL_GRACE);
            if (app_polls && !shared.reader_needed.load(Ordering::Acquire))
                || !readable(watched, Duration::ZERO)
            {
                continue;
            }
        } else {
            // Acks held from `BusyPoll` wait no longer than they would have there.
            let nap = if shared.acks_held.load(Ordering::Acquire) { RING_TICK } else { RING_NAP };
            if !readable(watched, nap) {
                continue;
            }
        }
        let mut socket = shared.reading.lock().unwrap_or_else(PoisonError::into_inner);
        shared.reader_needed.store(false, Ordering::Release);
        // Looked at again under the lock: the application's poll may have taken it meanwhile,
        // and a read here must not block on a socket that has nothing.
        while readable(&socket, Duration::ZERO) {
            if let Err(reason) = read_frame(shared, &mut socket, &mut staging) {
                return reason;
            }
        }
    }
}

/// Reads one frame (waiting for its bytes), has the session take it and does what it asks;
/// its ack and arrival go to the sender thread.
fn read_frame(shared: &Shared, socket: &mut TcpStream, staging: &mut Staging) -> Result<(), String> {
    shared.partial_since_us.store(0, Ordering::Relaxed);
    let mut header = [0u8; HEADER_BYTES];
    if let Err(e) = socket.read_exact(&mut header) {
        return Err(match e.kind() {
            std::io::ErrorKind::UnexpectedEof => "the peer closed the connection".into(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("the peer stopped in a frame's header for {} s", ANSWER_PATIENCE.as_secs())
            }
            _ => format!("reading from the peer: {e}"),
        });
    }
    let frame = Frame::decode(&header).map_err(|e| format!("protocol error: {e}"))?;
    // Life at a frame's start (the session's take) and, for a body that took long, at its end.
    let started = Instant::now();
    let received = shared.session().receive(&frame, started)?;
    let applied = apply(shared, received, socket, staging);
    let ended = Instant::now();
    if ended.saturating_duration_since(started) > LONG_BODY {
        shared.session().heard(ended);
    }
    applied
}

/// Does what a frame the session took asks: places a write's payload or a read's answer off
/// `socket`, completes a write, or hands the sender thread what it owes.
fn apply(
    shared: &Shared,
    received: Received<PendingRead>,
    socket: &mut TcpStream,
    staging: &mut Staging,
) -> Result<(), String> {
    match received {
        Received::Write { region, offset, len, owed, acked } => {
            with_target(shared, region, |target| {
                (target.memory.over_socket(Direction::Receive, offset, len, socket, staging))
                    .map_err(|e| format!("the peer vanished mid-write: {e}"))
            })?;
            acknowledged(shared, acked)?;
            hand_over(shared, owe(shared, owed, false))
        }
        Received::Completed(done) => shared.complete(done),
        Received::ReadRequest { region, offset, len, answer } => {
            hand_over(shared, Some(Outgoing::Answer { region, offset, len, answer }))
        }
        Received::ReadData(read) => place_answer(shared, read, socket, staging),
        // Checked by the channel's reader on the sender thread, after what came before it. The
        // peer's answer that it dropped a region this side withdraws closes the region to its
        // frames here, before the next frame is read: one behind the answer is a breach.
        Received::Control { len } => {
            let mut body = vec![0u8; len as usize];
            socket.read_exact(&mut body).map_err(|e| format!("the peer vanished mid-frame: {e}"))?;
            if let Some(region) = shared.control.withdrawn_by(&body) {
                shared.inbox.withdraw(region);
            }
            hand_over(shared, Some(Outgoing::Control(body)))
        }
    }
}

/// What a placed write owes: its ack joins those the session owes (held there for a write to
/// carry where `may_hold`, see [`crate::session::held_acks`]); what is left to deliver: the acks
/// owed, sent before the arrival (see [`deliver`]), or the arrival alone.
fn owe(shared: &Shared, owed: Owed, may_hold: bool) -> Option<Outgoing> {
    let Some(ack) = owed.ack else { return owed.arrival.map(Outgoing::Arrival) };
    let timing = shared.session().held_acks().owe(ack, may_hold, Instant::now());
    match timing {
        AckTiming::Hold => {
            shared.acks_held.store(true, Ordering::Release);
            owed.arrival.map(Outgoing::Arrival)
        }
        AckTiming::SendNow => Some(Outgoing::Acks { then: owed.arrival }),
    }
}

/// The acks a write carried (its bytes are off the socket) complete our oldest writes.
fn acknowledged(shared: &Shared, acked: u16) -> Result<(), String> {
    let mut queued = Ok(());
    if acked > 0 {
        shared.session().acknowledged(acked, |done| {
            if queued.is_ok() {
                queued = shared.complete(done);
            }
        });
    }
    queued
}

/// Queues `outgoing` for the sender thread (a reader never writes to the socket itself: two
/// links writing to each other at once cannot deadlock).
pub(super) fn hand_over(shared: &Shared, outgoing: Option<Outgoing>) -> Result<(), String> {
    let Some(outgoing) = outgoing else { return Ok(()) };
    shared.queued_deliveries.fetch_add(1, Ordering::AcqRel);
    shared.outgoing.try_send(outgoing).map_err(|_| {
        shared.queued_deliveries.fetch_sub(1, Ordering::AcqRel);
        "protocol error: the peer exceeded its window of unacknowledged writes".to_string()
    })
}

impl Shared {
    fn app_polled_within(&self, grace: Duration) -> bool {
        let now = self.born.elapsed().as_micros() as u64;
        now.saturating_sub(self.app_polled_us.load(Ordering::Relaxed)) < grace.as_micros() as u64
    }
}

impl Link {
    /// TCP: takes the frames wholly waiting on the socket in the calling thread (a wait's own
    /// poll: no thread between the socket and the queues), up to [`PUMP_FRAMES`]; a frame not
    /// all there yet, or bound for GPU memory, is left to the reader thread. Nothing here waits
    /// on the peer.
    pub(crate) fn pump(&self) -> Result<(), TransportError> {
        let shared = &*self.shared;
        if shared.channel != ChannelKind::Tcp || shared.lane.gone.is_gone() {
            return Ok(());
        }
        let now = Instant::now();
        let polled_us = now.saturating_duration_since(shared.born).as_micros() as u64;
        shared.app_polled_us.store(polled_us, Ordering::Relaxed);
        if let Err(reason) = shared.send_overdue_acks(now, true) {
            return Err(self.break_with(reason));
        }
        let Ok(mut socket) = shared.reading.try_lock() else { return Ok(()) };
        for _ in 0..PUMP_FRAMES {
            // The header and, where they are there, the first bytes after it: a small write
            // seen whole here needs no second look at what waits.
            let mut seen = [0u8; HEADER_BYTES + PEEK_PAST_HEADER];
            let waiting = match peek(&socket, &mut seen) {
                Ok(waiting) if waiting >= HEADER_BYTES => waiting,
                // A header on its way: the next poll looks again, up to the patience a write's
                // bytes get (a peer that stops there, or closes, is the reader thread's).
                Ok(1..) => {
                    if shared.partial_for_too_long(polled_us) {
                        self.leave_to_reader();
                    }
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // The peer closed, or the socket failed: the reader thread reads why and ends
                // the link (flushing what waits), where a poll would only look again.
                Ok(0) | Err(_) => {
                    self.leave_to_reader();
                    break;
                }
            };
            let mut header: [u8; HEADER_BYTES] = seen[..HEADER_BYTES].try_into().expect("a header's bytes");
            match self.pump_frame(&mut socket, &mut header, (polled_us, waiting)) {
                Ok(Pumped::Took) => shared.partial_since_us.store(0, Ordering::Relaxed),
                Ok(Pumped::NotYet) => break,
                Ok(Pumped::Reader) => {
                    self.leave_to_reader();
                    break;
                }
                // A link another thread ended meanwhile (whose end flushed what waited) is
                // reported by the waits once its queue is drained, not by this poll.
                Err(_) if shared.lane.gone.is_gone() => break,
                Err(reason) => return Err(self.break_with(reason)),
            }
        }
        Ok(())
    }

    /// Takes the frame whose `header` waits at the socket's head, or says who will.
    fn pump_frame(
        &self,
        socket: &mut TcpStream,
        header: &mut [u8; HEADER_BYTES],
        (polled_us, seen): (u64, usize),
    ) -> Result<Pumped, String> {
        let shared = &*self.shared;
        let frame = Frame::decode(header).map_err(|e| format!("protocol error: {e}"))?;
        match frame.kind {
            // Reads are the reader thread's: it answers through the sender thread and places
            // answers into memory a poll does not hold; control frames too, which it hands the
            // sender thread in order with those answers.
            FrameKind::ReadRequest | FrameKind::ReadData | FrameKind::Control => Ok(Pumped::Reader),
            // An ack is off the socket before the session takes its write off what waits:
            // nothing taken is lost to a failed read.
            FrameKind::Ack => {
                socket.read_exact(header).map_err(|e| format!("reading from the peer: {e}"))?;
                let received = shared.session().receive(&frame, Instant::now())?;
                apply(shared, received, socket, &mut Staging::default())?;
                Ok(Pumped::Took)
            }
            // A write takes nothing off what waits: the session takes it before its bytes are,
            // which may be left to the reader thread (which takes it again).
            FrameKind::Write => {
                let received = shared.session().receive(&frame, Instant::now())?;
                match received {
                    Received::Write { region, offset, len, owed, acked } => {
                        let write = WholeWrite { region, offset, len, owed, acked };
                        take_whole_write(shared, socket, header, write, (polled_us, seen))
                    }
                    other => apply(shared, other, socket, &mut Staging::default()).map(|()| Pumped::Took),
                }
            }
        }
    }

    /// TCP: the frame at the socket's head is the reader thread's (not wholly there yet, bound
    /// for GPU memory, or a read's): wake it for it.
    fn leave_to_reader(&self) {
        self.shared.reader_needed.store(true, Ordering::Release);
        if let Some(reader) = self.threads.first() {
            reader.thread().unpark();
        }
    }

    /// TCP in `BusyPoll`: sends `ops` (checked by the caller, with the region table
    /// read-locked) from the posting thread, header and payload in one system call each.
    /// `Ok(false)`: the batch goes the sender thread's way (it has writes queued, a source is
    /// GPU memory or larger than [`DIRECT_SEND_MAX`], or the socket is being written).
    pub(crate) fn post_over_socket(
        &self,
        ops: &[impl Pieces],
        regions: &RegionTable<LocalEntry>,
    ) -> Result<bool, TransportError> {
        let shared = &*self.shared;
        if shared.channel != ChannelKind::Tcp
            || shared.wait_mode.get() != WaitMode::BusyPoll
            || shared.lane.in_flight.load(Ordering::Acquire) > 0
        {
            return Ok(false);
        }
        for request in ops {
            if request.head().len > DIRECT_SEND_MAX {
                return Ok(false);
            }
            for piece in request.pieces() {
                if regions.get(piece.local)?.memory.host().is_none() {
                    return Ok(false);
                }
            }
        }
        let Ok(writer) = shared.writer.try_lock() else { return Ok(false) };
        // Recorded before the first frame leaves, so no ack can overtake its write; taken back
        // for the writes that never leave. The writer held meanwhile keeps the reader's end
        // (which flushes what waits) out until then.
        let signalled = ops.iter().map(|request| request.head()).filter(|op| op.signalled).map(|op| op.wr_id);
        // The acks this side owes ride in the first write (owed acks leave only under the
        // writer, held here: none goes twice).
        let (recorded, carried) = {
            let mut session = shared.session();
            let now = Instant::now();
            let recorded = session.sent_writes(signalled, now);
            (recorded, session.held_acks().write_leaving(now))
        };
        match recorded {
            Ok(()) => {}
            Err(NotRecorded::Full { room }) => {
                return Err(TransportError::QueueFull { given: ops.len() as u32, max: room as u32 })
            }
            Err(NotRecorded::Closed) => return Err(self.break_with("link already broken".into())),
        }
        for (index, request) in ops.iter().enumerate() {
            let carrying = if index == 0 { carried } else { 0 };
            let sent = send_direct(request, regions, &writer, carrying);
            if sent.is_ok() && carrying > 0 {
                shared.acks_went(&mut shared.session(), usize::from(carrying));
            }
            if let Err(failure) = sent {
                // Neither it nor any after it was posted (those before it were).
                let mut session = shared.session();
                for op in ops[index..].iter().map(|request| request.head()).filter(|op| op.signalled) {
                    session.retract_write(op.wr_id);
                }
                drop(session);
                return Err(match failure {
                    DirectFailure::Refused(refused) => refused,
                    DirectFailure::Send(e) => self.break_with(format!("sending a write: {e}")),
                });
            }
        }
        Ok(true)
    }
}

/// Why a write the posting thread sends itself did not go.
enum DirectFailure {
    /// Refused before any byte went (a source that is not host memory).
    Refused(TransportError),
    /// The socket failed: the link breaks.
    Send(std::io::Error),
}

/// Sends one write, header (carrying `acks` acks) and payload (every piece of a gather), in
/// one system call.
fn send_direct(
    request: &impl Pieces,
    regions: &RegionTable<LocalEntry>,
    writer: &TcpStream,
    acks: u16,
) -> Result<(), DirectFailure> {
    let op = request.head();
    let mut frame = write_frame(&op).carrying(acks);
    if op.signalled {
        frame.flags |= FLAG_SIGNALLED;
    }
    let header = frame.encode();
    let mut send = GatherSend::new(&header);
    for piece in request.pieces() {
        let source = regions.get(piece.local).map_err(DirectFailure::Refused)?.memory.host();
        let source = source.ok_or(DirectFailure::Refused(TransportError::UnregisteredRegion(piece.local)))?;
        send.push(source, piece.local_offset, piece.len).map_err(|e| DirectFailure::Refused(e.into()))?;
    }
    send.send(writer).map_err(DirectFailure::Send)
}

/// What a poll did with the frame at the socket's head.
enum Pumped {
    /// Took it off the socket.
    Took,
    /// A write whose bytes are not all there yet: the next poll looks again.
    NotYet,
    /// The reader thread's to take.
    Reader,
}

/// A write the session admitted, as a poll takes it.
struct WholeWrite {
    region: u32,
    offset: u64,
    len: u64,
    owed: Owed,
    acked: u16,
}

/// A poll's write: taken off the socket with its payload in one read when every byte of it is
/// waiting and it lands in host memory (then the acks it carries complete, and what it owes
/// is delivered, or queued behind what the sender thread has yet to deliver). A write into
/// host memory no larger than a poster sends at once, whose bytes are on their way, waits for
/// the next poll (a thread's wake-up costs more than the rest of the bytes take to come) up to
/// [`PARTIAL_PATIENCE`]; anything else is the reader thread's.
fn take_whole_write(
    shared: &Shared,
    socket: &TcpStream,
    header: &mut [u8; HEADER_BYTES],
    write: WholeWrite,
    (polled_us, seen): (u64, usize),
) -> Result<Pumped, String> {
    let WholeWrite { region, offset, len, owed, acked } = write;
    let total = (HEADER_BYTES as u64).checked_add(len);
    // What the peek saw answers for a small write; a larger one asks the socket.
    let whole = total.is_some_and(|bytes| seen as u64 >= bytes || waiting_bytes(socket) >= bytes);
    let received = with_target(shared, region, |target| match target.memory.host() {
        // Every byte of the frame is waiting: one read that returns at once.
        Some(host) if whole => (host.receive_framed(socket, header, (offset, len)))
            .map(|()| Pumped::Took)
            .map_err(|e| format!("reading from the peer: {e}")),
        Some(_) if total.is_some_and(|bytes| bytes <= HEADER_BYTES as u64 + DIRECT_SEND_MAX) => {
            Ok(if shared.partial_for_too_long(polled_us) { Pumped::Reader } else { Pumped::NotYet })
        }
        _ => Ok(Pumped::Reader),
    })?;
    if !matches!(received, Pumped::Took) {
        return Ok(received);
    }
    acknowledged(shared, acked)?;
    let direct = shared.queued_deliveries.load(Ordering::Acquire) == 0;
    // Held only where the application's polls take the socket and nothing waits to go first.
    let may_hold = direct && shared.wait_mode.get() == WaitMode::BusyPoll;
    match owe(shared, owed, may_hold) {
        Some(owed) if direct => deliver(shared, owed, &mut Staging::default())?,
        owed => hand_over(shared, owed)?,
    }
    Ok(Pumped::Took)
}
