//! The sender thread: takes posted ops off the link's queue and moves them (a frame and its
//! payload over TCP, a copy into the peer's mapping over shm), and sends what the reader owes
//! the peer (acks, read answers) in the order it came in.

use super::shm::announcement;
use super::*;

/// What the reader hands the sender thread, in arrival order: the acks owed to write (and the
/// arrival to publish once they are on the wire), or an arrival alone.
pub(super) enum Outgoing {
    Acks {
        then: Option<Arrival>,
    },
    Arrival(Arrival),
    /// The answer to the peer's read: its header, then `len` bytes at `offset` of our exposed
    /// `region`.
    Answer {
        region: u32,
        offset: u64,
        len: u64,
        answer: Frame,
    },
    /// A control frame (a region exposed or withdrawn, an answer): taken in after whatever
    /// came before it was delivered, so a withdrawal's answer lets the region go only once the
    /// answers to reads of it queued before have gone out.
    Control(Vec<u8>),
}

/// Writes the acks owed before publishing the arrival they precede: an application that exits
/// as soon as it sees the arrival must not strand the writer's completions.
pub(super) fn deliver(shared: &Shared, outgoing: Outgoing, staging: &mut Staging) -> Result<(), String> {
    let arrival = match outgoing {
        Outgoing::Acks { then } => {
            // Cleared first: acks owed after this look queue another flush.
            shared.acks_flush_queued.store(false, Ordering::Release);
            shared.send_owed_acks().map_err(|e| format!("sending an ack: {e}"))?;
            then
        }
        Outgoing::Arrival(arrival) => Some(arrival),
        Outgoing::Answer { region, offset, len, answer } => {
            let writer = shared.writer.lock().unwrap_or_else(PoisonError::into_inner);
            with_target(shared, region, |target| {
                (&*writer)
                    .write_all(&answer.encode())
                    .and_then(|()| target.memory.over_socket(Direction::Send, offset, len, &writer, staging))
                    .map_err(|e| format!("answering a read: {e}"))
            })?;
            None
        }
        Outgoing::Control(bytes) => {
            shared.take_control(&bytes)?;
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

pub(super) fn send_loop(
    shared: &Shared,
    ops: &Receiver<Request>,
    acks: &Receiver<Outgoing>,
    reader_gone: &Receiver<()>,
) {
    let mut staging = Staging::default();
    // Ops this thread finished with (published as the lane's `retired` once settled).
    let mut finished = 0u64;
    loop {
        // Nothing more to post: let queued GPU copies land rather than leave them in flight
        // while the link waits (a source may be deregistered next).
        if ops.is_empty() && staging.unsettled() {
            let settled = (staging.settle())
                .map_err(|e| format!("copying GPU memory to the peer: {e}"))
                .and_then(|()| retire(shared, &mut staging, finished));
            if let Err(reason) = settled {
                shared.fail(reason);
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
            shared.session().unreserve_reads(1);
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
        finished += 1;
        if let Some((reason, flush_it)) = failed {
            shared.fail(reason);
            if flush_it {
                flush(&op, &shared.completions);
            }
            break;
        }
        if let Err(reason) = retire(shared, &mut staging, finished) {
            shared.fail(reason);
            break;
        }
    }
    // The link is down: every queued signalled op completes with a flush error, and writes
    // that fully landed before it still announce themselves.
    while let Ok(op) = ops.try_recv() {
        shared.lane.in_flight.fetch_sub(1, Ordering::AcqRel);
        if op.is_read() {
            shared.session().unreserve_reads(1);
        }
        flush(&op, &shared.completions);
    }
    while let Ok(outgoing) = acks.try_recv() {
        if let Outgoing::Acks { then: Some(arrival) } | Outgoing::Arrival(arrival) = outgoing {
            let _ = shared.arrivals.try_send(arrival);
        }
    }
}

/// Publishes the `finished` ops as the lane's retired ones once nothing of theirs may still be
/// landing (while a peer's withdrawal waits, copies are settled first), answers the withdrawals
/// that passes, and lets go of the peer's mappings that nothing holds any more.
fn retire(shared: &Shared, staging: &mut Staging, finished: u64) -> Result<(), String> {
    let settle_error = |e: TransportError| format!("copying to the peer: {e}");
    if !shared.withdrawals.is_empty() && staging.unsettled() {
        staging.settle().map_err(settle_error)?;
    }
    if staging.unsettled() {
        return Ok(());
    }
    shared.lane.retired.store(finished, Ordering::Release);
    shared.answer_withdrawals();
    staging.release_withdrawn().map_err(settle_error)
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
        shared.session().retract_write(op.wr_id)
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
        return read_one(shared, request);
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
            // Recorded under the writer, as a poster sending its own batch records: the order
            // writes are awaited in is the order they leave in (a peer's acks are matched to it).
            let mut writer = shared.writer.lock().unwrap_or_else(PoisonError::into_inner);
            if op.signalled {
                frame.flags |= FLAG_SIGNALLED;
                // Recorded before the frame leaves, so its ack cannot overtake it. Not waiting
                // once the reader ended: the sender flushes it.
                shared.session().sent_write(op.wr_id, Instant::now()).map_err(|_| "link already broken")?;
            }
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
            let (target, notify_each_write) =
                request.target().ok_or_else(|| format!("remote region {:?} is not mapped", op.remote))?;
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
fn read_one(shared: &Shared, request: &Request) -> Result<Sent, String> {
    let op = &request.head();
    let local =
        local(&shared.local, op.local).ok_or_else(|| format!("local region {:?} vanished", op.local))?;
    match shared.channel {
        ChannelKind::Shm => {
            let (mapping, _) =
                request.target().ok_or_else(|| format!("remote region {:?} is not mapped", op.remote))?;
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
            shared
                .session()
                .asked_read(read, Instant::now())
                .map_err(|_| "link already broken".to_string())?;
            // From here the read is the reader's: a failed request ends the link, and the
            // reader's end flushes it (once).
            if let Err(e) = shared.send_frame(&request_frame(op)) {
                shared.fail(format!("asking for a read: {e}"));
            }
            Ok(Sent::Asked)
        }
    }
}

/// The header of `op` (a TCP frame's, whose payload follows).
pub(super) fn write_frame(op: &WriteOp) -> Frame {
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
