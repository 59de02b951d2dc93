//! Connecting a peer over all its lanes in one call, and exposing regions to it later.

use super::{Engine, PeerId};
use rdma_hint_core::{PeerEndpoint, RegionId, RemoteRegion, Transport, TransportError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

impl Engine {
    /// Connects a peer over `lanes` (1 to [`MAX_LANES`](crate::MAX_LANES) transports opened
    /// together: `open_lanes` in the facade, a backend's `open_lane`) in one call, and adds it:
    /// every lane dials, or accepts on the one listener the lanes share, at once; each
    /// exposes `expose`; the peer's regions come back with its id.
    ///
    /// Both sides name the same address: a listening side's lanes accept its peer's lanes in
    /// whatever order they arrive (any lane of one side may pair with any of the other, since
    /// lanes address the same memory by the same ids). A listening side may
    /// [`bind`](Transport::bind) first to learn a port it then tells its peer.
    ///
    /// Fails with the first lane's error (in lane order) if any lane fails, with
    /// [`TransportError::InvalidArgument`] for lanes that cannot be one connection (not
    /// opened together, too many, a lane already this engine's), and with
    /// [`TransportError::Handshake`] if the peer's lanes exposed different regions.
    ///
    /// ```
    /// use rdma_hint_engine::{BlockSpec, Engine, EngineConfig, LoopbackTransport, TransferRequest};
    /// use rdma_hint_core::{MemoryKind, PeerEndpoint, SourceId, Transport};
    /// use std::sync::Arc;
    /// use std::time::{Duration, Instant};
    ///
    /// let first = LoopbackTransport::new(64);
    /// let lanes: Vec<Arc<dyn Transport>> = vec![Arc::new(first.open_lane()), Arc::new(first)];
    /// let (source, target) = (lanes[0].register(MemoryKind::Host, 1 << 20)?, lanes[0].register(MemoryKind::Host, 1 << 20)?);
    /// lanes[0].write_region(source.id, 0, &[7u8; 1 << 20])?;
    /// let deadline = Instant::now() + Duration::from_secs(5);
    /// let engine = Engine::new(EngineConfig::default())?;
    /// engine.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, 4096)?);
    /// let listen = PeerEndpoint::Listen("127.0.0.1:0".parse()?);
    /// let (peer, remote) = engine.connect_blocking(lanes, listen, &[target.id], deadline)?;
    /// let id = engine.submit(peer, TransferRequest::single(&source, 0, &remote[0], 0, 1 << 20), deadline)?;
    /// assert_eq!(engine.wait_blocking(id, deadline)?.bytes, 1 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn connect(
        &self,
        lanes: Vec<Arc<dyn Transport>>,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<(PeerId, Vec<RemoteRegion>), TransportError> {
        let invalid = |why: String| TransportError::InvalidArgument { what: "lanes", why };
        if lanes.is_empty() || lanes.len() > crate::MAX_LANES {
            return Err(invalid(format!("{} lanes; give 1 to {}", lanes.len(), crate::MAX_LANES)));
        }
        if lanes.iter().enumerate().any(|(at, lane)| lanes[..at].iter().any(|other| Arc::ptr_eq(other, lane)))
        {
            return Err(invalid("a transport is given twice: each lane is a transport of its own".into()));
        }
        if let PeerEndpoint::Listen(address) = peer {
            one_listener(&lanes, address)?;
        }
        let connected = on_every_lane(&lanes, |lane| lane.connect(peer, expose, deadline)).await;
        let mut regions = Vec::with_capacity(lanes.len());
        for result in connected {
            regions.push(result?);
        }
        let remote = regions.swap_remove(0);
        if let Some(other) = regions.iter().find(|other| !same_regions(other, &remote)) {
            return Err(TransportError::Handshake(format!(
                "the peer's lanes exposed different regions ({} and {}): they are not lanes of one connection",
                remote.len(),
                other.len()
            )));
        }
        let id = self.add_peer(lanes, &remote)?;
        Ok((id, remote))
    }

    /// [`connect`](Engine::connect), parking the calling thread.
    pub fn connect_blocking(
        &self,
        lanes: Vec<Arc<dyn Transport>>,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<(PeerId, Vec<RemoteRegion>), TransportError> {
        rdma_hint_backend_core::blocking::block_on(self.connect(lanes, peer, expose, deadline))
    }

    /// Exposes `region` to a connected `peer` on every lane (see [`Transport::expose`]): when
    /// this returns, the peer may write and read it, and the peer's engine takes transfers to
    /// it. A lane that fails leaves the region exposed on the lanes that succeeded;
    /// [`withdraw`](Engine::withdraw) it to take it back from every lane.
    pub async fn expose(
        &self,
        peer: PeerId,
        region: RegionId,
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let Some(lanes) = self.shared.transports(peer.0) else { return Err(TransportError::NotConnected) };
        on_every_lane(lanes, |lane| lane.expose(region, deadline)).await.into_iter().collect()
    }

    /// Withdraws `region` from `peer` on every lane that exposes it (see
    /// [`Transport::withdraw`]): when this returns, no op of the peer reaches it.
    pub async fn withdraw(
        &self,
        peer: PeerId,
        region: RegionId,
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let Some(lanes) = self.shared.transports(peer.0) else { return Err(TransportError::NotConnected) };
        on_every_lane(lanes, |lane| lane.withdraw(region, deadline)).await.into_iter().collect()
    }
}

impl Engine {
    /// Reloads the regions `peer` exposes, those every lane lists (a transfer's blocks go over
    /// any of them); whether they changed. Only a refused submit's path takes it: it asks each
    /// lane's transport and allocates, without the engine's lock, so the other peers' posting
    /// and the driver go on meanwhile.
    pub(super) fn reload_remote(&self, peer: PeerId) -> bool {
        let Some(lanes) = self.shared.transports(peer.0) else { return false };
        let mut lists = lanes.iter().map(|lane| lane.peer_regions());
        let Some(first) = lists.next() else { return false };
        let others: Vec<std::collections::HashSet<RemoteRegion>> =
            lists.map(|list| list.into_iter().collect()).collect();
        let on_every_lane: Vec<RemoteRegion> =
            first.into_iter().filter(|region| others.iter().all(|list| list.contains(region))).collect();
        self.shared.lock().sched.set_remote(peer.0, &on_every_lane)
    }
}

/// Checks that `lanes` accept on one listener at `address` (binding it if none is): lanes
/// opened separately each bind their own, and the peer's lanes could then not all reach them.
fn one_listener(lanes: &[Arc<dyn Transport>], address: std::net::SocketAddr) -> Result<(), TransportError> {
    let bound = lanes[0].bind(address)?;
    for lane in &lanes[1..] {
        match lane.bind(address) {
            Ok(other) if other == bound => {}
            _ => {
                return Err(TransportError::InvalidArgument {
                    what: "lanes",
                    why: format!(
                        "the lanes do not share one listener at {bound}: open the lanes of a connection together (open_lanes)"
                    ),
                })
            }
        }
    }
    Ok(())
}

/// Whether two lanes' lists name the same regions (in any order).
fn same_regions(a: &[RemoteRegion], b: &[RemoteRegion]) -> bool {
    a.len() == b.len() && a.iter().all(|region| b.contains(region))
}

/// Runs `op` on every lane at once and answers each lane's result, in lane order.
async fn on_every_lane<'a, T>(
    lanes: &'a [Arc<dyn Transport>],
    op: impl Fn(&'a Arc<dyn Transport>) -> Pin<Box<dyn Future<Output = Result<T, TransportError>> + Send + 'a>>,
) -> Vec<Result<T, TransportError>> {
    let mut running: Vec<_> = lanes.iter().map(|lane| Some(op(lane))).collect();
    let mut results: Vec<Option<Result<T, TransportError>>> = lanes.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (future, result) in running.iter_mut().zip(results.iter_mut()) {
            if let Some(pending) = future {
                if let Poll::Ready(done) = pending.as_mut().poll(cx) {
                    *result = Some(done);
                    *future = None;
                }
            }
        }
        if running.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    results.into_iter().flatten().collect()
}
