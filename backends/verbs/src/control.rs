//! Regions exposed and withdrawn after connect, over the lane's control channel: what the peer
//! asks of this lane (load a region's rkey; stop posting to one and answer once what was posted
//! to it has retired), and what this side asks of the peer.

use crate::lane::{lock, Lane};
use crate::transport::VerbsTransport;
use crate::wire::ExposedRegion;
use rdma_hint_backend_core::wait::off_thread;
use rdma_hint_core::{RegionId, TransportError};
use rdma_hint_oob::{Asking, Control, ControlChannel, PeerLoss, Refusal, MAX_OUTSTANDING};
use std::time::{Duration, Instant};

/// How long an answer to the peer may wait for room on the socket: the peer is reading it (it
/// awaits the answer), so a full buffer this long is a peer that stopped.
const ANSWER_PATIENCE: Duration = Duration::from_millis(100);

impl Lane {
    /// Takes in what the control channel holds and acts on the peer's requests; the loss, once
    /// the peer is gone. Whoever looks at the socket calls this: the event thread when it is
    /// readable, a poll that checks on the peer, a wait for the peer's answer.
    pub(crate) fn watch_control(&self) -> Option<PeerLoss> {
        self.watch_control_on(self.control.get()?)
    }

    /// [`watch_control`](Self::watch_control) on `control`, this lane's channel (the event
    /// thread's, from before the connect returned).
    pub(crate) fn watch_control_on(&self, control: &ControlChannel) -> Option<PeerLoss> {
        let loss = control.peer_left();
        // One thread acts at a time, in the order the requests came.
        let _serving = lock(&self.serving);
        // A peer that keeps withdrawing while its withdrawals wait is not served further: its
        // requests stay on the socket.
        while self.withdrawals.len() < MAX_OUTSTANDING {
            let Some(request) = control.next_request() else { break };
            match request {
                Control::Expose { seq, descriptor } => {
                    let refused = match ExposedRegion::from_descriptor(&descriptor) {
                        Err(_) => Some(Refusal::Unreachable),
                        Ok(region) => self.peer.load(descriptor.id, region).err().map(|_| Refusal::Taken),
                    };
                    answer(control, seq, refused);
                }
                Control::Withdraw { seq, id } => self.withdraw(control, seq, id),
                // The channel keeps answers and the goodbye itself.
                Control::Done { .. } | Control::Goodbye => {}
            }
        }
        loss
    }

    /// The peer withdraws region `id` (ask `seq`): posts to it are refused from here on
    /// (withdrawing took the write lock posts read under), and the answer waits until every WR
    /// posted so far has retired. An ask while a withdrawal of the region still waits (the
    /// peer's first one timed out) is answered with it.
    fn withdraw(&self, control: &ControlChannel, seq: u32, id: u32) {
        match self.peer.withdraw(id) {
            Some(region) => {
                let mark = lock(&self.posting).posted;
                self.withdrawals.wait_for(id, seq, mark, region);
                self.answer_withdrawals_on(control);
            }
            // Answered with the waiting one (now, if its WRs retired meanwhile).
            None if self.withdrawals.join(id, seq) => self.answer_withdrawals_on(control),
            None if self.withdrawals.waits_for(id) => answer(control, seq, Some(Refusal::Taken)),
            None => answer(control, seq, Some(Refusal::Unknown)),
        }
    }

    /// Answers the peer's withdrawals whose WRs have all retired.
    pub(crate) fn answer_withdrawals(&self) {
        let Some(control) = self.control.get() else { return };
        self.answer_withdrawals_on(control);
    }

    fn answer_withdrawals_on(&self, control: &ControlChannel) {
        if self.withdrawals.is_empty() {
            return;
        }
        let retired = lock(&self.posting).retired;
        self.withdrawals.passed(retired, |seqs, _| seqs.iter().for_each(|seq| answer(control, *seq, None)));
    }

    /// A look at the socket by this side's own waits and polls: a loss it finds is the lane's.
    pub(crate) fn drive(&self) {
        if let Some(loss) = self.watch_control() {
            self.events.lost(loss);
        }
    }
}

fn answer(control: &ControlChannel, seq: u32, refused: Option<Refusal>) {
    if let Err(error) = control.send(&Control::Done { seq, refused }, Instant::now() + ANSWER_PATIENCE) {
        tracing::debug!(%error, seq, "verbs: the peer's request could not be answered");
    }
}

impl VerbsTransport {
    fn asking(&self) -> Result<Asking<'_, impl FnMut() + Unpin + '_>, TransportError> {
        let lane = &self.lane;
        let control = lane.control.get().ok_or(TransportError::NotConnected)?;
        let drive = move || lane.drive();
        Ok(Asking { control, exposure: &lane.exposure, mode: lane.events.wait_mode.get(), drive })
    }

    /// [`Transport::expose`](rdma_hint_core::Transport::expose): registers the region for
    /// remote access (once; a slow kernel call on Soft-RoCE, made off the task's thread) and
    /// sends its rkey.
    pub(crate) async fn expose_region(
        &self,
        region: RegionId,
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let asking = self.asking()?;
        if self.lane.broken() {
            return Err(self.lane.events.gone.error());
        }
        let (domain, pd) = (self.domain.clone(), self.pd.clone());
        let register = move || {
            let mut table = domain.regions_mut();
            let memory = table.get_mut(region)?;
            let rkey = memory.expose(&pd)?;
            Ok(ExposedRegion { id: region.0, address: memory.address(0), len: memory.len(), rkey }
                .descriptor())
        };
        let describe = async move {
            off_thread("verbs-expose", "a region's remote registration", deadline, register).await?
        };
        asking.expose(region, describe, deadline, || ()).await
    }

    /// [`Transport::withdraw`](rdma_hint_core::Transport::withdraw): the peer answers once its
    /// WRs to the region retired; then the region's remote registration goes (unless a lane
    /// still exposes it), and with it the rkey.
    pub(crate) async fn withdraw_region(
        &self,
        region: RegionId,
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let lane = &self.lane;
        // A gone peer's QP may still be up (a breach of the protocol says nothing of what its
        // process does): this side's QP leaves RTS before the region may go.
        let gone = |why: String| {
            lane.events.lost(PeerLoss::failure(why));
            lane.qp.to_error()
        };
        self.asking()?.withdraw(region, deadline, gone, || ()).await?;
        self.domain.unreached(region, |memory| memory.unexpose());
        Ok(())
    }
}
