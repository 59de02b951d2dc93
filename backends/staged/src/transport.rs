//! `StagedTransport`: the `Transport` implementation.

use crate::channel::{capabilities, StagedChannel};
use crate::handoff::{self, Offer};
use crate::lane::StagedLane;
use crate::link::{Link, LinkParts, RemoteEntry, RemoteView, Rings};
use crate::local::{local, Bounce, LocalEntry, LocalRegions, StagedMemory};
use crate::memory::PeerMapping;
use crate::request::{Pieces, Request};
use crate::wire::{ChannelKind, ExposedRegion, Handoff, Hello, MAX_REGIONS};
use async_trait::async_trait;
use rdma_hint_backend_core::gather::gathered;
use rdma_hint_backend_core::lanes::Lane;
use rdma_hint_backend_core::wait::{ready, wait, Notifier, WaitModeCell};
use rdma_hint_backend_core::{DomainCore, PeerRegions, RegionTable};
use rdma_hint_core::{
    Arrival, Capabilities, Completion, Domain, GatherEntry, GatherOp, PeerEndpoint, ReadOp, RegionId,
    RemoteRegion, Transport, TransportError, WaitMode, WriteOp,
};
use rdma_hint_oob::{Asking, Rendezvous};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Host-staged transport over shared memory (same host) or TCP (any host).
///
/// Regions are host memory the transport allocates (on the shm channel, sealed memfds whose
/// descriptors the peer receives over a Unix socket and maps). `connect` runs a validated
/// handshake over TCP; the handshake runs on a thread of its own, so `connect` never blocks the
/// awaiting task's thread. Afterwards, on TCP, a sender thread moves posted writes and a reader
/// thread places incoming ones, acknowledges signalled writes and queues arrivals, waking the
/// waits that sleep on them; in `BusyPoll` mode the posting thread sends writes of up to 64 KiB
/// itself and the waits take whole frames off the socket themselves. On shm, a write from host memory is copied into the peer's mapping
/// by the thread that posts it, completed at once and announced on the peer's ring, which the
/// peer's waits read directly (GPU sources go through the sender thread and its copy engine).
///
/// ```no_run
/// use rdma_hint_core::{MemoryKind, PeerEndpoint, Transport};
/// use rdma_hint_backend_core::BlockingTransport;
/// use rdma_hint_staged::{StagedChannel, StagedTransport};
/// use std::time::{Duration, Instant};
///
/// let transport = StagedTransport::new(StagedChannel::Tcp);
/// let region = transport.register(MemoryKind::Host, 1 << 20).unwrap();
/// let deadline = Instant::now() + Duration::from_secs(10);
/// let peer = PeerEndpoint::Dial("10.0.0.2:7000".parse().unwrap());
/// let remote = transport.connect_blocking(peer, &[region.id], deadline).unwrap();
/// ```
#[derive(Debug)]
pub struct StagedTransport {
    channel: StagedChannel,
    caps: Capabilities,
    /// The regions, and every lane opened together with this one (this one included).
    regions: LocalRegions,
    rendezvous: Rendezvous,
    link: OnceLock<Link>,
    lane: Arc<StagedLane>,
    /// Shared with the link's ring thread, which sleeps only in `Adaptive` mode.
    wait_mode: Arc<WaitModeCell>,
    /// Held while a post queues its requests for the sender thread (see `queue`).
    queueing: Mutex<()>,
}

fn wire_channel(channel: StagedChannel) -> ChannelKind {
    match channel {
        StagedChannel::SharedMemory => ChannelKind::Shm,
        StagedChannel::Tcp => ChannelKind::Tcp,
    }
}

rdma_hint_oob::token_setters!(StagedTransport, "regions, the shm hand-off");

impl StagedTransport {
    /// A transport over `channel`, not yet connected.
    pub fn new(channel: StagedChannel) -> StagedTransport {
        let caps = capabilities(channel);
        let source = StagedMemory { shared: channel == StagedChannel::SharedMemory };
        let caller_memory = caps.caller_memory.clone();
        StagedTransport {
            channel,
            caps,
            regions: Arc::new(DomainCore::new(MAX_REGIONS, source, caller_memory)),
            rendezvous: Rendezvous::default(),
            link: OnceLock::new(),
            lane: Arc::default(),
            wait_mode: Arc::default(),
            queueing: Mutex::default(),
        }
        .joined()
    }

    fn in_mode(self, mode: WaitMode) -> StagedTransport {
        self.wait_mode.set(mode);
        self
    }

    /// Enters this transport's lane in its domain's group.
    fn joined(self) -> StagedTransport {
        self.regions.lanes().join(&self.lane);
        self
    }

    /// Another lane of the same connection: a transport of the same channel and token, in
    /// this lane's wait mode now (each lane's can be set apart later), over the same region table (same ids, same memory), to connect to the same peer's
    /// lane. An engine stripes one transfer's blocks over such lanes. A region registered or
    /// released on one lane is registered or released on all; it stays busy while an op of
    /// any lane may read it or the peer of any lane may write it.
    ///
    /// ```
    /// use rdma_hint_core::{MemoryKind, Transport};
    /// use rdma_hint_staged::{StagedChannel, StagedTransport};
    /// let first = StagedTransport::new(StagedChannel::Tcp);
    /// let region = first.register(MemoryKind::Host, 4096).unwrap();
    /// first.write_region(region.id, 0, b"one memory").unwrap();
    /// let second = first.open_lane();
    /// let mut seen = [0u8; 10];
    /// second.read_region(region.id, 0, &mut seen).unwrap();
    /// assert_eq!(&seen, b"one memory");
    /// ```
    pub fn open_lane(&self) -> StagedTransport {
        StagedTransport {
            channel: self.channel,
            caps: self.caps.clone(),
            regions: self.regions.clone(),
            rendezvous: self.rendezvous.for_lane(),
            link: OnceLock::new(),
            lane: Arc::default(),
            wait_mode: Arc::new(WaitModeCell::default()),
            queueing: Mutex::default(),
        }
        .joined()
        .in_mode(self.wait_mode.get())
    }

    /// The channel this transport speaks.
    pub fn channel(&self) -> StagedChannel {
        self.channel
    }

    /// shm channel: gives every exposed region the peer cannot map (caller host memory, GPU
    /// memory) a shared bounce mapping the peer writes instead.
    fn bounce_unmappable_regions(&self, expose: &[RegionId]) -> Result<(), TransportError> {
        if self.channel != StagedChannel::SharedMemory {
            return Ok(());
        }
        let mut regions = self.regions.regions_mut();
        for id in expose {
            let Ok(entry) = regions.get_mut(*id) else { continue };
            bounce_if_unmappable(entry)?;
        }
        Ok(())
    }

    /// Region `region`'s entry as the peer will reach it once exposed after connect: on the shm
    /// channel behind a bounce where the peer cannot map it.
    fn exposable(&self, region: RegionId) -> Result<LocalEntry, TransportError> {
        let mut regions = self.regions.regions_mut();
        let entry = regions.get_mut(region)?;
        if self.channel == StagedChannel::SharedMemory {
            bounce_if_unmappable(entry)?;
        }
        Ok(entry.clone())
    }

    /// How this lane asks its peer to load or drop a region: the link's thread that watches
    /// the socket takes the answer in, so the wait only sleeps.
    fn asking<'a>(&'a self, link: &'a Link) -> Asking<'a, impl FnMut() + Unpin> {
        Asking {
            control: link.control(),
            exposure: &self.lane.exposure,
            mode: self.wait_mode.get(),
            drive: || (),
        }
    }

    fn link(&self) -> Result<&Link, TransportError> {
        // Matched, not `ok_or`: on every post and poll, an unused error is still dropped.
        match self.link.get() {
            Some(link) => Ok(link),
            None => Err(TransportError::NotConnected),
        }
    }

    /// This side's hello: the exposed regions, and on the shm channel where to take them.
    fn hello(&self, expose: &[RegionId], offer: Option<&Offer>) -> Result<Hello, TransportError> {
        let channel = wire_channel(self.channel);
        let mut regions = Vec::with_capacity(expose.len());
        for id in expose {
            let entry = local(&self.regions, *id).ok_or(TransportError::UnregisteredRegion(*id))?;
            if channel == ChannelKind::Shm && entry.shm_fd().is_none() {
                return Err(TransportError::Handshake(format!(
                    "region {} ({:?} memory) has no shared mapping to hand the peer over the shm channel",
                    id.0,
                    entry.memory.kind()
                )));
            }
            regions.push(ExposedRegion {
                id: id.0,
                len: entry.memory.len(),
                notify_each_write: channel == ChannelKind::Shm && entry.bounce.is_some(),
            });
        }
        let handoff = offer.map(|offer| Handoff { socket: offer.name.clone(), cookie: offer.cookie });
        Ok(Hello { channel, regions, handoff })
    }

    /// Checks one read as a write of the same ranges, and what the channel cannot read: into
    /// GPU memory over shm (the copy out of the peer's mapping is the CPU's), or a peer region
    /// behind a bounce (its mapping holds what was written through it, not the region).
    fn check_read(
        &self,
        regions: &RegionTable<LocalEntry>,
        remote: &RemoteView<'_>,
        op: &ReadOp,
    ) -> Result<(), TransportError> {
        self.check_op(regions, remote, &op.ranges())?;
        if self.channel != StagedChannel::SharedMemory {
            return Ok(());
        }
        let local = &regions.get(op.local)?.memory;
        if local.host().is_none() {
            return Err(TransportError::UnsupportedMemory { kind: local.kind() });
        }
        if remote.get(op.remote)?.notify_each_write {
            return Err(TransportError::InvalidArgument {
                what: "read",
                why: format!(
                    "the peer's region {} is memory it could not share over shm (caller or GPU memory behind a bounce): read it over the tcp channel",
                    op.remote.0
                ),
            });
        }
        Ok(())
    }

    /// Checks one op against the region tables (read-locked once per batch by the caller: no
    /// reference counting on the posting path).
    fn check_op(
        &self,
        regions: &RegionTable<LocalEntry>,
        remote: &RemoteView<'_>,
        op: &WriteOp,
    ) -> Result<(), TransportError> {
        let source = regions.get(op.local)?;
        let remote_len = remote.get(op.remote)?.len;
        op.check_lens(source.memory.len(), remote_len, self.caps.facts.max_msg_bytes)
    }
}

impl StagedTransport {
    /// Posts plain or gather writes: every piece is checked first, then the batch is moved in
    /// the calling thread where it can be ([`Link::post_in_place`], [`Link::post_over_socket`])
    /// or queued for the sender thread.
    fn post(&self, ops: &[impl Pieces]) -> Result<(), TransportError> {
        let link = self.postable(ops.len())?;
        // Held until the ops are queued and counted: a region cannot be released (nor lent)
        // between the check and the count, and a withdrawal of the peer's that comes meanwhile
        // counts them among the ops it waits for.
        let regions = self.regions.regions();
        let remote = link.remote.view();
        for request in ops {
            for piece in request.pieces() {
                self.check_op(&regions, &remote, &piece)?;
            }
        }
        if link.post_in_place(ops, &regions, &remote)? || link.post_over_socket(ops, &regions)? {
            return Ok(());
        }
        self.queue(link, ops.iter().map(|op| aimed(&remote, Request::of(op))), usize::MAX)?;
        drop((regions, remote));
        Ok(())
    }

    /// The link, if `count` ops may be posted on it now: connected, not gone, one doorbell's
    /// worth at most.
    fn postable(&self, count: usize) -> Result<&Link, TransportError> {
        let link = self.link()?;
        if self.lane.gone.is_gone() {
            return Err(link.gone());
        }
        self.caps.check_post(count)?;
        Ok(link)
    }

    /// Counts `requests` in flight and queues them for the sender thread, unless the queue (or
    /// `room`, a further bound) lacks space for all of them. Called with the region table
    /// read-locked, so a region cannot be released between the check and the count.
    fn queue(
        &self,
        link: &Link,
        requests: impl ExactSizeIterator<Item = Request>,
        room: usize,
    ) -> Result<(), TransportError> {
        let count = requests.len();
        // One poster at a time between the look at the room and the last send: only the
        // sender thread changes the queue meanwhile, and it only makes room.
        let _one_poster = self.queueing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let room = link.ops.capacity().unwrap_or(usize::MAX).saturating_sub(link.ops.len()).min(room);
        if count > room {
            return Err(TransportError::QueueFull { given: count as u32, max: room as u32 });
        }
        self.lane.in_flight.fetch_add(count, Ordering::AcqRel);
        self.lane.queued.fetch_add(count as u64, Ordering::AcqRel);
        for (queued, request) in requests.enumerate() {
            if link.ops.try_send(request).is_err() {
                self.lane.in_flight.fetch_sub(count - queued, Ordering::AcqRel);
                return Err(link.gone());
            }
        }
        Ok(())
    }
}

impl StagedTransport {
    /// `connect` after the checks and the bounces: the hello, the handshake, the link.
    async fn finish_connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        offer: Option<Offer>,
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        let ours = self.hello(expose, offer.as_ref())?;
        let channel = ours.channel;
        let setup = LinkSetup {
            channel: wire_channel(self.channel),
            regions: self.regions.clone(),
            expose: expose.to_vec(),
            max_outstanding: self.caps.max_outstanding_wrs as usize,
            max_msg_bytes: self.caps.facts.max_msg_bytes,
            offer,
            deadline,
            lane: self.lane.clone(),
            wait_mode: self.wait_mode.clone(),
        };
        // Mapping the peer's regions and starting the link threads happen on the rendezvous
        // thread too: nothing that can take milliseconds runs on the awaiting task's thread.
        let (_, (link, hello)) = self
            .rendezvous
            .meet(
                peer,
                deadline,
                move || {
                    let start = move |stream: &mut TcpStream, hello: Hello| {
                        stream.set_read_timeout(None)?;
                        // Writes keep a bound so a peer that stops reading breaks the link
                        // instead of a thread.
                        stream.set_write_timeout(Some(Duration::from_secs(30)))?;
                        let link = setup.start(stream.try_clone()?, &hello)?;
                        Ok((link, hello))
                    };
                    Ok((ours.encode(), start))
                },
                move |stream| decode_hello(stream, channel),
            )
            .await?;
        self.link.set(link).map_err(|_| TransportError::AlreadyConnected)?;
        Ok(hello.regions.iter().map(|r| RemoteRegion { id: RegionId(r.id), len: r.len }).collect())
    }
}

#[async_trait]
impl Transport for StagedTransport {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        self.rendezvous.bind(address)
    }

    fn set_wait_mode(&self, mode: WaitMode) {
        self.wait_mode.set(mode);
    }

    fn wait_mode(&self) -> WaitMode {
        self.wait_mode.get()
    }

    fn domain(&self) -> &dyn Domain {
        &*self.regions
    }

    async fn connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        if self.link.get().is_some() {
            return Err(TransportError::AlreadyConnected);
        }
        // On the shm channel the accepting side offers the socket the regions cross.
        let offer = match (self.channel, peer) {
            (StagedChannel::SharedMemory, PeerEndpoint::Listen(_)) => Some(Offer::new()?),
            _ => None,
        };
        let connect = async {
            self.bounce_unmappable_regions(expose)?;
            self.finish_connect(peer, expose, offer, deadline).await
        };
        self.lane.exposure.around_connect(expose, connect).await
    }

    fn peer_regions(&self) -> Vec<RemoteRegion> {
        self.link().map(|link| link.remote.list()).unwrap_or_default()
    }

    async fn expose(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        let link = self.postable(0)?;
        let describe = async {
            let entry = self.exposable(region)?;
            link.open_to_peer(region, entry, deadline)
        };
        // Describing fails before anything is set up for the peer; a peer that could not load
        // the region has it closed again before the region counts as unexposed.
        self.asking(link).expose(region, describe, deadline, || link.close_to_peer(region, deadline)).await
    }

    async fn withdraw(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        let link = self.link()?;
        let lane = &self.lane;
        // A gone peer may still write what it holds until its link's threads have seen the end.
        let gone =
            |why: String| if lane.peer_may_write() { Err(TransportError::PeerGone(why)) } else { Ok(()) };
        self.asking(link).withdraw(region, deadline, gone, || link.close_to_peer(region, deadline)).await
    }

    fn post_writes(&self, ops: &[WriteOp]) -> Result<(), TransportError> {
        self.post(ops)
    }

    fn post_reads(&self, ops: &[ReadOp]) -> Result<(), TransportError> {
        let link = self.postable(ops.len())?;
        // Held until the reads are queued and counted, as a post's writes are.
        let regions = self.regions.regions();
        let remote = link.remote.view();
        for op in ops {
            self.check_read(&regions, &remote, op)?;
        }
        if link.read_in_place(ops, &regions, &remote)? {
            return Ok(());
        }
        // TCP: places in the peer's window of answers first, so that reads queued and not yet
        // asked count against it too.
        link.reserve_reads(ops.len())?;
        if let Err(e) = self.queue(link, ops.iter().map(|op| aimed(&remote, Request::read(op))), usize::MAX) {
            link.unreserve_reads(ops.len());
            return Err(e);
        }
        drop((regions, remote));
        Ok(())
    }

    fn post_gather_writes(&self, ops: &[GatherOp], entries: &[GatherEntry]) -> Result<(), TransportError> {
        gathered(ops, entries, &self.caps, |views| self.post(views))
    }

    fn poll_completions(&self, out: &mut [Completion]) -> Result<usize, TransportError> {
        self.poll_link(|link| Ok(link.completions.try_drain(out).unwrap_or(0)))
    }

    async fn wait_completions(
        &self,
        out: &mut [Completion],
        deadline: Instant,
    ) -> Result<usize, TransportError> {
        let poll = |this: &Self, out: &mut [Completion]| this.poll_completions(out);
        self.wait_link(out, deadline, |link| link.completions.notifier(), "staged completions", poll).await
    }

    fn poll_arrivals(&self, out: &mut [Arrival]) -> Result<usize, TransportError> {
        self.poll_link(|link| link.take_arrivals(out))
    }

    async fn wait_arrivals(&self, out: &mut [Arrival], deadline: Instant) -> Result<usize, TransportError> {
        let poll = |this: &Self, out: &mut [Arrival]| this.poll_arrivals(out);
        self.wait_link(out, deadline, |link| link.arrivals.notifier(), "staged arrivals", poll).await
    }
}

impl StagedTransport {
    /// One poll of the link: what the link's threads (or this call's pump) queued, as `take`
    /// takes it; nothing from a link whose threads all ended is the loss.
    fn poll_link(
        &self,
        take: impl FnOnce(&Link) -> Result<usize, TransportError>,
    ) -> Result<usize, TransportError> {
        let link = self.link()?;
        // Read before taking: once no link thread runs, nothing can be queued after the take.
        let finished = link.finished();
        link.pump()?;
        let ready = take(link)?;
        if ready == 0 && finished {
            return Err(link.gone());
        }
        Ok(ready)
    }

    /// Waits for what `poll` finds, woken by the link's `notifier`.
    async fn wait_link<T>(
        &self,
        out: &mut [T],
        deadline: Instant,
        notifier: impl FnOnce(&Link) -> &Notifier,
        what: &'static str,
        poll: impl Fn(&Self, &mut [T]) -> Result<usize, TransportError> + Unpin,
    ) -> Result<usize, TransportError> {
        if out.is_empty() {
            return Ok(0);
        }
        let link = self.link()?;
        wait(notifier(link), self.wait_mode.get(), deadline, what, || ready(poll(self, out))).await
    }
}

/// The peer's region descriptors (in its hello's order) and its ring's, last, each checked
/// for what the hello says it is.
fn check_peer_descriptors(
    mut theirs: Vec<OwnedFd>,
    peer: &Hello,
) -> Result<(Vec<PeerMapping>, PeerMapping), TransportError> {
    let their_ring = theirs.pop().ok_or_else(|| TransportError::Handshake("the peer sent no ring".into()))?;
    let outbound = PeerMapping::check(their_ring, crate::ring::RING_BYTES)?;
    let mapped = theirs.into_iter().zip(&peer.regions).map(|(fd, region)| PeerMapping::check(fd, region.len));
    Ok((mapped.collect::<Result<_, _>>()?, outbound))
}

/// shm channel: gives `entry`, if the peer cannot map it (caller host memory, GPU memory), a
/// shared bounce mapping the peer writes instead.
fn bounce_if_unmappable(entry: &mut LocalEntry) -> Result<(), TransportError> {
    let mappable = entry.memory.host().is_some_and(|memory| memory.shm_fd().is_some());
    if entry.bounce.is_none() && !mappable {
        entry.bounce = Some(Arc::new(Bounce::new(&entry.memory)?));
    }
    Ok(())
}

/// `request` toward the peer's region it names, as `remote` holds it now (checked before):
/// the sender thread reaches the region through what the request carries.
fn aimed(remote: &RemoteView<'_>, request: Request) -> Request {
    match remote.get(request.head().remote) {
        Ok(entry) => request.toward(entry.mapped.as_ref(), entry.notify_each_write),
        Err(_) => request,
    }
}

/// The channel as `--channel` and transport ids spell it.
fn channel_name(channel: ChannelKind) -> &'static str {
    match channel {
        ChannelKind::Tcp => "tcp",
        ChannelKind::Shm => "shm",
    }
}

/// Decodes the peer's hello and checks it speaks `channel`.
fn decode_hello(mut stream: &mut dyn std::io::Read, channel: ChannelKind) -> Result<Hello, TransportError> {
    let peer = Hello::decode(&mut stream)?;
    if peer.channel != channel {
        return Err(TransportError::Handshake(format!(
            "the peer uses the {} channel, this side {}: give both sides the same --channel",
            channel_name(peer.channel),
            channel_name(channel)
        )));
    }
    Ok(peer)
}

/// What starting a link needs, moved to the rendezvous thread.
struct LinkSetup {
    channel: ChannelKind,
    regions: LocalRegions,
    expose: Vec<RegionId>,
    max_outstanding: usize,
    max_msg_bytes: u64,
    /// The shm hand-off socket this (accepting) side offered.
    offer: Option<Offer>,
    deadline: Instant,
    lane: Arc<StagedLane>,
    wait_mode: Arc<WaitModeCell>,
}

impl LinkSetup {
    /// Swaps shm regions with the peer and maps its, and starts the link threads.
    fn start(self, stream: TcpStream, hello: &Hello) -> Result<Link, TransportError> {
        let (mut mapped, rings, handoff) = match self.channel {
            ChannelKind::Shm => {
                let (mapped, rings, handoff) = self.swap_regions(hello)?;
                (
                    mapped.into_iter().map(|mapping| Some(Arc::new(mapping))).collect(),
                    Some(rings),
                    Some(handoff),
                )
            }
            ChannelKind::Tcp => (Vec::new(), None, None),
        };
        let remote = PeerRegions::from_hello(hello.regions.iter().enumerate().map(|(position, region)| {
            let mapped = mapped.get_mut(position).and_then(Option::take);
            (region.id, RemoteEntry { len: region.len, mapped, notify_each_write: region.notify_each_write })
        }));
        let parts = LinkParts {
            channel: self.channel,
            local: self.regions,
            remote: Arc::new(remote),
            limits: (self.max_outstanding, self.max_msg_bytes),
            lane: self.lane,
            rings,
            wait_mode: self.wait_mode,
            expose: self.expose.clone(),
            handoff,
        };
        Link::start(stream, parts)
    }

    /// Hands our exposed regions' memfds and then our ring's to the peer and checks the ones it
    /// hands us the same way (its regions are mapped when this side first writes them, its
    /// ring now), over the hand-off socket (offered by the accepting side, dialled by the other).
    fn swap_regions(&self, peer: &Hello) -> Result<(Vec<PeerMapping>, Rings, UnixStream), TransportError> {
        // Part of the handshake, under its limit: a peer that never dials the hand-off (or
        // never accepts ours) holds this side 5 s, not for the whole connect's deadline.
        let deadline = self.deadline.min(Instant::now() + rdma_hint_oob::HANDSHAKE_TIMEOUT);
        let stream = match (&self.offer, &peer.handoff) {
            (Some(offer), _) => offer.accept(deadline)?,
            (None, Some(theirs)) => handoff::connect(&theirs.socket, &theirs.cookie, deadline)?,
            (None, None) => {
                return Err(TransportError::Handshake("the peer offered no shm hand-off socket".into()))
            }
        };
        let ours: Vec<LocalEntry> = {
            let regions = self.regions.regions();
            self.expose.iter().map(|id| regions.get(*id).cloned()).collect::<Result<_, _>>()?
        };
        let fds = ours
            .iter()
            .map(|entry| {
                entry.shm_fd().ok_or_else(|| {
                    TransportError::Handshake(
                        "an exposed region has no shared mapping for the shm channel".into(),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let inbound = Rings::inbound_memory()?;
        let ring_fd =
            inbound.shm_fd().ok_or_else(|| TransportError::Handshake("the ring has no memfd".into()))?;
        let fds: Vec<_> = fds.into_iter().chain([ring_fd]).collect();
        let expected = peer.regions.len() + 1;
        // The side that offered the socket (serve, to whoever dials it) hands nothing of its
        // own over before the peer's descriptors have passed every check: a peer that sends
        // bad ones leaves with none of our memory. The dialling side sends first.
        let (mapped, outbound) = if self.offer.is_some() {
            let checked = check_peer_descriptors(handoff::receive(&stream, expected, deadline)?, peer)?;
            handoff::send(&stream, &fds, deadline)?;
            checked
        } else {
            handoff::send(&stream, &fds, deadline)?;
            check_peer_descriptors(handoff::receive(&stream, expected, deadline)?, peer)?
        };
        Ok((mapped, Rings::new(inbound, outbound)?, stream))
    }
}
