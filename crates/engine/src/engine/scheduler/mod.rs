//! The engine's scheduler: transfer slots, per-peer queues, per-lane posting and the routing
//! of completions back to their transfers, as a state machine without I/O (quinn-proto's
//! shape). It holds no transport, no lock, no waker and no clock: the driver rings the
//! doorbells it builds, hands it each lane's completions and failures, passes the time in,
//! and acts on its [`Event`]s (wake a waiter, wake the submitters waiting for room, end a
//! transfer's hold on its source). Its unit tests (`tests.rs`) drive it with scripted events.

mod completions;
mod doorbell;
mod lane;
#[cfg(test)]
mod observed_tests;
#[cfg(test)]
mod random_scripts;
mod slot;
#[cfg(test)]
mod tests;

use super::hints::Hints;
use super::request::{Class, RequestError, Segments, TransferRequest};
use super::{Delivered, TransferId};
use crate::plan::BlockSpec;
use crate::TransferError;
pub(crate) use doorbell::Doorbell;
#[cfg(test)]
use doorbell::Ring;
use lane::Lane;
pub use lane::LaneStats;
pub(crate) use lane::{LaneConfig, MAX_PIECES};
use rdma_hint_core::{
    Capabilities, ErrorKind, MemoryKind, RegionId, RemoteRegion, SourceId, TransportError, TransportId,
};
use slot::{Phase, Slot};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Peers one engine connects to, at most.
pub const MAX_PEERS: usize = 1024;
/// Lanes (transports opened together) one connection may have, at most.
pub const MAX_LANES: usize = 16;
/// Work requests a lane posts (through the driver) before callers post on it themselves.
const WARM_WRS: u64 = 256;
/// How often the transfers' deadlines and the lanes' stalls are looked at, at most.
const TIMEOUT_SCAN: Duration = Duration::from_millis(1);

/// One lane of one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkId {
    pub(crate) peer: u32,
    pub(crate) lane: u32,
}

/// What the driver acts on after a call (see [`Scheduler::poll_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A transfer ended: wake its waiter.
    Ended { slot: u32 },
    /// A slot came free while submitters wait for room ([`Scheduler::want_room`]), or the
    /// engine stops: wake them.
    Room,
    /// A transfer's hold on its source ends: unhold `region` on every lane of `peer`.
    Unhold { peer: u32, region: RegionId },
    /// Observed only ([`Scheduler::observe`]): `link` failed.
    LaneLost { link: LinkId, error: ErrorKind },
}

/// What one completion retired, while observed: `requests` blocks of `bytes` on `link`, and
/// (where its doorbell was stamped) how long before it the completion's own request was
/// posted and the bytes in flight ahead of its doorbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completed {
    pub(crate) link: LinkId,
    pub(crate) requests: u32,
    pub(crate) bytes: u64,
    /// They were reads.
    pub(crate) reads: bool,
    pub(crate) timed: Option<(Duration, u64)>,
}

/// Who builds a doorbell: the driver thread, or a caller's `submit` of a transfer of that
/// class (which leaves a lane's first posts to the driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poster {
    Driver,
    Caller(Class),
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

/// A request that passed every check ([`Scheduler::admit`]): what [`Scheduler::queue`] needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted {
    peer: u32,
    total: u64,
    block_bytes: u64,
}

struct Peer {
    lanes: Vec<Lane>,
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
    /// How long its latency-first transfers took from queue to end, lately, in nanoseconds (an
    /// average that weighs the last one by 1/8; integers, since `Duration` arithmetic divides):
    /// how long a waiter may expect to poll before one ends.
    latency_first_took_ns: Option<u64>,
}

impl Peer {
    fn queued(&self) -> bool {
        !self.latency.is_empty() || !self.bulk.is_empty() || self.lanes.iter().any(Lane::has_refused)
    }
}

pub(crate) struct Scheduler {
    peers: Vec<Peer>,
    /// Source holds of freed slots whose peer had a doorbell ringing (see `unhold_source`).
    deferred_unholds: Vec<(u32, RegionId)>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    hints: Hints,
    host_node: u32,
    lanes: LaneConfig,
    lane_stall: Duration,
    /// A peer of several lanes keeps its last for latency-first transfers.
    control_lane: bool,
    /// The peer whose turn it is to post.
    next_peer: usize,
    stopping: bool,
    next_timeout_scan: Instant,
    /// No running transfer's deadline is earlier (the last scan's minimum, lowered by each
    /// submit since; it may be a transfer's that ended, which only wakes the driver early).
    earliest_deadline: Option<Instant>,
    /// Reserved for two per slot and one `Room`: each slot ends and unholds at most once
    /// between two drains (observed, a lost lane adds one more, at most one a lane).
    events: VecDeque<Event>,
    room_pending: bool,
    /// A submitter waits for a free slot (see [`want_room`](Self::want_room)): only then does
    /// a freed slot cost an event.
    room_wanted: bool,
    /// Someone subscribed to what the engine does: lost lanes are events too, and each
    /// completion leaves a record in `completed`.
    observed: bool,
    /// Observed: what each completion retired, for [`poll_completed`](Self::poll_completed)
    /// (kept apart from `events`, whose entries stay small).
    completed: VecDeque<Completed>,
    /// Tests: how many doorbells `build_lone` built, or `None` to build every one with the
    /// queues' loop (to check `build_lone` against it).
    #[cfg(test)]
    lone_built: Option<u64>,
}

impl Scheduler {
    pub(crate) fn new(
        max_transfers: u32,
        lanes: LaneConfig,
        lane_stall: Duration,
        control_lane: bool,
        now: Instant,
    ) -> Scheduler {
        Scheduler {
            peers: Vec::new(),
            deferred_unholds: Vec::with_capacity(max_transfers as usize),
            slots: (0..max_transfers).map(|_| Slot::free(now)).collect(),
            free: (0..max_transfers).rev().collect(),
            hints: Hints::default(),
            host_node: 0,
            lanes,
            lane_stall,
            control_lane,
            next_peer: 0,
            stopping: false,
            next_timeout_scan: now,
            earliest_deadline: None,
            events: VecDeque::with_capacity(2 * max_transfers as usize + 1),
            room_pending: false,
            room_wanted: false,
            observed: false,
            completed: VecDeque::new(),
            #[cfg(test)]
            lone_built: Some(0),
        }
    }

    pub(crate) fn set_hint(&mut self, source: SourceId, transport: Option<TransportId>, spec: BlockSpec) {
        self.hints.set(source, transport, spec);
    }

    pub(crate) fn set_host_node(&mut self, node: u32) {
        self.host_node = node;
    }

    pub(crate) fn host_node(&self) -> u32 {
        self.host_node
    }

    pub(crate) fn max_transfers(&self) -> u32 {
        self.slots.len() as u32
    }

    pub(crate) fn peers(&self) -> usize {
        self.peers.len()
    }

    /// Replaces the regions `peer` exposed (it exposed or withdrew some since it was added);
    /// whether the list changed.
    pub(crate) fn set_remote(&mut self, peer: u32, remote: &[RemoteRegion]) -> bool {
        match self.peers.get_mut(peer as usize) {
            Some(state) if state.remote != remote => {
                // Into the room it has: a chunker's transfer to the region of its last one
                // allocates nothing.
                state.remote.clear();
                state.remote.extend_from_slice(remote);
                true
            }
            _ => false,
        }
    }

    /// Adds a peer of one lane per entry of `lanes` (their capabilities); its id.
    pub(crate) fn add_peer(
        &mut self,
        lanes: &[&Capabilities],
        remote: &[RemoteRegion],
        now: Instant,
    ) -> Result<u32, RequestError> {
        if lanes.is_empty() || lanes.len() > MAX_LANES {
            return Err(RequestError::InvalidPeer(format!("{} lanes; give 1 to {MAX_LANES}", lanes.len())));
        }
        if self.peers.len() >= MAX_PEERS {
            return Err(RequestError::InvalidPeer(format!("this engine already has {MAX_PEERS} peers")));
        }
        let max_block = lanes.iter().map(|caps| caps.facts.max_msg_bytes.max(1)).min().unwrap_or(1);
        let mut built: Vec<Lane> = lanes.iter().map(|caps| Lane::new(caps, &self.lanes, now)).collect();
        if self.observed {
            built.iter_mut().for_each(Lane::observe);
        }
        let count = built.len();
        if self.control_lane && count > 1 {
            built[count - 1].make_control();
        }
        let slots = self.slots.len();
        self.peers.push(Peer {
            lanes: built,
            transport: lanes[0].facts.id.clone(),
            remote: remote.to_vec(),
            max_block,
            last_lane: 0,
            bulk_next: false,
            latency: VecDeque::with_capacity(slots),
            bulk: VecDeque::with_capacity(slots),
            latency_first_took_ns: None,
        });
        Ok(self.peers.len() as u32 - 1)
    }

    /// Requests `link` may have outstanding (the size its completions are polled in).
    pub(crate) fn window(&self, link: LinkId) -> usize {
        self.lane(link).window as usize
    }

    fn lane(&self, link: LinkId) -> &Lane {
        &self.peers[link.peer as usize].lanes[link.lane as usize]
    }

    fn lane_mut(&mut self, link: LinkId) -> &mut Lane {
        &mut self.peers[link.peer as usize].lanes[link.lane as usize]
    }

    /// Every check a submit runs, in order (a free slot last); changes nothing. The driver
    /// holds the request's source on the peer's lanes next, then [`queue`](Self::queue)s it.
    pub(crate) fn admit(&self, peer: u32, request: &mut TransferRequest) -> Result<Admitted, RequestError> {
        if self.stopping {
            return Err(RequestError::Stopped);
        }
        let peer_state = self.peers.get(peer as usize).ok_or(RequestError::UnknownPeer(peer))?;
        if peer_state.lanes.iter().all(|lane| lane.dead.is_some()) {
            let why = peer_state.lanes.first().and_then(|lane| lane.dead.as_ref());
            return Err(RequestError::PeerGone(why.map_or(String::new(), |why| why.to_string())));
        }
        if request.read && request.notify.is_some() {
            return Err(RequestError::NotifyOnRead);
        }
        let remote = request.remote;
        if !peer_state.remote.contains(&remote) {
            return Err(RequestError::UnknownRemoteRegion { id: remote.id, len: remote.len });
        }
        let source = match request.source {
            Some(source) => source,
            None => match request.local.kind {
                MemoryKind::Host => SourceId::Host(self.host_node),
                MemoryKind::CudaDevice { ordinal } => SourceId::Gpu(ordinal),
                MemoryKind::DmaBuf => return Err(RequestError::UnknownSource),
            },
        };
        let spec = self.hints.spec(source, &peer_state.transport)?;
        let block_bytes = spec.block_bytes().min(peer_state.max_block);
        let local_len = request.local.len;
        let total = match &mut request.segments {
            Segments::One(segment) => {
                super::request::check_all(std::slice::from_ref(segment), local_len, remote.len)?;
                segment.len
            }
            Segments::Many(segments) => super::request::validate_segments(segments, local_len, remote.len)?,
        };
        if self.free.is_empty() {
            return Err(RequestError::Full { max_transfers: self.max_transfers() });
        }
        Ok(Admitted { peer, total, block_bytes })
    }

    /// Takes an admitted request into a free slot and queues it. The driver holds its source
    /// on every lane of the peer until an [`Event::Unhold`] says otherwise.
    pub(crate) fn queue(
        &mut self,
        admitted: Admitted,
        request: TransferRequest,
        deadline: Instant,
        now: Instant,
    ) -> TransferId {
        let index = self.free.pop().expect("admit found a free slot and nothing took it since");
        let slot = &mut self.slots[index as usize];
        let generation = slot.generation + 1;
        *slot = Slot {
            generation,
            phase: Phase::Running,
            peer: admitted.peer,
            local: request.local.id,
            remote: request.remote.id,
            segments: request.segments,
            segment: 0,
            offset: 0,
            block_bytes: admitted.block_bytes,
            notify: request.notify,
            read: request.read,
            deadline,
            total: admitted.total,
            confirmed: 0,
            blocks: 0,
            in_flight: 0,
            cancelled: false,
            lanes_used: 0,
            holds_source: true,
            latency_first: request.class == Class::LatencyFirst,
            queued_at: now,
        };
        self.earliest_deadline = Some(self.earliest_deadline.map_or(deadline, |at| at.min(deadline)));
        let peer = &mut self.peers[admitted.peer as usize];
        match request.class {
            Class::Bulk => peer.bulk.push_back(index),
            Class::LatencyFirst => peer.latency.push_back(index),
        }
        TransferId { slot: index, generation }
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

    /// For a running latency-first transfer, how long its peer's latest took from queue to
    /// end (on average, lately); `None` for bulk, or before any ended.
    pub(crate) fn expected_latency(&self, id: TransferId) -> Option<Duration> {
        let slot = self.slot(id).filter(|slot| slot.running() && slot.latency_first)?;
        self.peers[slot.peer as usize].latency_first_took_ns.map(Duration::from_nanos)
    }

    /// Whether `id` is still running (its waiter may wait for its [`Event::Ended`]).
    pub(crate) fn is_running(&self, id: TransferId) -> bool {
        self.slot(id).is_some_and(Slot::running)
    }

    /// The result of a finished transfer, once: its slot is freed (or freed when its last
    /// posted block retires). `None` while it runs; `Some(Err(Unknown))` for an id not (or no
    /// longer) this engine's.
    pub(crate) fn collect(&mut self, id: TransferId) -> Option<Result<Delivered, TransferError>> {
        let Some(slot) = self.slots.get_mut(id.slot as usize).filter(|slot| slot.generation == id.generation)
        else {
            return Some(Err(TransferError::UnknownTransfer));
        };
        match std::mem::replace(&mut slot.phase, Phase::Collected) {
            Phase::Finished(result) => {
                if slot.in_flight == 0 {
                    self.release(id.slot);
                }
                Some(result)
            }
            Phase::Running => {
                slot.phase = Phase::Running;
                None
            }
            other => {
                slot.phase = other;
                Some(Err(TransferError::UnknownTransfer))
            }
        }
    }

    /// The peer of a running transfer and its lanes that carried a block of it (bit `n`:
    /// lane `n`): the lanes its waiter polls.
    pub(crate) fn lanes_of(&self, id: TransferId) -> Option<(u32, u16)> {
        self.slot(id).filter(|slot| slot.running()).map(|slot| (slot.peer, slot.lanes_used))
    }

    /// Whether `id`'s result was handed out while blocks of it are still in flight (its slot
    /// frees when they retire, which someone must poll for).
    pub(crate) fn holds_blocks(&self, id: TransferId) -> bool {
        self.slot(id).is_some_and(|slot| matches!(slot.phase, Phase::Collected) && slot.in_flight > 0)
    }

    /// Stops posting a transfer's blocks; it ends [`TransferError::Cancelled`] (blocks already
    /// posted still land). `false` if it had already ended.
    pub(crate) fn cancel(&mut self, id: TransferId) -> bool {
        if !self.is_running(id) {
            return false;
        }
        let slot = &mut self.slots[id.slot as usize];
        slot.cancelled = true;
        let (confirmed_bytes, peer) = (slot.confirmed, slot.peer as usize);
        self.end(id.slot, Err(TransferError::Cancelled { confirmed_bytes }));
        let peer = &mut self.peers[peer];
        peer.latency.retain(|index| *index != id.slot);
        peer.bulk.retain(|index| *index != id.slot);
        true
    }

    /// From now on completions and lost lanes are events too ([`Event::Completed`],
    /// [`Event::LaneLost`]), for the engine's subscribers.
    pub(crate) fn observe(&mut self) {
        self.observed = true;
        self.peers.iter_mut().flat_map(|peer| peer.lanes.iter_mut()).for_each(Lane::observe);
    }

    /// The next completion's record, while observed (see [`Completed`]).
    pub(crate) fn poll_completed(&mut self) -> Option<Completed> {
        self.completed.pop_front()
    }

    /// What a subscriber learns of the transfer in `index` that just ended ([`Event::Ended`]):
    /// its peer, bytes, blocks, time since it was queued, class and failure.
    pub(crate) fn ended(&self, index: u32, now: Instant) -> Option<crate::events::TransferEnded> {
        let slot = &self.slots[index as usize];
        let Phase::Finished(result) = &slot.phase else { return None };
        Some(crate::events::TransferEnded {
            peer: super::PeerId(slot.peer),
            bytes: slot.total,
            blocks: slot.blocks,
            took: now.saturating_duration_since(slot.queued_at),
            latency_first: slot.latency_first,
            failed: result.as_ref().err().map(TransferError::kind),
        })
    }

    /// A submitter waits for a free slot: the next slot freed brings an [`Event::Room`] (one
    /// for every submitter waiting then; a later one asks again).
    pub(crate) fn want_room(&mut self) {
        self.room_wanted = true;
    }

    /// Whether [`poll_event`](Self::poll_event) has one to give.
    #[inline]
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty() || !self.completed.is_empty()
    }

    /// The next thing the driver must do, in the order they happened.
    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        let event = self.events.pop_front();
        if event == Some(Event::Room) {
            (self.room_pending, self.room_wanted) = (false, false);
        }
        event
    }

    fn end(&mut self, index: u32, result: Result<Delivered, TransferError>) {
        if self.slots[index as usize].end(result) {
            self.events.push_back(Event::Ended { slot: index });
        }
    }

    /// Frees a slot whose result was collected and whose last block retired.
    fn release(&mut self, index: u32) {
        self.unhold_source(index);
        self.slots[index as usize].phase = Phase::Free;
        self.free.push(index);
        if self.room_wanted && !std::mem::replace(&mut self.room_pending, true) {
            self.events.push_back(Event::Room);
        }
    }

    /// Ends the hold a transfer took on its source at submit (once). While a doorbell of its
    /// peer rings, its blocks may still be on their way into the transport (a lane failed
    /// meanwhile counts them out early): the hold then ends when that doorbell has rung.
    fn unhold_source(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        if std::mem::take(&mut slot.holds_source) {
            let (peer, region) = (slot.peer, slot.local);
            if self.peers[peer as usize].lanes.iter().any(|lane| lane.posting) {
                // At most one a slot: the capacity reserved for them is never outgrown.
                self.deferred_unholds.push((peer, region));
            } else {
                self.events.push_back(Event::Unhold { peer, region });
            }
        }
    }

    /// Ends the holds deferred while `peer`'s doorbells rang, once none rings.
    fn end_deferred_unholds(&mut self, peer: u32) {
        if self.deferred_unholds.is_empty() || self.peers[peer as usize].lanes.iter().any(|lane| lane.posting)
        {
            return;
        }
        let events = &mut self.events;
        self.deferred_unholds.retain(|&(of, region)| {
            if of == peer {
                events.push_back(Event::Unhold { peer, region });
            }
            of != peer
        });
    }

    /// Ends the transfers whose deadline passed and fails the lanes that stalled (their
    /// oldest request unanswered for `lane_stall`: a peer that stalls without closing must not
    /// hold its transfers' slots for ever). Looks once per millisecond at most; whether
    /// anything ended.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> bool {
        if now < self.next_timeout_scan {
            return false;
        }
        self.next_timeout_scan = now + TIMEOUT_SCAN;
        let mut ended = false;
        self.earliest_deadline = None;
        for index in 0..self.slots.len() {
            let slot = &self.slots[index];
            if !slot.running() {
                continue;
            }
            if now >= slot.deadline {
                let error =
                    TransferError::DeadlineExceeded { confirmed_bytes: slot.confirmed, len: slot.total };
                self.end(index as u32, Err(error));
                ended = true;
            } else {
                let deadline = slot.deadline;
                self.earliest_deadline = Some(self.earliest_deadline.map_or(deadline, |at| at.min(deadline)));
            }
        }
        if ended {
            let slots = &self.slots;
            for peer in &mut self.peers {
                peer.latency.retain(|&index| slots[index as usize].running());
                peer.bulk.retain(|&index| slots[index as usize].running());
            }
        }
        for peer in 0..self.peers.len() as u32 {
            for lane in 0..self.peers[peer as usize].lanes.len() as u32 {
                let link = LinkId { peer, lane };
                let state = self.lane(link);
                let waited = now.saturating_duration_since(state.progress_at);
                if state.dead.is_none() && !state.in_flight.is_empty() && waited >= self.lane_stall {
                    let error = TransportError::DeadlineExceeded {
                        what: "a completion on an engine lane",
                        waited_ms: waited.as_millis() as u64,
                    };
                    self.lose_link(link, error);
                    ended = true;
                }
            }
        }
        ended
    }

    /// When [`handle_timeout`](Self::handle_timeout) next has something to end (the earliest
    /// deadline of a running transfer or stall of a busy lane), or a lane waiting on a full
    /// queue tries again (at its own time, not the scan's). Looks at no slot (a scan of
    /// thousands is what `handle_timeout` does once per millisecond): the earliest deadline is
    /// kept as transfers come and scans pass.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        let lanes = || self.peers.iter().flat_map(|peer| &peer.lanes);
        let stalls = lanes().filter(|lane| lane.dead.is_none() && !lane.in_flight.is_empty());
        // Checked: `Duration::MAX` (no stall watch) must not overflow the instant.
        let stalls = stalls.filter_map(|lane| lane.progress_at.checked_add(self.lane_stall));
        let scan = stalls.chain(self.earliest_deadline).min().map(|at| at.max(self.next_timeout_scan));
        lanes().filter_map(Lane::retry_at).chain(scan).min()
    }

    /// Whether some live lane has requests in flight (the driver polls them).
    pub(crate) fn in_flight(&self) -> bool {
        self.peers
            .iter()
            .flat_map(|peer| &peer.lanes)
            .any(|lane| lane.dead.is_none() && !lane.in_flight.is_empty())
    }

    /// Whether some transfer has blocks left to post (queued, fenced, or refused and waiting
    /// to go again).
    pub(crate) fn queued(&self) -> bool {
        self.peers.iter().any(Peer::queued)
    }

    /// [`queued`](Self::queued) for one peer (a submit's: the others' were the driver's
    /// already).
    pub(crate) fn peer_queued(&self, peer: u32) -> bool {
        self.peers.get(peer as usize).is_some_and(Peer::queued)
    }

    /// Whether `link` is live and has requests in flight (the driver polls it, or sleeps on
    /// it).
    pub(crate) fn has_in_flight(&self, link: LinkId) -> bool {
        let lane = self.lane(link);
        lane.dead.is_none() && !lane.in_flight.is_empty()
    }

    pub(crate) fn lane_stats(&self, peer: u32) -> Option<Vec<LaneStats>> {
        let peer = self.peers.get(peer as usize)?;
        let stats = peer.lanes.iter().map(|lane| LaneStats {
            posted_bytes: lane.posted_bytes,
            posted_wrs: lane.posted_wrs,
            outstanding_bytes: lane.outstanding_bytes,
            failed: lane.dead.clone(),
        });
        Some(stats.collect())
    }

    /// Ends every running transfer and every hold (the engine is going away): nothing is
    /// posted or retired after this; the transports' own in-flight checks guard what is
    /// still posted.
    pub(crate) fn stop_all(&mut self) {
        self.stopping = true;
        for index in 0..self.slots.len() as u32 {
            let slot = &self.slots[index as usize];
            if slot.running() {
                let confirmed_bytes = slot.confirmed;
                self.end(index, Err(TransferError::Cancelled { confirmed_bytes }));
            }
            let slot = &mut self.slots[index as usize];
            if std::mem::take(&mut slot.holds_source) {
                self.events.push_back(Event::Unhold { peer: slot.peer, region: slot.local });
            }
        }
        for (peer, region) in self.deferred_unholds.drain(..) {
            self.events.push_back(Event::Unhold { peer, region });
        }
        if !std::mem::replace(&mut self.room_pending, true) {
            self.events.push_back(Event::Room);
        }
        for peer in &mut self.peers {
            peer.latency.clear();
            peer.bulk.clear();
        }
    }
}
