//! What the peer's notices travel through and land in: the state UCX's callbacks write into
//! ([`Signals`]), this side's notice ring and the peer's mapped one ([`NoticeRing`],
//! [`Direct`]), the callbacks themselves, and a notice's 16 bytes.

use crate::region::Region;
use crate::ring::{self, Consumer, Producer, RingView};
use crate::wire::ExposedRing;
use crate::worker::Context;
use rdma_hint_backend_core::lanes::ExposedLens;
use rdma_hint_backend_core::queue::EventSender;
use rdma_hint_backend_core::PeerGone;
use rdma_hint_core::{Arrival, RegionId, TransportError};
use rdma_hint_stream_copy::Run;
use rdma_hint_ucx_sys as sys;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Bytes of a notice: imm u32 · region u32 · len u64 (little-endian).
pub(crate) const NOTICE_BYTES: usize = 16;

/// State UCX callbacks write into. They run inside `ucp_worker_progress` (engine lock held),
/// so they only touch atomics and their own small locks.
#[derive(Debug, Default)]
pub(crate) struct Signals {
    /// First endpoint error status reported by UCX (0 = none).
    pub(crate) peer_error: AtomicI32,
    /// Where notices become arrivals; taken (closing the queue) when the peer is gone.
    pub(crate) arrivals: Mutex<Option<EventSender<Arrival>>>,
    /// The lengths of the regions this side exposed (at connect and since), for the checks of
    /// the peer's notices.
    pub(crate) exposed: ExposedLens,
    /// Why the connection is gone, set first thing when it goes (under the engine's lock).
    pub(crate) gone: PeerGone,
    /// Set once the connection is gone and every signalled op has its completion queued, for
    /// lock-free checks by waiters: read it before draining, so an empty drain after it is
    /// final.
    pub(crate) all_queued: AtomicBool,
    /// The ring this side takes the peer's notices on, when it offered one.
    pub(crate) ring: OnceLock<Arc<NoticeRing>>,
}

impl Signals {
    /// Takes the notices on this side's ring into `out`, unless `queued` (the arrival queue's
    /// drain, run under the ring's lock) hands over older ones first: the progress thread moves
    /// notices into that queue under the same lock, so whatever it holds precedes what is still
    /// on the ring. A broken ring is a protocol error (the text says so).
    pub(crate) fn take_ring(
        &self,
        out: &mut [Arrival],
        queued: impl FnOnce(&mut [Arrival]) -> usize,
    ) -> Result<usize, String> {
        // Once gone, the connection's last notices are in the queue (`Engine::lost`): what the
        // peer publishes after that is not taken.
        if self.all_queued.load(Ordering::Acquire) {
            return Ok(0);
        }
        match self.ring.get() {
            Some(ring) => ring.take(&self.exposed, out, queued, |_| {}),
            None => Ok(0),
        }
    }

    /// Moves the notices on this side's ring into the arrival queue, at most `room` of them,
    /// for tasks that sleep on it (the progress thread's part, and a connection's last word).
    pub(crate) fn ring_to_queue(&self, room: usize) -> Result<usize, String> {
        let Some(ring) = self.ring.get() else { return Ok(0) };
        if room == 0 || ring.nothing_new() {
            return Ok(0);
        }
        let arrivals = self.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(sender) = arrivals.as_ref() else { return Ok(0) };
        let mut taken = [Arrival::EMPTY; 64];
        // Queued before the ring's lock is let go: a wait that takes the ring next finds them
        // in the queue first.
        ring.take(
            &self.exposed,
            &mut taken[..room.min(64)],
            |_| 0,
            |taken| {
                // Room was counted first by the progress thread, and only this lock's holders send;
                // a closing connection takes what fits.
                if taken.iter().any(|arrival| sender.try_send(*arrival).is_err()) {
                    tracing::warn!("ucx: arrival queue full; notices dropped");
                }
            },
        )
    }
}

/// The ring a side takes its peer's notices on: memory UCX allocated (a shared segment over
/// shared memory, so the peer can map it) and the consumer's state. Unmapped when the last
/// holder lets go; a lane whose peer may still write it hands it to its lane group (as it does
/// the regions it exposed), which leaks it rather than free memory a peer still writes.
#[derive(Debug)]
pub(crate) struct NoticeRing {
    region: Region,
    context: Arc<Context>,
    consumer: Mutex<Consumer>,
    /// The consumer's count, stored after each take: a look at an empty ring reads it and the
    /// next slot's number, and takes no lock.
    taken: AtomicU64,
}

impl NoticeRing {
    /// A zeroed ring of [`ring::RING_BYTES`] on `context`; `None` when UCX's memory is not
    /// aligned for one.
    pub(crate) fn new(context: &Arc<Context>) -> Result<Option<NoticeRing>, TransportError> {
        let region = Region::map(context.handle, ring::RING_BYTES)?;
        if !region.address(0).is_multiple_of(64) {
            region.unmap(context.handle);
            return Ok(None);
        }
        Ok(Some(NoticeRing {
            region,
            context: context.clone(),
            consumer: Mutex::new(Consumer::default()),
            taken: AtomicU64::new(0),
        }))
    }

    /// Its address and length here (for the screen of the peer's mappings).
    pub(crate) fn range(&self) -> (u64, u64) {
        (self.region.address(0), ring::RING_BYTES)
    }

    /// What the hello tells the peer of it.
    pub(crate) fn exposed(&self) -> ExposedRing {
        ExposedRing { address: self.region.address(0), rkey: self.region.packed_rkey.clone() }
    }

    pub(crate) fn view(&self) -> RingView<'_> {
        // SAFETY: the region is RING_BYTES of UCX's memory, 64-byte aligned (checked in `new`),
        // mapped until `self` drops; this side touches it only through the view's atomics.
        unsafe { ring::view_at(self.region.pointer(0)) }
    }

    fn nothing_new(&self) -> bool {
        ring::nothing_after(&self.view(), self.taken.load(Ordering::Acquire))
    }

    /// Under the ring's lock: `queued` first (older notices, see [`Signals::take_ring`]), else
    /// the notices on the ring into `out`, handed to `taken` before the lock is let go.
    fn take(
        &self,
        exposed: &ExposedLens,
        out: &mut [Arrival],
        queued: impl FnOnce(&mut [Arrival]) -> usize,
        taken: impl FnOnce(&[Arrival]),
    ) -> Result<usize, String> {
        if out.is_empty() || self.nothing_new() {
            return Ok(0);
        }
        let mut consumer = self.consumer.lock().unwrap_or_else(PoisonError::into_inner);
        let older = queued(out);
        if older > 0 {
            return Ok(older);
        }
        let count = ring::take(&mut consumer, &self.view(), &|id, len| exposed.admits(id, len), out);
        self.taken.store(consumer.taken(), Ordering::Release);
        let count = count?;
        taken(&out[..count]);
        Ok(count)
    }

    /// Marks the ring before its waiter sleeps on the worker's event fd; `false`: a notice
    /// came meanwhile, do not sleep.
    pub(crate) fn prepare_sleep(&self) -> bool {
        self.consumer.lock().unwrap_or_else(PoisonError::into_inner).prepare_sleep(&self.view())
    }

    /// Clears the mark once awake.
    pub(crate) fn woke(&self) {
        ring::awake(&self.view());
    }
}

impl Drop for NoticeRing {
    fn drop(&mut self) {
        self.region.unmap(self.context.handle);
    }
}

/// The peer's memory mapped into this process: its ring (and, in each `RemoteEntry`, every
/// region it exposed).
#[derive(Debug)]
pub(crate) struct Direct {
    pub(crate) ring: PeerRing,
    pub(crate) ring_rkey: sys::ucp_rkey_h,
    pub(crate) producer: Producer,
    /// Where this connection's copies have been landing (whether the next one streams).
    pub(crate) run: Run,
}

impl Direct {
    /// The peer's mapped ring (its regions' mappings are in their `RemoteEntry`s);
    /// `ring_rkey` is destroyed with it.
    pub(crate) fn new(ring: *mut u8, ring_rkey: sys::ucp_rkey_h) -> Direct {
        Direct { ring: PeerRing(ring), ring_rkey, producer: Producer::default(), run: Run::default() }
    }
}

/// Where UCX mapped the peer's notice ring here.
#[derive(Debug)]
pub(crate) struct PeerRing(*mut u8);

impl PeerRing {
    pub(crate) fn view(&self) -> RingView<'_> {
        // SAFETY: this is where UCX mapped the peer's RING_BYTES ring: the screen checked the
        // whole range lies in one mapping the unpacking of the peer's keys made, 64-byte
        // aligned, which stays attached until those rkeys are destroyed (`close` does, all of
        // them, after dropping this); it is touched here only through the view's atomics.
        unsafe { ring::view_at(self.0) }
    }
}

/// `ucp_am_recv_callback_t` for wake-ups: the message only wakes the worker's event fd, whose
/// sleeper then takes the ring.
pub(crate) unsafe extern "C" fn on_wake(
    _arg: *mut c_void,
    _header: *const c_void,
    _header_length: usize,
    _data: *mut c_void,
    _length: usize,
    _param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    sys::UCS_OK
}

/// `ucp_err_handler_cb_t`: records the endpoint's failure for the engine to act on.
pub(crate) unsafe extern "C" fn on_endpoint_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    // SAFETY: `arg` is the `Signals` the engine registered; it outlives the endpoint.
    let signals = unsafe { &*arg.cast::<Signals>() };
    let _ = signals.peer_error.compare_exchange(0, i32::from(status), Ordering::AcqRel, Ordering::Acquire);
}

/// `ucp_am_recv_callback_t` for notices: validates and queues an [`Arrival`].
pub(crate) unsafe extern "C" fn on_notice(
    arg: *mut c_void,
    _header: *const c_void,
    _header_length: usize,
    data: *mut c_void,
    length: usize,
    _param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: `arg` is the `Signals` registered with the handler; it outlives the worker.
    let signals = unsafe { &*arg.cast::<Signals>() };
    if length != NOTICE_BYTES || data.is_null() {
        tracing::warn!(length, "ucx: dropped a malformed notice from the peer");
        return sys::UCS_OK;
    }
    let mut bytes = [0u8; NOTICE_BYTES];
    // SAFETY: UCX passes `length` (= NOTICE_BYTES) readable bytes at `data` (WHOLE_MSG, eager).
    unsafe { std::ptr::copy_nonoverlapping(data.cast::<u8>(), bytes.as_mut_ptr(), NOTICE_BYTES) };
    let arrival = decode_notice(&bytes);
    if !signals.exposed.admits(arrival.region.0, arrival.len) {
        tracing::warn!(?arrival, "ucx: dropped a notice for a region this side did not expose");
        return sys::UCS_OK;
    }
    // A peer that stopped writing this side's memory directly (a region exposed later that it
    // cannot map) announced its earlier writes on the ring: those go first, as many as the
    // queue takes. What the ring still holds then (a full queue) keeps this notice out too, as
    // a full queue does below: no notice is delivered before an older one.
    let room = || {
        signals.arrivals.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map_or(0, EventSender::room)
    };
    // The common notice finds no ring or an empty one: one load, no lock.
    while signals.ring.get().is_some_and(|ring| !ring.nothing_new()) {
        match signals.ring_to_queue(room()) {
            Ok(0) => break,
            Ok(_) => {}
            Err(why) => {
                // The progress thread meets the same slot and ends the connection.
                tracing::warn!(%why, "ucx: the peer's ring notices before its first message are not taken");
                return sys::UCS_OK;
            }
        }
    }
    if signals.ring.get().is_some_and(|ring| !ring.nothing_new()) {
        tracing::warn!("ucx: arrival queue full; notice dropped");
        return sys::UCS_OK;
    }
    if let Some(sender) = signals.arrivals.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
        // Bounded queue: when the application stops draining, the oldest unread notices stay
        // and new ones are dropped with a warning rather than blocking UCX's progress.
        if sender.try_send(arrival).is_err() {
            tracing::warn!("ucx: arrival queue full; notice dropped");
        }
    }
    sys::UCS_OK
}

pub(crate) fn encode_notice(imm: u32, region: u32, len: u64) -> [u8; NOTICE_BYTES] {
    let mut bytes = [0u8; NOTICE_BYTES];
    bytes[0..4].copy_from_slice(&imm.to_le_bytes());
    bytes[4..8].copy_from_slice(&region.to_le_bytes());
    bytes[8..16].copy_from_slice(&len.to_le_bytes());
    bytes
}

pub(crate) fn decode_notice(bytes: &[u8; NOTICE_BYTES]) -> Arrival {
    let word = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    Arrival { imm: word(0), region: RegionId(word(4)), len: u64::from(word(8)) | (u64::from(word(12)) << 32) }
}
