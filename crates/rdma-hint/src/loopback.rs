//! Both ends of one transport in this process, connected over loopback: what `calibrate`,
//! `rdma-hint sweep --loopback` and tests measure.

use crate::error::Error;
use crate::open::{open, open_lanes, OpenOptions, TransportId};
use rdma_hint_backend_core::BlockingTransport;
use rdma_hint_core::SourceId;
use rdma_hint_core::{LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, Transport};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// A connected sender and receiver of one transport in this process: the sender's region of
/// `region_bytes` in the source's memory, and the receiver's host region it writes into.
///
/// ```
/// use rdma_hint::{Device, OpenOptions, TransportId};
/// use rdma_hint::calibration::LoopbackPair;
/// use std::time::{Duration, Instant};
/// let deadline = Instant::now() + Duration::from_secs(30);
/// let pair = LoopbackPair::open(&TransportId::STAGED_SHM, Device::Host(0), 1 << 20, &OpenOptions::default(), deadline)?;
/// assert_eq!(pair.remote.len, 1 << 20);
/// # Ok::<(), rdma_hint::Error>(())
/// ```
pub struct LoopbackPair {
    /// The end that writes.
    pub sender: Box<dyn Transport>,
    /// The end written into (kept open for as long as the pair lives).
    pub receiver: Box<dyn Transport>,
    /// The sender's region, in the source's memory.
    pub local: LocalRegion,
    /// The receiver's region as the sender addresses it.
    pub remote: RemoteRegion,
    /// The same region as the receiver holds it (to read what arrived).
    pub target: LocalRegion,
}

impl std::fmt::Debug for LoopbackPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackPair").field("local", &self.local).field("remote", &self.remote).finish()
    }
}

impl LoopbackPair {
    /// Opens both ends of `id`, registers `region_bytes` on each (the sender's in `source`'s
    /// memory) and connects them over 127.0.0.1, all before `deadline`.
    pub fn open(
        id: &TransportId,
        source: SourceId,
        region_bytes: u64,
        options: &OpenOptions,
        deadline: Instant,
    ) -> Result<LoopbackPair, Error> {
        let sender = open(id, options)?;
        let local = sender.register(MemoryKind::of(source), region_bytes)?;
        let receiver = open(id, options)?;
        let target = receiver.register(MemoryKind::Host, region_bytes)?;
        let remote = connect_over_loopback(&*sender, &*receiver, target.id, deadline)?;
        Ok(LoopbackPair { sender, receiver, local, remote, target })
    }
}

/// Dials `receiver` from `sender` over 127.0.0.1, `receiver` exposing `target`; the region the
/// sender addresses.
fn connect_over_loopback(
    sender: &dyn Transport,
    receiver: &dyn Transport,
    target: rdma_hint_core::RegionId,
    deadline: Instant,
) -> Result<RemoteRegion, Error> {
    let address = receiver.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let remote = std::thread::scope(|scope| {
        let accepting = scope
            .spawn(move || receiver.connect_blocking(PeerEndpoint::Listen(address), &[target], deadline));
        let dialled = sender.connect_blocking(PeerEndpoint::Dial(address), &[], deadline);
        let accepted = accepting.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        accepted?;
        Ok::<_, Error>(dialled?)
    })?;
    Ok(*remote.first().ok_or_else(|| {
        rdma_hint_core::TransportError::Handshake("the loopback receiver exposed no region".into())
    })?)
}

/// [`LoopbackPair`] over `lanes` transports opened together ([`open_lanes`]): what the
/// engine and `rdma-hint sweep --lanes` stripe blocks over. Lane 0 of each side holds the
/// regions; every lane reaches them.
///
/// ```
/// use rdma_hint::{Device, OpenOptions, TransportId};
/// use rdma_hint::calibration::LoopbackLanes;
/// use std::time::{Duration, Instant};
/// let deadline = Instant::now() + Duration::from_secs(30);
/// let lanes = LoopbackLanes::open(&TransportId::STAGED_TCP, Device::Host(0), 1 << 20, &OpenOptions::default(), 2, deadline)?;
/// assert_eq!((lanes.senders.len(), lanes.remote.len), (2, 1 << 20));
/// # Ok::<(), rdma_hint::Error>(())
/// ```
pub struct LoopbackLanes {
    /// The writing lanes.
    pub senders: Vec<Arc<dyn Transport>>,
    /// The lanes written into (kept open for as long as the lanes live).
    pub receivers: Vec<Arc<dyn Transport>>,
    /// The senders' region, in the source's memory.
    pub local: LocalRegion,
    /// The receivers' region as the senders address it.
    pub remote: RemoteRegion,
    /// The same region as the receivers hold it.
    pub target: LocalRegion,
}

impl std::fmt::Debug for LoopbackLanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackLanes")
            .field("lanes", &self.senders.len())
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

impl LoopbackLanes {
    /// Opens `lanes` lanes of `id` on both ends ([`Error::Lanes`] where the backend opens one
    /// per connection), registers `region_bytes` on each end's first lane (the sender's in
    /// `source`'s memory) and connects lane to lane over 127.0.0.1, all before `deadline`.
    pub fn open(
        id: &TransportId,
        source: SourceId,
        region_bytes: u64,
        options: &OpenOptions,
        lanes: usize,
        deadline: Instant,
    ) -> Result<LoopbackLanes, Error> {
        let senders = open_lanes(id, options, lanes)?;
        let receivers = open_lanes(id, options, lanes)?;
        let local = senders[0].register(MemoryKind::of(source), region_bytes)?;
        let target = receivers[0].register(MemoryKind::Host, region_bytes)?;
        let mut remote: Option<RemoteRegion> = None;
        for (sender, receiver) in senders.iter().zip(&receivers) {
            let this = connect_over_loopback(&**sender, &**receiver, target.id, deadline)?;
            // The engine addresses one region through every lane: they must agree.
            if remote.is_some_and(|first| first != this) {
                return Err(rdma_hint_core::TransportError::Handshake(format!(
                    "lanes disagree on the receiver's region: {remote:?} and {this:?}"
                ))
                .into());
            }
            remote = Some(this);
        }
        let remote = remote.expect("open_lanes opens at least one lane");
        Ok(LoopbackLanes { senders, receivers, local, remote, target })
    }
}
