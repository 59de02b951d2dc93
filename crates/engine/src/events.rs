//! What the engine does, as typed events for subscribers the embedder registers
//! ([`Engine::subscribe`](crate::Engine::subscribe)), in s2n-quic's shape: a trait whose
//! methods do nothing unless overridden, so a subscriber takes the events it wants and a
//! new event costs nobody a change. With no subscriber the engine builds no event: the
//! posting and completion paths read one flag and allocate nothing.
//!
//! Subscribers are called on the thread that saw the event (the driver, or a caller's
//! `submit` or `wait`), with the engine's lock held: a subscriber keeps each call short (a
//! counter, a histogram, a line to a channel) and never calls back into the engine (it would
//! wait for the lock it is called under). One that panics is dropped, and the engine goes on.
//!
//! [`TracingSubscriber`] writes each event as a `tracing` event (target `rdma_hint::engine`).
//!
//! ```
//! use rdma_hint_engine::events::{BlocksCompleted, Subscriber};
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! /// Counts the bytes the engine saw confirmed.
//! #[derive(Default)]
//! struct ConfirmedBytes(AtomicU64);
//!
//! impl Subscriber for ConfirmedBytes {
//!     fn blocks_completed(&self, event: &BlocksCompleted) {
//!         self.0.fetch_add(event.bytes, Ordering::Relaxed);
//!     }
//! }
//! ```

use rdma_hint_core::ErrorKind;
use std::time::Duration;

/// A doorbell went to a lane's transport: `requests` blocks (work requests) of `bytes` in
/// all, in one post. One the transport refused (`refused`) is posted again later and told
/// again then. A doorbell rung outside the engine's lock (over 16 KiB, or on a lane whose
/// posts may wait) is told once the engine has it back, which may be after a completion of
/// its own blocks was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DoorbellRung {
    /// The peer.
    pub peer: crate::PeerId,
    /// The lane of the peer it went to.
    pub lane: u32,
    /// Requests posted, as completions count them (a refused gather posted again as its
    /// pieces is one).
    pub requests: u32,
    /// Payload bytes posted, in bytes.
    pub bytes: u64,
    /// Its requests are reads (the peer's bytes into ours), not writes.
    pub reads: bool,
    /// What the transport answered, where it refused the post (`QueueFull` is tried again;
    /// other refusals fail the transfers or the lane).
    pub refused: Option<ErrorKind>,
}

/// A completion retired `requests` posted blocks of one lane (a signalled request vouches
/// for the unsignalled ones before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlocksCompleted {
    /// The peer.
    pub peer: crate::PeerId,
    /// The lane the blocks went over.
    pub lane: u32,
    /// Blocks retired by this completion.
    pub requests: u32,
    /// Their payload bytes, in bytes.
    pub bytes: u64,
    /// They were reads, not writes.
    pub reads: bool,
    /// How long the completed request took, `None` for one posted before the first
    /// subscriber came.
    pub timing: Option<BlockTiming>,
}

/// How long a completed request took from its doorbell, and behind what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockTiming {
    /// From the doorbell that posted the request the completion answers to the completion:
    /// its post-to-completion time, queueing behind `bytes_ahead` included.
    pub took: Duration,
    /// Payload bytes the lane had in flight before that doorbell (0: it went to an idle lane,
    /// and `took` is the path's own time).
    pub bytes_ahead: u64,
}

/// A transfer ended: every byte delivered, or failed (cancelled and timed-out ones too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransferEnded {
    /// The peer.
    pub peer: crate::PeerId,
    /// Payload bytes the transfer asked for, in bytes.
    pub bytes: u64,
    /// Blocks it was cut into.
    pub blocks: u64,
    /// From `submit` to its end.
    pub took: Duration,
    /// It was submitted latency-first.
    pub latency_first: bool,
    /// Why it failed (`None`: delivered).
    pub failed: Option<ErrorKind>,
}

/// A lane failed: its transfers with blocks on it fail, and the peer goes on over its other
/// lanes (or has none left).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneLost {
    /// The peer.
    pub peer: crate::PeerId,
    /// The lane that failed.
    pub lane: u32,
    /// What failed it.
    pub error: ErrorKind,
}

/// Writes-with-immediate from a peer that a wait handed to the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArrivalsTaken {
    /// The peer.
    pub peer: crate::PeerId,
    /// Arrivals handed out by one wait.
    pub count: u32,
}

/// Takes the engine's events; every method does nothing unless overridden.
pub trait Subscriber: Send + Sync {
    /// A doorbell was rung (see [`DoorbellRung`]).
    fn doorbell_rung(&self, event: &DoorbellRung) {
        let _ = event;
    }
    /// A completion retired blocks (see [`BlocksCompleted`]).
    fn blocks_completed(&self, event: &BlocksCompleted) {
        let _ = event;
    }
    /// A transfer ended (see [`TransferEnded`]).
    fn transfer_ended(&self, event: &TransferEnded) {
        let _ = event;
    }
    /// A lane failed (see [`LaneLost`]).
    fn lane_lost(&self, event: &LaneLost) {
        let _ = event;
    }
    /// A wait handed out arrivals (see [`ArrivalsTaken`]).
    fn arrivals_taken(&self, event: &ArrivalsTaken) {
        let _ = event;
    }
}

/// Writes every event as a `tracing` event of target `rdma_hint::engine`: doorbells and
/// completions at `TRACE`, transfers at `DEBUG`, a lost lane at `WARN`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingSubscriber;

impl Subscriber for TracingSubscriber {
    fn doorbell_rung(&self, e: &DoorbellRung) {
        tracing::trace!(target: "rdma_hint::engine", peer = e.peer.index(), lane = e.lane, requests = e.requests,
            bytes = e.bytes, reads = e.reads, refused = ?e.refused, "doorbell rung");
    }
    fn blocks_completed(&self, e: &BlocksCompleted) {
        let (took_ns, bytes_ahead) = e.timing.map(|t| (t.took.as_nanos() as u64, t.bytes_ahead)).unzip();
        tracing::trace!(target: "rdma_hint::engine", peer = e.peer.index(), lane = e.lane, requests = e.requests,
            bytes = e.bytes, reads = e.reads, took_ns, bytes_ahead, "blocks completed");
    }
    fn transfer_ended(&self, e: &TransferEnded) {
        tracing::debug!(target: "rdma_hint::engine", peer = e.peer.index(), bytes = e.bytes, blocks = e.blocks,
            took_ns = e.took.as_nanos() as u64, latency_first = e.latency_first, failed = ?e.failed, "transfer ended");
    }
    fn lane_lost(&self, e: &LaneLost) {
        tracing::warn!(target: "rdma_hint::engine", peer = e.peer.index(), lane = e.lane, error = ?e.error, "lane lost");
    }
    fn arrivals_taken(&self, e: &ArrivalsTaken) {
        tracing::trace!(target: "rdma_hint::engine", peer = e.peer.index(), count = e.count, "arrivals taken");
    }
}
