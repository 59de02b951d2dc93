//! The asking side of exposing and withdrawing a region after connect, written once for the
//! backends whose control frames travel on a [`ControlChannel`]: the checks, the link's
//! [`Exposure`] kept in step with what the peer holds, and what each answer means.

use crate::channel::ControlChannel;
use crate::control::{Control, Refusal};
use crate::hello::RegionDescriptor;
use rdma_hint_backend_core::lanes::Exposure;
use rdma_hint_core::{RegionId, TransportError, WaitMode};
use std::future::Future;
use std::time::Instant;

/// How one link asks its peer: its channel, what it exposes, its waits' mode, and `drive`, the
/// backend's own look at the socket that acts on the peer's requests meanwhile (see
/// [`ControlChannel::answer`]).
pub struct Asking<'a, D> {
    /// The link's control channel.
    pub control: &'a ControlChannel,
    /// What the link exposes.
    pub exposure: &'a Exposure,
    /// How its waits wait.
    pub mode: WaitMode,
    /// The backend's look at the socket.
    pub drive: D,
}

impl<D: FnMut() + Unpin> Asking<'_, D> {
    /// Exposes `region` as `describe` describes it (awaited once the region is entered in the
    /// link's exposure: two exposures of one region cannot both pass): it counts as exposed
    /// from before its descriptor may leave, and stops counting if it cannot be described or
    /// the peer could not load it (then `unreached` first drops what describing it set up for
    /// the peer). Any other failure (the peer holds a region of that id, a deadline) leaves it
    /// exposed, for a [`withdraw`](Self::withdraw) to settle.
    pub async fn expose(
        self,
        region: RegionId,
        describe: impl Future<Output = Result<RegionDescriptor, TransportError>>,
        deadline: Instant,
        unreached: impl FnOnce(),
    ) -> Result<(), TransportError> {
        if !self.exposure.add(region) {
            let why = format!("region {} is exposed on this link already", region.0);
            return Err(TransportError::InvalidArgument { what: "expose", why });
        }
        let descriptor = match describe.await {
            Ok(descriptor) => descriptor,
            Err(error) => {
                self.exposure.remove(region);
                return Err(error);
            }
        };
        let expose = |seq| Control::Expose { seq, descriptor };
        match self.control.request(expose, self.mode, deadline, self.drive).await? {
            None => Ok(()),
            Some(refusal @ Refusal::Unreachable) => {
                unreached();
                self.exposure.remove(region);
                Err(refusal.error("expose", region.0))
            }
            Some(refusal) => Err(refusal.error("expose", region.0)),
        }
    }

    /// Withdraws `region`: once the peer answers (it finished what it had posted to the region
    /// and dropped its key), `let_go` drops what this link holds of it (what reaches the
    /// region's memory for the peer) and the region is exposed no more. A peer that was never
    /// told of it holds nothing of it. When the peer is gone instead, `gone` says whether the
    /// region is safe to let go all the same (it makes it so where it can: a QP moved out of
    /// RTS), or the error to return (it stays exposed).
    pub async fn withdraw(
        self,
        region: RegionId,
        deadline: Instant,
        gone: impl FnOnce(String) -> Result<(), TransportError>,
        let_go: impl FnOnce(),
    ) -> Result<(), TransportError> {
        if !self.exposure.contains(region) {
            let why = format!("region {} is not exposed on this link", region.0);
            return Err(TransportError::InvalidArgument { what: "withdraw", why });
        }
        let withdraw = |seq| Control::Withdraw { seq, id: region.0 };
        match self.control.request(withdraw, self.mode, deadline, self.drive).await {
            Ok(None | Some(Refusal::Unknown)) => {}
            Ok(Some(refusal)) => return Err(refusal.error("withdraw", region.0)),
            Err(TransportError::PeerGone(why)) => gone(why)?,
            Err(error) => return Err(error),
        }
        let_go();
        self.exposure.remove(region);
        Ok(())
    }
}
