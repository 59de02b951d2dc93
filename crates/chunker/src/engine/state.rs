//! The engine's bookkeeping, without threads: transfer slots, per-peer queues, per-lane
//! posting and the routing of completions back to their transfers. The driver thread and the
//! API calls take turns on it under one lock.

use super::hints::Hints;
use super::request::{Class, RequestError, Segment, Segments, TransferRequest};
use super::{Delivered, EngineError, TransferId};
use crate::plan::BlockSpec;
use crate::policy::PostPolicy;
use rdma_hint_core::{
    Completion, CompletionStatus, GatherEntry, GatherOp, MemoryKind, RegionId, RemoteRegion, SourceId,
    Transport, TransportError, TransportId, WriteOp, MAX_OPS_PER_POST,
};
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

/// One transport of a connection. Its `wr_id`s are its own post sequence numbers; the
/// in-flight queue says which transfer each number belongs to.
pub(crate) struct Lane {
    pub(crate) transport: Arc<dyn Transport>,
    window: u32,
    per_post: u32,
    /// The configured cap on payload bytes in flight.
    bytes_in_flight: u64,
    /// How long the bytes in flight may take to drain at the lane's rate (see [`Lane::cap`]).
    queue_time: Duration,
    /// Bytes per second the lane has retired at best lately (a max that decays); 0 until
    /// measured.
    rate: f64,
    /// Bytes retired since `window_at`, the start of the current rate sample (moved on by the
    /// time the lane stood empty, so a sample measures busy time).
    window_bytes: u64,
    window_at: Instant,
    /// When the lane last emptied.
    idle_since: Option<Instant>,
    /// A rate sample was taken (the first is dropped: it holds the lane's first posts, which
    /// may map the peer's region).
    sampled: bool,
    /// The peer's control lane: latency-first transfers only, capped by `bytes_in_flight` alone
    /// (its rate is that of lone small transfers, not of the link).
    control: bool,
    /// The largest block posted on the lane.
    largest_block: u64,
    next_seq: u64,
    in_flight: VecDeque<Posted>,
    outstanding_bytes: u64,
    posted_bytes: u64,
    posted_wrs: u64,
    /// When the lane last retired a request, or had none in flight.
    progress_at: Instant,
    /// A doorbell of this lane is being rung outside the lock: no other may be built on it
    /// (its sequence numbers must reach the transport in order).
    posting: bool,
    completions: Vec<Completion>,
    dead: Option<String>,
    /// Local ranges one work request may gather on this lane (1: no packing).
    max_pieces: u32,
    /// The gather entries of the doorbell being built (lent to it while it rings).
    entries: Vec<GatherEntry>,
}

/// One posted work request.
#[derive(Debug, Clone, Copy)]
struct Posted {
    seq: u64,
    slot: u32,
    generation: u64,
    bytes: u64,
}

pub(crate) struct Peer {
    pub(crate) lanes: Vec<Lane>,
    /// Its lanes' transport (the first lane's): which transport's hint its transfers take.
    transport: TransportId,
    remote: Vec<RemoteRegion>,
    max_block: u64,
    /// The lane the last doorbell went to.
    last_lane: usize,
    /// With a control lane: the driver's next doorbell goes to bulk first (the two classes
    /// take turns, so a long latency-first transfer does not idle the bulk lanes).
    bulk_next: bool,
    latency: VecDeque<u32>,
    bulk: VecDeque<u32>,
}

/// Where a transfer stands.
enum Phase {
    Free,
    Running,
    Finished(Result<Delivered, EngineError>),
    /// Its result was handed out; posted blocks may still be retiring.
    Collected,
}

struct Slot {
    generation: u64,
    phase: Phase,
    /// The task waiting for the result, woken when it ends.
    waker: Option<Waker>,
    peer: u32,
    local: RegionId,
    remote: RegionId,
    segments: Segments,
    segment: usize,
    offset: u64,
    block_bytes: u64,
    notify: Option<u32>,
    deadline: Instant,
    total: u64,
    confirmed: u64,
    blocks: u64,
    in_flight: u64,
    cancelled: bool,
    /// Lanes its blocks went to, a bit each.
    lanes_used: u16,
    /// Whether it holds its local region on every lane of its peer ([`Transport::hold`]).
    holds_source: bool,
}

impl Lane {
    /// Payload bytes the lane may have in flight now: what drains in `queue_time` at its
    /// measured rate (so work submitted now waits about that long behind it), at least two of
    /// its largest blocks (one landing while the next is sent), at most the configured cap.
    fn cap(&self) -> u64 {
        if self.control {
            return self.bytes_in_flight;
        }
        cap(self.rate, self.queue_time, self.largest_block, self.bytes_in_flight)
    }

    /// Whether another doorbell of `batch_bytes` may grow (one block always goes out).
    fn has_room(&self, batch_bytes: u64) -> bool {
        self.outstanding_bytes + batch_bytes < self.cap() || self.in_flight.is_empty()
    }
}

/// [`Lane::cap`] of a lane retiring `rate` bytes per second (0: not measured yet).
fn cap(rate: f64, queue_time: Duration, largest_block: u64, configured: u64) -> u64 {
    if rate == 0.0 {
        return configured;
    }
    let drains = (rate * queue_time.as_secs_f64()) as u64;
    drains.max(largest_block.saturating_mul(2)).min(configured)
}

/// Folds a window of `bytes` retired over `took` into the lane's `rate`, once the window
/// spans at least a quarter of the queue time (completions drained by one poll arrive
/// nanoseconds apart and would read as terabytes per second). Every bias left is downward (a
/// lane held back by its cap, or by a sender with little to send, retires less than it
/// could), so the rate is the best sample, decaying slowly toward what the lane delivers now.
fn fold_rate(rate: f64, (bytes, took): (u64, Duration), queue_time: Duration) -> Option<f64> {
    if bytes == 0 || took < (queue_time / 4).max(Duration::from_micros(20)) {
        return None;
    }
    let sample = bytes as f64 / took.as_secs_f64();
    Some(sample.max(rate * RATE_DECAY))
}

/// What a lane's best rate keeps of itself per sample (halves in about 14 samples).
const RATE_DECAY: f64 = 0.95;

impl Slot {
    fn free() -> Slot {
        Slot {
            generation: 0,
            phase: Phase::Free,
            waker: None,
            peer: 0,
            local: RegionId(0),
            remote: RegionId(0),
            segments: Segments::One(Segment { local_offset: 0, remote_offset: 0, len: 0 }),
            segment: 0,
            offset: 0,
            block_bytes: 1,
            notify: None,
            deadline: Instant::now(),
            total: 0,
            confirmed: 0,
            blocks: 0,
            in_flight: 0,
            cancelled: false,
            lanes_used: 0,
            holds_source: false,
        }
    }

    /// The next block: up to `block_bytes` from where the last one ended, packed with the
    /// segments after it while they land right behind it remotely, `max_pieces` local ranges
    /// at most (segments smaller than the hint share one work request). Each local range goes
    /// to `piece` as (offset, len). `None` once all are posted.
    fn next_block(&self, max_pieces: u32, mut piece: impl FnMut(u64, u64)) -> Option<Block> {
        let segments = self.segments.as_slice();
        let first = segments.get(self.segment)?;
        let (mut segment, mut offset) = (self.segment, self.offset);
        let (local_offset, remote_offset) = (first.local_offset + offset, first.remote_offset + offset);
        let (mut len, mut pieces) = (0, 0);
        loop {
            let at = segments[segment];
            let take = (at.len - offset).min(self.block_bytes - len);
            piece(at.local_offset + offset, take);
            (len, pieces, offset) = (len + take, pieces + 1, offset + take);
            if offset == at.len {
                (segment, offset) = (segment + 1, 0);
            }
            let continues =
                segments.get(segment).is_some_and(|next| next.remote_offset == remote_offset + len);
            if len == self.block_bytes || pieces == max_pieces || !continues {
                break;
            }
        }
        let last = segment == segments.len();
        Some(Block { local_offset, remote_offset, len, pieces, last, segment, offset })
    }

    fn advance(&mut self, block: &Block) {
        (self.segment, self.offset) = (block.segment, block.offset);
        self.blocks += 1;
        self.in_flight += 1;
    }

    fn all_posted(&self) -> bool {
        self.segment >= self.segments.as_slice().len()
    }

    /// Ends a running transfer with `result` and wakes its waiter.
    fn end(&mut self, result: Result<Delivered, EngineError>) {
        if matches!(self.phase, Phase::Running) {
            self.phase = Phase::Finished(result);
            if let Some(waker) = self.waker.take() {
                waker.wake();
            }
        }
    }
}

/// One work request's worth of a transfer (see [`Slot::next_block`]).
struct Block {
    /// The first piece's local offset.
    local_offset: u64,
    remote_offset: u64,
    len: u64,
    /// Local ranges it gathers.
    pieces: u32,
    /// Whether it is the transfer's last.
    last: bool,
    /// Where the next block starts: segment and offset in it.
    segment: usize,
    offset: u64,
}

/// What one lane of a connection has carried.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaneStats {
    /// Payload bytes posted on the lane so far.
    pub posted_bytes: u64,
    /// Work requests posted on the lane so far.
    pub posted_wrs: u64,
    /// Bytes posted and not yet completed.
    pub outstanding_bytes: u64,
    /// Why the lane stopped, if it failed.
    pub failed: Option<String>,
}

/// What a transfer looks like from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferStatus {
    /// Blocks are still being posted or confirmed.
    Running {
        /// Payload bytes whose completion arrived, in bytes.
        confirmed_bytes: u64,
        /// Payload bytes asked for.
        len: u64,
    },
    /// Every byte was confirmed delivered; `wait` hands out the report.
    Done,
    /// It failed, was cancelled or passed its deadline; `wait` hands out the error.
    Failed,
    /// Not a transfer of this engine, or its result was already handed out.
    Unknown,
}

pub(crate) struct State {
    pub(crate) peers: Vec<Peer>,
    /// Source holds of freed slots whose peer had a doorbell ringing (see `unhold_source`).
    deferred_unholds: Vec<(usize, RegionId)>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    hints: Hints,
    host_node: u32,
    policy: PostPolicy,
    lane_bytes_in_flight: u64,
    lane_stall: Duration,
    /// Local ranges a packed request gathers at most (the lane's `max_sges` may say fewer).
    gather_entries: u32,
    lane_queue_time: Duration,
    /// A peer of several lanes keeps its last for latency-first transfers.
    control_lane: bool,
    room_waiters: Vec<Waker>,
    /// The peer whose turn it is to post.
    next_peer: usize,
    pub(crate) stopping: bool,
    next_deadline_scan: Instant,
}

/// Work requests a lane posts (through the driver) before callers post on it themselves.
const WARM_WRS: u64 = 256;

/// Local ranges one packed work request gathers, at most (below the transport's `max_sges`).
pub(crate) const MAX_PIECES: u32 = 64;

/// A doorbell built under the lock, rung without it ([`State::finish_doorbell`] records it).
pub(crate) struct Doorbell {
    peer: usize,
    lane: usize,
    first_seq: u64,
    count: usize,
    /// Payload bytes of its requests.
    bytes: u64,
    pub(crate) transport: Arc<dyn Transport>,
    /// A packed request's entry here holds its first piece's local range and its whole
    /// remote range and length.
    ops: [WriteOp; MAX_OPS_PER_POST],
    /// Per request, its local ranges in `entries` (on lanes that pack).
    pieces: [u32; MAX_OPS_PER_POST],
    /// The gather entries of every request, in order; empty on lanes that do not pack.
    entries: Vec<GatherEntry>,
}

impl Doorbell {
    fn ops(&self) -> &[WriteOp] {
        &self.ops[..self.count]
    }

    /// Posts the doorbell's requests with one call: plain writes, or gather writes where a
    /// request packs several ranges.
    pub(crate) fn ring(&self) -> Result<(), TransportError> {
        if self.pieces[..self.count].iter().all(|pieces| *pieces == 1) {
            return self.transport.post_writes(self.ops());
        }
        let mut gathers = [GatherOp::EMPTY; MAX_OPS_PER_POST];
        let mut first = 0;
        for (index, op) in self.ops().iter().enumerate() {
            gathers[index] = gather_op(op, first, self.pieces[index]);
            first += self.pieces[index];
        }
        self.transport.post_gather_writes(&gathers[..self.count], &self.entries)
    }
}

fn gather_op(op: &WriteOp, first: u32, count: u32) -> GatherOp {
    GatherOp {
        wr_id: op.wr_id,
        first,
        count,
        remote: op.remote,
        remote_offset: op.remote_offset,
        signalled: op.signalled,
        imm: op.imm,
    }
}

/// A refused request, with the request handed back (boxed: refusals are rare, the `Ok` path
/// stays small).
pub(crate) type Refusal = (RequestError, Box<TransferRequest>);

/// Peers one engine connects to, at most.
pub const MAX_PEERS: usize = 1024;
/// Lanes (transports opened together) one connection may have, at most.
pub const MAX_LANES: usize = 16;

/// What one turn of the driver did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Turn {
    /// Something was posted, retired or ended.
    pub(crate) worked: bool,
    /// Some lane has work requests in flight.
    pub(crate) in_flight: bool,
    /// Some transfer runs (queued or in flight): its deadline needs watching.
    pub(crate) running: bool,
}

impl State {
    pub(crate) fn new(
        policy: PostPolicy,
        max_transfers: u32,
        lane_bytes_in_flight: u64,
        lane_stall: Duration,
        gather_entries: u32,
        lane_queue_time: Duration,
        control_lane: bool,
    ) -> State {
        State {
            peers: Vec::new(),
            slots: (0..max_transfers).map(|_| Slot::free()).collect(),
            free: (0..max_transfers).rev().collect(),
            hints: Hints::default(),
            host_node: 0,
            policy,
            lane_bytes_in_flight,
            lane_stall,
            gather_entries,
            lane_queue_time,
            control_lane,
            room_waiters: Vec::new(),
            deferred_unholds: Vec::with_capacity(max_transfers as usize),
            next_peer: 0,
            stopping: false,
            next_deadline_scan: Instant::now(),
        }
    }

    pub(crate) fn set_hint(&mut self, source: SourceId, transport: Option<TransportId>, spec: BlockSpec) {
        self.hints.set(source, transport, spec);
    }

    pub(crate) fn set_host_node(&mut self, node: u32) {
        self.host_node = node;
    }

    pub(crate) fn max_transfers(&self) -> u32 {
        self.slots.len() as u32
    }

    pub(crate) fn add_peer(
        &mut self,
        lanes: Vec<Arc<dyn Transport>>,
        remote: &[RemoteRegion],
    ) -> Result<u32, RequestError> {
        if lanes.is_empty() || lanes.len() > MAX_LANES {
            return Err(RequestError::InvalidPeer(format!("{} lanes; give 1 to {MAX_LANES}", lanes.len())));
        }
        if self.peers.len() >= MAX_PEERS {
            return Err(RequestError::InvalidPeer(format!("this engine already has {MAX_PEERS} peers")));
        }
        let known = self.peers.iter().flat_map(|peer| peer.lanes.iter().map(|lane| &lane.transport));
        for (index, lane) in lanes.iter().enumerate() {
            let same = |other: &Arc<dyn Transport>| std::ptr::addr_eq(Arc::as_ptr(other), Arc::as_ptr(lane));
            if lanes[..index].iter().any(same) || known.clone().any(same) {
                return Err(RequestError::InvalidPeer(
                    "a transport is already a lane of this engine: each lane's completions must be the engine's alone".into(),
                ));
            }
        }
        let mut max_block = u64::MAX;
        let lanes = lanes
            .into_iter()
            .map(|transport| {
                let caps = transport.capabilities();
                let policy = self.policy.fitted_to(caps);
                max_block = max_block.min(caps.facts.max_msg_bytes.max(1));
                let max_pieces = caps.max_sges.clamp(1, self.gather_entries);
                let entries = if max_pieces > 1 {
                    Vec::with_capacity(MAX_OPS_PER_POST * max_pieces as usize)
                } else {
                    Vec::new()
                };
                Lane {
                    window: policy.window,
                    per_post: policy.wrs_per_doorbell,
                    bytes_in_flight: self.lane_bytes_in_flight,
                    queue_time: self.lane_queue_time,
                    rate: 0.0,
                    window_bytes: 0,
                    window_at: Instant::now(),
                    idle_since: None,
                    sampled: false,
                    control: false,
                    largest_block: 0,
                    next_seq: 1,
                    in_flight: VecDeque::with_capacity(policy.window as usize),
                    outstanding_bytes: 0,
                    posted_bytes: 0,
                    posted_wrs: 0,
                    progress_at: Instant::now(),
                    posting: false,
                    completions: vec![Completion::EMPTY; policy.window as usize],
                    dead: None,
                    max_pieces,
                    entries,
                    transport,
                }
            })
            .collect::<Vec<Lane>>();
        let mut lanes = lanes;
        let count = lanes.len();
        if self.control_lane && count > 1 {
            lanes[count - 1].control = true;
        }
        let slots = self.slots.len();
        let transport = lanes[0].transport.capabilities().facts.id.clone();
        self.peers.push(Peer {
            lanes,
            transport,
            remote: remote.to_vec(),
            max_block,
            last_lane: 0,
            bulk_next: false,
            latency: VecDeque::with_capacity(slots),
            bulk: VecDeque::with_capacity(slots),
        });
        Ok(self.peers.len() as u32 - 1)
    }

    /// Takes a request into a free slot and queues it: the checks come first, so a refusal
    /// leaves nothing behind.
    pub(crate) fn submit(
        &mut self,
        peer: u32,
        request: TransferRequest,
        deadline: Instant,
    ) -> Result<TransferId, Refusal> {
        match self.admit(peer, request) {
            Ok((request, total, block_bytes)) => {
                let Some(index) = self.free.pop() else {
                    let max_transfers = self.max_transfers();
                    return Err((RequestError::Full { max_transfers }, Box::new(request)));
                };
                // Held from here until the slot is freed: the source can be neither released
                // nor its id reused for other memory while a block of it may still be posted.
                if let Err(error) = self.hold_source(peer, request.local.id) {
                    self.free.push(index);
                    let (id, why) = (request.local.id, error.to_string());
                    return Err((RequestError::LocalRegion { id, why }, Box::new(request)));
                }
                let slot = &mut self.slots[index as usize];
                slot.generation += 1;
                *slot = Slot {
                    generation: slot.generation,
                    phase: Phase::Running,
                    waker: None,
                    peer,
                    local: request.local.id,
                    remote: request.remote.id,
                    segments: request.segments,
                    segment: 0,
                    offset: 0,
                    block_bytes,
                    notify: request.notify,
                    deadline,
                    total,
                    confirmed: 0,
                    blocks: 0,
                    in_flight: 0,
                    cancelled: false,
                    lanes_used: 0,
                    holds_source: true,
                };
                let peer = &mut self.peers[peer as usize];
                match request.class {
                    Class::Bulk => peer.bulk.push_back(index),
                    Class::LatencyFirst => peer.latency.push_back(index),
                }
                Ok(TransferId { slot: index, generation: slot.generation })
            }
            Err(refusal) => Err(refusal),
        }
    }

    fn admit(&self, peer: u32, mut request: TransferRequest) -> Result<(TransferRequest, u64, u64), Refusal> {
        if self.stopping {
            return Err((RequestError::Stopped, Box::new(request)));
        }
        let Some(peer_state) = self.peers.get(peer as usize) else {
            return Err((RequestError::UnknownPeer(peer), Box::new(request)));
        };
        if let Some(reason) =
            peer_state.lanes.iter().map(|lane| lane.dead.as_ref()).collect::<Option<Vec<_>>>()
        {
            let why = reason.first().map_or(String::new(), |why| why.to_string());
            return Err((RequestError::PeerGone(why), Box::new(request)));
        }
        let remote = request.remote;
        if !peer_state.remote.contains(&remote) {
            return Err((
                RequestError::UnknownRemoteRegion { id: remote.id, len: remote.len },
                Box::new(request),
            ));
        }
        let source = match request.source {
            Some(source) => source,
            None => match request.local.kind {
                MemoryKind::Host => SourceId::Host(self.host_node),
                MemoryKind::CudaDevice { ordinal } => SourceId::Gpu(ordinal),
                MemoryKind::DmaBuf => return Err((RequestError::UnknownSource, Box::new(request))),
            },
        };
        let spec = match self.hints.spec(source, &peer_state.transport) {
            Ok(spec) => spec,
            Err(error) => return Err((error, Box::new(request))),
        };
        let block_bytes = spec.block_bytes().min(peer_state.max_block);
        let local_len = request.local.len;
        let checked = match &mut request.segments {
            Segments::One(segment) => {
                super::request::check_all(std::slice::from_ref(segment), local_len, remote.len)
                    .map(|()| segment.len)
            }
            Segments::Many(segments) => super::request::validate_segments(segments, local_len, remote.len),
        };
        match checked {
            Ok(total) => Ok((request, total, block_bytes)),
            Err(error) => Err((error, Box::new(request))),
        }
    }

    fn slot(&self, id: TransferId) -> Option<&Slot> {
        self.slots.get(id.slot as usize).filter(|slot| slot.generation == id.generation)
    }

    pub(crate) fn status(&self, id: TransferId) -> TransferStatus {
        match self.slot(id).map(|slot| (&slot.phase, slot)) {
            Some((Phase::Running, slot)) => {
                TransferStatus::Running { confirmed_bytes: slot.confirmed, len: slot.total }
            }
            Some((Phase::Finished(Ok(_)), _)) => TransferStatus::Done,
            Some((Phase::Finished(Err(_)), _)) => TransferStatus::Failed,
            _ => TransferStatus::Unknown,
        }
    }

    /// The result of a finished transfer, once: its slot is freed (or freed when its last
    /// posted block retires). `None` while it runs; `Some(Err(Unknown))` for an id not (or no
    /// longer) this engine's.
    pub(crate) fn collect(&mut self, id: TransferId) -> (Option<Result<Delivered, EngineError>>, bool) {
        let Some(slot) = self.slots.get_mut(id.slot as usize).filter(|slot| slot.generation == id.generation)
        else {
            return (Some(Err(EngineError::UnknownTransfer)), false);
        };
        match std::mem::replace(&mut slot.phase, Phase::Collected) {
            Phase::Finished(result) => {
                let freed = slot.in_flight == 0;
                if freed {
                    self.release(id.slot);
                }
                (Some(result), freed)
            }
            Phase::Running => {
                slot.phase = Phase::Running;
                (None, false)
            }
            other => {
                slot.phase = other;
                (Some(Err(EngineError::UnknownTransfer)), false)
            }
        }
    }

    /// Stops posting a transfer's blocks; it ends [`EngineError::Cancelled`] (blocks already
    /// posted still land). `false` if it had already ended.
    pub(crate) fn cancel(&mut self, id: TransferId) -> bool {
        let Some(slot) = self.slots.get_mut(id.slot as usize).filter(|slot| slot.generation == id.generation)
        else {
            return false;
        };
        if !matches!(slot.phase, Phase::Running) {
            return false;
        }
        slot.cancelled = true;
        let confirmed_bytes = slot.confirmed;
        let peer = slot.peer as usize;
        self.finish(id.slot, Err(EngineError::Cancelled { confirmed_bytes }));
        let peer = &mut self.peers[peer];
        peer.latency.retain(|index| *index != id.slot);
        peer.bulk.retain(|index| *index != id.slot);
        true
    }

    fn finish(&mut self, index: u32, result: Result<Delivered, EngineError>) {
        self.slots[index as usize].end(result);
    }

    /// Frees a slot whose result was collected and whose last block retired, and wakes the
    /// submitters waiting for room.
    fn release(&mut self, index: u32) {
        self.unhold_source(index);
        self.slots[index as usize].phase = Phase::Free;
        self.free.push(index);
        self.room_waiters.drain(..).for_each(Waker::wake);
    }

    /// Holds `region` on every lane of `peer` (lanes may share one region table, or not:
    /// holds are counted either way); all or none.
    fn hold_source(&self, peer: u32, region: RegionId) -> Result<(), TransportError> {
        let lanes = &self.peers[peer as usize].lanes;
        for (index, lane) in lanes.iter().enumerate() {
            if let Err(error) = lane.transport.hold(region) {
                lanes[..index].iter().for_each(|lane| lane.transport.unhold(region));
                return Err(error);
            }
        }
        Ok(())
    }

    /// Ends the hold a transfer took on its source at submit (once). While a doorbell of its
    /// peer rings outside the lock, its blocks may still be on their way into `post_writes`
    /// (a lane failed meanwhile counts them out early): the hold then ends when the doorbell
    /// has rung.
    fn unhold_source(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        if std::mem::take(&mut slot.holds_source) {
            let (peer, region) = (slot.peer as usize, slot.local);
            let lanes = &self.peers[peer].lanes;
            if lanes.iter().any(|lane| lane.posting) {
                // At most one a slot: the capacity reserved for them is never outgrown.
                self.deferred_unholds.push((peer, region));
            } else {
                lanes.iter().for_each(|lane| lane.transport.unhold(region));
            }
        }
    }

    /// Ends the holds deferred while `peer`'s doorbells rang, once none rings.
    fn end_deferred_unholds(&mut self, peer: usize) {
        let lanes = &self.peers[peer].lanes;
        if self.deferred_unholds.is_empty() || lanes.iter().any(|lane| lane.posting) {
            return;
        }
        self.deferred_unholds.retain(|(of, region)| {
            let done = *of == peer;
            if done {
                lanes.iter().for_each(|lane| lane.transport.unhold(*region));
            }
            !done
        });
    }

    /// Has `waker` woken when `id` ends (`false`: it already has, or is unknown).
    pub(crate) fn wake_when_done(&mut self, id: TransferId, waker: &Waker) -> bool {
        match self.slots.get_mut(id.slot as usize).filter(|slot| slot.generation == id.generation) {
            Some(slot) if matches!(slot.phase, Phase::Running) => {
                if !slot.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    slot.waker = Some(waker.clone());
                }
                true
            }
            _ => false,
        }
    }

    /// Has `waker` woken when a slot comes free.
    pub(crate) fn wake_on_room(&mut self, waker: &Waker) {
        if !self.room_waiters.iter().any(|w| w.will_wake(waker)) {
            self.room_waiters.push(waker.clone());
        }
    }

    /// Posts what the peer's lanes have room for now (the submitting thread's turn, so a
    /// transfer does not wait for the driver to start).
    pub(crate) fn post_now(&mut self, peer: u32) -> Option<Doorbell> {
        let mut turn = Turn::default();
        self.peers.get(peer as usize)?;
        self.post_peer(peer as usize, &mut turn, Poster::Caller)
    }

    /// Retires what completed on every lane, posting nothing (a waiter's look).
    pub(crate) fn poll_all(&mut self) -> Turn {
        let mut turn = Turn::default();
        for peer in 0..self.peers.len() {
            for lane in 0..self.peers[peer].lanes.len() {
                self.poll_lane(peer, lane, &mut turn);
            }
        }
        turn
    }

    /// One turn: a doorbell per lane where the windows allow, retire what completed, end what
    /// passed its deadline.
    pub(crate) fn turn(&mut self, now: Option<Instant>) -> (Turn, Option<Doorbell>) {
        let mut turn = Turn::default();
        let mut doorbell = None;
        // One doorbell per turn, the peers taking turns: the lock is held for one post (the
        // staged shm channel copies inside it), then let go.
        let peers = self.peers.len();
        for step in 0..peers {
            let peer = (self.next_peer + step) % peers;
            doorbell = self.post_peer(peer, &mut turn, Poster::Driver);
            if doorbell.is_some() {
                self.next_peer = (peer + 1) % peers;
                break;
            }
        }
        for peer in 0..peers {
            for lane in 0..self.peers[peer].lanes.len() {
                self.poll_lane(peer, lane, &mut turn);
            }
        }
        if let Some(now) = now {
            if now >= self.next_deadline_scan {
                self.next_deadline_scan = now + std::time::Duration::from_millis(1);
                self.end_overdue(now, &mut turn);
            }
        }
        turn.in_flight =
            self.peers.iter().any(|peer| peer.lanes.iter().any(|lane| !lane.in_flight.is_empty()));
        // A running transfer is queued (blocks left to post, or fenced) or has blocks in flight.
        turn.running =
            turn.in_flight || self.peers.iter().any(|peer| !peer.latency.is_empty() || !peer.bulk.is_empty());
        (turn, doorbell)
    }

    fn end_overdue(&mut self, now: Instant, turn: &mut Turn) {
        let mut ended = false;
        for slot in &mut self.slots {
            if matches!(slot.phase, Phase::Running) && now >= slot.deadline {
                let error =
                    EngineError::DeadlineExceeded { confirmed_bytes: slot.confirmed, len: slot.total };
                slot.end(Err(error));
                ended = true;
            }
        }
        if ended {
            let slots = &self.slots;
            for peer in &mut self.peers {
                peer.latency.retain(|index| matches!(slots[*index as usize].phase, Phase::Running));
                peer.bulk.retain(|index| matches!(slots[*index as usize].phase, Phase::Running));
            }
            turn.worked = true;
        }
        // A lane whose oldest request has gone unanswered for `lane_stall` is failed: a peer
        // that stalls without closing must not hold its transfers' slots for ever.
        for peer in 0..self.peers.len() {
            for lane in 0..self.peers[peer].lanes.len() {
                let state = &self.peers[peer].lanes[lane];
                let waited = now.saturating_duration_since(state.progress_at);
                if state.dead.is_none() && !state.in_flight.is_empty() && waited >= self.lane_stall {
                    let error = TransportError::DeadlineExceeded {
                        what: "a completion on an engine lane",
                        waited_ms: waited.as_millis() as u64,
                    };
                    self.fail_lane(peer, lane, error, turn);
                }
            }
        }
    }

    /// Posts blocks of the peer's queued transfers, one block per transfer per turn (latency
    /// class first), on the live lane with the fewest outstanding bytes, a doorbell at a time.
    /// Builds one doorbell (returned, to be rung without the lock): the lock is let go between doorbells, so a transfer submitted
    /// meanwhile (whose block then goes next) does not wait for a whole window of copies (the
    /// staged shm channel copies inside `post_writes`); lanes take turns by their outstanding
    /// bytes.
    fn post_peer(&mut self, peer_index: usize, turn: &mut Turn, poster: Poster) -> Option<Doorbell> {
        let peer = &self.peers[peer_index];
        if peer.latency.is_empty() && peer.bulk.is_empty() {
            return None;
        }
        // With a control lane (the last, while it and another lane live), latency-first
        // transfers go there alone and bulk stripes over the others: nothing bulk is ever
        // ahead of them. The two classes take turns at the driver's doorbells.
        let lanes = peer.lanes.len();
        let control = (self.control_lane
            && lanes > 1
            && peer.lanes[lanes - 1].dead.is_none()
            && peer.lanes[..lanes - 1].iter().any(|lane| lane.dead.is_none()))
        .then_some(lanes - 1);
        let mut choices = [None, None];
        match control {
            Some(last) => {
                let latency = (!peer.latency.is_empty() && available(&peer.lanes[last]))
                    .then_some((last, Classes::Latency));
                let bulk = (!peer.bulk.is_empty())
                    .then(|| pick_lane(&peer.lanes[..last], peer.last_lane))
                    .flatten()
                    .map(|lane| (lane, Classes::Bulk));
                choices = if peer.bulk_next { [bulk, latency] } else { [latency, bulk] };
            }
            None => choices[0] = pick_lane(&peer.lanes, peer.last_lane).map(|lane| (lane, Classes::Both)),
        }
        for (lane_index, classes) in choices.into_iter().flatten() {
            // A lane's first doorbells are left to the driver thread: they may cost
            // milliseconds the caller's thread should not spend (the staged shm channel maps
            // the peer's region at its first write into it).
            if poster == Poster::Caller && self.peers[peer_index].lanes[lane_index].posted_wrs < WARM_WRS {
                continue;
            }
            if let Some(doorbell) = self.build_doorbell(peer_index, lane_index, classes, turn) {
                let peer = &mut self.peers[peer_index];
                if classes != Classes::Latency {
                    peer.last_lane = lane_index;
                }
                if poster == Poster::Driver {
                    peer.bulk_next = classes == Classes::Latency;
                }
                return Some(doorbell);
            }
        }
        None
    }

    /// A doorbell for `lane_index` of blocks from the queues `classes` names; `None` when none
    /// can go (all fenced, or the queues empty).
    fn build_doorbell(
        &mut self,
        peer_index: usize,
        lane_index: usize,
        classes: Classes,
        turn: &mut Turn,
    ) -> Option<Doorbell> {
        {
            let peer = &mut self.peers[peer_index];
            let lane = &mut peer.lanes[lane_index];
            let room = (lane.window as usize - lane.in_flight.len()).min(lane.per_post as usize);
            let mut ops = [WriteOp::EMPTY; MAX_OPS_PER_POST];
            let mut pieces = [1u32; MAX_OPS_PER_POST];
            let mut entries = std::mem::take(&mut lane.entries);
            entries.clear();
            let packs = lane.max_pieces > 1;
            let mut count = 0;
            let (mut latency_fenced, mut bulk_fenced) = (0, 0);
            let mut batch_bytes = 0;
            if lane.in_flight.is_empty() {
                // The lane stood empty: neither the wait for a stall nor a rate sample counts
                // the idle time.
                let now = Instant::now();
                lane.progress_at = now;
                if let Some(idle) = lane.idle_since.take() {
                    lane.window_at += now.saturating_duration_since(idle);
                }
            }
            // Bytes in flight are capped (past the first block): whatever is posted on a lane
            // is ahead of every block submitted later, small transfers' included. A doorbell
            // takes half the cap at most (past its first block), so one is in flight while
            // the next is sent: each asks for one completion.
            let half_cap = lane.cap() / 2;
            while count < room && lane.has_room(batch_bytes) && (count == 0 || batch_bytes < half_cap) {
                // Latency-first transfers go first, unless every one of them is fenced (below).
                let from_latency = classes != Classes::Bulk && latency_fenced < peer.latency.len();
                if !from_latency && (classes == Classes::Latency || bulk_fenced >= peer.bulk.len()) {
                    break;
                }
                let queue = if from_latency { &mut peer.latency } else { &mut peer.bulk };
                let Some(index) = queue.pop_front() else { break };
                let slot = &mut self.slots[index as usize];
                let built = entries.len();
                let local = slot.local;
                let block = slot.next_block(lane.max_pieces, |offset, len| {
                    if packs {
                        entries.push(GatherEntry { local, offset, len });
                    }
                });
                let Some(block) = block else { continue };
                let last = block.last;
                // The announcing block waits for the transfer's blocks in flight on other lanes:
                // an arrival vouches only for the writes of its own lane before it.
                let elsewhere = slot.lanes_used & !(1u16 << lane_index) != 0;
                if last && elsewhere && slot.notify.is_some() && slot.in_flight > 0 {
                    entries.truncate(built);
                    queue.push_back(index);
                    if from_latency {
                        latency_fenced += 1;
                    } else {
                        bulk_fenced += 1;
                    }
                    continue;
                }
                ops[count] = WriteOp {
                    wr_id: lane.next_seq + count as u64,
                    local: slot.local,
                    local_offset: block.local_offset,
                    remote: slot.remote,
                    remote_offset: block.remote_offset,
                    len: block.len,
                    signalled: last,
                    imm: if last { slot.notify } else { None },
                };
                lane.in_flight.push_back(Posted {
                    seq: lane.next_seq + count as u64,
                    slot: index,
                    generation: slot.generation,
                    bytes: block.len,
                });
                pieces[count] = block.pieces;
                slot.lanes_used |= 1u16 << lane_index;
                lane.largest_block = lane.largest_block.max(block.len);
                slot.advance(&block);
                batch_bytes += block.len;
                if !slot.all_posted() {
                    queue.push_back(index);
                }
                count += 1;
            }
            if count == 0 {
                lane.entries = entries;
                return None;
            }
            ops[count - 1].signalled = true;
            turn.worked = true;
            let first_seq = lane.next_seq;
            lane.next_seq += count as u64;
            lane.outstanding_bytes += batch_bytes;
            lane.posting = true;
            let transport = lane.transport.clone();
            Some(Doorbell {
                peer: peer_index,
                lane: lane_index,
                first_seq,
                count,
                bytes: batch_bytes,
                transport,
                ops,
                pieces,
                entries,
            })
        }
    }

    /// Records how ringing `doorbell` went.
    pub(crate) fn finish_doorbell(&mut self, mut doorbell: Doorbell, rung: Result<(), TransportError>) {
        let mut turn = Turn::default();
        let (peer_index, lane_index) = (doorbell.peer, doorbell.lane);
        let lane = &mut self.peers[peer_index].lanes[lane_index];
        lane.posting = false;
        let entries = std::mem::take(&mut doorbell.entries);
        if lane.dead.is_some() {
            // The lane failed while the doorbell rang (a poll or the stall watch): its
            // requests left the in-flight queue with their transfers, nothing is left to count.
            lane.entries = entries;
            self.end_deferred_unholds(peer_index);
            return;
        }
        match rung {
            Ok(()) => {
                lane.posted_bytes += doorbell.bytes;
                lane.posted_wrs += doorbell.count as u64;
            }
            Err(error) if refuses_the_ops(&error) => {
                // Checked before anything was posted: a bad request (a region deregistered
                // since its submit, say) fails alone and the lane goes on. Nothing of the
                // doorbell reached the transport, so its numbers are handed out again.
                lane.next_seq = doorbell.first_seq;
                lane.outstanding_bytes -= doorbell.bytes;
                self.post_one_by_one(peer_index, lane_index, &doorbell, &entries);
            }
            Err(error) => {
                // Nothing of the doorbell counts as posted: its entries leave the queue with
                // the lane's earlier ones, and their transfers fail.
                self.fail_lane(peer_index, lane_index, error, &mut turn);
            }
        }
        self.peers[peer_index].lanes[lane_index].entries = entries;
        self.end_deferred_unholds(peer_index);
    }

    /// After the transport refused a doorbell of `count` requests whole, posts them one at a
    /// time (each signalled), ending the transfers of those refused with the reason.
    fn post_one_by_one(
        &mut self,
        peer_index: usize,
        lane_index: usize,
        doorbell: &Doorbell,
        entries: &[GatherEntry],
    ) {
        let ops = doorbell.ops();
        let lane = &mut self.peers[peer_index].lanes[lane_index];
        let kept = lane.in_flight.len() - ops.len();
        let batch: Vec<(WriteOp, Posted)> = ops.iter().copied().zip(lane.in_flight.drain(kept..)).collect();
        let mut first = 0usize;
        for (index, (mut op, posted)) in batch.into_iter().enumerate() {
            let lane = &mut self.peers[peer_index].lanes[lane_index];
            op.wr_id = lane.next_seq;
            op.signalled = true;
            let pieces = doorbell.pieces[index];
            let rung = if pieces > 1 {
                let own = &entries[first..first + pieces as usize];
                let gather = gather_op(&op, 0, pieces);
                match lane.transport.post_gather_writes(&[gather], own) {
                    // A transport whose capabilities promise gathers it does not take (a
                    // wrapper passing them through, say): the lane stops packing, and the
                    // request goes as its pieces in one plain post, only the last signalled.
                    Err(TransportError::TooManyEntries { .. }) => {
                        lane.max_pieces = 1;
                        let mut writes = [WriteOp::EMPTY; MAX_PIECES as usize];
                        for (write, piece) in writes.iter_mut().zip(gather.pieces(own)) {
                            *write = piece;
                        }
                        lane.transport.post_writes(&writes[..own.len()])
                    }
                    rung => rung,
                }
            } else {
                lane.transport.post_writes(std::slice::from_ref(&op))
            };
            // Only read where a request gathers, which happens on lanes that pack.
            first += pieces as usize;
            match rung {
                Ok(()) => {
                    lane.next_seq += 1;
                    lane.outstanding_bytes += op.len;
                    lane.posted_bytes += op.len;
                    lane.posted_wrs += 1;
                    lane.in_flight.push_back(Posted { seq: op.wr_id, ..posted });
                }
                Err(error) => {
                    let slot = &mut self.slots[posted.slot as usize];
                    if slot.generation == posted.generation {
                        let confirmed_bytes = slot.confirmed;
                        slot.end(Err(EngineError::Transport { source: error, confirmed_bytes }));
                        let peer = &mut self.peers[peer_index];
                        peer.latency.retain(|index| *index != posted.slot);
                        peer.bulk.retain(|index| *index != posted.slot);
                        self.retire_block(Posted { bytes: 0, ..posted });
                    }
                }
            }
        }
    }

    fn poll_lane(&mut self, peer: usize, lane_index: usize, turn: &mut Turn) {
        let lane = &mut self.peers[peer].lanes[lane_index];
        if lane.in_flight.is_empty() || lane.dead.is_some() {
            return;
        }
        let mut completions = std::mem::take(&mut lane.completions);
        let polled = lane.transport.poll_completions(&mut completions);
        match polled {
            Ok(ready) => self.retire(peer, lane_index, &completions[..ready], turn),
            Err(error) => self.fail_lane(peer, lane_index, error, turn),
        }
        self.peers[peer].lanes[lane_index].completions = completions;
    }

    /// Retires, per completion, every work request posted on the lane up to its number.
    pub(crate) fn retire(
        &mut self,
        peer: usize,
        lane_index: usize,
        completions: &[Completion],
        turn: &mut Turn,
    ) {
        let mut retired_bytes = 0;
        for completion in completions {
            if let CompletionStatus::Failed { code } = completion.status {
                let error = TransportError::Completion { wr_id: completion.wr_id, code };
                self.fail_lane(peer, lane_index, error, turn);
                return;
            }
            loop {
                let lane = &mut self.peers[peer].lanes[lane_index];
                let Some(posted) = lane.in_flight.front().copied().filter(|p| p.seq <= completion.wr_id)
                else {
                    break;
                };
                lane.in_flight.pop_front();
                lane.outstanding_bytes -= posted.bytes;
                retired_bytes += posted.bytes;
                turn.worked = true;
                self.retire_block(posted);
            }
        }
        if retired_bytes > 0 {
            let lane = &mut self.peers[peer].lanes[lane_index];
            let now = Instant::now();
            lane.progress_at = now;
            lane.window_bytes += retired_bytes;
            let window = (lane.window_bytes, now.saturating_duration_since(lane.window_at));
            if let Some(rate) = fold_rate(lane.rate, window, lane.queue_time) {
                if lane.sampled {
                    lane.rate = rate;
                }
                lane.sampled = true;
                (lane.window_bytes, lane.window_at) = (0, now);
            }
            if lane.in_flight.is_empty() {
                lane.idle_since = Some(now);
            }
        }
    }

    fn retire_block(&mut self, posted: Posted) {
        let slot = &mut self.slots[posted.slot as usize];
        if slot.generation != posted.generation {
            return;
        }
        slot.in_flight -= 1;
        slot.confirmed += posted.bytes;
        match slot.phase {
            Phase::Running if slot.in_flight == 0 && slot.all_posted() => {
                let delivered = Delivered { bytes: slot.total, blocks: slot.blocks };
                slot.end(Ok(delivered));
            }
            Phase::Collected if slot.in_flight == 0 => {
                self.release(posted.slot);
            }
            _ => {}
        }
    }

    /// A lane that failed takes down every transfer with a block on it; the connection goes
    /// on over its other lanes, and with none left every transfer queued for the peer fails.
    fn fail_lane(&mut self, peer: usize, lane_index: usize, error: TransportError, turn: &mut Turn) {
        let reason = error.to_string();
        let mut error = Some(error);
        let lane = &mut self.peers[peer].lanes[lane_index];
        lane.dead = Some(reason.clone());
        lane.outstanding_bytes = 0;
        let posted: Vec<Posted> = lane.in_flight.drain(..).collect();
        for posted in posted {
            let slot = &self.slots[posted.slot as usize];
            if slot.generation != posted.generation {
                continue;
            }
            let confirmed_bytes = slot.confirmed;
            let source = error.take().unwrap_or_else(|| TransportError::PeerGone(reason.clone()));
            self.finish(posted.slot, Err(EngineError::Transport { source, confirmed_bytes }));
            let slot = &mut self.slots[posted.slot as usize];
            slot.cancelled = true;
            // The block will never retire: count it out (with no bytes) so the slot can come
            // free.
            self.retire_block(Posted { bytes: 0, ..posted });
        }
        let peer_state = &mut self.peers[peer];
        let all_dead = peer_state.lanes.iter().all(|lane| lane.dead.is_some());
        let slots = &mut self.slots;
        for queue in [&mut peer_state.latency, &mut peer_state.bulk] {
            queue.retain(|index| {
                let slot = &mut slots[*index as usize];
                let keep = !slot.cancelled && !all_dead;
                if !keep && matches!(slot.phase, Phase::Running) {
                    let source = TransportError::PeerGone(format!("every lane to the peer failed: {reason}"));
                    let confirmed_bytes = slot.confirmed;
                    slot.end(Err(EngineError::Transport { source, confirmed_bytes }));
                }
                keep
            });
        }
        turn.worked = true;
    }

    pub(crate) fn lane_stats(&self, peer: u32) -> Option<Vec<LaneStats>> {
        let peer = self.peers.get(peer as usize)?;
        Some(
            peer.lanes
                .iter()
                .map(|lane| LaneStats {
                    posted_bytes: lane.posted_bytes,
                    posted_wrs: lane.posted_wrs,
                    outstanding_bytes: lane.outstanding_bytes,
                    failed: lane.dead.clone(),
                })
                .collect(),
        )
    }

    /// Transports of lanes with work requests in flight, for the driver to sleep on.
    pub(crate) fn waiting_lanes(&self, out: &mut Vec<(usize, usize, Arc<dyn Transport>)>) {
        out.clear();
        for (peer_index, peer) in self.peers.iter().enumerate() {
            for (lane_index, lane) in peer.lanes.iter().enumerate() {
                if !lane.in_flight.is_empty() && lane.dead.is_none() {
                    out.push((peer_index, lane_index, lane.transport.clone()));
                }
            }
        }
    }

    /// Ends every running transfer (the engine is going away).
    pub(crate) fn stop_all(&mut self) {
        self.stopping = true;
        for index in 0..self.slots.len() {
            let slot = &self.slots[index];
            if matches!(slot.phase, Phase::Running) {
                let confirmed_bytes = slot.confirmed;
                self.finish(index as u32, Err(EngineError::Cancelled { confirmed_bytes }));
            }
            // Nothing is posted or retired after this: the transports' own in-flight checks
            // guard what is still posted.
            self.unhold_source(index as u32);
        }
        for (peer, region) in self.deferred_unholds.drain(..) {
            self.peers[peer].lanes.iter().for_each(|lane| lane.transport.unhold(region));
        }
        self.room_waiters.drain(..).for_each(Waker::wake);
        for peer in &mut self.peers {
            peer.latency.clear();
            peer.bulk.clear();
        }
    }
}

/// Errors a transport answers before posting anything of a doorbell: the ops, not the link.
fn refuses_the_ops(error: &TransportError) -> bool {
    matches!(
        error,
        TransportError::UnregisteredRegion(_)
            | TransportError::RegionWithdrawn(_)
            | TransportError::OutOfBounds { .. }
            | TransportError::ZeroLength { .. }
            | TransportError::MessageTooLarge { .. }
            | TransportError::UnsupportedMemory { .. }
            | TransportError::InvalidArgument { .. }
            | TransportError::TooManyEntries { .. }
    )
}

/// The live lane with room and the fewest outstanding bytes; ties go round, starting after
/// `last` (a channel that completes inside the post always has none outstanding).
fn pick_lane(lanes: &[Lane], last: usize) -> Option<usize> {
    let count = lanes.len();
    (1..=count)
        .map(|step| ((last + step) % count, &lanes[(last + step) % count]))
        .filter(|(_, lane)| available(lane))
        .min_by_key(|(_, lane)| lane.outstanding_bytes)
        .map(|(index, _)| index)
}

/// Whether a doorbell may be built on `lane` now.
fn available(lane: &Lane) -> bool {
    lane.dead.is_none() && !lane.posting && lane.in_flight.len() < lane.window as usize && lane.has_room(0)
}

/// Who builds a doorbell: the driver thread, or a caller's `submit` (which leaves a lane's
/// first posts to the driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poster {
    Driver,
    Caller,
}

/// Which queues a doorbell takes blocks from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Classes {
    Both,
    /// The control lane: latency-first transfers only.
    Latency,
    /// A lane beside a control lane: bulk only.
    Bulk,
}

#[cfg(test)]
mod tests {
    use super::{cap, fold_rate};
    use std::time::Duration;

    #[test]
    fn a_rate_sample_spans_a_quarter_of_the_queue_time_and_the_best_one_decays_slowly() {
        let queue = Duration::from_micros(200);
        // Completions one poll drains arrive nanoseconds apart: no sample until 50 us passed.
        assert_eq!(fold_rate(0.0, (256 << 10, Duration::from_nanos(80)), queue), None);
        assert_eq!(fold_rate(0.0, (0, Duration::from_millis(1)), queue), None);
        let first = fold_rate(0.0, (1_000_000, Duration::from_micros(100)), queue).unwrap();
        assert_eq!(first, 1e10);
        // A slower window (held back by the cap, or little to send) lowers it only slowly.
        let after = fold_rate(first, (100_000, Duration::from_micros(100)), queue).unwrap();
        assert_eq!(after, 0.95e10);
        assert_eq!(fold_rate(after, (4_000_000, Duration::from_micros(100)), queue), Some(4e10));
    }

    #[test]
    fn the_bytes_in_flight_follow_the_rate_between_two_blocks_and_the_configured_cap() {
        let queue = Duration::from_micros(200);
        let (block, configured) = (64 << 10, 2 << 20);
        assert_eq!(cap(0.0, queue, block, configured), configured, "unmeasured: the configured cap");
        assert_eq!(cap(5e9, queue, block, configured), 1_000_000, "5 GB/s drains 1 MB in 200 us");
        assert_eq!(cap(1e8, queue, block, configured), 2 * block, "never below two blocks");
        assert_eq!(cap(1e11, queue, block, configured), configured, "never above the configured cap");
    }
}
