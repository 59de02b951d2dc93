//! One connected peer: a sender thread that moves posted writes (socket payload or shm copy)
//! and a reader thread that places incoming writes, acknowledges them and collects arrivals.

use crate::memory::{Direction, Memory, PeerMapping};
use crate::protocol::{Inbound, Inbox};
use crate::region::{copy_to_peer, RegionMemory, Staging};
use crate::wire::{ChannelKind, Frame, FrameKind, FLAG_IMM, FLAG_PLACED, FLAG_SIGNALLED, HEADER_BYTES};
use crossbeam_channel::{select, Receiver, Sender};
use rdma_hint_core::{Arrival, Completion, CompletionStatus, RegionId, TransportError, WriteOp};
use rdma_hint_toolkit::caller_memory::CopyMeter;
use rdma_hint_toolkit::queue::{event_queue, EventQueue, EventSender};
use rdma_hint_toolkit::RegionTable;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::thread::JoinHandle;

/// Status code of work requests flushed because the connection broke (as `IBV_WC_WR_FLUSH_ERR`).
pub(crate) const FLUSHED: u32 = 5;
/// Arrivals the application has not drained yet, at most.
pub(crate) const MAX_PENDING_ARRIVALS: usize = 4096;
/// Acknowledgements waiting for the sender thread, at most (a peer keeps far fewer signalled
/// writes outstanding; more is a broken peer).
const MAX_PENDING_ACKS: usize = 4096;

/// A registered local region and whether the peer may write it.
#[derive(Debug, Clone)]
pub(crate) struct LocalEntry {
    pub(crate) memory: Arc<RegionMemory>,
    pub(crate) exposed: bool,
    /// shm channel, a region the peer cannot map (caller host memory, GPU memory) exposed to
    /// it: the shared mapping the peer writes instead, whose bytes the reader copies on into
    /// `memory` as each write is announced.
    pub(crate) bounce: Option<Arc<Bounce>>,
}

/// A shared mapping in front of a region the peer cannot map; page-locked when the region is
/// GPU memory, so the copy on is the copy engine's.
#[derive(Debug)]
pub(crate) struct Bounce {
    // Unregistered before the mapping goes (field order).
    #[cfg(feature = "cuda")]
    _pinned: Option<crate::gpu::HostRegistration>,
    pub(crate) memory: Memory,
}

impl Bounce {
    /// A new shared mapping for `region`.
    pub(crate) fn new(region: &RegionMemory) -> Result<Bounce, TransportError> {
        // Allocated behind the region table's back: checked against the machine here.
        rdma_hint_toolkit::memory_limit::check_commit(region.len(), None, 0)?;
        let memory = Memory::shared(region.len())?;
        #[cfg(feature = "cuda")]
        if let RegionMemory::Gpu(buffer, _) = region {
            let (base, len) = memory.mapping();
            // SAFETY: the mapping lives in this value and outlives the registration (field order).
            let pinned = unsafe { crate::gpu::HostRegistration::new(buffer.gpu(), base, len) };
            if let Err(error) = &pinned {
                tracing::debug!(%error, "staged: the bounce cannot be page-locked; copying through the driver");
            }
            return Ok(Bounce { _pinned: pinned.ok(), memory });
        }
        Ok(Bounce {
            #[cfg(feature = "cuda")]
            _pinned: None,
            memory,
        })
    }
}

impl LocalEntry {
    /// A newly registered region: not exposed, no bounce.
    pub(crate) fn new(memory: RegionMemory) -> LocalEntry {
        LocalEntry { memory: Arc::new(memory), exposed: false, bounce: None }
    }

    /// The descriptor the peer maps on the shm channel: the bounce's, or the region's own.
    pub(crate) fn shm_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match &self.bounce {
            Some(bounce) => bounce.memory.shm_fd(),
            None => self.memory.host().and_then(Memory::shm_fd),
        }
    }
}

/// What the link reports back to its transport: the bytes its code copies, and the posted
/// ops the sender thread has not finished with (their source regions are busy until then).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) copies: CopyMeter,
    pub(crate) in_flight: AtomicUsize,
}

/// The local region table, shared with the link threads.
pub(crate) type LocalRegions = Arc<RwLock<RegionTable<LocalEntry>>>;

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

pub(crate) fn local(regions: &LocalRegions, id: RegionId) -> Option<LocalEntry> {
    regions.read().unwrap_or_else(PoisonError::into_inner).get(id).ok().cloned()
}

/// Why the link stopped; first reason wins.
pub(crate) type Broken = Arc<OnceLock<String>>;

/// A running link.
pub(crate) struct Link {
    pub(crate) ops: Sender<WriteOp>,
    pub(crate) completions: EventQueue<Completion>,
    pub(crate) arrivals: EventQueue<Arrival>,
    pub(crate) broken: Broken,
    pub(crate) remote: RemoteRegions,
    socket: TcpStream,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("broken", &self.broken.get()).finish()
    }
}

struct Shared {
    channel: ChannelKind,
    local: LocalRegions,
    remote: RemoteRegions,
    writer: Mutex<TcpStream>,
    broken: Broken,
    /// Tags of the signalled writes sent and not yet acknowledged, oldest first: acks must
    /// come back for exactly these, in this order (TCP keeps frames in order).
    awaiting_ack: Mutex<VecDeque<u64>>,
    max_msg_bytes: u64,
    counters: Arc<Counters>,
}

impl Shared {
    fn fail(&self, reason: String) {
        if self.broken.set(reason.clone()).is_ok() {
            // A peer that leaves is ordinary at the end of a session; a protocol violation is not.
            if reason.starts_with("protocol error") {
                tracing::warn!(%reason, "staged link broken");
            } else {
                tracing::debug!(%reason, "staged link closed");
            }
        }
        if let Ok(writer) = self.writer.lock() {
            let _ = writer.shutdown(Shutdown::Both);
        }
    }

    fn send_frame(&self, frame: &Frame) -> std::io::Result<()> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner).write_all(&frame.encode())
    }
}

impl Link {
    /// Starts the threads on a socket whose handshake is done.
    pub(crate) fn start(
        socket: TcpStream,
        channel: ChannelKind,
        local: LocalRegions,
        remote: RemoteRegions,
        (max_outstanding, max_msg_bytes): (usize, u64),
        counters: Arc<Counters>,
    ) -> Result<Link, TransportError> {
        let (ops_tx, ops_rx) = crossbeam_channel::bounded(max_outstanding);
        let (completion_tx, completions) = event_queue(max_outstanding * 2);
        let (arrival_tx, arrivals) = event_queue(MAX_PENDING_ARRIVALS);
        let (reader_alive, reader_gone) = crossbeam_channel::bounded::<()>(0);
        // Acks go out through the sender thread, so a reader never waits on the socket's write
        // side: two links writing to each other at once cannot deadlock.
        let (ack_tx, acks) = crossbeam_channel::bounded(MAX_PENDING_ACKS);
        let broken: Broken = Arc::new(OnceLock::new());
        let shared = Arc::new(Shared {
            channel,
            local,
            remote: remote.clone(),
            writer: Mutex::new(socket.try_clone()?),
            broken: broken.clone(),
            awaiting_ack: Mutex::new(VecDeque::with_capacity(max_outstanding)),
            max_msg_bytes,
            counters,
        });
        let reader_socket = socket.try_clone()?;
        let reader = {
            let shared = shared.clone();
            let completion_tx = completion_tx.clone();
            std::thread::Builder::new().name("staged-reader".into()).spawn(move || {
                let _alive = reader_alive;
                let reason = read_loop(&shared, reader_socket, &completion_tx, &ack_tx);
                shared.fail(reason);
            })?
        };
        let sender = std::thread::Builder::new()
            .name("staged-sender".into())
            .spawn(move || send_loop(&shared, &ops_rx, &acks, &arrival_tx, &reader_gone, &completion_tx))?;
        Ok(Link { ops: ops_tx, completions, arrivals, broken, remote, socket, threads: vec![reader, sender] })
    }

    /// Whether the sender thread has ended (nothing it was handed will be read any more).
    pub(crate) fn sender_finished(&self) -> bool {
        self.threads.get(1).is_none_or(JoinHandle::is_finished)
    }

    /// The reason the link broke, as an error.
    pub(crate) fn gone(&self) -> TransportError {
        TransportError::PeerGone(self.broken.get().cloned().unwrap_or_else(|| "connection closed".into()))
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = self.broken.set("transport dropped".into());
        let _ = self.socket.shutdown(Shutdown::Both);
        // Closing the op queue stops the sender; the shutdown socket stops the reader.
        let (closed, _) = crossbeam_channel::bounded(0);
        self.ops = closed;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// What the reader hands the sender thread, in arrival order: an acknowledgement to write
/// (and the arrival to publish once it is on the wire), or an arrival alone.
pub(crate) enum Outgoing {
    Ack { ack: Frame, then: Option<Arrival> },
    Arrival(Arrival),
}

/// Writes an ack before publishing the arrival it precedes: an application that exits as soon
/// as it sees the arrival must not strand the writer's completions.
fn deliver(shared: &Shared, outgoing: Outgoing, arrivals: &EventSender<Arrival>) -> Result<(), String> {
    let arrival = match outgoing {
        Outgoing::Ack { ack, then } => {
            shared.send_frame(&ack).map_err(|e| format!("sending an ack: {e}"))?;
            then
        }
        Outgoing::Arrival(arrival) => Some(arrival),
    };
    match arrival {
        Some(arrival) => arrivals
            .try_send(arrival)
            .map_err(|_| "arrival queue overflow: the application is not draining arrivals".to_string()),
        None => Ok(()),
    }
}

fn send_loop(
    shared: &Shared,
    ops: &Receiver<WriteOp>,
    acks: &Receiver<Outgoing>,
    arrivals: &EventSender<Arrival>,
    reader_gone: &Receiver<()>,
    completions: &EventSender<Completion>,
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
                    if let Err(reason) = deliver(shared, outgoing, arrivals) {
                        shared.fail(reason);
                        break;
                    }
                    continue;
                }
                Err(_) => break,
            },
            recv(reader_gone) -> _ => break,
        };
        let sent = send_one(shared, &op, completions, &mut staging);
        shared.counters.in_flight.fetch_sub(1, Ordering::AcqRel);
        if let Err(reason) = sent {
            shared.fail(reason);
            flush(&op, completions);
            break;
        }
    }
    // The link is down: every queued signalled op completes with a flush error, and writes
    // that fully landed before it still announce themselves.
    while let Ok(op) = ops.try_recv() {
        shared.counters.in_flight.fetch_sub(1, Ordering::AcqRel);
        flush(&op, completions);
    }
    while let Ok(outgoing) = acks.try_recv() {
        if let Outgoing::Ack { then: Some(arrival), .. } | Outgoing::Arrival(arrival) = outgoing {
            let _ = arrivals.try_send(arrival);
        }
    }
}

fn flush(op: &WriteOp, completions: &EventSender<Completion>) {
    if op.signalled {
        let _ = completions
            .try_send(Completion { wr_id: op.wr_id, status: CompletionStatus::Failed { code: FLUSHED } });
    }
}

fn send_one(
    shared: &Shared,
    op: &WriteOp,
    completions: &EventSender<Completion>,
    staging: &mut Staging,
) -> Result<(), String> {
    if shared.broken.get().is_some() {
        return Err("link already broken".into());
    }
    let source =
        local(&shared.local, op.local).ok_or_else(|| format!("local region {:?} vanished", op.local))?;
    let mut flags = 0;
    if op.imm.is_some() {
        flags |= FLAG_IMM;
    }
    let mut frame = Frame {
        kind: FrameKind::Write,
        flags,
        status: 0,
        region: op.remote.0,
        offset: op.remote_offset,
        len: op.len,
        wr_id: op.wr_id,
        imm: op.imm.unwrap_or(0),
    };
    match shared.channel {
        ChannelKind::Tcp => {
            if op.signalled {
                frame.flags |= FLAG_SIGNALLED;
                // Recorded before the frame leaves, so its ack cannot overtake it.
                shared.awaiting_ack.lock().unwrap_or_else(PoisonError::into_inner).push_back(op.wr_id);
            }
            let mut writer = shared.writer.lock().unwrap_or_else(PoisonError::into_inner);
            writer
                .write_all(&frame.encode())
                .and_then(|()| {
                    source.memory.over_socket(Direction::Send, op.local_offset, op.len, &writer, staging)
                })
                .map_err(|e| format!("sending a write: {e}"))?;
        }
        ChannelKind::Shm => {
            let remote = shared.remote.get(op.remote.0 as usize).and_then(Option::as_ref);
            let (mapping, notify_each_write) = remote
                .and_then(|r| r.mapped.as_ref().map(|mapped| (mapped, r.notify_each_write)))
                .ok_or_else(|| format!("remote region {:?} is not mapped", op.remote))?;
            let target = mapping.get().map_err(|e| e.to_string())?;
            copy_to_peer(&source.memory, op.local_offset, target, (op.remote_offset, op.len), staging)
                .map_err(|e| e.to_string())?;
            if source.memory.host().is_some() {
                shared.counters.copies.in_transit(op.len);
            }
            let announce = op.imm.is_some() || notify_each_write;
            if op.signalled || announce {
                // A completion or a notification says the bytes are there: GPU copies land first.
                staging.settle().map_err(|e| format!("copying GPU memory to the peer: {e}"))?;
            }
            if op.signalled {
                // The bytes are in the peer's memory (an RDMA WRITE completion's meaning), or in
                // its bounce in front of memory it could not map, which it copies on in order.
                let _ =
                    completions.try_send(Completion { wr_id: op.wr_id, status: CompletionStatus::Success });
            }
            if announce {
                frame.flags |= FLAG_PLACED;
                shared.send_frame(&frame).map_err(|e| format!("sending a notification: {e}"))?;
            }
        }
    }
    Ok(())
}

/// Runs until the socket closes or the peer breaks the protocol; returns why it stopped. Every
/// frame goes through the [`Inbox`] rules first; only what they admit touches memory.
fn read_loop(
    shared: &Shared,
    mut socket: TcpStream,
    completions: &EventSender<Completion>,
    acks: &Sender<Outgoing>,
) -> String {
    let mut header = [0u8; HEADER_BYTES];
    let mut staging = Staging::default();
    // The regions the peer may write, by id, taken once: none can be released while the link
    // runs, so no frame needs the table's lock.
    let targets: Vec<Option<LocalEntry>> = {
        let regions = shared.local.read().unwrap_or_else(PoisonError::into_inner);
        let mut targets = Vec::new();
        for (id, entry) in regions.iter().filter(|(_, entry)| entry.exposed) {
            let index = id.0 as usize;
            targets.resize_with(targets.len().max(index + 1), || None);
            targets[index] = Some(entry.clone());
        }
        targets
    };
    let exposed: Vec<(u32, u64)> = (targets.iter().enumerate())
        .filter_map(|(id, entry)| entry.as_ref().map(|e| (id as u32, e.memory.len())))
        .collect();
    let inbox = Inbox::new(shared.channel, &exposed, shared.max_msg_bytes);
    loop {
        if let Err(e) = socket.read_exact(&mut header) {
            return match e.kind() {
                std::io::ErrorKind::UnexpectedEof => "the peer closed the connection".into(),
                _ => format!("reading from the peer: {e}"),
            };
        }
        let frame = match Frame::decode(&header) {
            Ok(frame) => frame,
            Err(e) => return format!("protocol error: {e}"),
        };
        // Only an ack needs the queue: writes, the common frame, take no lock here.
        let expected_ack = match frame.kind {
            FrameKind::Ack => {
                shared.awaiting_ack.lock().unwrap_or_else(PoisonError::into_inner).front().copied()
            }
            FrameKind::Write => None,
        };
        let step = match inbox.admit(&frame, expected_ack) {
            Err(reason) => Err(reason),
            Ok(Inbound::Write { region, offset, len, payload_follows, arrival, ack }) => place(
                shared,
                &mut socket,
                (&targets, RegionId(region), offset, len),
                payload_follows,
                (arrival, ack),
                acks,
                &mut staging,
            ),
            Ok(Inbound::Ack { wr_id, status }) => {
                shared.awaiting_ack.lock().unwrap_or_else(PoisonError::into_inner).pop_front();
                acknowledge(wr_id, status, completions)
            }
        };
        if let Err(reason) = step {
            return reason;
        }
    }
}

/// Places an admitted write (reads its payload on TCP), then queues its arrival and ack.
fn place(
    shared: &Shared,
    socket: &mut TcpStream,
    (targets, region, offset, len): (&[Option<LocalEntry>], RegionId, u64, u64),
    payload_follows: bool,
    (arrival, ack): (Option<u32>, Option<u64>),
    acks: &Sender<Outgoing>,
    staging: &mut Staging,
) -> Result<(), String> {
    // Admitted writes name exposed regions only, which are all in `targets`.
    let target = targets.get(region.0 as usize).and_then(Option::as_ref);
    let target = target.ok_or_else(|| format!("region {} vanished", region.0))?;
    if payload_follows {
        target
            .memory
            .over_socket(Direction::Receive, offset, len, socket, staging)
            .map_err(|e| format!("the peer vanished mid-write: {e}"))?;
    } else if let Some(bounce) = &target.bounce {
        // A write into the bounce in front of memory the peer cannot map: the one copy here.
        let by_cpu = target
            .memory
            .copy_from_bounce(&bounce.memory, offset, len)
            .map_err(|e| format!("copying out of the channel: {e}"))?;
        if by_cpu {
            shared.counters.copies.in_transit(len);
        }
    }
    let arrival = arrival.map(|imm| Arrival { imm, region, len });
    let outgoing = match ack {
        Some(wr_id) => {
            let ack = Frame::ack(region.0, wr_id);
            Some(Outgoing::Ack { ack, then: arrival })
        }
        None => arrival.map(Outgoing::Arrival),
    };
    if let Some(outgoing) = outgoing {
        acks.try_send(outgoing).map_err(|_| {
            "protocol error: the peer exceeded its window of unacknowledged writes".to_string()
        })?;
    }
    Ok(())
}

fn acknowledge(wr_id: u64, status: u16, completions: &EventSender<Completion>) -> Result<(), String> {
    let status = match status {
        0 => CompletionStatus::Success,
        code => CompletionStatus::Failed { code: u32::from(code) },
    };
    completions
        .try_send(Completion { wr_id, status })
        .map_err(|_| "completion queue overflow: the application is not draining completions".to_string())
}
