//! Doorbells: the scheduler builds one per lane (blocks of its peer's queued transfers), the
//! driver rings it with the lane's transport, and the scheduler records how that went.

use super::lane::{pick_lane, DoorbellOps, Lane, Refused};
use super::slot::{Block, Posted, Slot};
use super::{Class, LinkId, Poster, Scheduler, WARM_WRS};
use rdma_hint_core::{GatherEntry, GatherOp, ReadOp, TransportError, WriteOp};
use std::time::Instant;

/// Work requests for one lane, to be posted with one call (see [`Doorbell::ring`]). Small: its
/// ops live in the lane's [`DoorbellOps`], lent to it while it rings.
pub(crate) struct Doorbell {
    pub(crate) link: LinkId,
    pub(super) first_seq: u64,
    /// Work requests in `ops`.
    count: usize,
    /// Sequence numbers it takes: `count`, or 1 for a refused request posted as its pieces.
    pub(super) requests: u64,
    /// Payload bytes of its requests.
    pub(super) bytes: u64,
    /// The lane's room for the ops (one doorbell per lane rings at a time).
    ops: Box<DoorbellOps>,
    /// Its requests are reads (`ops` hold their fields; no immediate, no gather).
    reads: bool,
    /// When it was built: a lane whose transport answers it `QueueFull` waits from then.
    pub(super) built_at: Instant,
}

/// What the transport is handed: plain writes, gather writes where a request packs several
/// ranges, or reads.
pub(crate) enum Ring<'a> {
    Writes(&'a [WriteOp]),
    Gathers(&'a [GatherOp], &'a [GatherEntry]),
    Reads(&'a [ReadOp]),
}

impl Doorbell {
    /// Payload bytes of its requests.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Requests it posts, as their completions count them (a refused request posted again as
    /// its pieces is one).
    pub(crate) fn requests(&self) -> u32 {
        self.requests as u32
    }

    /// Its requests are reads.
    pub(crate) fn reads(&self) -> bool {
        self.reads
    }

    /// The call to make: plain writes, or the gather or read forms written into the lane's room.
    pub(crate) fn ring(&mut self) -> Ring<'_> {
        let count = self.count;
        let room = &mut *self.ops;
        let ops = &room.writes[..count];
        if self.reads {
            for (read, op) in room.reads.iter_mut().zip(ops) {
                *read = op.as_read();
            }
            return Ring::Reads(&room.reads[..count]);
        }
        if room.pieces[..count].iter().all(|pieces| *pieces == 1) {
            return Ring::Writes(ops);
        }
        let mut first = 0;
        for (index, op) in ops.iter().enumerate() {
            room.gathers[index] = gather_op(op, first, room.pieces[index]);
            first += room.pieces[index];
        }
        Ring::Gathers(&room.gathers[..count], &room.entries)
    }
}

impl Doorbell {
    /// An empty doorbell for `link`, in its lane's room for ops (`None` while another of the
    /// lane's rings): its numbers start at the lane's next.
    fn open(link: LinkId, lane: &mut Lane, reads: bool, now: Instant) -> Option<Doorbell> {
        let mut ops = lane.doorbell_ops.take()?;
        ops.entries.clear();
        let first_seq = lane.next_seq;
        Some(Doorbell { link, first_seq, count: 0, requests: 0, bytes: 0, ops, reads, built_at: now })
    }

    /// Posts its requests on `transport` with one call (the lane's: the driver's or a
    /// chunker's).
    pub(crate) fn post_on<T: rdma_hint_core::Transport + ?Sized>(
        &mut self,
        transport: &T,
    ) -> Result<(), TransportError> {
        match self.ring() {
            Ring::Writes(ops) => transport.post_writes(ops),
            Ring::Gathers(ops, entries) => transport.post_gather_writes(ops, entries),
            Ring::Reads(ops) => transport.post_reads(ops),
        }
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

/// Which queues a doorbell takes blocks from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Classes {
    Both,
    /// The control lane: latency-first transfers only.
    Latency,
    /// A lane beside a control lane: bulk only.
    Bulk,
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

/// Records `block` of slot `index` as the doorbell's request `count` on `lane` (signalled
/// if it is its transfer's last; `seal` marks the rest of the signalled ones).
#[inline]
fn put_block(
    doorbell: &mut Doorbell,
    lane: &mut Lane,
    lane_index: usize,
    slot: &mut Slot,
    index: u32,
    block: &Block,
    count: usize,
) {
    let seq = lane.next_seq + count as u64;
    doorbell.ops.writes[count] = WriteOp {
        wr_id: seq,
        local: slot.local,
        local_offset: block.local_offset,
        remote: slot.remote,
        remote_offset: block.remote_offset,
        len: block.len,
        signalled: block.last,
        imm: if block.last { slot.notify } else { None },
    };
    lane.in_flight.push_back(Posted { seq, slot: index, generation: slot.generation, bytes: block.len });
    doorbell.ops.pieces[count] = block.pieces;
    slot.lanes_used |= 1u16 << lane_index;
    lane.note_block(block.len);
    slot.advance(block);
    doorbell.bytes += block.len;
}

/// Closes a doorbell of `count` requests built on `lane`: every `signal_every`-th request and
/// the last ask for a completion, and the doorbell takes its numbers and bytes from the lane,
/// which rings no other until it is finished.
fn seal(doorbell: &mut Doorbell, lane: &mut Lane, count: usize) {
    let ops = &mut doorbell.ops.writes[..count];
    let every = lane.signal_every as usize;
    let mut signalled = every - 1;
    while signalled < count {
        ops[signalled].signalled = true;
        signalled += every;
    }
    ops[count - 1].signalled = true;
    (doorbell.count, doorbell.requests) = (count, count as u64);
    lane.next_seq += count as u64;
    lane.outstanding_bytes += doorbell.bytes;
    lane.posting = true;
}

/// Whether the transfer's announcing block may have to wait for its blocks on other lanes
/// (see `build_doorbell`): its run of whole blocks then leaves the last one to the full checks.
fn fenced_at_end(slot: &Slot, lane_index: usize) -> bool {
    slot.notify.is_some() && slot.lanes_used & !(1u16 << lane_index) != 0
}

impl Scheduler {
    /// The driver's doorbell: the peers take turns, one doorbell per call.
    pub(crate) fn next_doorbell(&mut self, now: Instant) -> Option<Doorbell> {
        let peers = self.peers.len();
        for step in 0..peers {
            let peer = (self.next_peer + step) % peers;
            if let Some(doorbell) = self.next_doorbell_for(peer as u32, Poster::Driver, now) {
                self.next_peer = (peer + 1) % peers;
                return Some(doorbell);
            }
        }
        None
    }

    /// A doorbell of `peer`'s queued transfers, one block per transfer (latency class first),
    /// on the live lane with the fewest outstanding bytes; a request refused earlier goes
    /// first, alone. The lanes take turns by their outstanding bytes, and a doorbell at a time
    /// lets a transfer submitted meanwhile (whose block then goes next) not wait for a whole
    /// window of copies (the staged shm channel copies inside `post_writes`).
    pub(crate) fn next_doorbell_for(
        &mut self,
        peer_index: u32,
        poster: Poster,
        now: Instant,
    ) -> Option<Doorbell> {
        let peer = self.peers.get(peer_index as usize)?;
        if let Some(lane) = peer.lanes.iter().position(|lane| lane.retry_ready(now)) {
            // A refused request goes first, alone, from the driver: a caller would post
            // someone else's request (bulk, perhaps) before its own submit returned.
            if poster != Poster::Driver {
                return None;
            }
            let retry = self.build_retry(LinkId { peer: peer_index, lane: lane as u32 }, now);
            if retry.is_some() {
                return retry;
            }
            // Every request waiting there belonged to a transfer that ended: new blocks go.
        }
        let peer = &self.peers[peer_index as usize];
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
        // A latency-first submit rings latency-first blocks only: a bulk block on its doorbell
        // would be posted (on the staged shm channel, copied) by its caller before the submit
        // returned. The driver, which the submit wakes, posts the bulk.
        let latency_caller = poster == Poster::Caller(Class::LatencyFirst);
        let mut choices = [None, None];
        match control {
            Some(last) => {
                let latency = (!peer.latency.is_empty() && peer.lanes[last].available())
                    .then_some((last, Classes::Latency));
                let bulk = (!peer.bulk.is_empty() && !latency_caller)
                    .then(|| pick_lane(&peer.lanes[..last], peer.last_lane))
                    .flatten()
                    .map(|lane| (lane, Classes::Bulk));
                choices = if peer.bulk_next { [bulk, latency] } else { [latency, bulk] };
            }
            None => {
                let classes = if latency_caller { Classes::Latency } else { Classes::Both };
                choices[0] = pick_lane(&peer.lanes, peer.last_lane).map(|lane| (lane, classes));
            }
        }
        for (lane_index, classes) in choices.into_iter().flatten() {
            // A lane's first doorbells are left to the driver thread: they may cost
            // milliseconds the caller's thread should not spend (the staged shm channel maps
            // the peer's region at its first write into it).
            let peer = &self.peers[peer_index as usize];
            if poster != Poster::Driver && peer.lanes[lane_index].posted_wrs < WARM_WRS {
                continue;
            }
            let link = LinkId { peer: peer_index, lane: lane_index as u32 };
            let lone = if self.lone_path() { self.build_lone(link, classes, now) } else { None };
            #[cfg(test)]
            if let (Some(built), Some(_)) = (&mut self.lone_built, &lone) {
                *built += 1;
            }
            let built = lone.or_else(|| self.build_doorbell(link, classes, now));
            if let Some(doorbell) = built {
                let peer = &mut self.peers[peer_index as usize];
                // The control lane is no turn of the others' round.
                if control != Some(lane_index) {
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

    #[cfg(not(test))]
    fn lone_path(&self) -> bool {
        true
    }

    /// Whether `build_lone` may build (tests compare it with the queues' loop alone).
    #[cfg(test)]
    fn lone_path(&self) -> bool {
        self.lone_built.is_some()
    }

    /// [`build_doorbell`](Self::build_doorbell) for the commonest small case: the queues
    /// `classes` names hold one transfer, one block long, none of it posted yet. It builds
    /// what `build_doorbell` would (the same request, number and counts) without its loop over
    /// the queues, their fences and turns of direction; `None` where the case does not hold.
    /// The link's lane was picked available (alive, with room, no doorbell ringing).
    fn build_lone(&mut self, link: LinkId, classes: Classes, now: Instant) -> Option<Doorbell> {
        let lane_index = link.lane as usize;
        let peer = &mut self.peers[link.peer as usize];
        let (latency, bulk) = (peer.latency.len(), peer.bulk.len());
        let queue = match classes {
            Classes::Both if latency + bulk == 1 => {
                if latency == 1 {
                    &mut peer.latency
                } else {
                    &mut peer.bulk
                }
            }
            Classes::Latency if latency == 1 => &mut peer.latency,
            Classes::Bulk if bulk == 1 => &mut peer.bulk,
            _ => return None,
        };
        let index = *queue.front()?;
        let slot = &mut self.slots[index as usize];
        let lane = &mut peer.lanes[lane_index];
        let turning = lane.switching || (!lane.in_flight.is_empty() && lane.reading != slot.read);
        if turning || slot.blocks != 0 {
            return None;
        }
        let block = slot.next_whole_block().filter(|block| block.last)?;
        let mut doorbell = Doorbell::open(link, lane, slot.read, now)?;
        queue.pop_front();
        lane.wake_up(now);
        lane.reading = slot.read;
        // Its transfer's last block: signalled, and announced if the transfer is.
        put_block(&mut doorbell, lane, lane_index, slot, index, &block, 0);
        seal(&mut doorbell, lane, 1);
        lane.stamp(
            (doorbell.first_seq, doorbell.first_seq + doorbell.requests - 1),
            doorbell.built_at,
            doorbell.bytes,
        );
        Some(doorbell)
    }

    /// A doorbell for `link` of blocks from the queues `classes` names; `None` when none can
    /// go (all fenced, or the queues empty).
    fn build_doorbell(&mut self, link: LinkId, classes: Classes, now: Instant) -> Option<Doorbell> {
        let lane_index = link.lane as usize;
        let peer = &mut self.peers[link.peer as usize];
        let lane = &mut peer.lanes[lane_index];
        if lane.switching && !lane.in_flight.is_empty() {
            return None; // draining before it turns
        }
        let room = (lane.window as usize - lane.in_flight.len()).min(lane.per_post as usize);
        let mut doorbell = Doorbell::open(link, lane, lane.reading, now)?;
        // The lane's direction while it has requests in flight; an empty lane turns to the
        // direction that waited, if a transfer of it still waits, else takes the first block's.
        let mut direction = if lane.in_flight.is_empty() {
            let waited = std::mem::take(&mut lane.switching).then_some(!lane.reading);
            let slots = &self.slots;
            let queued = |reads: &bool| {
                peer.latency.iter().chain(&peer.bulk).any(|&index| slots[index as usize].read == *reads)
            };
            waited.filter(queued)
        } else {
            Some(lane.reading)
        };
        let (mut latency_fenced, mut bulk_fenced) = (0, 0);
        lane.wake_up(now);
        // Bytes in flight are capped (past the first block): whatever is posted on a lane is
        // ahead of every block submitted later, small transfers' included. A doorbell takes
        // half the cap at most (past its first block), so one is in flight while the next is
        // sent: each asks for one completion.
        let half_cap = lane.cap() / 2;
        let mut count = 0;
        while count < room && lane.has_room(doorbell.bytes) && (count == 0 || doorbell.bytes < half_cap) {
            // Latency-first transfers go first, unless every one of them is fenced (below).
            let from_latency = classes != Classes::Bulk && latency_fenced < peer.latency.len();
            if !from_latency && (classes == Classes::Latency || bulk_fenced >= peer.bulk.len()) {
                break;
            }
            let queue = if from_latency { &mut peer.latency } else { &mut peer.bulk };
            let Some(index) = queue.pop_front() else { break };
            let slot = &mut self.slots[index as usize];
            let built = doorbell.ops.entries.len();
            // Reads are not packed: a read lands in one local range.
            let max_pieces = if slot.read { 1 } else { lane.max_pieces };
            let (local, entries) = (slot.local, &mut doorbell.ops.entries);
            let block = slot.next_block(max_pieces, |offset, len| {
                if max_pieces > 1 {
                    entries.push(GatherEntry { local, offset, len });
                }
            });
            let Some(block) = block else { continue };
            let last = block.last;
            // The announcing block waits for the transfer's blocks in flight on other lanes:
            // an arrival vouches only for the writes of its own lane before it. A block of the
            // other direction than the doorbell's waits for a doorbell of its own.
            let elsewhere = slot.lanes_used & !(1u16 << lane_index) != 0;
            let fenced = last && elsewhere && slot.notify.is_some() && slot.in_flight > 0;
            if direction.is_some_and(|reads| reads != slot.read) {
                // The other direction waits: nothing more of this one until the lane turns.
                doorbell.ops.entries.truncate(built);
                queue.push_front(index);
                lane.switching = true;
                break;
            }
            if fenced {
                doorbell.ops.entries.truncate(built);
                queue.push_back(index);
                if from_latency {
                    latency_fenced += 1;
                } else {
                    bulk_fenced += 1;
                }
                continue;
            }
            (direction, doorbell.reads, lane.reading) = (Some(slot.read), slot.read, slot.read);
            put_block(&mut doorbell, lane, lane_index, slot, index, &block, count);
            count += 1;
            // Alone in its peer's queues, the transfer's next blocks would come back to it one
            // queue round trip each: they go in at once while they are plain whole blocks.
            if peer.latency.is_empty() && peer.bulk.is_empty() && !fenced_at_end(slot, lane_index) {
                // The lane has requests in flight now: its room is its cap's.
                let room_bytes = lane.cap().saturating_sub(lane.outstanding_bytes).min(half_cap);
                while count < room && doorbell.bytes < room_bytes {
                    let Some(block) = slot.next_whole_block() else { break };
                    if max_pieces > 1 {
                        doorbell.ops.entries.push(GatherEntry {
                            local,
                            offset: block.local_offset,
                            len: block.len,
                        });
                    }
                    put_block(&mut doorbell, lane, lane_index, slot, index, &block, count);
                    count += 1;
                }
            }
            if !slot.all_posted() {
                let queue = if from_latency { &mut peer.latency } else { &mut peer.bulk };
                queue.push_back(index);
            }
        }
        if count == 0 {
            lane.doorbell_ops = Some(doorbell.ops);
            return None;
        }
        seal(&mut doorbell, lane, count);
        lane.stamp(
            (doorbell.first_seq, doorbell.first_seq + doorbell.requests - 1),
            doorbell.built_at,
            doorbell.bytes,
        );
        Some(doorbell)
    }

    /// A doorbell of the lane's oldest refused request alone, signalled; after the lane
    /// refused gathers it promised, a gathering request goes as its pieces in one plain post
    /// (one sequence number, the last piece signalled). A request whose transfer ended
    /// meanwhile (its deadline, a cancel, another lane lost) is counted out, not posted.
    fn build_retry(&mut self, link: LinkId, now: Instant) -> Option<Doorbell> {
        self.drop_ended_refused(link);
        let lane = self.lane_mut(link);
        // The lane's room first: without it (its doorbell still rings) nothing is taken.
        let refused = *lane.refused.front()?;
        let mut doorbell = Doorbell::open(link, lane, refused.read, now)?;
        lane.refused.pop_front();
        let op = WriteOp { wr_id: lane.next_seq, signalled: true, ..refused.op };
        (doorbell.count, doorbell.requests, doorbell.bytes) = (1, 1, op.len);
        let room = &mut *doorbell.ops;
        (room.writes[0], room.pieces[0]) = (op, 1);
        if refused.pieces > 1 {
            // Kept in the room either way: a refusal of the whole post gives them back.
            room.entries.extend(lane.refused_entries.drain(..refused.pieces as usize));
            if lane.max_pieces > 1 {
                room.pieces[0] = refused.pieces;
            } else {
                for (index, piece) in gather_op(&op, 0, refused.pieces).pieces(&room.entries).enumerate() {
                    (room.writes[index], room.pieces[index]) = (piece, 1);
                }
                doorbell.count = refused.pieces as usize;
            }
        }
        // Time spent waiting on a full queue is no unanswered request's: the stall watch
        // counts from this try, as from any doorbell built on an empty lane.
        lane.wake_up(now);
        lane.in_flight.push_back(Posted { seq: doorbell.first_seq, ..refused.posted });
        lane.retrying = Some(refused);
        lane.reading = refused.read;
        lane.next_seq += 1;
        lane.outstanding_bytes += doorbell.bytes;
        lane.posting = true;
        lane.stamp(
            (doorbell.first_seq, doorbell.first_seq + doorbell.requests - 1),
            doorbell.built_at,
            doorbell.bytes,
        );
        Some(doorbell)
    }

    /// Counts out the refused requests at the front of `link`'s lane whose transfers ended.
    fn drop_ended_refused(&mut self, link: LinkId) {
        loop {
            let lane = &mut self.peers[link.peer as usize].lanes[link.lane as usize];
            let Some(refused) = lane.refused.front().copied() else { return };
            let slot = &self.slots[refused.posted.slot as usize];
            if slot.generation == refused.posted.generation && slot.running() {
                return;
            }
            lane.refused.pop_front();
            if refused.pieces > 1 {
                lane.refused_entries.drain(..refused.pieces as usize);
            }
            self.retire_block(Posted { bytes: 0, ..refused.posted });
        }
    }

    /// Records how ringing `doorbell` went.
    pub(crate) fn finish_doorbell(&mut self, doorbell: Doorbell, rung: Result<(), TransportError>) {
        let link = doorbell.link;
        let lane = self.lane_mut(link);
        lane.posting = false;
        // Set by a retry's doorbell alone, and one doorbell of a lane rings at a time.
        let retried = lane.retrying.take();
        if lane.dead.is_some() {
            // The lane failed while the doorbell rang (a poll or the stall watch): its
            // requests left the in-flight queue with their transfers, nothing is left to count.
        } else if let Some(refused) = retried {
            self.finish_retry(&doorbell, refused, rung);
        } else {
            match rung {
                Ok(()) => {
                    lane.posted_bytes += doorbell.bytes;
                    lane.posted_wrs += doorbell.requests;
                    lane.took_a_post();
                }
                // No room in the transport's queue (or the peer's) now: nothing was posted,
                // and the requests go again, in order, once the lane has waited.
                Err(TransportError::QueueFull { .. }) => {
                    lane.back_off(doorbell.built_at);
                    take_back(lane, &doorbell);
                }
                // Checked before anything was posted: a bad request (a region deregistered
                // since its submit, say) fails alone and the lane goes on. Nothing of the
                // doorbell reached the transport, so its numbers are handed out again, a
                // request per doorbell.
                Err(error) if refuses_the_ops(&error) => take_back(lane, &doorbell),
                // Nothing of the doorbell counts as posted: its entries leave the queue with
                // the lane's earlier ones, and their transfers fail.
                Err(error) => self.lose_link(link, error),
            }
        }
        self.lane_mut(link).doorbell_ops = Some(doorbell.ops);
        self.end_deferred_unholds(link.peer);
    }

    /// Records how posting a refused request alone went: it fails its own transfer only, or
    /// waits again where the transport had no room for it.
    fn finish_retry(&mut self, doorbell: &Doorbell, refused: Refused, rung: Result<(), TransportError>) {
        let lane = self.lane_mut(doorbell.link);
        let gathered = doorbell.ops.pieces[0] > 1;
        match rung {
            Ok(()) => {
                lane.posted_bytes += doorbell.bytes;
                lane.posted_wrs += 1;
                lane.took_a_post();
            }
            Err(TransportError::QueueFull { .. }) => {
                lane.back_off(doorbell.built_at);
                take_back_retry(lane, doorbell, refused);
            }
            // A transport whose capabilities promise gathers it does not take (a wrapper
            // passing them through, say): the lane stops packing, and the request goes again
            // as its pieces.
            Err(TransportError::TooManyEntries { .. }) if gathered => {
                lane.max_pieces = 1;
                take_back_retry(lane, doorbell, refused);
            }
            Err(error) => {
                let posted = lane.in_flight.pop_back().expect("a retry's request is in flight");
                lane.outstanding_bytes -= doorbell.bytes;
                let slot = &self.slots[posted.slot as usize];
                if slot.generation == posted.generation {
                    let confirmed_bytes = slot.confirmed;
                    self.end(
                        posted.slot,
                        Err(super::TransferError::Transport { source: error, confirmed_bytes }),
                    );
                    let peer = &mut self.peers[doorbell.link.peer as usize];
                    peer.latency.retain(|index| *index != posted.slot);
                    peer.bulk.retain(|index| *index != posted.slot);
                    self.retire_block(Posted { bytes: 0, ..posted });
                }
            }
        }
    }
}

/// Puts a retry's request, which the transport did not take, back at the front of its lane's
/// refused queue, its entries with it, and hands its sequence number out again.
fn take_back_retry(lane: &mut Lane, doorbell: &Doorbell, refused: Refused) {
    lane.unstamp(doorbell.first_seq);
    lane.in_flight.pop_back();
    lane.next_seq -= 1;
    lane.outstanding_bytes -= doorbell.bytes;
    lane.refused.push_front(refused);
    doorbell.ops.entries.iter().rev().for_each(|entry| lane.refused_entries.push_front(*entry));
}

/// Puts the requests of `doorbell`, which the transport refused whole, back on its lane's
/// refused queue in order, and hands their sequence numbers out again.
fn take_back(lane: &mut Lane, doorbell: &Doorbell) {
    lane.unstamp(doorbell.first_seq);
    lane.next_seq = doorbell.first_seq;
    lane.outstanding_bytes -= doorbell.bytes;
    let kept = lane.in_flight.len() - doorbell.count;
    let mut first = 0;
    for (index, posted) in lane.in_flight.drain(kept..).enumerate() {
        let (op, pieces) = (doorbell.ops.writes[index], doorbell.ops.pieces[index]);
        if pieces > 1 {
            let own = &doorbell.ops.entries[first..first + pieces as usize];
            lane.refused_entries.extend(own.iter().copied());
        }
        first += pieces as usize;
        lane.refused.push_back(Refused { op, read: doorbell.reads, pieces, posted });
    }
}
