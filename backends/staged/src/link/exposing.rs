//! Regions exposed and withdrawn after connect, over the link's control channel (its own socket
//! on shm, `Control` frames on the TCP socket): what the peer asks of this link (load a region,
//! mapping its memfd on shm; stop posting to one and answer once the ops queued toward it have
//! left), and what this side opens to the peer and closes again once the peer is done.

use super::*;
use crate::handoff;
use crate::socket::send_now;
use crate::wire::REGION_NOTIFY_EACH_WRITE;
use rdma_hint_oob::{Control, PeerLoss, Refusal, RegionDescriptor, MAX_OUTSTANDING};
use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::TryLockError;

/// How long an answer to the peer may wait for room on the shm channel's socket: the peer
/// reads it (it awaits the answer), so a full buffer this long is a peer that stopped.
const SHM_ANSWER_PATIENCE: Duration = Duration::from_millis(100);
/// TCP: answers go out from the sender thread between writes, which wait as long for room (the
/// socket's send timeout); an answer cut short would end the link.
const TCP_ANSWER_PATIENCE: Duration = Duration::from_secs(30);
/// How long an `Expose` waits for its memfd on the hand-off socket: the peer sent it before
/// the `Expose`, so it is there unless the peer broke the protocol (a peer that sends `Expose`s
/// without memfds costs the thread that serves it this much each, and is refused each).
const MEMFD_PATIENCE: Duration = Duration::from_millis(100);
/// The peer's memfds kept while nobody asked for them yet (an expose of the peer's that failed
/// after its memfd went leaves one that nobody ever asks for), at most.
const MAX_UNCLAIMED: usize = 8;
/// Announcements a withdrawal takes off the ring between looks at its deadline.
const CLOSING_TAKE: usize = 64;
/// How long a carried control frame waits between tries for the socket's writer.
const CARRY_RETRY: Duration = Duration::from_micros(200);

/// shm: the hand-off socket after connect. Each side sends the memfd of a region it exposes on
/// it before the region's `Expose`, whose key is the memfd's inode; the other side takes the
/// memfd of that inode when the `Expose` comes, so one memfd that is never asked for (its
/// expose failed after it went) throws no later expose off.
pub(super) struct Handoff {
    stream: UnixStream,
    sending: Mutex<()>,
    /// The peer's memfds taken off the socket and not asked for yet, by inode, oldest first.
    unclaimed: Mutex<VecDeque<(u64, OwnedFd)>>,
}

impl Handoff {
    pub(super) fn new(stream: UnixStream) -> Handoff {
        Handoff { stream, sending: Mutex::default(), unclaimed: Mutex::default() }
    }

    /// Sends `memfd` (a region's) by `deadline`; returns its inode, the `Expose`'s key.
    fn send(&self, memfd: BorrowedFd<'_>, deadline: Instant) -> Result<u64, TransportError> {
        let inode = inode(memfd)?;
        let _sending = self.sending.lock().unwrap_or_else(PoisonError::into_inner);
        handoff::send(&self.stream, &[memfd], deadline)?;
        Ok(inode)
    }

    /// The peer's memfd of `inode`: one taken off the socket before, or the next ones until it
    /// comes (by `deadline`). `None` when it does not come.
    fn take(&self, inode: u64, deadline: Instant) -> Option<OwnedFd> {
        let mut unclaimed = self.unclaimed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = unclaimed.iter().position(|(kept, _)| *kept == inode) {
            return unclaimed.remove(at).map(|(_, memfd)| memfd);
        }
        loop {
            let memfd = handoff::receive(&self.stream, 1, deadline).ok()?.pop()?;
            // Only a memfd is looked at further: a sealable file's seals are read without the
            // file's filesystem, where a `fstat` could wait on a peer's own (FUSE) daemon.
            if !sealable(memfd.as_fd()) {
                continue;
            }
            let found = self::inode(memfd.as_fd()).ok()?;
            if found == inode {
                return Some(memfd);
            }
            if unclaimed.len() == MAX_UNCLAIMED {
                unclaimed.pop_front();
            }
            unclaimed.push_back((found, memfd));
        }
    }
}

/// Whether `fd` is a file that takes seals (a memfd).
fn sealable(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: F_GET_SEALS on a descriptor the caller holds open; no pointers.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) >= 0 }
}

/// The inode of the file behind `fd`.
fn inode(fd: BorrowedFd<'_>) -> Result<u64, TransportError> {
    Ok(File::from(fd.try_clone_to_owned()?).metadata()?.ino())
}

/// Why the link ends when its control channel found the peer gone: a breach of the protocol
/// reads as one (the link logs it as such); a goodbye or a closed socket as the peer leaving.
pub(super) fn link_ended(loss: PeerLoss) -> String {
    if loss.stopped {
        loss.why
    } else {
        format!("protocol error: {}", loss.why)
    }
}

/// TCP: carries one control frame on the link's socket, whole, in a `Control` frame, by
/// `deadline`: the writer is taken (a send that holds it keeps this waiting), then the frame goes
/// as the socket's buffer takes it. A frame cut short by the deadline would garble every frame
/// after it: the socket is then shut down (the link ends).
pub(super) fn carry(
    writer: &Mutex<TcpStream>,
    bytes: &[u8],
    deadline: Instant,
) -> Result<(), TransportError> {
    let mut frame = Vec::with_capacity(HEADER_BYTES + bytes.len());
    frame.extend_from_slice(&Frame::control(bytes.len() as u64).encode());
    frame.extend_from_slice(bytes);
    let writer = loop {
        match writer.try_lock() {
            Ok(writer) => break writer,
            Err(TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
            Err(TryLockError::WouldBlock) if Instant::now() >= deadline => {
                return Err(TransportError::DeadlineExceeded { what: "the link's socket", waited_ms: 0 })
            }
            Err(TryLockError::WouldBlock) => std::thread::sleep(CARRY_RETRY),
        }
    };
    let out_of_time = || TransportError::DeadlineExceeded { what: "room on the link's socket", waited_ms: 0 };
    let mut rest = &frame[..];
    // Once a frame has started it is finished within the socket's own bound (the peer reads its
    // socket, or the link ends), whatever the caller's deadline: a short deadline must not end
    // a link that is only busy.
    let mut deadline = deadline;
    while !rest.is_empty() {
        match send_now(&writer, rest) {
            Ok(0) if Instant::now() < deadline => std::thread::sleep(CARRY_RETRY),
            Ok(0) if rest.len() == frame.len() => return Err(out_of_time()),
            Ok(0) => {
                let _ = writer.shutdown(Shutdown::Both);
                let why = "a control frame could not be sent whole in time (the peer stopped reading)";
                return Err(TransportError::PeerGone(why.into()));
            }
            Ok(sent) => {
                if rest.len() == frame.len() {
                    deadline = deadline.max(Instant::now() + TCP_ANSWER_PATIENCE);
                }
                rest = &rest[sent..];
            }
            Err(e) => return Err(TransportError::PeerGone(format!("sending a control frame: {e}"))),
        }
    }
    Ok(())
}

impl Shared {
    /// TCP: takes in a control frame the reader took off the socket and acts on what it asks;
    /// `Err(why)` once the peer is gone (it said goodbye, or broke the protocol).
    pub(super) fn take_control(&self, bytes: &[u8]) -> Result<(), String> {
        if let Some(loss) = self.control.take_in(bytes) {
            return Err(link_ended(loss));
        }
        self.serve_requests();
        Ok(())
    }

    /// Acts on the peer's requests, in order. A peer that keeps withdrawing while its
    /// withdrawals wait is not served further (on TCP its requests then pile up to the
    /// channel's bound, which ends the link).
    pub(super) fn serve_requests(&self) {
        let _serving = self.serving.lock().unwrap_or_else(PoisonError::into_inner);
        while self.withdrawals.len() < MAX_OUTSTANDING && !self.lane.gone.is_gone() {
            let Some(request) = self.control.next_request() else { break };
            match request {
                Control::Expose { seq, descriptor } => {
                    let refused = self.load(&descriptor).err();
                    self.answer(seq, refused);
                }
                Control::Withdraw { seq, id } => self.withdraw_for_peer(seq, id),
                // The channel keeps answers and the goodbye itself.
                Control::Done { .. } | Control::Goodbye => {}
            }
        }
    }

    /// Loads a region the peer exposed (its descriptor checked by the channel's reader); on
    /// shm, its memfd is taken off the hand-off socket and checked as at connect.
    fn load(&self, descriptor: &RegionDescriptor) -> Result<(), Refusal> {
        if descriptor.address != 0 {
            return Err(Refusal::Unreachable);
        }
        let mapped = match (self.channel, &self.handoff) {
            (ChannelKind::Shm, Some(handoff)) => {
                let key = <[u8; 8]>::try_from(&descriptor.key[..]).map_err(|_| Refusal::Unreachable)?;
                let memfd = handoff.take(u64::from_le_bytes(key), Instant::now() + MEMFD_PATIENCE);
                let memfd = memfd.ok_or(Refusal::Unreachable)?;
                let mapping = PeerMapping::check(memfd, descriptor.len).map_err(|error| {
                    tracing::debug!(%error, "staged: the peer's exposed region is refused");
                    Refusal::Unreachable
                })?;
                Some(Arc::new(mapping))
            }
            (ChannelKind::Tcp, _) if descriptor.key.is_empty() => None,
            _ => return Err(Refusal::Unreachable),
        };
        let notify_each_write =
            self.channel == ChannelKind::Shm && descriptor.flags & REGION_NOTIFY_EACH_WRITE != 0;
        let entry = RemoteEntry { len: descriptor.len, mapped, notify_each_write };
        self.remote.load(descriptor.id, entry).map_err(|_| Refusal::Taken)
    }

    /// The peer withdraws region `id` (ask `seq`): posts to it are refused from here on
    /// (withdrawing took the write lock posts hold while they count their ops), and the answer
    /// waits until the sender thread has finished every op queued so far. An ask while a
    /// withdrawal of the region still waits (the peer's first one timed out) is answered with it.
    fn withdraw_for_peer(&self, seq: u32, id: u32) {
        match self.remote.withdraw(id) {
            Some(region) => {
                let mark = self.lane.queued.load(Ordering::Acquire);
                self.withdrawals.wait_for(id, seq, mark, region);
                self.answer_withdrawals();
            }
            None if self.withdrawals.join(id, seq) => self.answer_withdrawals(),
            None if self.withdrawals.waits_for(id) => self.answer(seq, Some(Refusal::Taken)),
            None => self.answer(seq, Some(Refusal::Unknown)),
        }
    }

    /// Answers the peer's withdrawals whose queued ops have all left (on TCP from the sender
    /// thread, so each answer follows those ops on the socket).
    pub(super) fn answer_withdrawals(&self) {
        // Pairs with itself on the other thread: the sender stores `retired`, then looks for
        // withdrawals; the control thread enters a withdrawal, then reads `retired`. A fence
        // between each one's store and load lets at least one of them see the other's.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.withdrawals.is_empty() {
            return;
        }
        let retired = self.lane.retired.load(Ordering::Acquire);
        self.withdrawals.passed(retired, |seqs, _| seqs.iter().for_each(|seq| self.answer(*seq, None)));
    }

    fn answer(&self, seq: u32, refused: Option<Refusal>) {
        let done = Control::Done { seq, refused };
        let patience = match self.channel {
            ChannelKind::Shm => SHM_ANSWER_PATIENCE,
            ChannelKind::Tcp => TCP_ANSWER_PATIENCE,
        };
        if let Err(error) = self.control.send(&done, Instant::now() + patience) {
            tracing::debug!(%error, seq, "staged: the peer's request could not be answered");
            if self.channel == ChannelKind::Tcp {
                // The sender thread waited as long as any write may: a peer that reads nothing
                // for that long has stopped (as a write that times out ends the link).
                self.fail(format!("answering the peer's request: {error}"));
            }
        }
    }
}

impl Link {
    /// The link's control channel.
    pub(crate) fn control(&self) -> &ControlChannel {
        &self.shared.control
    }

    /// Opens region `id` (`entry`, behind its bounce on shm where the peer cannot map it) to
    /// the peer: its memfd crosses the hand-off socket (shm), and the peer's writes and reads
    /// of it are admitted from here on, before its descriptor (returned) leaves.
    pub(crate) fn open_to_peer(
        &self,
        id: RegionId,
        entry: LocalEntry,
        deadline: Instant,
    ) -> Result<RegionDescriptor, TransportError> {
        let shared = &*self.shared;
        let len = entry.memory.len();
        let key = match &shared.handoff {
            Some(handoff) => {
                let memfd =
                    entry.shm_fd().ok_or(TransportError::UnsupportedMemory { kind: entry.memory.kind() })?;
                handoff.send(memfd, deadline)?.to_le_bytes().to_vec()
            }
            None => Vec::new(),
        };
        let bounced = entry.bounce.is_some();
        let index = id.0 as usize;
        let slot = shared.bounced.get(index).ok_or(TransportError::UnregisteredRegion(id))?;
        slot.store(bounced, Ordering::Release);
        {
            let mut targets = shared.targets.write().unwrap_or_else(PoisonError::into_inner);
            let len = targets.len().max(index + 1);
            targets.resize_with(len, || None);
            targets[index] = Some(entry);
        }
        shared.inbox.expose(id.0, len);
        let flags = if bounced { REGION_NOTIFY_EACH_WRITE } else { 0 };
        Ok(RegionDescriptor { id: id.0, len, address: 0, flags, key })
    }

    /// Closes region `id` to the peer, which is done with it (it answered the withdrawal, or
    /// it is gone): what it wrote is taken in first (shm: the announcements on our ring, the
    /// bytes behind a bounce copied on, until `deadline`: a peer that keeps announcing past it
    /// breaks the link; TCP: every frame before the answer was placed, and every read answered,
    /// before the answer reached this side, and the reader refuses the region from the answer
    /// on), then a frame or slot naming the region is refused, a take that admitted one before
    /// has landed it, and the link lets the region go.
    pub(crate) fn close_to_peer(&self, id: RegionId, deadline: Instant) {
        let shared = &*self.shared;
        loop {
            match shared.take_ring(CLOSING_TAKE) {
                Ok(0) => break,
                Ok(_) if Instant::now() < deadline => {}
                Ok(_) => {
                    let why = "protocol error: the peer kept announcing writes past a withdrawal's deadline";
                    shared.fail(why.into());
                    break;
                }
                Err(reason) => {
                    shared.fail(reason);
                    break;
                }
            }
        }
        shared.inbox.withdraw(id.0);
        shared.wait_for_takes();
        let mut targets = shared.targets.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(target) = targets.get_mut(id.0 as usize) {
            *target = None;
        }
        if let Some(bounced) = shared.bounced.get(id.0 as usize) {
            bounced.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An expose whose memfd went but whose `Expose` never did leaves a memfd nobody asks for:
    /// each later `Expose` still takes its own, the strays are kept (as many as may be, the
    /// newest) and the oldest dropped.
    #[test]
    fn an_expose_takes_its_own_memfd_past_strays() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (sender, receiver) = (Handoff::new(ours), Handoff::new(theirs));
        let soon = || Instant::now() + Duration::from_secs(5);
        let memfds: Vec<Memory> = (0..MAX_UNCLAIMED + 2).map(|_| Memory::shared(4096).unwrap()).collect();
        let inodes: Vec<u64> =
            memfds.iter().map(|memory| sender.send(memory.shm_fd().unwrap(), soon()).unwrap()).collect();
        let last = *inodes.last().unwrap();
        let taken = receiver.take(last, soon()).expect("the memfd asked for");
        assert_eq!(inode(taken.as_fd()).unwrap(), last);
        let kept = inodes[inodes.len() - 2];
        assert_eq!(receiver.take(kept, soon()).map(|memfd| inode(memfd.as_fd()).unwrap()), Some(kept));
        let dropped = receiver.take(inodes[0], Instant::now() + Duration::from_millis(50));
        assert!(dropped.is_none(), "the oldest stray was kept past the bound");
    }
}
