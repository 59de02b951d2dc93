//! Regions exposed and withdrawn after connect, on the UCX backend: the peer's requests, acted
//! on with the lane's engine held (an rkey is unpacked on the lane's endpoint, and mapped and
//! screened as at connect where the peer's memory is written directly), and this side's own.

use crate::engine::{Engine, RemoteEntry, Withdrawing};
use crate::mapping::{map_peer, Screen};
use crate::progress::Shared;
use crate::status::status_text;
use crate::transport::UcxTransport;
use crate::wire::check_region;
use rdma_hint_backend_core::peer_regions::MAX_JOINED_ASKS;
use rdma_hint_core::{RegionId, TransportError};
use rdma_hint_oob::{Asking, Control, ControlChannel, PeerLoss, Refusal, RegionDescriptor, MAX_OUTSTANDING};
use rdma_hint_ucx_sys as sys;
use std::time::{Duration, Instant};

/// How long an answer to the peer may wait for room on the socket: the peer is reading it (it
/// awaits the answer), so a full buffer this long is a peer that stopped.
const ANSWER_PATIENCE: Duration = Duration::from_millis(100);

fn answer(control: &ControlChannel, seq: u32, refused: Option<Refusal>) {
    if let Err(error) = control.send(&Control::Done { seq, refused }, Instant::now() + ANSWER_PATIENCE) {
        tracing::debug!(%error, seq, "ucx: the peer's request could not be answered");
    }
}

impl Engine {
    /// Acts on the peer's requests taken in on `control`; `own` lists this side's own memory
    /// (the screen of a direct mapping refuses it).
    pub(crate) fn serve(&mut self, control: &ControlChannel, own: &dyn Fn() -> Vec<(u64, u64)>) {
        // A peer that keeps withdrawing while its withdrawals wait is not served further: its
        // requests stay on the socket.
        while self.withdrawing.len() < MAX_OUTSTANDING {
            let Some(request) = control.next_request() else { break };
            match request {
                Control::Expose { seq, descriptor } => {
                    let refused = self.load(&descriptor, own).err();
                    answer(control, seq, refused);
                }
                Control::Withdraw { seq, id } => self.withdraw(control, seq, id),
                // The channel keeps answers and the goodbye itself.
                Control::Done { .. } | Control::Goodbye => {}
            }
        }
    }

    /// The peer withdraws region `id` (ask `seq`): puts to it are refused from here on, and
    /// the answer waits for the flush that ends those already posted. An ask while a
    /// withdrawal of the region still waits (the peer's first one timed out) is answered with
    /// it.
    fn withdraw(&mut self, control: &ControlChannel, seq: u32, id: u32) {
        if let Some(entry) = self.remote.withdraw(id) {
            return self.withdraw_after_flush(id, seq, entry);
        }
        match self.withdrawing.iter_mut().find(|withdrawal| withdrawal.id == id) {
            Some(withdrawal) if withdrawal.seqs.len() < MAX_JOINED_ASKS => withdrawal.seqs.push(seq),
            Some(_) => answer(control, seq, Some(Refusal::Taken)),
            None => answer(control, seq, Some(Refusal::Unknown)),
        }
    }

    /// Unpacks (and, where the peer's memory is written directly, maps and screens) a region
    /// the peer exposed after connect.
    fn load(&mut self, region: &RegionDescriptor, own: &dyn Fn() -> Vec<(u64, u64)>) -> Result<(), Refusal> {
        check_region(region).map_err(|_| Refusal::Unreachable)?;
        if self.ep.is_null() {
            return Err(Refusal::Unreachable);
        }
        // What was mapped before the key is unpacked: its mapping must be new, and the peer's.
        let screen = match self.direct {
            Some(_) => Some(Screen::before_unpacking(&own()).map_err(|_| Refusal::Unreachable)?),
            None => None,
        };
        let rkey = Engine::unpack_rkey(self.ep, &region.key).map_err(|_| Refusal::Unreachable)?;
        let mut entry = RemoteEntry { address: region.address, len: region.len, rkey, mapped: None };
        let mut leave_direct = false;
        if let Some(screen) = screen {
            let what = "a region of the peer";
            let mapped = map_peer(rkey, region.address, what);
            let checked = match (mapped, screen.after_unpacking()) {
                (Some(at), Ok(after)) => after.check(at, region.len, what).map(|fresh| fresh.then_some(at)),
                (_, Err(why)) => Err(why),
                (None, Ok(_)) => Ok(None),
            };
            match checked {
                Ok(Some(at)) => entry.mapped = Some(at),
                // Memory UCX does not map here (caller memory): as at connect, a connection
                // with such a region leaves every write to UCX, once the region is loaded.
                Ok(None) => leave_direct = true,
                // A range outside what the peer's key maps, or this side's own memory.
                Err(why) => {
                    tracing::warn!(%why, "ucx: the peer exposed a region that is not its own");
                    self.destroy_rkey(entry.rkey);
                    return Err(Refusal::Unreachable);
                }
            }
        }
        self.remote.load(region.id, entry).map_err(|(_, entry)| {
            self.destroy_rkey(entry.rkey);
            Refusal::Taken
        })?;
        if leave_direct {
            self.leave_direct();
        }
        Ok(())
    }

    /// Stops writing the peer's memory directly: every write goes through UCX from here on,
    /// as on a connection whose peer exposed such a region at connect. What was copied is in
    /// place (each copy ends inside its post, under this engine) and announced on the peer's
    /// ring, which the peer takes before the first of UCX's notices (see `on_notice`).
    fn leave_direct(&mut self) {
        let Some(direct) = self.direct.take() else { return };
        tracing::debug!("ucx: the peer exposed a region not mapped here; writes go through UCX from now on");
        // The ring's mapping went with `direct`: nothing publishes on it any more.
        self.destroy_rkey(direct.ring_rkey);
    }

    /// Answers a withdrawal once every put posted before it has ended: at once where writes
    /// are copies (each ends inside its post, under this engine), else after a flush.
    fn withdraw_after_flush(&mut self, id: u32, seq: u32, entry: RemoteEntry) {
        if self.direct.is_some() || self.ep.is_null() {
            self.destroy_rkey(entry.rkey);
            if let Some(control) = &self.control {
                answer(control, seq, None);
            }
            return;
        }
        let param = sys::ucp_request_param_t::default();
        // SAFETY: `ep` is live (engine lock held); the request is tracked in `withdrawing` and
        // freed in `finish_withdrawals` or `drop_withdrawals`.
        let request = unsafe { sys::ucp_ep_flush_nbx(self.ep, &param) };
        if sys::status_ptr_is_err(request) {
            let status = sys::status_ptr_status(request);
            // The endpoint's forced close first: no put of it may still use the key then.
            self.fail(format!("the flush of a withdrawal failed: {}", status_text(status)));
            self.destroy_rkey(entry.rkey);
            return;
        }
        let request = if sys::status_ptr_is_ptr(request) { request } else { std::ptr::null_mut() };
        self.withdrawing.push_back(Withdrawing { id, seqs: vec![seq], request, entry });
        self.finish_withdrawals();
    }

    /// Answers the withdrawals whose flushes finished, in order.
    pub(crate) fn finish_withdrawals(&mut self) {
        while let Some(withdrawal) = self.withdrawing.front() {
            let status = if withdrawal.request.is_null() {
                sys::UCS_OK
            } else {
                // SAFETY: the flush request is live until freed just below.
                unsafe { sys::ucp_request_check_status(withdrawal.request) }
            };
            if status == sys::UCS_INPROGRESS {
                return;
            }
            let Some(withdrawal) = self.withdrawing.pop_front() else { return };
            if !withdrawal.request.is_null() {
                // SAFETY: finished flush request, freed once.
                unsafe { sys::ucp_request_free(withdrawal.request) };
            }
            if status != sys::UCS_OK {
                // The endpoint's forced close first: no put of it may still use the key then.
                self.fail(format!("the flush of a withdrawal failed: {}", status_text(status)));
                self.destroy_rkey(withdrawal.entry.rkey);
                return;
            }
            self.destroy_rkey(withdrawal.entry.rkey);
            if let Some(control) = &self.control {
                withdrawal.seqs.iter().for_each(|seq| answer(control, *seq, None));
            }
        }
    }

    /// At the endpoint's close: the withdrawals go unanswered (the peer reads the close).
    pub(crate) fn drop_withdrawals(&mut self) {
        while let Some(withdrawal) = self.withdrawing.pop_front() {
            if !withdrawal.request.is_null() {
                // SAFETY: after the (forced) close UCX has completed or will complete the
                // request; freeing hands it back either way.
                unsafe { sys::ucp_request_free(withdrawal.request) };
            }
            self.destroy_rkey(withdrawal.entry.rkey);
        }
    }
}

impl Shared {
    /// Takes in what the control channel holds and acts on the peer's requests; the loss, once
    /// the peer is gone. Whoever looks at the socket calls this: the progress thread (which
    /// waits for the engine), a wait for the peer's answer (which does not: a put of 1 MiB may
    /// hold the engine, and the progress thread acts on what it leaves within its poll bound).
    pub(crate) fn watch_control(&self, wait_for_engine: bool) -> Option<PeerLoss> {
        let control = self.control.get()?;
        let loss = control.peer_left();
        if control.has_requests() {
            let engine = if wait_for_engine { Some(self.engine()) } else { self.try_engine() };
            let Some(mut engine) = engine else { return loss };
            let ring = engine.signals.ring.get().map(|ring| ring.range());
            let own = || {
                let mut own = self.domain_memory();
                own.extend(ring);
                own
            };
            engine.serve(control, &own);
        }
        loss
    }
}

impl UcxTransport {
    fn asking(&self) -> Result<Asking<'_, impl FnMut() + Unpin + '_>, TransportError> {
        let shared = &self.shared;
        let control = shared.control.get().ok_or(TransportError::NotConnected)?;
        let drive = move || drop(shared.watch_control(false));
        Ok(Asking { control, exposure: &shared.exposure, mode: self.wait_mode.get(), drive })
    }

    /// [`Transport::expose`](rdma_hint_core::Transport::expose): sends the region's packed
    /// rkey; the peer's notices may name it from then on.
    pub(crate) async fn expose_region(
        &self,
        region: RegionId,
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let asking = self.asking()?;
        if let Some(why) = self.signals.gone.why() {
            return Err(TransportError::PeerGone(why.to_string()));
        }
        let describe = async {
            let table = self.domain.core.regions();
            let memory = table.get(region)?;
            self.signals.exposed.set(region, memory.len());
            let (address, len, key) = (memory.address(0), memory.len(), memory.packed_rkey.clone());
            Ok(RegionDescriptor { id: region.0, len, address, flags: 0, key })
        };
        asking.expose(region, describe, deadline, || ()).await
    }

    /// [`Transport::withdraw`](rdma_hint_core::Transport::withdraw): the peer stops putting to
    /// the region, flushes what it put, drops its key (and mapping), then answers.
    pub(crate) async fn withdraw_region(
        &self,
        region: RegionId,
        deadline: Instant,
    ) -> Result<(), TransportError> {
        // A peer seen to stop writes nothing more; one that broke the protocol may still write
        // over shared memory, so the region stays guarded until it stops.
        let gone = |why: String| match self.shared.peer_stopped() {
            true => Ok(()),
            false => Err(TransportError::PeerGone(why)),
        };
        self.asking()?.withdraw(region, deadline, gone, || ()).await
    }
}
