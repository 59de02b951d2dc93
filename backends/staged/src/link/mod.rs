//! One connected peer: a sender thread that moves posted writes (socket payload or shm copy)
//! and a reader thread that places incoming writes, acknowledges them and collects arrivals.
//! On the shm channel, writes from host memory are copied into the peer's mapping by the
//! posting thread itself and announced on the peer's [ring](crate::ring); the socket then
//! carries only control frames (regions exposed and withdrawn after connect, the goodbye), and a
//! ring thread takes announcements off our ring while the application does not (it sleeps on
//! the ring's futex in `Adaptive` mode).

mod exposing;
mod sender;
mod shm;
mod tcp;

use crate::lane::{StagedLane, ThreadDone};
use crate::local::{local, LocalEntry, LocalRegions};
use crate::memory::{Direction, GatherSend, Memory, PeerMapping};
use crate::protocol::{Inbound, Inbox};
use crate::reads::{request_frame, PendingRead};
use crate::region::{copy_to_peer, Staging};
use crate::request::{Pieces, Request};
use crate::ring::{self, Consumer, Producer, RingView, RING_BYTES};
use crate::session::held_acks::{AckTiming, MAX_HELD};
use crate::session::{NotRecorded, Owed, Received, Session, ANSWER_PATIENCE, FLUSHED};
use crate::socket::{peek, readable, send_now, waiting_bytes};
use crate::wire::{
    ChannelKind, Frame, FrameKind, CONTROL_LIMITS, FLAG_IMM, FLAG_PLACED, FLAG_SIGNALLED, HEADER_BYTES,
    MAX_REGIONS,
};
use crossbeam_channel::{select, Receiver, Sender};
use rdma_hint_backend_core::peer_regions::{PeerView, Withdrawals};
use rdma_hint_backend_core::queue::{event_queue, EventQueue, EventSender};
use rdma_hint_backend_core::region_table::RegionLen;
use rdma_hint_backend_core::wait::WaitModeCell;
use rdma_hint_backend_core::{PeerRegions, RegionTable};
use rdma_hint_core::{
    Arrival, Completion, CompletionStatus, ReadOp, RegionId, TransportError, WaitMode, WriteOp,
};
use rdma_hint_oob::ControlChannel;
use rdma_hint_stream_copy::Run;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exposing::Handoff;
use sender::{send_loop, Outgoing};
pub(crate) use shm::Rings;
use shm::{ring_loop, watch_control};
use tcp::{read_loop, unanswered};

/// Arrivals the application has not drained yet, at most.
pub(crate) const MAX_PENDING_ARRIVALS: usize = 4096;
/// Acknowledgements waiting for the sender thread, at most (a peer keeps far fewer signalled
/// writes outstanding; more is a broken peer).
const MAX_PENDING_ACKS: usize = 4096;
/// How long the ring thread sleeps on the futex at most in `Adaptive` mode: a wake-up a peer
/// never sends, or a change of wait mode, costs no more.
const RING_NAP: Duration = Duration::from_millis(50);
/// How often the ring thread (shm) and the reader thread (TCP) look in `BusyPoll` mode, where
/// the application's own waits take what arrives and no writer makes a system call to wake
/// anyone: rarely, since each look preempts a spinning thread on a busy machine (a wait that
/// leaves the reader a frame wakes it at once).
const RING_TICK: Duration = Duration::from_millis(10);
/// How long the sender thread waits for room on the peer's ring before it gives up on a peer
/// that takes nothing off it (as a socket's send timeout would).
const RING_PATIENCE: Duration = Duration::from_secs(30);
/// TCP in `BusyPoll`: the reader thread leaves the socket to an application that polled it
/// this recently, unless the frame at its head needs the thread.
const APP_POLL_GRACE: Duration = Duration::from_millis(2);
/// TCP in `BusyPoll`: frames one poll of the application takes off the socket at most.
const PUMP_FRAMES: usize = 64;
/// TCP: bytes past a frame's header a poll's peek takes in too: a write no larger is seen whole
/// without asking the socket how much waits (a system call less; the bytes are copied twice).
const PEEK_PAST_HEADER: usize = 64;
/// TCP in `BusyPoll`: writes up to this size are sent by the posting thread itself.
const DIRECT_SEND_MAX: u64 = 64 << 10;
/// TCP in `BusyPoll`: how long a poll leaves a write whose bytes are on their way for the next
/// poll before it hands it to the reader thread (a peer that stops mid-frame, or a frame the
/// socket's buffer cannot hold whole).
const PARTIAL_PATIENCE: Duration = Duration::from_micros(200);
/// TCP: a frame whose body took longer than this to arrive restarts the peer's silence clock at
/// its end too (a long body is life; a short one's start says as much).
const LONG_BODY: Duration = Duration::from_millis(100);

/// A region the peer exposed: its length and, on the shm channel, its mapping here (made at
/// the first write into it; shared with the queued requests toward it, so a withdrawal never
/// unmaps it under one) and whether every write into it must be announced (a bounce buffer in
/// front of caller memory).
#[derive(Debug)]
pub(crate) struct RemoteEntry {
    pub(crate) len: u64,
    pub(crate) mapped: Option<Arc<PeerMapping>>,
    pub(crate) notify_each_write: bool,
}

impl RegionLen for RemoteEntry {
    fn region_len(&self) -> u64 {
        self.len
    }
}

/// The peer's regions by id: those its hello named, those it exposed since, less those it
/// withdrew.
pub(crate) type RemoteRegions = Arc<PeerRegions<RemoteEntry>>;

/// The peer's regions, read-locked for a post.
pub(crate) type RemoteView<'a> = PeerView<'a, RemoteEntry>;

/// A running link.
pub(crate) struct Link {
    pub(crate) ops: Sender<Request>,
    pub(crate) completions: EventQueue<Completion>,
    pub(crate) arrivals: EventQueue<Arrival>,
    pub(crate) lane: Arc<StagedLane>,
    pub(crate) remote: RemoteRegions,
    shared: Arc<Shared>,
    socket: TcpStream,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("gone", &self.lane.gone.why()).finish()
    }
}

struct Shared {
    channel: ChannelKind,
    local: LocalRegions,
    remote: RemoteRegions,
    /// The regions the peer may write, by id: those the connect exposed, and those exposed
    /// since until their withdrawal is done (none can be released while exposed, so no
    /// incoming write needs the table's lock). Let go when the last link thread ends, so that
    /// the regions can be released then.
    targets: RwLock<Vec<Option<LocalEntry>>>,
    /// Which targets sit behind a bounce (set with them): an announcement into any other
    /// region lands without the targets' lock.
    bounced: Box<[AtomicBool]>,
    /// The control channel: its own socket on shm, carried in `Control` frames on TCP.
    control: Arc<ControlChannel>,
    /// The peer's withdrawals waiting for the ops queued before them.
    withdrawals: Withdrawals<RemoteEntry>,
    /// Held while acting on the peer's requests: one thread at a time, in their order.
    serving: Mutex<()>,
    /// shm: the hand-off socket, kept after connect for the memfds of regions exposed since.
    handoff: Option<Handoff>,
    /// The rules every incoming frame and ring slot passes first (the ring takes slots by them
    /// without the session's lock).
    inbox: Arc<Inbox>,
    /// TCP: the protocol's state (what waits on the peer, how long it has been silent), locked
    /// for a step at a time and never across I/O.
    session: Mutex<Session<PendingRead>>,
    rings: Option<Rings>,
    wait_mode: Arc<WaitModeCell>,
    completions: EventSender<Completion>,
    arrivals: EventSender<Arrival>,
    /// Link threads still running; waits report the link gone once it is 0 and their queue
    /// is drained.
    running: AtomicUsize,
    /// Shared with the control channel, whose frames it carries on TCP.
    writer: Arc<Mutex<TcpStream>>,
    /// The socket once more, only to shut it down (see [`Shared::fail`]).
    closer: TcpStream,
    /// TCP: the socket's read side, held by whoever takes frames off it: the reader thread,
    /// or (`BusyPoll`) the application's own poll.
    reading: Mutex<TcpStream>,
    /// TCP: where the reader hands acks and arrivals to the sender thread.
    outgoing: Sender<Outgoing>,
    /// Of those, handed over and not delivered yet: while any is, later ones go the same way,
    /// so that none overtakes another.
    queued_deliveries: AtomicUsize,
    /// When the application last polled the socket itself (µs since `born`), and whether the
    /// frame at the socket's head needs the reader thread (not wholly there yet, or bound for
    /// GPU memory).
    app_polled_us: AtomicU64,
    reader_needed: AtomicBool,
    /// TCP: the session holds acks for a write to carry (read on every poll without its lock).
    acks_held: AtomicBool,
    /// TCP: a flush of the acks owed waits in the sender thread's queue (one is enough).
    acks_flush_queued: AtomicBool,
    /// TCP: since when (µs since `born`, 0: not) a poll has seen the write at the socket's head
    /// not wholly there; only the holder of `reading` touches it.
    partial_since_us: AtomicU64,
    born: Instant,
    lane: Arc<StagedLane>,
}

impl Shared {
    fn fail(&self, reason: String) {
        if self.lane.gone.set(reason.clone()) {
            // A peer that leaves is ordinary at the end of a session; a protocol violation is not.
            if reason.starts_with("protocol error") {
                tracing::warn!(%reason, "staged link broken");
            } else {
                tracing::debug!(%reason, "staged link closed");
            }
        }
        // Through a handle of its own: the writer's lock may be held by a send that waits on
        // this very socket (up to its timeout), and the shutdown is what ends that send.
        let _ = self.closer.shutdown(Shutdown::Both);
        if let Some(rings) = &self.rings {
            ring::wake(&rings.inbound());
        }
        // Whoever waits for the peer's answer learns why none comes.
        self.control.close(self.lane.gone.why().unwrap_or(&reason));
    }

    /// The end of a link thread: the last one's end turns a drained queue into "gone".
    fn retire(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.targets.write().unwrap_or_else(PoisonError::into_inner).clear();
        }
        self.completions.wake();
        self.arrivals.wake();
    }

    /// Queues a completion; a full queue is the application's fault, and ends the link.
    fn complete(&self, done: Completion) -> Result<(), String> {
        (self.completions.try_send(done))
            .map_err(|_| "completion queue overflow: the application is not draining completions".to_string())
    }

    fn session(&self) -> MutexGuard<'_, Session<PendingRead>> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn send_frame(&self, frame: &Frame) -> std::io::Result<()> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner).write_all(&frame.encode())
    }

    /// Sends every ack owed, oldest first, as frames. The writer is held throughout: owed acks
    /// leave only under it (here, or inside a write), so none is sent twice or out of order.
    fn send_owed_acks(&self) -> std::io::Result<()> {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.send_owed_acks_with(|bytes| (&*writer).write_all(bytes))
    }

    /// The acks owed, [`MAX_HELD`] + 1 at a time, through `send` (which holds the writer).
    fn send_owed_acks_with(&self, mut send: impl FnMut(&[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
        let mut bytes = [0u8; (MAX_HELD + 1) * HEADER_BYTES];
        loop {
            let count = {
                let mut session = self.session();
                let owed = session.held_acks().owed();
                let count = owed.len().min(MAX_HELD + 1);
                for (slot, ack) in bytes.chunks_exact_mut(HEADER_BYTES).zip(owed) {
                    slot.copy_from_slice(&ack.encode());
                }
                count
            };
            if count == 0 {
                return Ok(());
            }
            send(&bytes[..count * HEADER_BYTES])?;
            self.acks_went(&mut self.session(), count);
        }
    }

    /// `count` owed acks went on the wire (as frames, or inside a write).
    fn acks_went(&self, session: &mut Session<PendingRead>, count: usize) {
        let held = session.held_acks();
        held.went(count);
        self.acks_held.store(held.owed_since().is_some(), Ordering::Release);
    }

    /// Held acks that waited too long for an answer to carry them are sent now: by this thread
    /// where `direct`, no delivery waits before them and the writer is free (a poll never
    /// waits behind a send), else through the sender thread, one flush queued at a time.
    fn send_overdue_acks(&self, now: Instant, direct: bool) -> Result<(), String> {
        if !self.acks_held.load(Ordering::Acquire) || !self.session().held_acks().overdue(now) {
            return Ok(());
        }
        if direct && self.queued_deliveries.load(Ordering::Acquire) == 0 {
            if let Ok(writer) = self.writer.try_lock() {
                let sent = self.send_owed_acks_with(|bytes| (&*writer).write_all(bytes));
                return sent.map_err(|e| format!("sending an ack: {e}"));
            }
        }
        if self.acks_flush_queued.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        tcp::hand_over(self, Some(Outgoing::Acks { then: None }))
    }

    /// A poll has waited since `polled_us` (µs since `born`) for the rest of the frame at the
    /// socket's head longer than [`PARTIAL_PATIENCE`]: the reader thread's to take (the clock
    /// starts at the first such look, and starts again then).
    fn partial_for_too_long(&self, polled_us: u64) -> bool {
        let since = match self.partial_since_us.load(Ordering::Relaxed) {
            0 => {
                self.partial_since_us.store(polled_us.max(1), Ordering::Relaxed);
                polled_us
            }
            since => since,
        };
        let too_long = polled_us.saturating_sub(since) >= PARTIAL_PATIENCE.as_micros() as u64;
        if too_long {
            self.partial_since_us.store(0, Ordering::Relaxed);
        }
        too_long
    }
}

/// What a link is made of, besides its socket.
pub(crate) struct LinkParts {
    pub(crate) channel: ChannelKind,
    pub(crate) local: LocalRegions,
    pub(crate) remote: RemoteRegions,
    /// Queued writes and the largest message.
    pub(crate) limits: (usize, u64),
    pub(crate) lane: Arc<StagedLane>,
    /// shm channel: the rings (TCP: none).
    pub(crate) rings: Option<Rings>,
    pub(crate) wait_mode: Arc<WaitModeCell>,
    /// The regions this link's connect exposed: its peer may write these and no others (the
    /// table is shared with other lanes, which may expose more).
    pub(crate) expose: Vec<RegionId>,
    /// shm channel: the hand-off socket, kept for regions exposed after connect.
    pub(crate) handoff: Option<UnixStream>,
}

impl Link {
    /// Starts the threads on a socket whose handshake is done.
    pub(crate) fn start(socket: TcpStream, parts: LinkParts) -> Result<Link, TransportError> {
        let LinkParts {
            channel,
            local,
            remote,
            limits: (max_outstanding, max_msg_bytes),
            lane,
            rings,
            wait_mode,
            expose,
            handoff,
        } = parts;
        if channel == ChannelKind::Tcp {
            // Frames are read once the socket is readable: only a peer that stops in the middle
            // of one meets this bound, and its link breaks instead of a thread hanging.
            socket.set_read_timeout(Some(ANSWER_PATIENCE))?;
        }
        let (ops_tx, ops_rx) = crossbeam_channel::bounded(max_outstanding);
        let (completion_tx, completions) = event_queue(max_outstanding * 2);
        let (arrival_tx, arrivals) = event_queue(MAX_PENDING_ARRIVALS);
        let (reader_alive, reader_gone) = crossbeam_channel::bounded::<()>(0);
        // Acks go out through the sender thread, so a reader never waits on the socket's write
        // side: two links writing to each other at once cannot deadlock.
        let (ack_tx, acks) = crossbeam_channel::bounded(MAX_PENDING_ACKS);
        let targets = exposed_targets(&local, &expose);
        let exposed: Vec<(u32, u64)> = (targets.iter().enumerate())
            .filter_map(|(id, entry)| entry.as_ref().map(|e| (id as u32, e.memory.len())))
            .collect();
        let bounced = bounced_targets(&targets);
        let threads = if rings.is_some() { 3 } else { 2 };
        let inbox = Arc::new(Inbox::new(channel, &exposed, max_msg_bytes));
        let writer = Arc::new(Mutex::new(socket.try_clone()?));
        let control = Arc::new(match channel {
            ChannelKind::Shm => ControlChannel::new(socket.try_clone()?, CONTROL_LIMITS)?,
            ChannelKind::Tcp => {
                let writer = writer.clone();
                ControlChannel::carried(CONTROL_LIMITS, move |bytes: &[u8], deadline: Instant| {
                    exposing::carry(&writer, bytes, deadline)
                })
            }
        });
        let shared = Arc::new(Shared {
            channel,
            local,
            remote: remote.clone(),
            targets: RwLock::new(targets),
            bounced,
            control,
            withdrawals: Withdrawals::default(),
            serving: Mutex::default(),
            handoff: handoff.map(Handoff::new),
            session: Mutex::new(Session::new(inbox.clone(), max_outstanding, Instant::now())),
            inbox,
            rings,
            wait_mode,
            completions: completion_tx,
            arrivals: arrival_tx,
            running: AtomicUsize::new(threads),
            writer,
            closer: socket.try_clone()?,
            reading: Mutex::new(socket.try_clone()?),
            outgoing: ack_tx,
            queued_deliveries: AtomicUsize::new(0),
            app_polled_us: AtomicU64::new(0),
            reader_needed: AtomicBool::new(false),
            acks_held: AtomicBool::new(false),
            acks_flush_queued: AtomicBool::new(false),
            partial_since_us: AtomicU64::new(0),
            born: Instant::now(),
            lane: lane.clone(),
        });
        let spawn = |name: &str, body: Box<dyn FnOnce(&Shared) + Send>| {
            let shared = shared.clone();
            std::thread::Builder::new().name(name.into()).spawn(move || {
                body(&shared);
                shared.retire();
            })
        };
        let mut handles = vec![spawn(
            "staged-reader",
            Box::new(move |shared| {
                // Dropped last: the reads' flush below is the reader's last touch.
                let _done = ThreadDone(&shared.lane.reader_done);
                let _alive = reader_alive;
                let reason = match shared.channel {
                    ChannelKind::Tcp => read_loop(shared, &shared.closer),
                    ChannelKind::Shm => watch_control(shared),
                };
                shared.fail(reason);
                // No answer is placed after this thread: what still waits for one never completes.
                // A poster sending its own batch holds the writer until its send failed (the
                // socket is shut down by now) and it took back what never left: what waits
                // after that is this end's to flush.
                let ended = {
                    let _writer = shared.writer.lock().unwrap_or_else(PoisonError::into_inner);
                    shared.session().end()
                };
                for flushed in ended.flushed {
                    let _ = shared.completions.try_send(flushed);
                }
                for read in ended.reads {
                    unanswered(shared, read);
                }
            }),
        )?];
        handles.push(spawn(
            "staged-sender",
            Box::new(move |shared| {
                let _done = ThreadDone(&shared.lane.sender_done);
                send_loop(shared, &ops_rx, &acks, &reader_gone)
            }),
        )?);
        if threads == 3 {
            handles.push(spawn("staged-ring", Box::new(ring_loop))?);
        }
        Ok(Link { ops: ops_tx, completions, arrivals, lane, remote, shared, socket, threads: handles })
    }

    /// Whether every link thread has ended: nothing more will be queued.
    pub(crate) fn finished(&self) -> bool {
        self.shared.running.load(Ordering::Acquire) == 0
    }

    /// The reason the link broke, as an error.
    pub(crate) fn gone(&self) -> TransportError {
        self.lane.gone.error()
    }

    /// The peer's region `id` in `view`, mapped (on its first write), and whether it wants
    /// every write announced.
    fn mapped<'v>(view: &'v RemoteView<'_>, id: RegionId) -> Result<(&'v Memory, bool), TransportError> {
        let remote = view.get(id)?;
        let Some(mapping) = remote.mapped.as_ref() else {
            return Err(TransportError::UnregisteredRegion(id));
        };
        Ok((mapping.get()?, remote.notify_each_write))
    }

    fn break_with(&self, reason: String) -> TransportError {
        self.shared.fail(reason);
        self.gone()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Acks held for an answer go before the close (and before the link reads as gone, whose
        // end drops them): the peer's writes that landed complete. Not where the writer is busy
        // with a send or the socket's buffer is full: a drop does not wait on the peer.
        if self.shared.acks_held.load(Ordering::Acquire) {
            if let Ok(writer) = self.shared.writer.try_lock() {
                let _ = self.shared.send_owed_acks_with(|bytes| match send_now(&writer, bytes)? {
                    sent if sent == bytes.len() => Ok(()),
                    _ => Err(std::io::ErrorKind::WouldBlock.into()),
                });
            }
        }
        self.lane.gone.set("transport dropped");
        // The peer hears a close on purpose, not a vanished process (shm: a write that never
        // blocks; TCP's end of stream says as much already).
        if self.shared.channel == ChannelKind::Shm {
            self.shared.control.say_goodbye();
        }
        let _ = self.socket.shutdown(Shutdown::Both);
        if let Some(rings) = &self.shared.rings {
            ring::wake(&rings.inbound());
        }
        // Closing the op queue stops the sender; the shutdown socket stops the reader.
        let (closed, _) = crossbeam_channel::bounded(0);
        self.ops = closed;
        // Threads that nap between looks (`BusyPoll`) see the end at once.
        self.threads.iter().for_each(|thread| thread.thread().unpark());
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// The regions `expose` names, by id.
fn exposed_targets(local: &LocalRegions, expose: &[RegionId]) -> Vec<Option<LocalEntry>> {
    let regions = local.regions();
    let mut targets = Vec::new();
    for (id, entry) in regions.iter().filter(|(id, _)| expose.contains(id)) {
        let index = id.0 as usize;
        targets.resize_with(targets.len().max(index + 1), || None);
        targets[index] = Some(entry.clone());
    }
    targets
}

/// Which of `targets` sit behind a bounce, by id.
fn bounced_targets(targets: &[Option<LocalEntry>]) -> Box<[AtomicBool]> {
    (0..MAX_REGIONS)
        .map(|id| {
            AtomicBool::new(targets.get(id).is_some_and(|e| e.as_ref().is_some_and(|e| e.bounce.is_some())))
        })
        .collect()
}

/// Runs `apply` on an admitted write's target (admitted writes name exposed regions only,
/// which are in the targets until their withdrawal is done or the link's threads have ended).
/// The entry is taken out of the lock first: `apply` may wait on the socket, and an expose or
/// a withdrawal must not wait behind it (the region stays busy while the entry is held).
fn with_target<R>(
    shared: &Shared,
    region: u32,
    apply: impl FnOnce(&LocalEntry) -> Result<R, String>,
) -> Result<R, String> {
    let target = {
        let targets = shared.targets.read().unwrap_or_else(PoisonError::into_inner);
        targets.get(region as usize).and_then(Option::clone)
    };
    apply(&target.ok_or_else(|| format!("region {region} vanished"))?)
}

#[cfg(test)]
mod lane_tests {
    use super::*;
    use crate::region::RegionMemory;
    use rdma_hint_core::MemoryKind;

    /// Lanes share one table: a link's peer may write what its own connect exposed, never a
    /// region another lane exposed.
    #[test]
    fn a_link_admits_writes_only_to_the_regions_its_own_connect_exposed() {
        let local: LocalRegions = Arc::new(rdma_hint_backend_core::DomainCore::bare(8));
        for _ in 0..2 {
            let memory = RegionMemory::allocate(MemoryKind::Host, 4096, false).unwrap();
            let entry = LocalEntry::new(memory);
            local.regions_mut().insert_with(4096, || Ok::<_, TransportError>(entry)).unwrap();
        }
        let targets = exposed_targets(&local, &[RegionId(1)]);
        assert!(targets.first().is_none_or(Option::is_none), "region 0 was exposed by another lane");
        assert!(targets.get(1).is_some_and(Option::is_some));
    }
}
