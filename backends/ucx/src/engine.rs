//! Everything that touches UCP after setup, serialized by one mutex: posting puts and notices,
//! one flush per batch with signalled writes, turning finished flushes into completions, and
//! tearing down.
//!
//! Completion semantics follow RDMA WRITE: a signalled op completes when the flush that follows
//! its batch completes, i.e. when every byte of the batch is in the peer's memory. A write with
//! immediate data is its put, a worker fence, then a 16-byte active message on the same
//! endpoint, all posted at once: UCX completes everything issued before a fence before anything
//! issued after it, so the peer's [`Arrival`] implies its bytes (and all before them) have
//! landed, with no flush round trip before the notice leaves.
//!
//! Where UCX maps every region the peer exposed and the peer's notice ring into this process
//! (shared memory: `ucp_rkey_ptr`, checked by [`crate::mapping`]), a write is a copy by the
//! posting thread into that mapping and a notice is a slot on the peer's ring
//! ([`crate::ring`]): no UCX call, no `process_vm_writev`, and a signalled write completes as
//! its copy ends, when its bytes are in the peer's memory.

mod teardown;

use crate::notices::{encode_notice, Direct, Signals, NOTICE_BYTES};
use crate::region::Region;
use crate::ring;
use crate::status::{completion_code, status_text};
use crate::worker::{Ucp, NOTICE_AM_ID, WAKE_AM_ID};
use rdma_hint_backend_core::gather::Pieces;
use rdma_hint_backend_core::peer_regions::PeerRegions;
use rdma_hint_backend_core::queue::EventSender;
use rdma_hint_backend_core::region_table::RegionLen;
use rdma_hint_backend_core::RegionTable;
use rdma_hint_core::{Arrival, Completion, CompletionStatus, TransportError, MAX_OPS_PER_POST};
use rdma_hint_oob::ControlChannel;
use rdma_hint_stream_copy as stream_copy;
use rdma_hint_ucx_sys as sys;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Local ranges one gather write takes, at most (one put each: UCP RMA has no iov).
pub(crate) const MAX_SGES: u32 = 32;

/// How long a closing lane keeps flushing what it sent before it closes by force (and the
/// peer reads a failure, not a goodbye): a large put over TCP takes its time.
const FINAL_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// A peer region: where to put and with which unpacked rkey, and where UCX mapped it here
/// when the peer's memory is written directly.
#[derive(Debug)]
pub(crate) struct RemoteEntry {
    pub(crate) address: u64,
    pub(crate) len: u64,
    pub(crate) rkey: sys::ucp_rkey_h,
    pub(crate) mapped: Option<*mut u8>,
}

impl RegionLen for RemoteEntry {
    fn region_len(&self) -> u64 {
        self.len
    }
}

/// A withdrawal of the peer's waiting for the flush that ends every put posted before it
/// (see `crate::exposing`).
#[derive(Debug)]
pub(crate) struct Withdrawing {
    /// The region's id on the peer's side.
    pub(crate) id: u32,
    /// The asks to answer: the first, and any the peer made again meanwhile.
    pub(crate) seqs: Vec<u32>,
    /// The flush request, or null when it finished at once.
    pub(crate) request: sys::ucs_status_ptr_t,
    pub(crate) entry: RemoteEntry,
}

/// Which way a batch's bytes go: to the peer, or from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// `ucp_put_nbx`: local to the peer's region.
    Write,
    /// `ucp_get_nbx`: the peer's region to local.
    Read,
}

/// One op of a batch after its check: this side's range and the peer's, and which way the
/// bytes go.
#[derive(Debug, Clone, Copy)]
struct Put {
    /// This side's range: a write's source, a read's destination.
    source: *mut u8,
    memh: sys::ucp_mem_h,
    address: u64,
    rkey: sys::ucp_rkey_h,
    /// Where the peer's range lies in this process (`Direct`), or null.
    target: *mut u8,
    len: u64,
    direction: Direction,
}

/// One posted batch whose flush has not been turned into completions yet.
#[derive(Debug)]
struct Batch {
    /// Flush request handle, or null when the flush finished at once with `status`.
    request: sys::ucs_status_ptr_t,
    status: sys::ucs_status_t,
    /// How many entries of `signalled` (from the front) belong to this batch.
    signalled: u32,
}

/// The UCP side of a connected transport.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) ucp: Ucp,
    pub(crate) ep: sys::ucp_ep_h,
    pub(crate) remote: PeerRegions<RemoteEntry>,
    /// The peer's withdrawals waiting for the flush that ends every put to their region.
    pub(crate) withdrawing: VecDeque<Withdrawing>,
    batches: VecDeque<Batch>,
    signalled: VecDeque<u64>,
    notice_slots: Box<[[u8; NOTICE_BYTES]]>,
    /// Notice sends not finished yet, oldest first: their slots must stay put until then.
    notice_sends: VecDeque<sys::ucs_status_ptr_t>,
    next_slot: usize,
    /// The batch being posted, checked; sized once (`max_wrs_per_post`).
    puts: Vec<Put>,
    completions: EventSender<Completion>,
    capacity: usize,
    posted_any: bool,
    /// Puts posted since the last flush was posted: their requests are freed at once, so only
    /// a flush tells when they stopped reading their source.
    unflushed: usize,
    /// The out-of-band socket: tells a peer's goodbye from a failure, carries the answers to
    /// the peer's requests.
    pub(crate) control: Option<Arc<ControlChannel>>,
    pub(crate) signals: Arc<Signals>,
    /// The peer's memory mapped here, when all of it is.
    pub(crate) direct: Option<Direct>,
    /// The endpoint's forced close did not finish in time: a put it is still purging may name
    /// any of the peer's rkeys, so none is destroyed from then on (the worker's teardown takes
    /// them).
    keys_pinned: bool,
}

// SAFETY: the raw UCP handles (worker in serialized mode, endpoint, rkeys, requests) are only
// used through `&mut Engine`, i.e. under the mutex that owns the engine, one thread at a time.
unsafe impl Send for Engine {}

impl Engine {
    /// An engine for `ucp`, not connected yet. `capacity` bounds signalled ops, batches and
    /// notices in flight; nothing on the posting path allocates beyond it.
    pub(crate) fn new(
        ucp: Ucp,
        completions: EventSender<Completion>,
        capacity: usize,
        signals: Arc<Signals>,
    ) -> Engine {
        Engine {
            ucp,
            ep: std::ptr::null_mut(),
            remote: PeerRegions::default(),
            withdrawing: VecDeque::new(),
            batches: VecDeque::with_capacity(capacity),
            signalled: VecDeque::with_capacity(capacity),
            notice_slots: vec![[0u8; NOTICE_BYTES]; capacity].into_boxed_slice(),
            notice_sends: VecDeque::with_capacity(capacity),
            next_slot: 0,
            puts: Vec::with_capacity(MAX_OPS_PER_POST * MAX_SGES as usize),
            unflushed: 0,
            control: None,
            completions,
            capacity,
            posted_any: false,
            signals,
            direct: None,
            keys_pinned: false,
        }
    }

    /// Whether `connect` already ran.
    pub(crate) fn is_connected(&self) -> bool {
        !self.ep.is_null() || self.signals.gone.is_gone()
    }

    /// Adopts the endpoint and the peer's unpacked regions (and their mappings here).
    pub(crate) fn attach(
        &mut self,
        ep: sys::ucp_ep_h,
        remote: PeerRegions<RemoteEntry>,
        direct: Option<Direct>,
    ) {
        self.ep = ep;
        self.remote = remote;
        self.direct = direct;
    }

    /// Flushes the new endpoint so UCX finishes its wire-up (lane connections) while the
    /// handshake still holds both sides: UCX 1.13 aborts on an assertion when an endpoint
    /// fails with wire-up messages pending, so a peer that dies right after `connect` must
    /// find the wire-up done. Bounded; a flush still running at the bound is left to finish.
    pub(crate) fn complete_wireup(&mut self) -> Result<(), TransportError> {
        if self.ep.is_null() {
            return Ok(());
        }
        let param = sys::ucp_request_param_t::default();
        // SAFETY: `ep` is live (engine lock held); the request is finished and freed by `finish`.
        let request = unsafe { sys::ucp_ep_flush_nbx(self.ep, &param) };
        match self.ucp.finish(request, 200_000) {
            sys::UCS_OK => Ok(()),
            sys::UCS_INPROGRESS => {
                tracing::debug!("ucx: wire-up still running after the handshake's flush");
                Ok(())
            }
            status => Err(TransportError::Handshake(format!("UCX wire-up failed: {}", status_text(status)))),
        }
    }

    /// Unpacks a peer's packed rkey on `ep`.
    pub(crate) fn unpack_rkey(ep: sys::ucp_ep_h, packed: &[u8]) -> Result<sys::ucp_rkey_h, TransportError> {
        let mut rkey: sys::ucp_rkey_h = std::ptr::null_mut();
        // SAFETY: `ep` is live; `packed` is readable for its length. UCX validates the bytes
        // and refuses garbage with an error status.
        let status = unsafe { sys::ucp_ep_rkey_unpack(ep, packed.as_ptr().cast(), &mut rkey) };
        if status != sys::UCS_OK {
            return Err(TransportError::Handshake(format!(
                "the peer's rkey does not unpack: {}",
                status_text(status)
            )));
        }
        Ok(rkey)
    }

    /// Why the connection is gone, if it is.
    pub(crate) fn gone(&self) -> Option<&str> {
        self.signals.gone.why()
    }

    /// Work that still needs progress: flushes or notice sends in flight.
    pub(crate) fn busy(&self) -> bool {
        !self.batches.is_empty() || !self.notice_sends.is_empty() || self.unflushed > 0
    }

    /// Work the progress thread drives: [`busy`](Self::busy), or a withdrawal of the peer's
    /// whose flush has not finished (which keeps no region of this side busy).
    pub(crate) fn needs_progress(&self) -> bool {
        self.busy() || !self.withdrawing.is_empty()
    }

    /// Flushes the endpoint (bounded) so every put posted so far, signalled or not, has left
    /// its source: what deregistering a region needs when only unsignalled puts are pending.
    pub(crate) fn flush_unsignalled(&mut self) -> Result<(), TransportError> {
        if self.unflushed == 0 || !self.batches.is_empty() || !self.notice_sends.is_empty() {
            return Ok(());
        }
        if self.ep.is_null() {
            // Closed (by force): UCX has finished with every request.
            self.unflushed = 0;
            return Ok(());
        }
        let param = sys::ucp_request_param_t::default();
        // SAFETY: `ep` is live (engine lock held); the request is finished and freed by `finish`.
        let request = unsafe { sys::ucp_ep_flush_nbx(self.ep, &param) };
        match self.ucp.finish(request, 100_000) {
            sys::UCS_OK => {
                self.unflushed = 0;
                Ok(())
            }
            // A slow peer (say, one whose worker is not progressing) is not a failed one: the
            // puts stay counted, so the region stays busy, and the next release flushes again.
            sys::UCS_INPROGRESS => Ok(()),
            status => {
                self.fail(format!("flush before deregistering failed: {}", status_text(status)));
                Err(self.signals.gone.error())
            }
        }
    }

    /// Posts every request (each piece checked against both region tables first) as one
    /// `ucp_put_nbx` per piece (UCP RMA takes no iov: openucx/ucx#6912), followed by a fence
    /// and its notice when it carries an immediate, then one flush for the batch if anything in
    /// it is signalled; or, [`Direct`], as copies and ring slots. Returns the bytes this
    /// thread copied.
    pub(crate) fn post(
        &mut self,
        ops: &[impl Pieces],
        direction: Direction,
        locals: &RegionTable<Region>,
        max_msg_bytes: u64,
        queued_completions: usize,
    ) -> Result<u64, TransportError> {
        if let Some(why) = self.signals.gone.why() {
            return Err(TransportError::PeerGone(why.to_string()));
        }
        let signalled = ops.iter().filter(|op| op.head().signalled).count();
        let notices = ops.iter().filter(|op| op.head().imm.is_some()).count();
        let in_flight = self.signalled.len() + queued_completions;
        if in_flight + signalled > self.capacity
            || self.batches.len() >= self.capacity
            || (self.direct.is_none() && self.notice_sends.len() + notices > self.notice_slots.len())
        {
            return Err(TransportError::QueueFull {
                given: ops.len() as u32,
                max: (self.capacity.saturating_sub(in_flight)) as u32,
            });
        }
        // Check (and look up) every op before the first put: a rejected batch moves nothing.
        let Engine { puts, remote: remotes, direct, .. } = self;
        // The engine's lock is the table's: no lock of its own on the posting path.
        let remotes = remotes.view_owned();
        puts.clear();
        for op in ops.iter().flat_map(Pieces::pieces) {
            let remote = remotes.get(op.remote)?;
            let (local, remote) = locals.check_write(&op, Some(remote), max_msg_bytes)?;
            let target = (direct.as_ref().and(remote.mapped))
                .map_or(std::ptr::null_mut(), |base| base.wrapping_add(op.remote_offset as usize));
            // Connect maps all of the peer's regions or answers no `Direct` at all, and a region
            // loaded later is refused unless it is mapped too.
            debug_assert!(direct.is_none() || !target.is_null(), "a direct write without a mapping");
            puts.push(Put {
                source: local.pointer(op.local_offset),
                memh: local.memh,
                address: remote.address + op.remote_offset,
                rkey: remote.rkey,
                target,
                len: op.len,
                direction,
            });
        }
        drop(remotes);
        if self.direct.is_some() {
            return self.post_direct(ops, notices as u64);
        }
        let mut next_put = 0;
        for request in ops {
            let op = request.head();
            for _ in request.pieces() {
                // Copied out: the failure path below needs the engine mutably.
                let put = self.puts[next_put];
                next_put += 1;
                self.put(put)?;
            }
            if op.signalled {
                self.signalled.push_back(op.wr_id);
            }
            if let Some(imm) = op.imm {
                // SAFETY: the worker is live (engine lock held, serialized mode).
                let status = unsafe { sys::ucp_worker_fence(self.ucp.worker) };
                if status != sys::UCS_OK {
                    self.fail(format!("ucp_worker_fence failed: {}", status_text(status)));
                    return Err(self.signals.gone.error());
                }
                self.send_notice(encode_notice(imm, op.remote.0, op.len));
            }
        }
        self.posted_any = true;
        self.unflushed += next_put;
        if signalled > 0 {
            // This flush covers every put before it.
            self.unflushed = 0;
            let param = sys::ucp_request_param_t::default();
            // SAFETY: `ep` is live; the request is tracked in `batches` and freed in `harvest`.
            let request = unsafe { sys::ucp_ep_flush_nbx(self.ep, &param) };
            let status = sys::status_ptr_status(request);
            let request = if sys::status_ptr_is_ptr(request) { request } else { std::ptr::null_mut() };
            self.batches.push_back(Batch { request, status, signalled: signalled as u32 });
        }
        self.ucp.progress();
        self.harvest();
        Ok(0)
    }

    /// [`Engine::post`] of checked ops into the peer's memory mapped here: each piece one copy,
    /// each immediate one slot on the peer's ring (room for all of them checked first, so a
    /// full ring moves nothing), each signalled op completed as its copy ends.
    fn post_direct(&mut self, ops: &[impl Pieces], notices: u64) -> Result<u64, TransportError> {
        let Some(direct) = self.direct.as_mut() else { return Ok(0) };
        match direct.producer.room(&direct.ring.view(), notices).map(|free| free >= notices) {
            Ok(true) => {}
            // The caller tries again later: a post never waits for the peer.
            Ok(false) => return Err(TransportError::QueueFull { given: ops.len() as u32, max: 0 }),
            Err(why) => {
                self.fail(why.clone());
                return Err(TransportError::PeerGone(why));
            }
        }
        let Engine { direct: Some(direct), puts, completions, .. } = self else { return Ok(0) };
        let view = direct.ring.view();
        let mut copied = 0;
        let mut puts = puts.iter();
        // Streamed stores are fenced before anything says the bytes are there (a notice, a
        // completion), and before the post returns.
        for request in ops {
            let op = request.head();
            for put in puts.by_ref().take(request.pieces().count()) {
                // Overlapping addresses would be this side's own region taken for the peer's
                // (the screen refuses those segments): never streamed.
                let overlaps = put.source < put.target.wrapping_add(put.len as usize)
                    && put.target < put.source.wrapping_add(put.len as usize);
                let stream = if overlaps {
                    direct.run.fence();
                    false
                } else {
                    // Reads land in this side's memory: they neither stream nor continue a run.
                    put.direction == Direction::Write && direct.run.streams(put.target as usize, put.len)
                };
                let (from, to) = match put.direction {
                    Direction::Write => (put.source, put.target),
                    // A read lands in this side's memory, which the reader reads next: no
                    // streaming past the cache.
                    Direction::Read => (put.target, put.source),
                };
                // SAFETY: `post` checked this side's range against its registered region
                // (mapped while ops are in flight, and this one ends here) and the peer's against
                // its advertised length, which the screen found inside the System V segment UCX
                // mapped at `target`'s region (attached until its rkey is destroyed, under this
                // engine's lock). The peer may touch those bytes meanwhile, as with any RDMA
                // target or source; the ranges overlap only with `stream` off.
                unsafe { stream_copy::copy(from, to, put.len as usize, stream) };
                copied += put.len;
            }
            if op.imm.is_some() || op.signalled {
                direct.run.fence();
            }
            if let Some(imm) = op.imm {
                ring::publish(&mut direct.producer, &view, &Arrival { imm, region: op.remote, len: op.len });
            }
            if op.signalled {
                // Capacity was reserved by `post`'s check.
                let _ =
                    completions.try_send(Completion { wr_id: op.wr_id, status: CompletionStatus::Success });
            }
        }
        direct.run.fence();
        if notices > 0 && direct.producer.sleeper(&view) {
            self.send_wake();
        }
        Ok(copied)
    }

    /// One `ucp_put_nbx` (a write) or `ucp_get_nbx` (a read) of a piece `post` checked (this
    /// side's range inside its registered region, the peer's inside its advertised length):
    /// only `post` builds `Put`s, and only after the checks. Its completion is the batch's flush.
    fn put(&mut self, put: Put) -> Result<(), TransportError> {
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_MEMH,
            memh: put.memh,
            ..Default::default()
        };
        let (here, len, there) = (put.source, put.len as usize, put.address);
        // SAFETY: the ep and rkey are live (engine lock held); this side's range was
        // bound-checked against the registered region by `post`, and the region stays mapped
        // while ops are in flight (deregister refuses busy regions and flushes unsignalled ones
        // first); the remote range against the peer's advertised length.
        let (request, call) = unsafe {
            match put.direction {
                Direction::Write => {
                    (sys::ucp_put_nbx(self.ep, here.cast(), len, there, put.rkey, &param), "put")
                }
                Direction::Read => {
                    (sys::ucp_get_nbx(self.ep, here.cast(), len, there, put.rkey, &param), "get")
                }
            }
        };
        if sys::status_ptr_is_err(request) {
            let status = sys::status_ptr_status(request);
            self.fail(format!("ucp_{call}_nbx failed: {}", status_text(status)));
            return Err(self.signals.gone.error());
        }
        if sys::status_ptr_is_ptr(request) {
            // Completion is tracked by the batch's flush; UCX releases the request when done.
            // SAFETY: `request` is a live handle returned just now; freed once.
            unsafe { sys::ucp_request_free(request) };
        }
        Ok(())
    }

    /// One progress pass: UCX events, finished flushes, peer failures.
    pub(crate) fn progress(&mut self) {
        if self.ended() {
            return;
        }
        self.ucp.progress_all();
        self.harvest();
    }

    /// One `ucp_worker_progress` and a harvest: a spinning wait's look, which comes back at
    /// once anyway (a second call to find nothing left would double each look's cost).
    pub(crate) fn progress_once(&mut self) {
        if self.ended() {
            return;
        }
        self.ucp.progress();
        self.harvest();
    }

    /// Whether the connection was lost and its endpoint closed: the worker then serves nothing
    /// of this side's, and is not progressed again. UCX 1.13's tcp transport, progressed after
    /// a forced close while the peer's process still sends (a vanished peer's last puts, its
    /// own close), handles events for connections it already freed and jumps through freed
    /// memory (SIGSEGV in `uct_tcp_iface_progress`, 1 run in 10 of the 8 MiB-in-flight test on
    /// a busy machine). The worker's destruction takes what is left.
    fn ended(&self) -> bool {
        self.ep.is_null() && self.signals.gone.is_gone()
    }

    /// Turns finished flushes into completions (in posting order) and frees finished notices.
    fn harvest(&mut self) {
        while let Some(batch) = self.batches.front() {
            let status = if batch.request.is_null() {
                batch.status
            } else {
                // SAFETY: the flush request is live until freed just below.
                unsafe { sys::ucp_request_check_status(batch.request) }
            };
            if status == sys::UCS_INPROGRESS {
                break;
            }
            let Some(batch) = self.batches.pop_front() else { break };
            if !batch.request.is_null() {
                // SAFETY: finished flush request, freed once.
                unsafe { sys::ucp_request_free(batch.request) };
            }
            let outcome = if status == sys::UCS_OK {
                CompletionStatus::Success
            } else {
                CompletionStatus::Failed { code: completion_code(status) }
            };
            for _ in 0..batch.signalled {
                if let Some(wr_id) = self.signalled.pop_front() {
                    // Capacity was reserved at posting time; a full queue is impossible.
                    let _ = self.completions.try_send(Completion { wr_id, status: outcome });
                }
            }
            if status != sys::UCS_OK {
                self.fail(format!("flush failed: {}", status_text(status)));
                return;
            }
        }
        while let Some(&request) = self.notice_sends.front() {
            // SAFETY: the notice request is live until freed just below.
            if unsafe { sys::ucp_request_check_status(request) } == sys::UCS_INPROGRESS {
                break;
            }
            self.notice_sends.pop_front();
            // SAFETY: finished notice request, freed once; its slot may be reused now.
            unsafe { sys::ucp_request_free(request) };
        }
        self.finish_withdrawals();
        let error = self.signals.peer_error.load(Ordering::Acquire);
        if error != 0 && !self.signals.gone.is_gone() {
            // A peer that closed on purpose also fails the endpoint (UCX's keepalive times
            // out); its goodbye on the out-of-band socket says it was not an error.
            match self.control.as_ref().and_then(|control| control.peer_left()) {
                Some(loss) if loss.clean => self.lost(loss),
                _ => self.fail(format!(
                    "UCX reported the endpoint failed: {}",
                    status_text(error as sys::ucs_status_t)
                )),
            }
        }
    }

    /// A message with no payload that wakes the peer's worker, whose sleeper takes its ring.
    fn send_wake(&mut self) {
        if self.notice_sends.len() >= self.notice_slots.len() {
            // The sleeper looks again within its poll bound.
            return;
        }
        let param = sys::ucp_request_param_t::default();
        // SAFETY: `ep` is live (engine lock held); the message has no header and no payload.
        let request = unsafe {
            sys::ucp_am_send_nbx(self.ep, WAKE_AM_ID, std::ptr::null(), 0, std::ptr::null(), 0, &param)
        };
        if sys::status_ptr_is_err(request) {
            let status = sys::status_ptr_status(request);
            self.fail(format!("sending a wake-up failed: {}", status_text(status)));
        } else if sys::status_ptr_is_ptr(request) {
            self.notice_sends.push_back(request);
        }
    }

    fn send_notice(&mut self, notice: [u8; NOTICE_BYTES]) {
        if self.notice_sends.len() >= self.notice_slots.len() {
            tracing::warn!("ucx: too many notices in flight; one dropped");
            return;
        }
        let slot = self.next_slot;
        self.next_slot = (self.next_slot + 1) % self.notice_slots.len();
        self.notice_slots[slot] = notice;
        let param = sys::ucp_request_param_t::default();
        // SAFETY: `ep` is live; the notice bytes live in `notice_slots[slot]`, which is not
        // reused until this send's request finished (slots are used round-robin and at most
        // `notice_slots.len()` sends are in flight).
        let request = unsafe {
            sys::ucp_am_send_nbx(
                self.ep,
                NOTICE_AM_ID,
                std::ptr::null(),
                0,
                self.notice_slots[slot].as_ptr().cast(),
                NOTICE_BYTES,
                &param,
            )
        };
        if sys::status_ptr_is_err(request) {
            let status = sys::status_ptr_status(request);
            self.fail(format!("sending a notice failed: {}", status_text(status)));
        } else if sys::status_ptr_is_ptr(request) {
            self.notice_sends.push_back(request);
        }
    }

    /// Flushes everything this side sent (the last notice included) to the peer, bounded; done
    /// before the goodbye, so the goodbye cannot overtake the last notice. `false` when
    /// something is still in flight at the bound: the caller then closes by force.
    #[must_use]
    pub(crate) fn drain(&mut self) -> bool {
        if self.ep.is_null() || !self.posted_any || self.signals.gone.is_gone() {
            return true;
        }
        // Flush until nothing is left in flight (a notice send that finishes late included).
        let until = Instant::now() + FINAL_FLUSH_WAIT;
        let flushed = loop {
            self.harvest();
            // A harvest that found the connection failed has closed the endpoint (`fail`).
            if self.ep.is_null() || self.signals.gone.is_gone() {
                break false;
            }
            let param = sys::ucp_request_param_t::default();
            // SAFETY: `ep` is live (checked above); the request is finished (bounded) and
            // freed by `finish`.
            let request = unsafe { sys::ucp_ep_flush_nbx(self.ep, &param) };
            match self.ucp.finish(request, 10_000) {
                sys::UCS_OK => {
                    self.harvest();
                    // Unsignalled puts have no request of their own: a finished flush covered them.
                    if !self.signals.gone.is_gone() && self.batches.is_empty() && self.notice_sends.is_empty()
                    {
                        break true;
                    }
                }
                sys::UCS_INPROGRESS => {}
                status => {
                    self.fail(format!("the final flush failed: {}", status_text(status)));
                    break false;
                }
            }
            if Instant::now() >= until {
                tracing::warn!("ucx: the final flush did not finish in time");
                break false;
            }
        };
        if flushed {
            self.unflushed = 0;
        }
        // Flushed, or given up on: the close that follows does not wait again.
        self.posted_any = false;
        flushed
    }

    /// Watches the out-of-band socket to tell a peer's goodbye from a failure, and answers the
    /// peer's requests on it.
    pub(crate) fn watch(&mut self, control: Arc<ControlChannel>) {
        self.control = Some(control);
    }
}
