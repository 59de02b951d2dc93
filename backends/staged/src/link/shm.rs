//! The shm channel's side of a link: the two rings, the writes and reads the posting thread
//! moves itself, and the announcements taken off our ring (by the application's waits, or by
//! the ring thread while they do not look).

use super::sender::write_frame;
use super::*;

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

    pub(super) fn inbound(&self) -> RingView<'_> {
        Rings::view(&self.inbound)
    }

    fn outbound(&self) -> RingView<'_> {
        Rings::view(&self.outbound)
    }
}

impl Shared {
    /// Publishes `frame` on the peer's ring, waiting for room until `patience` passes (then
    /// `Ok(false)`), the link breaks, or the peer breaks the ring.
    pub(super) fn announce(&self, frame: &Frame, patience: Instant) -> Result<bool, String> {
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
}

impl Link {
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
        remote: &RemoteView<'_>,
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
            let (_, notify_each_write) = Link::mapped(remote, op.remote)?;
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
                let (target, notify_each_write) = Link::mapped(remote, op.remote)?;
                for piece in request.pieces() {
                    let source = regions.get(piece.local)?.memory.host();
                    let Some(source) = source else {
                        return Err(TransportError::UnregisteredRegion(piece.local));
                    };
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
                    shared.complete(done).map_err(|reason| self.break_with(reason))?;
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
        remote: &RemoteView<'_>,
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
                let (source, _) = Link::mapped(remote, op.remote)?;
                let local = &regions.get(op.local)?.memory;
                let target = local.host().ok_or(TransportError::UnsupportedMemory { kind: local.kind() })?;
                source.copy_to(op.remote_offset, target, op.local_offset, op.len, None)?;
                copied += op.len;
                if op.signalled {
                    let done = Completion { wr_id: op.wr_id, status: CompletionStatus::Success };
                    shared.complete(done).map_err(|reason| self.break_with(reason))?;
                }
            }
            Ok(())
        })();
        shared.local.copies().in_transit(copied);
        moved?;
        Ok(true)
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

/// The announcement of a write already placed in the peer's mapping.
pub(super) fn announcement(op: &WriteOp) -> Frame {
    let frame = write_frame(op);
    Frame { flags: frame.flags | FLAG_PLACED, ..frame }
}

/// Applies an announcement taken off our ring (its bytes are in place, or in the bounce in
/// front of the region, copied on here); returns its arrival.
// Inlined into the takes: its result came back through memory and stalled every slot.
#[inline(always)]
fn land_announced(shared: &Shared, write: Inbound) -> Result<Option<Arrival>, String> {
    let Inbound::Write { region, offset, len, arrival, .. } = write else {
        return Err("protocol error: a ring slot that is not a write".into());
    };
    if shared.bounced.get(region as usize).is_some_and(|bounced| bounced.load(Ordering::Acquire)) {
        with_target(shared, region, |target| copy_on_from_bounce(shared, target, offset, len))?;
    } else if shared.running.load(Ordering::Acquire) == 0 {
        // The targets are let go once every link thread has ended: the region may be released.
        // As the targets' lock did, this refuses only what comes after that end; no byte of the
        // region is touched on this path either way.
        return Err(format!("region {region} vanished"));
    }
    Ok(arrival.map(|imm| Arrival { imm, region: RegionId(region), len }))
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

impl Shared {
    /// shm: takes up to `max` announcements on our ring now (landing each, queueing its
    /// arrival), with the consumer's lock held for the ring thread's loop (`None` on TCP, which
    /// has no ring).
    fn take_ring_locked(&self, max: usize) -> Option<(MutexGuard<'_, Consumer>, Result<usize, String>)> {
        let rings = self.rings.as_ref()?;
        let mut consumer = rings.consumer.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = ring::take(&mut consumer, &rings.inbound(), &self.inbox, max, |write| {
            match land_announced(self, write)? {
                Some(arrival) => self.arrivals.try_send(arrival).map_err(|_| {
                    "arrival queue overflow: the application is not draining arrivals".to_string()
                }),
                None => Ok(()),
            }
        });
        rings.taken.store(consumer.taken(), Ordering::Release);
        Some((consumer, taken))
    }

    /// shm: takes up to `max` announcements on our ring now (see [`Shared::take_ring_locked`]);
    /// how many. TCP: nothing to take.
    pub(super) fn take_ring(&self, max: usize) -> Result<usize, String> {
        match self.take_ring_locked(max) {
            Some((_, taken)) => taken,
            None => Ok(0),
        }
    }

    /// shm: returns once no take of our ring is under way (one that admitted a slot has landed
    /// it).
    pub(super) fn wait_for_takes(&self) {
        if let Some(rings) = &self.rings {
            drop(rings.consumer.lock().unwrap_or_else(PoisonError::into_inner));
        }
    }
}

/// Takes announcements off our ring while the application does not; sleeps on the ring's
/// futex (`Adaptive`) or looks every [`RING_TICK`] (`BusyPoll`, where writers never wake it).
pub(super) fn ring_loop(shared: &Shared) {
    let Some(rings) = &shared.rings else { return };
    let inbound = rings.inbound();
    loop {
        let stopping = shared.lane.gone.is_gone();
        let Some((consumer, taken)) = shared.take_ring_locked(usize::MAX) else { return };
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

/// The shm channel's socket carries only control frames after the handshake: takes them in and
/// acts on the peer's requests until the peer leaves (its goodbye, its end, or a frame that
/// breaks the control protocol) or the link breaks; returns why.
pub(super) fn watch_control(shared: &Shared) -> String {
    let control = &shared.control;
    let Some(socket) = control.stream() else { return "the shm channel has no socket".into() };
    loop {
        if let Some(reason) = shared.lane.gone.why() {
            return reason.to_string();
        }
        if control.has_requests() {
            // Requests left unserved (withdrawals wait on ops in flight): the socket is not
            // read further meanwhile, so it would stay readable.
            std::thread::park_timeout(RING_TICK);
        } else {
            // Wakes for bytes, the peer's end, or this side's shutdown of the socket.
            readable(socket, RING_NAP);
        }
        if let Some(loss) = control.peer_left() {
            return super::exposing::link_ended(loss);
        }
        shared.serve_requests();
    }
}
