//! One connected peer: a sender thread that moves posted writes (socket payload or shm copy)
//! and a reader thread that places incoming writes, acknowledges them and collects arrivals.
//! On the shm channel, writes from host memory are copied into the peer's mapping by the
//! posting thread itself and announced on the peer's [ring](crate::ring); the socket then only
//! says when the peer is gone, and a ring thread takes announcements off our ring while the
//! application does not (it sleeps on the ring's futex in `Adaptive` mode).

use crate::answers::{AnswerClock, AnswerQueue, ANSWER_PATIENCE};
use crate::lane::{StagedLane, ThreadDone};
use crate::local::{local, LocalEntry, LocalRegions};
use crate::memory::{Direction, GatherSend, Memory, PeerMapping};
use crate::protocol::{Awaited, Inbound, Inbox};
use crate::reads::{answer_frame, request_frame, PendingRead, Reads};
use crate::region::{copy_to_peer, Staging};
use crate::request::{Pieces, Request};
use crate::ring::{self, Consumer, Producer, RingView, RING_BYTES};
use crate::socket::{peek, readable, waiting_bytes};
use crate::wire::{ChannelKind, Frame, FrameKind, FLAG_IMM, FLAG_PLACED, FLAG_SIGNALLED, HEADER_BYTES};
use crossbeam_channel::{select, Receiver, Sender};
use rdma_hint_backend_core::queue::{event_queue, EventQueue, EventSender};
use rdma_hint_backend_core::wait::WaitModeCell;
use rdma_hint_backend_core::RegionTable;
use rdma_hint_core::{
    Arrival, Completion, CompletionStatus, ReadOp, RegionId, TransportError, WaitMode, WriteOp,
};
use rdma_hint_stream_copy::Run;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Status code of work requests flushed because the connection broke (as `IBV_WC_WR_FLUSH_ERR`).
pub(crate) const FLUSHED: u32 = 5;
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
/// TCP in `BusyPoll`: writes up to this size are sent by the posting thread itself.
const DIRECT_SEND_MAX: u64 = 64 << 10;

/// A region the peer exposed: its length and, on the shm channel, its mapping here (made at
/// the first write into it) and
/// whether every write into it must be announced (a bounce buffer in front of caller memory).
#[derive(Debug)]
pub(crate) struct RemoteEntry {
    pub(crate) len: u64,
    pub(crate) mapped: Option<PeerMapping>,
    pub(crate) notify_each_write: bool,
}

/// The peer's regions by id (fixed at connect).
pub(crate) type RemoteRegions = Arc<Vec<Option<RemoteEntry>>>;

/// The shm channel's two rings: ours, which the peer publishes on (its memfd went to the peer
/// at connect), and the peer's, mapped here, which we publish on.
#[derive(Debug)]
pub(crate) struct Rings {
    inbound: Memory,
    consumer: Mutex<Consumer>,
    /// The consumer's count of announcements taken, as of its last take (stored under its
    /// lock): a wait peeks at the slot after it without taking the lock. Ours, not the ring's
    /// count in memory the peer can write.
    taken: AtomicU64,
    outbound: Memory,
    producer: Mutex<Outbound>,
}

/// What the writing side of a link keeps under one lock: its place on the peer's ring, and
/// where its direct copies have been landing (whether the next one streams).
#[derive(Debug, Default)]
struct Outbound {
    ring: Producer,
    run: Run,
}

impl Rings {
    /// A fresh ring of ours for the peer to map.
    pub(crate) fn inbound_memory() -> Result<Memory, TransportError> {
        Memory::shared(RING_BYTES)
    }

    /// The rings of a link: `inbound` from [`Rings::inbound_memory`], `outbound` the peer's
    /// checked descriptor.
    pub(crate) fn new(inbound: Memory, outbound: PeerMapping) -> Result<Rings, TransportError> {
        let outbound = outbound.map_now()?;
        for memory in [&inbound, &outbound] {
            if memory.len() != RING_BYTES {
                return Err(TransportError::Handshake(format!(
                    "a ring of {} B, not {RING_BYTES} B",
                    memory.len()
                )));
            }
        }
        Ok(Rings {
            inbound,
            consumer: Mutex::default(),
            taken: AtomicU64::new(0),
            outbound,
            producer: Mutex::default(),
        })
    }

    fn view(memory: &Memory) -> RingView<'_> {
        let (base, _) = memory.mapping();
        // SAFETY: `memory` is a page-aligned mapping of exactly RING_BYTES (checked in `new`)
        // that lives as long as the view's borrow of it, and this side touches a ring's bytes
        // only through the view's atomics.
        unsafe { ring::view_at(base) }
    }

    fn inbound(&self) -> RingView<'_> {
        Rings::view(&self.inbound)
    }

    fn outbound(&self) -> RingView<'_> {
        Rings::view(&self.outbound)
    }
}

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
    /// The regions the peer may write, by id, taken at the start: none can be released while
    /// the link runs, so no incoming write needs the table's lock. Let go when the last link
    /// thread ends, so that the regions can be released then.
    targets: RwLock<Vec<Option<LocalEntry>>>,
    /// Which targets sit behind a bounce (fixed with them): an announcement into any other
    /// region lands without the targets' lock.
    bounced: Vec<bool>,
    /// The rules every incoming frame and ring slot passes first.
    inbox: Inbox,
    rings: Option<Rings>,
    wait_mode: Arc<WaitModeCell>,
    completions: EventSender<Completion>,
    arrivals: EventSender<Arrival>,
    /// Link threads still running; waits report the link gone once it is 0 and their queue
    /// is drained.
    running: AtomicUsize,
    writer: Mutex<TcpStream>,
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
    born: Instant,
    max_outstanding: usize,
    lane: Arc<StagedLane>,
    /// Tags of the signalled writes sent and not yet acknowledged, oldest first: acks must
    /// come back for exactly these, in this order (TCP keeps frames in order).
    awaiting_ack: AnswerQueue<u64>,
    /// TCP: our reads waiting for their bytes, oldest first.
    reads: Reads,
    /// TCP: how long the peer has been silent while acks or reads wait on it.
    answers: AnswerClock,
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
    }

    /// The end of a link thread: the last one's end turns a drained queue into "gone".
    fn retire(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.targets.write().unwrap_or_else(PoisonError::into_inner).clear();
        }
        self.completions.wake();
        self.arrivals.wake();
    }

    /// Publishes `frame` on the peer's ring, waiting for room until `patience` passes (then
    /// `Ok(false)`), the link breaks, or the peer breaks the ring.
    fn announce(&self, frame: &Frame, patience: Instant) -> Result<bool, String> {
        let rings = self.rings.as_ref().ok_or("the shm channel has no ring")?;
        let outbound = rings.outbound();
        loop {
            let mut producer = rings.producer.lock().unwrap_or_else(PoisonError::into_inner);
            let published = ring::publish(&mut producer.ring, &outbound, frame)?;
            let sleeper = published && producer.ring.sleeper(&outbound);
            drop(producer);
            if sleeper {
                ring::wake(&outbound);
            }
            if published {
                return Ok(true);
            }
            if Instant::now() >= patience || self.lane.gone.is_gone() {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn send_frame(&self, frame: &Frame) -> std::io::Result<()> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner).write_all(&frame.encode())
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
        let bounced =
            targets.iter().map(|entry| entry.as_ref().is_some_and(|e| e.bounce.is_some())).collect();
        let threads = if rings.is_some() { 3 } else { 2 };
        let shared = Arc::new(Shared {
            channel,
            local,
            remote: remote.clone(),
            targets: RwLock::new(targets),
            bounced,
            inbox: Inbox::new(channel, &exposed, max_msg_bytes),
            rings,
            wait_mode,
            completions: completion_tx,
            arrivals: arrival_tx,
            running: AtomicUsize::new(threads),
            writer: Mutex::new(socket.try_clone()?),
            closer: socket.try_clone()?,
            reading: Mutex::new(socket.try_clone()?),
            outgoing: ack_tx,
            queued_deliveries: AtomicUsize::new(0),
            app_polled_us: AtomicU64::new(0),
            reader_needed: AtomicBool::new(false),
            born: Instant::now(),
            max_outstanding,
            lane: lane.clone(),
            awaiting_ack: AnswerQueue::new(max_outstanding),
            reads: Reads::new(max_outstanding),
            answers: AnswerClock::new(Instant::now()),
        });
        let spawn = |name: &str, body: Box<dyn FnOnce(&Shared) + Send>| {
            let shared = shared.clone();
            std::thread::Builder::new().name(name.into()).spawn(move || {
                body(&shared);
                shared.retire();
            })
        };
        let watched = socket.try_clone()?;
        let mut handles = vec![spawn(
            "staged-reader",
            Box::new(move |shared| {
                // Dropped last: the reads' flush below is the reader's last touch.
                let _done = ThreadDone(&shared.lane.reader_done);
                let _alive = reader_alive;
                let reason = match shared.channel {
                    ChannelKind::Tcp => read_loop(shared, &watched),
                    ChannelKind::Shm => watch_shm_socket(watched),
                };
                shared.fail(reason);
                // No answer is placed after this thread: what still waits for one never completes.
                for wr_id in shared.awaiting_ack.drain() {
                    let flushed = Completion { wr_id, status: CompletionStatus::Failed { code: FLUSHED } };
                    let _ = shared.completions.try_send(flushed);
                }
                for read in shared.reads.drain() {
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

    /// shm channel: moves `ops` (checked by the caller, with the region table read-locked) in
    /// the calling thread: copies each into the peer's mapping, announces it on the peer's ring
    /// where the peer must hear of it, and completes it. `Ok(false)`: the batch must go the
    /// sender thread's way, because that thread has writes of its own queued (order), a source
    /// is GPU memory (its copies are the copy engine's), or the ring or the completion queue
    /// lacks room for the whole batch.
    pub(crate) fn post_in_place(
        &self,
        ops: &[impl Pieces],
        regions: &RegionTable<LocalEntry>,
    ) -> Result<bool, TransportError> {
        let shared = &*self.shared;
        let Some(rings) = &shared.rings else { return Ok(false) };
        if shared.lane.in_flight.load(Ordering::Acquire) > 0 {
            return Ok(false);
        }
        let outbound = rings.outbound();
        // Held for the batch: its announcements go out in order, and its room cannot shrink.
        let mut producer = rings.producer.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut announced, mut signalled) = (0u64, 0usize);
        for request in ops {
            for piece in request.pieces() {
                if regions.get(piece.local)?.memory.host().is_none() {
                    return Ok(false);
                }
            }
            let op = request.head();
            let (_, notify_each_write) = self.mapped(op.remote)?;
            announced += u64::from(op.imm.is_some() || notify_each_write);
            signalled += usize::from(op.signalled);
        }
        let room = producer.ring.room(&outbound, announced).map_err(|reason| self.break_with(reason))?;
        if room < announced || self.completions.room() < signalled {
            return Ok(false);
        }
        // Moved in a closure so that a batch cut short by an error still wakes a sleeping
        // reader for what it published before the error.
        // Counted once for the batch, after it: a locked add between a copy and its announcement
        // would hold the announcement until the copy's stores are out. (So the count lands just
        // after the batch's completions: another thread that drains one may read it a batch
        // behind.)
        let mut copied = 0u64;
        // Streamed stores are fenced before anything says the bytes are there, and before the
        // batch lets the lock go.
        let moved = (|| -> Result<(), TransportError> {
            for request in ops {
                let op = request.head();
                let (target, notify_each_write) = self.mapped(op.remote)?;
                for piece in request.pieces() {
                    let source = regions.get(piece.local)?.memory.host();
                    let source = source.ok_or(TransportError::UnregisteredRegion(piece.local))?;
                    let run = Some(&mut producer.run);
                    source.copy_to(piece.local_offset, target, piece.remote_offset, piece.len, run)?;
                }
                copied += op.len;
                let announce = op.imm.is_some() || notify_each_write;
                if announce || op.signalled {
                    producer.run.fence();
                }
                if announce {
                    let published = ring::publish(&mut producer.ring, &outbound, &announcement(&op))
                        .map_err(|reason| self.break_with(reason))?;
                    debug_assert!(published, "room was checked under the same lock");
                }
                if op.signalled {
                    let done = Completion { wr_id: op.wr_id, status: CompletionStatus::Success };
                    shared.completions.try_send(done).map_err(|_| {
                        self.break_with(
                            "completion queue overflow: the application is not draining completions".into(),
                        )
                    })?;
                }
            }
            Ok(())
        })();
        producer.run.fence();
        let sleeper = announced > 0 && producer.ring.sleeper(&outbound);
        drop(producer);
        if sleeper {
            ring::wake(&outbound);
        }
        shared.local.copies().in_transit(copied);
        moved?;
        Ok(true)
    }

    /// shm channel: moves `ops` (reads, checked by the caller with the region table
    /// read-locked) in the calling thread: copies each out of the peer's mapping into local
    /// memory and completes it. `Ok(false)`: the reads go the sender thread's way (TCP, where
    /// the peer answers them; or that thread has ops queued, which go first), or the completion
    /// queue lacks room for the batch.
    pub(crate) fn read_in_place(
        &self,
        ops: &[ReadOp],
        regions: &RegionTable<LocalEntry>,
    ) -> Result<bool, TransportError> {
        let shared = &*self.shared;
        if shared.rings.is_none() || shared.lane.in_flight.load(Ordering::Acquire) > 0 {
            return Ok(false);
        }
        if self.completions.room() < ops.iter().filter(|op| op.signalled).count() {
            return Ok(false);
        }
        let mut copied = 0u64;
        let moved = (|| -> Result<(), TransportError> {
            for op in ops {
                let (source, _) = self.mapped(op.remote)?;
                let local = &regions.get(op.local)?.memory;
                let target = local.host().ok_or(TransportError::UnsupportedMemory { kind: local.kind() })?;
                source.copy_to(op.remote_offset, target, op.local_offset, op.len, None)?;
                copied += op.len;
                if op.signalled {
                    let done = Completion { wr_id: op.wr_id, status: CompletionStatus::Success };
                    shared.completions.try_send(done).map_err(|_| {
                        self.break_with(
                            "completion queue overflow: the application is not draining completions".into(),
                        )
                    })?;
                }
            }
            Ok(())
        })();
        shared.local.copies().in_transit(copied);
        moved?;
        Ok(true)
    }

    /// TCP: takes places in the peer's window of answers for `count` reads about to be
    /// queued (queued and asked reads count alike), or says how many fit.
    pub(crate) fn reserve_reads(&self, count: usize) -> Result<(), TransportError> {
        self.shared
            .reads
            .reserve(count)
            .map_err(|room| TransportError::QueueFull { given: count as u32, max: room as u32 })
    }

    /// TCP: gives back the places of `count` reads that were not queued after all.
    pub(crate) fn unreserve_reads(&self, count: usize) {
        self.shared.reads.unreserve(count);
    }

    /// The peer's region `id`, mapped (on its first write), and whether it wants every write
    /// announced.
    fn mapped(&self, id: RegionId) -> Result<(&Memory, bool), TransportError> {
        let remote = self.remote.get(id.0 as usize).and_then(Option::as_ref);
        let remote = remote.ok_or(TransportError::UnregisteredRegion(id))?;
        let mapping = remote.mapped.as_ref().ok_or(TransportError::UnregisteredRegion(id))?;
        Ok((mapping.get()?, remote.notify_each_write))
    }

    fn break_with(&self, reason: String) -> TransportError {
        self.shared.fail(reason);
        self.gone()
    }

    /// Arrivals ready now, oldest first: those the link's threads queued, then (shm) those
    /// still on our ring, taken here with no thread in between.
    pub(crate) fn take_arrivals(&self, out: &mut [Arrival]) -> Result<usize, TransportError> {
        let shared = &*self.shared;
        // Nothing queued and nothing new on the ring: the common look of a spinning wait costs
        // no lock. The count is read first: the arrivals of everything it counts are queued
        // by then, so an empty queue after it means they were drained.
        if let Some(rings) = &shared.rings {
            let taken = rings.taken.load(Ordering::Acquire);
            if self.arrivals.is_empty() && ring::nothing_after(&rings.inbound(), taken) {
                return Ok(0);
            }
        }
        // The ring thread queues what it takes under the consumer's lock: drained under it too,
        // the queue holds only arrivals older than any still on the ring.
        let consumer = shared.rings.as_ref().and_then(|rings| rings.consumer.try_lock().ok());
        let mut ready = self.arrivals.try_drain(out).unwrap_or(0);
        let (Some(mut consumer), Some(rings)) = (consumer, &shared.rings) else { return Ok(ready) };
        if ready == out.len() {
            return Ok(ready);
        }
        let max = out.len() - ready;
        let taken = ring::take(&mut consumer, &rings.inbound(), &shared.inbox, max, |write| {
            if let Some(arrival) = land_announced(shared, write)? {
                out[ready] = arrival;
                ready += 1;
            }
            Ok(())
        });
        rings.taken.store(consumer.taken(), Ordering::Release);
        match taken {
            Ok(_) => Ok(ready),
            Err(reason) => Err(self.break_with(reason)),
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.lane.gone.set("transport dropped");
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

/// The announcement of a write already placed in the peer's mapping.
fn announcement(op: &WriteOp) -> Frame {
    let frame = write_frame(op);
    Frame { flags: frame.flags | FLAG_PLACED, ..frame }
}

/// The header of `op` (a TCP frame's, whose payload follows).
fn write_frame(op: &WriteOp) -> Frame {
    Frame {
        kind: FrameKind::Write,
        flags: if op.imm.is_some() { FLAG_IMM } else { 0 },
        status: 0,
        region: op.remote.0,
        offset: op.remote_offset,
        len: op.len,
        wr_id: op.wr_id,
        imm: op.imm.unwrap_or(0),
    }
}

/// Applies an announcement taken off our ring (its bytes are in place, or in the bounce in
/// front of the region, copied on here); returns its arrival.
// Inlined into the takes: its result came back through memory and stalled every slot.
#[inline(always)]
fn land_announced(shared: &Shared, write: Inbound) -> Result<Option<Arrival>, String> {
    let Inbound::Write { region, offset, len, arrival, .. } = write else {
        return Err("protocol error: a ring slot that is not a write".into());
    };
    if shared.bounced.get(region as usize).copied().unwrap_or(false) {
        with_target(shared, region, |target| copy_on_from_bounce(shared, target, offset, len))?;
    } else if shared.running.load(Ordering::Acquire) == 0 {
        // The targets are let go once every link thread has ended: the region may be released.
        // As the targets' lock did, this refuses only what comes after that end; no byte of the
        // region is touched on this path either way.
        return Err(format!("region {region} vanished"));
    }
    Ok(arrival.map(|imm| Arrival { imm, region: RegionId(region), len }))
}

/// Runs `apply` on an admitted write's target (admitted writes name exposed regions only,
/// which are all in the targets until the link's threads have ended).
fn with_target<R>(
    shared: &Shared,
    region: u32,
    apply: impl FnOnce(&LocalEntry) -> Result<R, String>,
) -> Result<R, String> {
    let targets = shared.targets.read().unwrap_or_else(PoisonError::into_inner);
    apply(
        targets
            .get(region as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("region {region} vanished"))?,
    )
}

/// A write into the bounce in front of memory the peer cannot map: the one copy, here.
fn copy_on_from_bounce(shared: &Shared, target: &LocalEntry, offset: u64, len: u64) -> Result<(), String> {
    let Some(bounce) = &target.bounce else { return Ok(()) };
    let by_cpu = target
        .memory
        .copy_from_bounce(&bounce.memory, offset, len)
        .map_err(|e| format!("copying out of the channel: {e}"))?;
    if by_cpu {
        shared.local.copies().in_transit(len);
    }
    Ok(())
}

/// Takes announcements off our ring while the application does not; sleeps on the ring's
/// futex (`Adaptive`) or looks every [`RING_TICK`] (`BusyPoll`, where writers never wake it).
fn ring_loop(shared: &Shared) {
    let Some(rings) = &shared.rings else { return };
    let inbound = rings.inbound();
    loop {
        let stopping = shared.lane.gone.is_gone();
        let mut consumer = rings.consumer.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = ring::take(&mut consumer, &inbound, &shared.inbox, usize::MAX, |write| {
            match land_announced(shared, write)? {
                Some(arrival) => shared.arrivals.try_send(arrival).map_err(|_| {
                    "arrival queue overflow: the application is not draining arrivals".to_string()
                }),
                None => Ok(()),
            }
        });
        rings.taken.store(consumer.taken(), Ordering::Release);
        if let Err(reason) = taken {
            shared.fail(reason);
            return;
        }
        // A link that broke still delivered what was on the ring when it did.
        if stopping {
            return;
        }
        match shared.wait_mode.get() {
            WaitMode::Adaptive => {
                let seen = ring::prepare_sleep(&consumer, &inbound);
                drop(consumer);
                // Looked at after `seen` was read: a stop that wakes the ring after that read
                // changes the futex value, so the sleep returns at once.
                if let (Some(seen), None) = (seen, shared.lane.gone.why()) {
                    ring::sleep(&inbound, seen, RING_NAP);
                }
            }
            WaitMode::BusyPoll => {
                drop(consumer);
                std::thread::park_timeout(RING_TICK);
            }
        }
    }
}

/// What the reader hands the sender thread, in arrival order: an acknowledgement to write
/// (and the arrival to publish once it is on the wire), or an arrival alone.
pub(crate) enum Outgoing {
    Ack {
        ack: Frame,
        then: Option<Arrival>,
    },
    Arrival(Arrival),
    /// The answer to the peer's read: `len` bytes at `offset` of our exposed `region`.
    Answer {
        region: u32,
        offset: u64,
        len: u64,
        wr_id: u64,
    },
}

/// Writes an ack before publishing the arrival it precedes: an application that exits as soon
/// as it sees the arrival must not strand the writer's completions.
fn deliver(shared: &Shared, outgoing: Outgoing, staging: &mut Staging) -> Result<(), String> {
    let arrival = match outgoing {
        Outgoing::Ack { ack, then } => {
            shared.send_frame(&ack).map_err(|e| format!("sending an ack: {e}"))?;
            then
        }
        Outgoing::Arrival(arrival) => Some(arrival),
        Outgoing::Answer { region, offset, len, wr_id } => {
            let writer = shared.writer.lock().unwrap_or_else(PoisonError::into_inner);
            with_target(shared, region, |target| {
                (&*writer)
                    .write_all(&answer_frame(region, wr_id, len).encode())
                    .and_then(|()| target.memory.over_socket(Direction::Send, offset, len, &writer, staging))
                    .map_err(|e| format!("answering a read: {e}"))
            })?;
            None
        }
    };
    match arrival {
        Some(arrival) => shared
            .arrivals
            .try_send(arrival)
            .map_err(|_| "arrival queue overflow: the application is not draining arrivals".to_string()),
        None => Ok(()),
    }
}

fn send_loop(
    shared: &Shared,
    ops: &Receiver<Request>,
    acks: &Receiver<Outgoing>,
    reader_gone: &Receiver<()>,
) {
    let mut staging = Staging::default();
    loop {
        // Nothing more to post: let queued GPU copies land rather than leave them in flight
        // while the link waits (a source may be deregistered next).
        if ops.is_empty() && staging.unsettled() {
            if let Err(e) = staging.settle() {
                shared.fail(format!("copying GPU memory to the peer: {e}"));
                break;
            }
        }
        let op = select! {
            recv(ops) -> op => match op { Ok(op) => op, Err(_) => return },
            recv(acks) -> outgoing => match outgoing {
                Ok(outgoing) => {
                    let delivered = deliver(shared, outgoing, &mut staging);
                    shared.queued_deliveries.fetch_sub(1, Ordering::AcqRel);
                    if let Err(reason) = delivered {
                        shared.fail(reason);
                        break;
                    }
                    continue;
                }
                Err(_) => break,
            },
            recv(reader_gone) -> _ => break,
        };
        let sent = send_one(shared, &op, &mut staging);
        // A read over TCP stays in flight until its bytes are placed (or the link ends).
        let answered_later = matches!(sent, Ok(Sent::Asked));
        if op.is_read() && !answered_later {
            // Never asked: its place in the window goes back (asked, it took the place).
            shared.reads.unreserve(1);
        }
        // Why the link fails, and whether the sender completes the op (see `Sent`).
        let mut failed = match sent {
            Ok(Sent::Done | Sent::Asked) => None,
            Ok(Sent::Broken(reason)) => Some((reason, false)),
            Err(reason) => Some((reason, true)),
        };
        // With nothing queued the direct path may take over on another thread, and announce
        // bytes after these: they land first (streamed stores fenced, GPU copies done). A
        // poster counts an op in `in_flight` before queueing it, so the queue, not the count,
        // says whether this was the last.
        if failed.is_none() && ops.is_empty() {
            if let Err(e) = staging.settle() {
                let reason = format!("copying to the peer: {e}");
                failed = Some((reason, completes_on_failure(shared, &op, answered_later)));
            }
        }
        if failed.is_some() {
            staging.fence_host();
        }
        if !answered_later {
            shared.lane.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some((reason, flush_it)) = failed {
            shared.fail(reason);
            if flush_it {
                flush(&op, &shared.completions);
            }
            break;
        }
    }
    // The link is down: every queued signalled op completes with a flush error, and writes
    // that fully landed before it still announce themselves.
    while let Ok(op) = ops.try_recv() {
        shared.lane.in_flight.fetch_sub(1, Ordering::AcqRel);
        if op.is_read() {
            shared.reads.unreserve(1);
        }
        flush(&op, &shared.completions);
    }
    while let Ok(outgoing) = acks.try_recv() {
        if let Outgoing::Ack { then: Some(arrival), .. } | Outgoing::Arrival(arrival) = outgoing {
            let _ = shared.arrivals.try_send(arrival);
        }
    }
}

/// Whether the sender completes `request` (sent, or asked) when the link fails after it: not a
/// read asked over TCP, whose answer the reader awaits, nor a write waiting for its ack that the
/// reader's end has flushed already (one still waiting is taken back here, so the reader's end
/// does not flush it too).
fn completes_on_failure(shared: &Shared, request: &Request, asked: bool) -> bool {
    let op = request.head();
    if asked {
        false
    } else if shared.channel == ChannelKind::Tcp && op.signalled && !request.is_read() {
        shared.awaiting_ack.retract(|wr_id| *wr_id == op.wr_id).is_some()
    } else {
        true
    }
}

fn flush(request: &Request, completions: &EventSender<Completion>) {
    let op = request.head();
    if op.signalled {
        let _ = completions
            .try_send(Completion { wr_id: op.wr_id, status: CompletionStatus::Failed { code: FLUSHED } });
    }
}

/// What became of a request the sender thread took.
enum Sent {
    /// It is done with: its source may be reused (a write sent or copied, a read copied).
    Done,
    /// A read asked over TCP: in flight until its answer is placed.
    Asked,
    /// A signalled write whose send failed after the reader ended and flushed it: done with
    /// (its source), the link broken for this reason, its completion already given.
    Broken(String),
}

fn send_one(shared: &Shared, request: &Request, staging: &mut Staging) -> Result<Sent, String> {
    if shared.lane.gone.is_gone() {
        return Err("link already broken".into());
    }
    if request.is_read() {
        return read_one(shared, &request.head());
    }
    let op = request.head();
    // The sources, each looked up once (a gather's pieces usually share one region).
    let mut sources: [Option<(RegionId, LocalEntry)>; crate::request::MAX_SGES as usize] =
        std::array::from_fn(|_| None);
    for (index, piece) in request.pieces().enumerate() {
        let known = index.checked_sub(1).and_then(|before| sources[before].as_ref());
        let entry = match known {
            Some((id, entry)) if *id == piece.local => entry.clone(),
            _ => local(&shared.local, piece.local)
                .ok_or_else(|| format!("local region {:?} vanished", piece.local))?,
        };
        sources[index] = Some((piece.local, entry));
    }
    let source_of = |index: usize| &sources[index].as_ref().expect("looked up above").1;
    match shared.channel {
        ChannelKind::Tcp => {
            let mut frame = write_frame(&op);
            if op.signalled {
                frame.flags |= FLAG_SIGNALLED;
                // Recorded before the frame leaves, so its ack cannot overtake it. Not waiting
                // once the reader ended: the sender flushes it.
                shared.awaiting_ack.push(op.wr_id, &shared.answers).map_err(|_| "link already broken")?;
            }
            let mut writer = shared.writer.lock().unwrap_or_else(PoisonError::into_inner);
            let header = frame.encode();
            let all_host = sources.iter().flatten().all(|(_, entry)| entry.memory.host().is_some());
            let sent = if all_host {
                // Header and payload (every piece of a gather) in one system call.
                let mut send = GatherSend::new(&header);
                request
                    .pieces()
                    .enumerate()
                    .try_for_each(|(index, piece)| {
                        let host = source_of(index).memory.host().expect("host memory, checked above");
                        send.push(host, piece.local_offset, piece.len)
                    })
                    .and_then(|()| send.send(&writer))
            } else {
                writer.write_all(&header).and_then(|()| {
                    request.pieces().enumerate().try_for_each(|(index, piece)| {
                        let memory = &source_of(index).memory;
                        memory.over_socket(Direction::Send, piece.local_offset, piece.len, &writer, staging)
                    })
                })
            };
            if let Err(e) = sent {
                let reason = format!("sending a write: {e}");
                if !completes_on_failure(shared, request, false) {
                    return Ok(Sent::Broken(reason));
                }
                return Err(reason);
            }
        }
        ChannelKind::Shm => {
            let remote = shared.remote.get(op.remote.0 as usize).and_then(Option::as_ref);
            let (mapping, notify_each_write) = remote
                .and_then(|r| r.mapped.as_ref().map(|mapped| (mapped, r.notify_each_write)))
                .ok_or_else(|| format!("remote region {:?} is not mapped", op.remote))?;
            let target = mapping.get().map_err(|e| e.to_string())?;
            for (index, piece) in request.pieces().enumerate() {
                let memory = &source_of(index).memory;
                copy_to_peer(memory, piece.local_offset, target, (piece.remote_offset, piece.len), staging)
                    .map_err(|e| e.to_string())?;
                if memory.host().is_some() {
                    shared.local.copies().in_transit(piece.len);
                }
            }
            let announce = op.imm.is_some() || notify_each_write;
            if op.signalled || announce {
                // A completion or an announcement says the bytes are there: GPU copies land first.
                staging.settle().map_err(|e| format!("copying GPU memory to the peer: {e}"))?;
            }
            if announce && !shared.announce(&announcement(&op), Instant::now() + RING_PATIENCE)? {
                return Err(format!("the peer took nothing off its ring for {} s", RING_PATIENCE.as_secs()));
            }
            if op.signalled {
                // The bytes are in the peer's memory (an RDMA WRITE completion's meaning), or in
                // its bounce in front of memory it could not map, which it copies on in order.
                let _ = shared
                    .completions
                    .try_send(Completion { wr_id: op.wr_id, status: CompletionStatus::Success });
            }
        }
    }
    Ok(Sent::Done)
}

/// A read the sender thread took: over shm copied out of the peer's mapping at once; over TCP
/// recorded, then asked for.
fn read_one(shared: &Shared, op: &WriteOp) -> Result<Sent, String> {
    let local =
        local(&shared.local, op.local).ok_or_else(|| format!("local region {:?} vanished", op.local))?;
    match shared.channel {
        ChannelKind::Shm => {
            let remote = shared.remote.get(op.remote.0 as usize).and_then(Option::as_ref);
            let mapping = remote
                .and_then(|remote| remote.mapped.as_ref())
                .ok_or_else(|| format!("remote region {:?} is not mapped", op.remote))?;
            let target = local.memory.host().ok_or("a read into GPU memory over shm was refused at post")?;
            mapping
                .get()
                .and_then(|source| source.copy_to(op.remote_offset, target, op.local_offset, op.len, None))
                .map_err(|e| format!("reading the peer's region: {e}"))?;
            shared.local.copies().in_transit(op.len);
            if op.signalled {
                let _ = shared
                    .completions
                    .try_send(Completion { wr_id: op.wr_id, status: CompletionStatus::Success });
            }
            Ok(Sent::Done)
        }
        ChannelKind::Tcp => {
            let read = PendingRead {
                wr_id: op.wr_id,
                local: local.memory,
                local_offset: op.local_offset,
                len: op.len,
                signalled: op.signalled,
            };
            // Refused once the reader ended: the sender flushes it as any op it could not send.
            shared.reads.push(read, &shared.answers).map_err(|_| "link already broken".to_string())?;
            // From here the read is the reader's: a failed request ends the link, and the
            // reader's end flushes it (once).
            if let Err(e) = shared.send_frame(&request_frame(op)) {
                shared.fail(format!("asking for a read: {e}"));
            }
            Ok(Sent::Asked)
        }
    }
}

/// A read whose answer will never come (the link ended): its destination let go, no longer in
/// flight, and flushed if it was to complete.
fn unanswered(shared: &Shared, read: PendingRead) {
    let (wr_id, signalled) = (read.wr_id, read.signalled);
    drop(read);
    shared.lane.in_flight.fetch_sub(1, Ordering::AcqRel);
    if signalled {
        let flushed = Completion { wr_id, status: CompletionStatus::Failed { code: FLUSHED } };
        let _ = shared.completions.try_send(flushed);
    }
}

/// Places the answer to our oldest read (admitted: its tag and length are that read's), then
/// completes it.
fn place_answer(shared: &Shared, socket: &mut TcpStream, staging: &mut Staging) -> Result<(), String> {
    let read = shared.reads.pop_front().ok_or("an answer was admitted with no read waiting")?;
    if let Err(e) = read.local.over_socket(Direction::Receive, read.local_offset, read.len, socket, staging) {
        unanswered(shared, read);
        return Err(format!("the peer vanished mid-answer: {e}"));
    }
    // The destination is let go before the completion says so: a release right after it finds
    // no link thread holding the memory.
    let (wr_id, signalled) = (read.wr_id, read.signalled);
    drop(read);
    shared.lane.in_flight.fetch_sub(1, Ordering::AcqRel);
    if signalled {
        let done = Completion { wr_id, status: CompletionStatus::Success };
        shared.completions.try_send(done).map_err(|_| {
            "completion queue overflow: the application is not draining completions".to_string()
        })?;
    }
    Ok(())
}

/// The shm channel's socket carries nothing after the handshake: waits for its end, and a
/// frame on it is a protocol error.
fn watch_shm_socket(mut socket: TcpStream) -> String {
    let mut header = [0u8; HEADER_BYTES];
    match socket.read_exact(&mut header) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => "the peer closed the connection".into(),
        Err(e) => format!("reading from the peer: {e}"),
        Ok(()) => {
            "protocol error: a frame on the shm channel's socket (writes are announced on the ring)".into()
        }
    }
}

/// TCP: takes frames off the socket until it closes or the peer breaks the protocol; returns
/// why it stopped. In `Adaptive` mode it sleeps until the socket is readable; in `BusyPoll` it
/// looks every [`RING_TICK`] and leaves the socket to an application that polls it itself,
/// taking only what that poll cannot (a frame not wholly there yet, one bound for GPU memory).
fn read_loop(shared: &Shared, watched: &TcpStream) -> String {
    let mut staging = Staging::default();
    loop {
        if let Some(reason) = shared.lane.gone.why() {
            return reason.to_string();
        }
        if let Some(silent) = shared.answers.overdue(Instant::now(), shared.awaits_answers(), ANSWER_PATIENCE)
        {
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
        } else if !readable(watched, RING_NAP) {
            continue;
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

/// Reads one frame (waiting for its bytes), checks it against the [`Inbox`] rules and applies
/// it; its ack and arrival go to the sender thread.
fn read_frame(shared: &Shared, socket: &mut TcpStream, staging: &mut Staging) -> Result<(), String> {
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
    // Life at a frame's start and again at its end: a large frame's body may take long.
    shared.answers.restart(Instant::now());
    let applied = match shared.inbox.admit(&frame, awaited(shared, &frame))? {
        Inbound::Write { region, offset, len, arrival, ack, .. } => {
            with_target(shared, region, |target| {
                (target.memory.over_socket(Direction::Receive, offset, len, socket, staging))
                    .map_err(|e| format!("the peer vanished mid-write: {e}"))
            })?;
            hand_over(shared, outgoing(region, len, arrival, ack))
        }
        Inbound::Ack { wr_id, status } => acknowledge(shared, wr_id, status),
        Inbound::ReadRequest { region, offset, len, wr_id } => {
            hand_over(shared, Some(Outgoing::Answer { region, offset, len, wr_id }))
        }
        Inbound::ReadData { .. } => place_answer(shared, socket, staging),
    };
    shared.answers.restart(Instant::now());
    applied
}

/// What `frame` must answer: the oldest signalled write of ours still waiting for its ack, or
/// the oldest read still waiting for its bytes (only acks and answers look: writes, the
/// common frame, take no lock).
fn awaited(shared: &Shared, frame: &Frame) -> Awaited {
    match frame.kind {
        FrameKind::Ack => Awaited { ack: shared.awaiting_ack.front(|wr_id| *wr_id), read: None },
        FrameKind::ReadData => Awaited { ack: None, read: shared.reads.front(|read| (read.wr_id, read.len)) },
        FrameKind::Write | FrameKind::ReadRequest => Awaited::default(),
    }
}

/// What a placed write owes: its ack (before its arrival, see [`deliver`]) and its arrival.
fn outgoing(region: u32, len: u64, arrival: Option<u32>, ack: Option<u64>) -> Option<Outgoing> {
    let arrival = arrival.map(|imm| Arrival { imm, region: RegionId(region), len });
    match ack {
        Some(wr_id) => Some(Outgoing::Ack { ack: Frame::ack(region, wr_id), then: arrival }),
        None => arrival.map(Outgoing::Arrival),
    }
}

/// Queues `outgoing` for the sender thread (a reader never writes to the socket itself: two
/// links writing to each other at once cannot deadlock).
fn hand_over(shared: &Shared, outgoing: Option<Outgoing>) -> Result<(), String> {
    let Some(outgoing) = outgoing else { return Ok(()) };
    shared.queued_deliveries.fetch_add(1, Ordering::AcqRel);
    shared.outgoing.try_send(outgoing).map_err(|_| {
        shared.queued_deliveries.fetch_sub(1, Ordering::AcqRel);
        "protocol error: the peer exceeded its window of unacknowledged writes".to_string()
    })
}

impl Shared {
    /// Whether a signalled write's ack or a read's bytes are awaited from the peer.
    fn awaits_answers(&self) -> bool {
        !self.reads.is_empty() || !self.awaiting_ack.is_empty()
    }

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
        shared.app_polled_us.store(shared.born.elapsed().as_micros() as u64, Ordering::Relaxed);
        let Ok(mut socket) = shared.reading.try_lock() else { return Ok(()) };
        for _ in 0..PUMP_FRAMES {
            let mut header = [0u8; HEADER_BYTES];
            if !peek(&socket, &mut header) {
                break;
            }
            let frame =
                Frame::decode(&header).map_err(|e| self.break_with(format!("protocol error: {e}")))?;
            let inbound =
                shared.inbox.admit(&frame, awaited(shared, &frame)).map_err(|e| self.break_with(e))?;
            shared.answers.restart(Instant::now());
            let step = match inbound {
                Inbound::Write { region, offset, len, arrival, ack, .. } => {
                    let whole = (HEADER_BYTES as u64)
                        .checked_add(len)
                        .is_some_and(|bytes| waiting_bytes(&socket) >= bytes);
                    let received = with_target(shared, region, |target| match target.memory.host() {
                        // Every byte of the frame is waiting: one read that returns at once.
                        Some(host) if whole => (host.receive_framed(&socket, &mut header, (offset, len)))
                            .map(|()| true)
                            .map_err(|e| format!("reading from the peer: {e}")),
                        _ => Ok(false),
                    });
                    match received {
                        Ok(false) => {
                            shared.reader_needed.store(true, Ordering::Release);
                            if let Some(reader) = self.threads.first() {
                                reader.thread().unpark();
                            }
                            break;
                        }
                        Ok(true) => {
                            let owed = outgoing(region, len, arrival, ack);
                            match (owed, shared.queued_deliveries.load(Ordering::Acquire)) {
                                (Some(owed), 0) => deliver(shared, owed, &mut Staging::default()),
                                (owed, _) => hand_over(shared, owed),
                            }
                        }
                        Err(reason) => Err(reason),
                    }
                }
                Inbound::Ack { wr_id, status } => (socket.read_exact(&mut header))
                    .map_err(|e| format!("reading from the peer: {e}"))
                    .and_then(|()| acknowledge(shared, wr_id, status)),
                // Reads are the reader thread's: it answers through the sender thread and
                // places answers into memory a poll does not hold.
                Inbound::ReadRequest { .. } | Inbound::ReadData { .. } => {
                    shared.reader_needed.store(true, Ordering::Release);
                    if let Some(reader) = self.threads.first() {
                        reader.thread().unpark();
                    }
                    break;
                }
            };
            step.map_err(|reason| self.break_with(reason))?;
            shared.answers.restart(Instant::now());
        }
        Ok(())
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
        let signalled = ops.iter().filter(|request| request.head().signalled).count();
        let mut awaiting = shared.awaiting_ack.lock();
        if awaiting.len() + signalled > shared.max_outstanding {
            let max = shared.max_outstanding.saturating_sub(awaiting.len()) as u32;
            return Err(TransportError::QueueFull { given: ops.len() as u32, max });
        }
        for request in ops {
            let op = request.head();
            let mut frame = write_frame(&op);
            if op.signalled {
                frame.flags |= FLAG_SIGNALLED;
            }
            let header = frame.encode();
            let mut send = GatherSend::new(&header);
            for piece in request.pieces() {
                let source = regions.get(piece.local)?.memory.host();
                let source = source.ok_or(TransportError::UnregisteredRegion(piece.local))?;
                send.push(source, piece.local_offset, piece.len)?;
            }
            if op.signalled {
                // Recorded before the frame leaves, so its ack cannot overtake it.
                let pushed = awaiting.push(op.wr_id, &shared.answers);
                pushed.map_err(|_| self.break_with("link already broken".into()))?;
            }
            if let Err(e) = send.send(&writer) {
                // Not posted: it completes with nothing (any ops before it in `ops` went).
                awaiting.retract(|wr_id| op.signalled && *wr_id == op.wr_id);
                return Err(self.break_with(format!("sending a write: {e}")));
            }
        }
        Ok(true)
    }
}

/// An admitted ack: the oldest signalled write of ours stops waiting and completes.
fn acknowledge(shared: &Shared, wr_id: u64, status: u16) -> Result<(), String> {
    if shared.awaiting_ack.pop_front_if(|waiting| *waiting == wr_id).is_none() {
        // Admitted, then flushed by the reader's end (or taken back) before this ran: it has
        // had its one completion.
        return Ok(());
    }
    let completions = &shared.completions;
    let status = match status {
        0 => CompletionStatus::Success,
        code => CompletionStatus::Failed { code: u32::from(code) },
    };
    completions
        .try_send(Completion { wr_id, status })
        .map_err(|_| "completion queue overflow: the application is not draining completions".to_string())
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
