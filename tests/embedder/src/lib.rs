//! One verified transfer between two transports of one id, written only against the
//! `rdma-hint` facade: what an embedder's code looks like. The tests drive it under tokio,
//! smol and the library's blocking API.
#![forbid(unsafe_code)]

/// docs/engine.md's examples, built and run here, outside the workspace, against the facade
/// alone (as the facade's own doctests run them inside it).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/engine.md")]
pub struct EngineDocExamples;

/// The README's example, likewise.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExample;

use rdma_hint::engine::{Chunker, PostPolicy, TransferRequest};
use rdma_hint::transport::{Capabilities, Domain, GatherEntry, GatherOp, WaitMode};
use rdma_hint::{
    get_low_latency_rdma_size_hint_with, open, Arrival, Completion, Device, LocalRegion, MemoryKind,
    OpenOptions, PeerEndpoint, RegionId, RemoteRegion, Transport, TransportError, TransportId,
    TransportSelector, WriteOp,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The ids this build and machine can run: staged always, UCX over shm with the `ucx`
/// feature, or the comma list in `RDMA_HINT_EMBEDDER_IDS` (the Soft-RoCE VM sets `verbs:rxe0`).
pub fn ids() -> Vec<TransportId> {
    if let Ok(list) = std::env::var("RDMA_HINT_EMBEDDER_IDS") {
        return list.split(',').map(|id| id.trim().parse().expect("RDMA_HINT_EMBEDDER_IDS")).collect();
    }
    let mut ids = vec![TransportId::STAGED_TCP, TransportId::STAGED_SHM];
    if cfg!(feature = "ucx") {
        ids.push("ucx:shm".parse().expect("id"));
    }
    ids
}

/// Pair `pair`'s payload of `len` bytes: a 4093-byte pattern unique to the pair, repeated
/// (a prime period, so no block or page lines up with it). Built with memcpy, so a task that
/// makes one does not hold its executor thread for long.
pub fn payload(pair: u32, len: u64) -> Vec<u8> {
    let period: Vec<u8> =
        (0..4093u64).map(|i| (i.wrapping_mul(131) ^ u64::from(pair).wrapping_mul(0x9e37)) as u8).collect();
    let mut bytes = period.repeat((len as usize).div_ceil(period.len()));
    bytes.truncate(len as usize);
    bytes
}

/// A transport that records how long its longest `post_writes` took: a software NIC (Soft-RoCE)
/// does the NIC's work inside the post, on the caller's thread. Every other call forwards (its
/// domain is the wrapped transport's).
pub struct TimedPosts {
    inner: Box<dyn Transport>,
    longest_post_ns: AtomicU64,
}

impl TimedPosts {
    fn new(inner: Box<dyn Transport>) -> TimedPosts {
        TimedPosts { inner, longest_post_ns: AtomicU64::new(0) }
    }

    /// The longest `post_writes` so far.
    pub fn longest_post(&self) -> Duration {
        Duration::from_nanos(self.longest_post_ns.load(Ordering::Relaxed))
    }
}

#[async_trait::async_trait]
impl Transport for TimedPosts {
    fn domain(&self) -> &dyn Domain {
        self.inner.domain()
    }
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        self.inner.bind(address)
    }
    fn set_wait_mode(&self, mode: WaitMode) {
        self.inner.set_wait_mode(mode)
    }
    fn wait_mode(&self) -> WaitMode {
        self.inner.wait_mode()
    }
    async fn connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError> {
        self.inner.connect(peer, expose, deadline).await
    }
    async fn expose(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        self.inner.expose(region, deadline).await
    }
    async fn withdraw(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        self.inner.withdraw(region, deadline).await
    }
    fn peer_regions(&self) -> Vec<RemoteRegion> {
        self.inner.peer_regions()
    }
    fn post_writes(&self, ops: &[WriteOp]) -> Result<(), TransportError> {
        let started = Instant::now();
        let posted = self.inner.post_writes(ops);
        self.longest_post_ns.fetch_max(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        posted
    }
    fn post_reads(&self, ops: &[rdma_hint::ReadOp]) -> Result<(), TransportError> {
        let started = Instant::now();
        let posted = self.inner.post_reads(ops);
        self.longest_post_ns.fetch_max(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        posted
    }
    fn post_gather_writes(&self, ops: &[GatherOp], entries: &[GatherEntry]) -> Result<(), TransportError> {
        let started = Instant::now();
        let posted = self.inner.post_gather_writes(ops, entries);
        self.longest_post_ns.fetch_max(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        posted
    }
    fn poll_completions(&self, out: &mut [Completion]) -> Result<usize, TransportError> {
        self.inner.poll_completions(out)
    }
    async fn wait_completions(
        &self,
        out: &mut [Completion],
        deadline: Instant,
    ) -> Result<usize, TransportError> {
        self.inner.wait_completions(out, deadline).await
    }
    fn poll_arrivals(&self, out: &mut [Arrival]) -> Result<usize, TransportError> {
        self.inner.poll_arrivals(out)
    }
    async fn wait_arrivals(&self, out: &mut [Arrival], deadline: Instant) -> Result<usize, TransportError> {
        self.inner.wait_arrivals(out, deadline).await
    }
}

/// One sender and one receiver of a transport id, registered and filled, not yet connected.
pub struct Pair {
    id: TransportId,
    pair: u32,
    len: u64,
    hint: rdma_hint::SizeHint,
    sender: TimedPosts,
    receiver: Box<dyn Transport>,
    source: LocalRegion,
    target: LocalRegion,
    payload: Vec<u8>,
    imm: u32,
}

impl Pair {
    /// Opens both sides through `rdma_hint::open`, registers `len` bytes (rounded up to the
    /// hint's alignment) on each and fills the source (synchronous work, done before the clock
    /// runs).
    pub fn prepare(id: &TransportId, pair: u32, len: u64) -> Result<Pair, String> {
        let fail = |what: &str, e: &dyn std::fmt::Display| format!("{id} pair {pair}: {what}: {e}");
        let hint = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone()))
            .map_err(|e| fail("hint", &e))?;
        let options = OpenOptions::default().token(b"embedder");
        let sender = TimedPosts::new(open(id, &options).map_err(|e| fail("open", &e))?);
        let receiver = open(id, &options).map_err(|e| fail("open", &e))?;
        // Buffers in whole alignment units, as an embedder's usually are; `len` of them move.
        let region_len = len.next_multiple_of(hint.align_bytes);
        let source = sender.register(MemoryKind::Host, region_len).map_err(|e| fail("register", &e))?;
        let target = receiver.register(MemoryKind::Host, region_len).map_err(|e| fail("register", &e))?;
        let payload = payload(pair, len);
        sender.write_region(source.id, 0, &payload).map_err(|e| fail("write_region", &e))?;
        let imm = 0x1000 + pair;
        Ok(Pair { id: id.clone(), pair, len, hint, sender, receiver, source, target, payload, imm })
    }

    /// Binds the receiver, joins the listening and the dialling `connect` in this task, then
    /// writes with the chunker in the hint's blocks while the receiver waits for the arrival
    /// (joined too). Returns the blocks written.
    pub async fn run(&self) -> Result<u64, String> {
        let (id, pair) = (&self.id, self.pair);
        let fail = |what: &str, e: &dyn std::fmt::Display| format!("{id} pair {pair}: {what}: {e}");
        let address =
            self.receiver.bind("127.0.0.1:0".parse().expect("address")).map_err(|e| fail("bind", &e))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let exposed = [self.target.id];
        let listening = self.receiver.connect(PeerEndpoint::Listen(address), &exposed, deadline);
        let dialling = self.sender.connect(PeerEndpoint::Dial(address), &[], deadline);
        let (accepted, dialled) = join(listening, dialling).await;
        accepted.map_err(|e| fail("accept", &e))?;
        let remote = dialled.map_err(|e| fail("dial", &e))?[0];

        let mut chunker = Chunker::new(PostPolicy::default(), self.sender.capabilities())
            .map_err(|e| fail("chunker", &e))?;
        chunker.set_size_hint(&self.hint).map_err(|e| fail("hint", &e))?;
        let mut arrivals = [Arrival::EMPTY; 4];
        let transfer = TransferRequest::single(&self.source, 0, &remote, 0, self.len).notify(self.imm);
        let writing = chunker.transfer(&self.sender, transfer, deadline);
        let arriving = self.receiver.wait_arrivals(&mut arrivals, deadline);
        let (written, arrived) = join(writing, arriving).await;
        let report = written.map_err(|e| fail("write", &e))?;
        arrived.map_err(|e| fail("arrival", &e))?;
        if arrivals[0].imm != self.imm {
            return Err(format!(
                "{id} pair {pair}: arrival carried {} instead of {}",
                arrivals[0].imm, self.imm
            ));
        }
        Ok(report.blocks)
    }

    /// The longest `post_writes` of the sender so far.
    pub fn longest_post(&self) -> Duration {
        self.sender.longest_post()
    }

    /// Reads what landed in the receiver's region and compares every byte with what was sent.
    pub fn verify(&self) -> Result<(), String> {
        let mut landed = vec![0u8; self.len as usize];
        self.receiver.read_region(self.target.id, 0, &mut landed).map_err(|e| e.to_string())?;
        if landed != self.payload {
            let at = landed.iter().zip(&self.payload).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "{} pair {}: byte {at} differs ({} != {})",
                self.id, self.pair, landed[at], self.payload[at]
            ));
        }
        Ok(())
    }
}

/// [`Pair::prepare`], [`Pair::run`] and [`Pair::verify`] in one go; returns the blocks.
pub async fn verified_transfer(id: &TransportId, pair: u32, len: u64) -> Result<u64, String> {
    let prepared = Pair::prepare(id, pair, len)?;
    let blocks = prepared.run().await?;
    prepared.verify()?;
    Ok(blocks)
}

/// Polls two futures in one task until both are done (as `tokio::join!` or
/// `futures::join!` do), with no runtime of its own.
pub async fn join<A: std::future::Future, B: std::future::Future>(a: A, b: B) -> (A::Output, B::Output) {
    use std::pin::pin;
    use std::task::Poll;
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut left, mut right) = (None, None);
    std::future::poll_fn(|cx| {
        if left.is_none() {
            if let Poll::Ready(out) = a.as_mut().poll(cx) {
                left = Some(out);
            }
        }
        if right.is_none() {
            if let Poll::Ready(out) = b.as_mut().poll(cx) {
                right = Some(out);
            }
        }
        if left.is_some() && right.is_some() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    (left.expect("left"), right.expect("right"))
}
