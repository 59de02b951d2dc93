//! The engine's events as Prometheus metrics ([`MetricsSubscriber`]) and a loopback endpoint
//! that serves them as text ([`MetricsEndpoint`]), behind the `metrics` feature.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use rdma_hint_core::{ErrorKind, TransportError};
use rdma_hint_engine::events::{
    ArrivalsTaken, BlocksCompleted, DoorbellRung, LaneLost, Subscriber, TransferEnded,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A lane of a peer, one direction.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaneLabels {
    peer: u32,
    lane: u32,
    /// "write" or "read".
    op: &'static str,
}

fn op_label(reads: bool) -> &'static str {
    if reads {
        "read"
    } else {
        "write"
    }
}

/// A lane's blocks, by whether their doorbell queued behind bytes in flight.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BlockLabels {
    peer: u32,
    lane: u32,
    op: &'static str,
    /// "yes": bytes were in flight ahead of the doorbell; "no": the lane was idle, and the
    /// time is the path's own.
    queued: &'static str,
}

/// A peer's transfers, by class and outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransferLabels {
    peer: u32,
    class: &'static str,
    outcome: &'static str,
}

/// A failure on a lane, by what the caller can do about it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    peer: u32,
    lane: u32,
    kind: &'static str,
}

/// A peer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    peer: u32,
}

/// Post-to-completion of a block: 250 ns, doubling, to about 2 s.
fn block_seconds() -> Histogram {
    Histogram::new(exponential_buckets(250e-9, 2.0, 24))
}

/// Submit to end of a transfer: 1 µs, doubling, to about 2 minutes.
fn transfer_seconds() -> Histogram {
    Histogram::new(exponential_buckets(1e-6, 2.0, 28))
}

/// The engine's events as Prometheus metrics: histograms of block and transfer latency,
/// bytes, blocks and doorbells per lane and direction, refusals, lost lanes and arrivals.
/// Register it with one engine's [`Engine::subscribe`](crate::engine::Engine::subscribe)
/// (peers are labelled by their number in that engine: two engines' peer 0 would add up),
/// read it with [`encode`](MetricsSubscriber::encode) or serve it with [`MetricsEndpoint`].
/// Label sets are bounded by the engine's limits: at most 1024 peers × 16 lanes × 2
/// directions × 2 (queued or not) block histograms, where a scrape's text grows with the
/// peers and lanes that moved something.
///
/// ```
/// use rdma_hint::engine::events::MetricsSubscriber;
/// use rdma_hint::engine::{Engine, EngineConfig};
/// use std::sync::Arc;
///
/// let metrics = Arc::new(MetricsSubscriber::new());
/// let engine = Engine::new(EngineConfig::default()).unwrap();
/// engine.subscribe(metrics.clone());
/// // A family shows once it has a sample: the engine has moved nothing yet.
/// assert_eq!(metrics.encode(), "# EOF\n");
/// ```
pub struct MetricsSubscriber {
    registry: Registry,
    block_seconds: Family<BlockLabels, Histogram, fn() -> Histogram>,
    transfer_seconds: Family<TransferLabels, Histogram, fn() -> Histogram>,
    completed_bytes: Family<LaneLabels, Counter>,
    completed_blocks: Family<LaneLabels, Counter>,
    posted_bytes: Family<LaneLabels, Counter>,
    doorbells: Family<LaneLabels, Counter>,
    refused_doorbells: Family<FailureLabels, Counter>,
    lanes_lost: Family<FailureLabels, Counter>,
    arrivals: Family<PeerLabels, Counter>,
}

impl std::fmt::Debug for MetricsSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsSubscriber").finish_non_exhaustive()
    }
}

impl Default for MetricsSubscriber {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsSubscriber {
    /// Empty metrics, registered under the prefix `rdma_hint`.
    pub fn new() -> MetricsSubscriber {
        let mut registry = Registry::with_prefix("rdma_hint");
        let block_seconds = Family::new_with_constructor(block_seconds as fn() -> Histogram);
        let transfer_seconds = Family::new_with_constructor(transfer_seconds as fn() -> Histogram);
        let (completed_bytes, completed_blocks, posted_bytes, doorbells) =
            (Family::default(), Family::default(), Family::default(), Family::default());
        let (refused_doorbells, lanes_lost, arrivals) =
            (Family::default(), Family::default(), Family::default());
        registry.register(
            "block_seconds",
            "Post-to-completion time of a completed request, per lane (queued: whether bytes were in flight ahead of it)",
            block_seconds.clone(),
        );
        registry.register(
            "transfer_seconds",
            "Submit-to-end time of a transfer, per peer, class and outcome",
            transfer_seconds.clone(),
        );
        registry.register(
            "completed_bytes",
            "Payload bytes confirmed delivered, per lane",
            completed_bytes.clone(),
        );
        registry.register(
            "completed_blocks",
            "Blocks (work requests) confirmed, per lane",
            completed_blocks.clone(),
        );
        registry.register(
            "posted_bytes",
            "Payload bytes handed to the transport, per lane",
            posted_bytes.clone(),
        );
        registry.register(
            "doorbells",
            "Doorbells rung (posts of one or more blocks), per lane",
            doorbells.clone(),
        );
        registry.register(
            "refused_doorbells",
            "Doorbells the transport refused, per lane and error kind (QueueFull is Busy, tried again)",
            refused_doorbells.clone(),
        );
        registry.register("lanes_lost", "Lanes that failed, per error kind", lanes_lost.clone());
        registry.register(
            "arrivals",
            "Writes-with-immediate handed to the receiver, per peer",
            arrivals.clone(),
        );
        MetricsSubscriber {
            registry,
            block_seconds,
            transfer_seconds,
            completed_bytes,
            completed_blocks,
            posted_bytes,
            doorbells,
            refused_doorbells,
            lanes_lost,
            arrivals,
        }
    }

    /// The metrics in Prometheus' text exposition format (ending `# EOF`).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing into a String cannot fail");
        text
    }
}

fn kind_label(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidInput => "invalid_input",
        ErrorKind::Unsupported => "unsupported",
        ErrorKind::Busy => "busy",
        ErrorKind::Exhausted => "exhausted",
        ErrorKind::Deadline => "deadline",
        ErrorKind::Peer => "peer",
        ErrorKind::Cancelled => "cancelled",
        _ => "system",
    }
}

impl Subscriber for MetricsSubscriber {
    fn doorbell_rung(&self, event: &DoorbellRung) {
        let (peer, lane) = (event.peer.index(), event.lane);
        match event.refused {
            None => {
                let labels = LaneLabels { peer, lane, op: op_label(event.reads) };
                self.doorbells.get_or_create(&labels).inc();
                self.posted_bytes.get_or_create(&labels).inc_by(event.bytes);
            }
            Some(kind) => {
                let labels = FailureLabels { peer, lane, kind: kind_label(kind) };
                self.refused_doorbells.get_or_create(&labels).inc();
            }
        }
    }

    fn blocks_completed(&self, event: &BlocksCompleted) {
        let (peer, lane) = (event.peer.index(), event.lane);
        if let Some(timing) = event.timing {
            let queued = if timing.bytes_ahead == 0 { "no" } else { "yes" };
            let labels = BlockLabels { peer, lane, op: op_label(event.reads), queued };
            self.block_seconds.get_or_create(&labels).observe(timing.took.as_secs_f64());
        }
        let labels = LaneLabels { peer, lane, op: op_label(event.reads) };
        self.completed_bytes.get_or_create(&labels).inc_by(event.bytes);
        self.completed_blocks.get_or_create(&labels).inc_by(u64::from(event.requests));
    }

    fn transfer_ended(&self, event: &TransferEnded) {
        let class = if event.latency_first { "latency_first" } else { "bulk" };
        let outcome = event.failed.map_or("delivered", kind_label);
        let labels = TransferLabels { peer: event.peer.index(), class, outcome };
        self.transfer_seconds.get_or_create(&labels).observe(event.took.as_secs_f64());
    }

    fn lane_lost(&self, event: &LaneLost) {
        let labels =
            FailureLabels { peer: event.peer.index(), lane: event.lane, kind: kind_label(event.error) };
        self.lanes_lost.get_or_create(&labels).inc();
    }

    fn arrivals_taken(&self, event: &ArrivalsTaken) {
        self.arrivals.get_or_create(&PeerLabels { peer: event.peer.index() }).inc_by(u64::from(event.count));
    }
}

/// How long one connection may hold the endpoint, from its accept: to send its request,
/// take its answer and close (a client that trickles its bytes is cut off then, however it
/// paces them).
const CONNECTION_DEADLINE: Duration = Duration::from_secs(2);
/// The most request bytes read (a `GET /metrics` with its headers fits many times over).
const MAX_REQUEST_BYTES: usize = 8 << 10;
/// The most bytes read on (and discarded) after the answer, before the close: a request's
/// body or a pipelined request, read so that the close sends no reset the answer could be
/// lost to.
const LINGER_BYTES: usize = 256 << 10;
/// How often the endpoint's thread looks whether it should stop, between connections.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Serves a [`MetricsSubscriber`] over HTTP on a loopback address (`GET /metrics`; anything
/// else is 404, a `Host` other than a loopback name is 403), one connection at a time, each
/// for 2 s at most from its accept; stops when dropped (within those 2 s).
///
/// ```
/// use rdma_hint::engine::events::{MetricsEndpoint, MetricsSubscriber};
/// use std::sync::Arc;
///
/// let metrics = Arc::new(MetricsSubscriber::new());
/// let endpoint = MetricsEndpoint::serve(metrics, "127.0.0.1:0".parse().unwrap()).unwrap();
/// println!("scrape http://{}/metrics", endpoint.local_addr());
/// // A non-loopback address is refused: the metrics say what the machine moves, and to whom.
/// assert!(MetricsEndpoint::serve(Arc::new(MetricsSubscriber::new()), "0.0.0.0:0".parse().unwrap()).is_err());
/// ```
#[derive(Debug)]
pub struct MetricsEndpoint {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Listens on `address` (a loopback one: `TransportError::InvalidArgument` otherwise) and
    /// answers scrapes on a thread of its own.
    pub fn serve(
        metrics: Arc<MetricsSubscriber>,
        address: SocketAddr,
    ) -> Result<MetricsEndpoint, TransportError> {
        if !address.ip().is_loopback() {
            return Err(TransportError::InvalidArgument {
                what: "metrics address",
                why: format!("{address} is not a loopback address: the metrics are served on loopback only"),
            });
        }
        let listener = TcpListener::bind(address)?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rdma-hint-metrics".into())
            .spawn(move || answer_scrapes(&listener, &metrics, &stopping))?;
        Ok(MetricsEndpoint { address, stop, thread: Some(thread) })
    }

    /// Where it listens (the port the system chose, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn answer_scrapes(listener: &TcpListener, metrics: &MetricsSubscriber, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                let deadline = Instant::now() + CONNECTION_DEADLINE;
                if let Err(error) = answer(Connection { stream, deadline }, metrics) {
                    tracing::debug!(target: "rdma_hint::metrics", %error, "a scrape failed");
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(STOP_POLL),
            Err(error) => {
                tracing::debug!(target: "rdma_hint::metrics", %error, "accept failed");
                std::thread::sleep(STOP_POLL);
            }
        }
    }
}

/// A scraper's connection, under one deadline for all of it.
struct Connection {
    stream: TcpStream,
    deadline: Instant,
}

impl Connection {
    /// What is left of the deadline, or `TimedOut`: every read and write waits that long at most.
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the scrape's 2 s are up"));
        }
        Ok(left)
    }

    fn read(&mut self, into: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        self.stream.read(into)
    }

    fn write_all(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            self.stream.set_write_timeout(Some(self.left()?))?;
            match self.stream.write(bytes)? {
                0 => return Err(std::io::ErrorKind::WriteZero.into()),
                written => bytes = &bytes[written..],
            }
        }
        Ok(())
    }

    fn respond(&mut self, status: &str, content_type: &str, body: &str) -> std::io::Result<()> {
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        self.write_all(head.as_bytes())?;
        self.write_all(body.as_bytes())?;
        self.linger()
    }

    /// Closes without resetting: sends the end, then reads on, discarding, up to
    /// [`LINGER_BYTES`], the peer's end or the deadline.
    fn linger(&mut self) -> std::io::Result<()> {
        self.stream.shutdown(std::net::Shutdown::Write)?;
        let mut discard = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match self.read(&mut discard) {
                Ok(0) | Err(_) => break,
                Ok(read) => left = left.saturating_sub(read),
            }
        }
        Ok(())
    }
}

/// Reads one request's head (up to its blank line, CRLF or bare LF, at most
/// [`MAX_REQUEST_BYTES`]) and answers it.
fn answer(mut connection: Connection, metrics: &MetricsSubscriber) -> std::io::Result<()> {
    connection.stream.set_nonblocking(false)?;
    let mut request = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(end) = head_end(&request) {
            break end;
        }
        if request.len() >= MAX_REQUEST_BYTES {
            return connection.respond(
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            );
        }
        let read = connection.read(&mut chunk)?;
        if read == 0 {
            return Ok(());
        }
        request.extend_from_slice(&chunk[..read]);
    };
    let mut lines =
        request[..head_end].split(|b| *b == b'\n').map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let first = lines.next().unwrap_or_default();
    if !lines.all(host_is_loopback) {
        return connection.respond("403 Forbidden", "text/plain", "the metrics answer loopback names only\n");
    }
    match first {
        b"GET /metrics HTTP/1.1" | b"GET /metrics HTTP/1.0" => connection.respond(
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            &metrics.encode(),
        ),
        _ => connection.respond("404 Not Found", "text/plain", "GET /metrics\n"),
    }
}

/// Where a request's head ends (its blank line), if it is all there.
fn head_end(request: &[u8]) -> Option<usize> {
    let crlf = request.windows(4).position(|end| end == b"\r\n\r\n");
    let lf = request.windows(2).position(|end| end == b"\n\n");
    crlf.into_iter().chain(lf).min()
}

/// Whether a header line is anything but a `Host` naming another machine: a page in a
/// browser on this host that a rebinding DNS name points at 127.0.0.1 sends its own name,
/// and is refused.
fn host_is_loopback(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|b| *b == b':') else { return true };
    if !line[..colon].eq_ignore_ascii_case(b"host") {
        return true;
    }
    let value = String::from_utf8_lossy(&line[colon + 1..]);
    let value = value.trim();
    // The name without its port: `[::1]:9464`, `127.0.0.1:9464`, `localhost`.
    let name = match value.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => value.rsplit_once(':').map_or(value, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}
