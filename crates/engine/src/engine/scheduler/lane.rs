//! One lane of a connection as the scheduler sees it: its window, its cap on bytes in flight
//! (following the rate it retires at), its posted requests in sequence order. No transport:
//! the driver rings what the scheduler builds for it.

use super::slot::Posted;
use rdma_hint_core::{Capabilities, GatherEntry, GatherOp, ReadOp, WriteOp, MAX_OPS_PER_POST};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Local ranges one packed work request gathers, at most (below the transport's `max_sges`).
pub(crate) const MAX_PIECES: u32 = 64;

/// The lane settings an engine gives every lane it adds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneConfig {
    pub(crate) policy: crate::policy::PostPolicy,
    pub(crate) bytes_in_flight: u64,
    pub(crate) queue_time: Duration,
    pub(crate) gather_entries: u32,
}

/// One transport of a connection. Its `wr_id`s are its own post sequence numbers; the
/// in-flight queue says which transfer each number belongs to.
pub(crate) struct Lane {
    pub(super) window: u32,
    pub(super) per_post: u32,
    /// Every this many requests of a doorbell asks for a completion (and its last).
    pub(super) signal_every: u32,
    /// The configured cap on payload bytes in flight.
    bytes_in_flight: u64,
    /// How long the bytes in flight may take to drain at the lane's rate (see [`Lane::cap`]).
    queue_time: Duration,
    /// Bytes per second the lane has retired at best lately (a max that decays); 0 until
    /// measured.
    rate: f64,
    /// Bytes retired since the current rate sample began, `window_busy_ns` into the lane's busy
    /// time (time with requests in flight: a sample measures that, not the gaps between
    /// transfers). Kept in nanoseconds: a lone transfer starts and empties its lane each time,
    /// and shifting two instants by every gap cost some 80 instructions a transfer.
    window_bytes: u64,
    window_busy_ns: u64,
    /// The busy time at which the current sample spans enough to be folded (see [`fold_rate`]).
    sample_due_ns: u64,
    /// Busy time before `busy_since`.
    busy_ns: u64,
    /// Since when the lane has had requests in flight (`None` while it stands empty).
    busy_since: Option<Instant>,
    /// A rate sample was taken (the first is dropped: it holds the lane's first posts, which
    /// may map the peer's region).
    sampled: bool,
    /// The peer's control lane: latency-first transfers only, capped by `bytes_in_flight` alone
    /// (its rate is that of lone small transfers, not of the link).
    control: bool,
    /// The largest block posted on the lane.
    largest_block: u64,
    /// [`Lane::cap`], kept as the rate and the largest block change (every doorbell asks for
    /// it, some of them several times).
    cap_bytes: u64,
    pub(super) next_seq: u64,
    pub(super) in_flight: VecDeque<Posted>,
    /// The requests in flight are reads. A lane carries one direction at a time: a signalled
    /// request vouches for every request before it only in its own direction on some
    /// transports (a staged tcp write completes when sent, a read when its answer is back).
    pub(super) reading: bool,
    /// A block of the other direction waits: the lane takes no more of this direction until
    /// its requests in flight retire, then turns (so neither direction starves the other).
    pub(super) switching: bool,
    pub(super) outstanding_bytes: u64,
    pub(super) posted_bytes: u64,
    pub(super) posted_wrs: u64,
    /// When the lane last retired a request, or had none in flight.
    pub(super) progress_at: Instant,
    /// A doorbell of this lane is being rung: no other may be built on it (its sequence
    /// numbers must reach the transport in order).
    pub(super) posting: bool,
    pub(super) dead: Option<String>,
    /// Local ranges one work request may gather on this lane (1: no packing).
    pub(super) max_pieces: u32,
    /// Room for the lane's doorbell (lent to it while it rings: `None` then).
    pub(super) doorbell_ops: Option<Box<DoorbellOps>>,
    /// Requests of a doorbell the transport refused whole, posted again one per doorbell so
    /// that a bad one fails alone (empty but on that failure path).
    pub(super) refused: VecDeque<Refused>,
    /// The gather entries of `refused`, in order.
    pub(super) refused_entries: VecDeque<GatherEntry>,
    /// The refused request a doorbell of this lane posts again while it rings (taken off
    /// `refused`: it is in flight now, and goes back to the front only if the lane refuses
    /// its gather); `Some` says the ringing doorbell is that retry.
    pub(super) retrying: Option<Refused>,
    /// The transport last answered `QueueFull` (its queue, or the peer's, had no room): the
    /// requests it refused wait in `refused` until then, and no new doorbell overtakes them.
    pub(super) full_until: Option<Instant>,
    /// How long the lane waits after its next `QueueFull`: doubled by each in a row, from
    /// [`FIRST_BACKOFF`] to [`LAST_BACKOFF`]; zero once a post is taken.
    backoff: Duration,
    /// While the engine has subscribers, a [`Stamp`] per doorbell in flight, oldest first
    /// (`None` otherwise).
    pub(super) stamps: Option<VecDeque<Stamp>>,
}

/// When a doorbell was built and what was in flight ahead of it: what a completion's
/// post-to-completion time and queueing are read from, for subscribers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    /// The doorbell's sequence numbers, first to last.
    pub(super) first_seq: u64,
    pub(super) last_seq: u64,
    pub(super) at: Instant,
    pub(super) bytes_ahead: u64,
}

/// The first wait after a transport's `QueueFull`: about what a peer polling in a loop takes
/// to make room.
const FIRST_BACKOFF: Duration = Duration::from_micros(16);
/// The longest wait between two tries on a full queue (a peer that stalls for long leaves the
/// transfers to their deadlines, not to the lane).
const LAST_BACKOFF: Duration = Duration::from_millis(1);

/// A request of a refused doorbell, waiting to be posted alone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refused {
    pub(super) op: WriteOp,
    /// It is a read (`op` holds its fields).
    pub(super) read: bool,
    /// Local ranges it gathers (its entries lead `refused_entries`).
    pub(super) pieces: u32,
    pub(super) posted: Posted,
}

impl Lane {
    pub(super) fn new(caps: &Capabilities, config: &LaneConfig, now: Instant) -> Lane {
        let policy = config.policy.fitted_to(caps);
        // A packed request the lane must split (a transport that refuses its gathers) goes as
        // one post of its pieces, which must fit one.
        let max_pieces = caps.max_sges.clamp(1, config.gather_entries).min(caps.max_wrs_per_post.max(1));
        Lane {
            window: policy.window,
            per_post: policy.wrs_per_doorbell,
            signal_every: policy.signal_every.max(1),
            bytes_in_flight: config.bytes_in_flight,
            queue_time: config.queue_time,
            rate: 0.0,
            window_bytes: 0,
            window_busy_ns: 0,
            // Saturated: the chunker's lanes have no queue time (`Duration::MAX`).
            sample_due_ns: nanos(shortest_sample(config.queue_time)),
            busy_ns: 0,
            busy_since: Some(now),
            sampled: false,
            control: false,
            largest_block: 0,
            cap_bytes: config.bytes_in_flight,
            next_seq: 1,
            in_flight: VecDeque::with_capacity(policy.window as usize),
            reading: false,
            switching: false,
            outstanding_bytes: 0,
            posted_bytes: 0,
            posted_wrs: 0,
            progress_at: now,
            posting: false,
            dead: None,
            max_pieces,
            doorbell_ops: Some(DoorbellOps::new(max_pieces)),
            refused: VecDeque::new(),
            refused_entries: VecDeque::new(),
            retrying: None,
            full_until: None,
            backoff: Duration::ZERO,
            stamps: None,
        }
    }

    /// Payload bytes the lane may have in flight now: what drains in `queue_time` at its
    /// measured rate (so work submitted now waits about that long behind it), at least two of
    /// its largest blocks (one landing while the next is sent), at most the configured cap.
    pub(super) fn cap(&self) -> u64 {
        self.cap_bytes
    }

    fn refresh_cap(&mut self) {
        self.cap_bytes = if self.control {
            self.bytes_in_flight
        } else {
            cap(self.rate, self.queue_time, self.largest_block, self.bytes_in_flight)
        };
    }

    /// Makes it the peer's control lane (see [`Lane::cap`]).
    pub(super) fn make_control(&mut self) {
        self.control = true;
        self.refresh_cap();
    }

    /// A block of `len` bytes is posted on the lane.
    pub(super) fn note_block(&mut self, len: u64) {
        if len > self.largest_block {
            self.largest_block = len;
            self.refresh_cap();
        }
    }

    /// Whether another doorbell of `batch_bytes` may grow (one block always goes out).
    pub(super) fn has_room(&self, batch_bytes: u64) -> bool {
        self.outstanding_bytes + batch_bytes < self.cap() || self.in_flight.is_empty()
    }

    /// Whether a doorbell of new blocks may be built on the lane now (none overtakes a
    /// refused request: a transfer's notifying block must not land before its others).
    pub(super) fn available(&self) -> bool {
        self.dead.is_none()
            && !self.posting
            && self.refused.is_empty()
            && self.in_flight.len() < self.window as usize
            && self.has_room(0)
    }

    /// A refused request waits to be posted again (now, or once the lane's wait on a full
    /// queue ends).
    pub(super) fn has_refused(&self) -> bool {
        !self.refused.is_empty() && self.dead.is_none()
    }

    /// A refused request waits to be posted again, and the lane may take it at `now`.
    pub(super) fn retry_ready(&self, now: Instant) -> bool {
        self.has_refused() && !self.posting && self.full_until.is_none_or(|at| now >= at)
    }

    /// When the lane's wait on a full queue ends, while a refused request waits for it.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.full_until.filter(|_| self.has_refused())
    }

    /// The transport answered `QueueFull` at `now`: the lane waits before it tries again,
    /// twice as long as the last time in a row.
    pub(super) fn back_off(&mut self, now: Instant) {
        self.backoff = (self.backoff * 2).clamp(FIRST_BACKOFF, LAST_BACKOFF);
        self.full_until = Some(now + self.backoff);
    }

    /// The transport took a post: the next `QueueFull` waits the shortest time again.
    pub(super) fn took_a_post(&mut self) {
        if self.full_until.is_some() {
            (self.full_until, self.backoff) = (None, Duration::ZERO);
        }
    }

    /// Observed: remembers the doorbell just sealed on this lane (its numbers `first_seq` to
    /// `last_seq`, and its `bytes`, taken), built `at`. Values, not the doorbell: a doorbell
    /// whose address is taken leaves the registers on the path without subscribers too.
    #[inline]
    pub(super) fn stamp(&mut self, (first_seq, last_seq): (u64, u64), at: Instant, bytes: u64) {
        if self.stamps.is_some() {
            self.push_stamp((first_seq, last_seq), at, bytes);
        }
    }

    /// Out of line: a doorbell's path without subscribers stays as it was.
    #[cold]
    #[inline(never)]
    fn push_stamp(&mut self, (first_seq, last_seq): (u64, u64), at: Instant, bytes: u64) {
        let bytes_ahead = self.outstanding_bytes - bytes;
        if let Some(stamps) = &mut self.stamps {
            stamps.push_back(Stamp { first_seq, last_seq, at, bytes_ahead });
        }
    }

    /// A doorbell the transport refused whole gives its numbers back: its stamp goes too (the
    /// requests are stamped again when they are posted again).
    pub(super) fn unstamp(&mut self, first_seq: u64) {
        if let Some(stamps) = &mut self.stamps {
            if stamps.back().is_some_and(|stamp| stamp.first_seq == first_seq) {
                stamps.pop_back();
            }
        }
    }

    /// The stamp of the doorbell that posted request `seq` (`None` for a request posted
    /// before the lane was observed), dropping those of doorbells wholly before it (and its
    /// own, when `seq` is its last).
    pub(super) fn stamp_of(&mut self, seq: u64) -> Option<Stamp> {
        let stamps = self.stamps.as_mut()?;
        while stamps.front().is_some_and(|stamp| stamp.last_seq < seq) {
            stamps.pop_front();
        }
        let stamp = *stamps.front().filter(|stamp| stamp.first_seq <= seq)?;
        if stamp.last_seq == seq {
            stamps.pop_front();
        }
        Some(stamp)
    }

    /// From now on each doorbell leaves a stamp (room for a window of them).
    pub(super) fn observe(&mut self) {
        if self.stamps.is_none() {
            self.stamps = Some(VecDeque::with_capacity(self.window as usize));
        }
    }

    /// The lane starts a doorbell while empty: neither the wait for a stall nor a rate sample
    /// counts the time it stood idle.
    pub(super) fn wake_up(&mut self, now: Instant) {
        if self.in_flight.is_empty() {
            self.progress_at = now;
            self.busy_since.get_or_insert(now);
        }
    }

    /// Counts `bytes` retired at `now` into the rate and the stall watch.
    pub(super) fn retired(&mut self, bytes: u64, now: Instant) {
        self.progress_at = now;
        self.window_bytes += bytes;
        let busy_for = self.busy_since.map_or(0, |since| nanos(now.saturating_duration_since(since)));
        let busy = self.busy_ns.saturating_add(busy_for);
        if busy >= self.sample_due_ns {
            let window = (self.window_bytes, Duration::from_nanos(busy - self.window_busy_ns));
            if let Some(rate) = fold_rate(self.rate, window, self.queue_time) {
                if self.sampled {
                    self.rate = rate;
                    self.refresh_cap();
                }
                self.sampled = true;
                (self.window_bytes, self.window_busy_ns) = (0, busy);
                self.sample_due_ns = busy.saturating_add(nanos(shortest_sample(self.queue_time)));
            }
        }
        if self.in_flight.is_empty() {
            (self.busy_ns, self.busy_since) = (busy, None);
        }
    }
}

/// `duration` in whole nanoseconds, saturated (584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// [`Lane::cap`] of a lane retiring `rate` bytes per second (0: not measured yet).
pub(super) fn cap(rate: f64, queue_time: Duration, largest_block: u64, configured: u64) -> u64 {
    if rate == 0.0 {
        return configured;
    }
    let drains = (rate * queue_time.as_secs_f64()) as u64;
    drains.max(largest_block.saturating_mul(2)).min(configured)
}

/// Folds a window of `bytes` retired over `took` into the lane's `rate`, once the window
/// spans at least a quarter of the queue time (completions drained by one poll arrive
/// nanoseconds apart and would read as terabytes per second). Every bias left is downward (a
/// lane held back by its cap, or by a sender with little to send, retires less than it
/// could), so the rate is the best sample, decaying slowly toward what the lane delivers now.
pub(super) fn fold_rate(rate: f64, (bytes, took): (u64, Duration), queue_time: Duration) -> Option<f64> {
    if bytes == 0 || took < shortest_sample(queue_time) {
        return None;
    }
    let sample = bytes as f64 / took.as_secs_f64();
    Some(sample.max(rate * RATE_DECAY))
}

/// The shortest window a rate sample spans: a quarter of the queue time, at least 20 µs.
fn shortest_sample(queue_time: Duration) -> Duration {
    (queue_time / 4).max(Duration::from_micros(20))
}

/// What a lane's best rate keeps of itself per sample (halves in about 14 samples).
const RATE_DECAY: f64 = 0.95;

/// The live lane with room and the fewest outstanding bytes; ties go round, starting after
/// `last` (a channel that completes inside the post always has none outstanding). A lane
/// whose transport answered `QueueFull` and has taken no post since goes last: it has no
/// bytes outstanding, and would otherwise take every doorbell only to hold it.
pub(super) fn pick_lane(lanes: &[Lane], last: usize) -> Option<usize> {
    if let [only] = lanes {
        return only.available().then_some(0);
    }
    let count = lanes.len();
    (1..=count)
        .map(|step| ((last + step) % count, &lanes[(last + step) % count]))
        .filter(|(_, lane)| lane.available())
        .min_by_key(|(_, lane)| (lane.full_until.is_some(), lane.outstanding_bytes))
        .map(|(index, _)| index)
}

/// What one lane of a connection has carried.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaneStats {
    /// Payload bytes posted on the lane so far.
    pub posted_bytes: u64,
    /// Work requests posted on the lane so far.
    pub posted_wrs: u64,
    /// Bytes posted and not yet completed.
    pub outstanding_bytes: u64,
    /// Why the lane stopped, if it failed.
    pub failed: Option<String>,
}

/// A lane's room for one doorbell's work requests and the forms its call takes, allocated
/// with the lane and reused: building and ringing a doorbell neither allocates nor clears it
/// (a doorbell reads only its first `count` entries, each written as it is built).
pub(crate) struct DoorbellOps {
    /// A packed request's entry here holds its first piece's local range and its whole
    /// remote range and length.
    pub(super) writes: [WriteOp; MAX_OPS_PER_POST],
    /// Per request, its local ranges in `entries` (on lanes that pack).
    pub(super) pieces: [u32; MAX_OPS_PER_POST],
    /// The gather entries of every request, in order; empty on lanes that do not pack.
    pub(super) entries: Vec<GatherEntry>,
    pub(super) gathers: [GatherOp; MAX_OPS_PER_POST],
    pub(super) reads: [ReadOp; MAX_OPS_PER_POST],
}

impl DoorbellOps {
    /// Room for a lane that packs up to `max_pieces` ranges a request.
    pub(super) fn new(max_pieces: u32) -> Box<DoorbellOps> {
        let entries = if max_pieces > 1 {
            Vec::with_capacity(MAX_OPS_PER_POST * max_pieces as usize)
        } else {
            Vec::new()
        };
        Box::new(DoorbellOps {
            writes: [WriteOp::EMPTY; MAX_OPS_PER_POST],
            pieces: [1; MAX_OPS_PER_POST],
            entries,
            gathers: [GatherOp::EMPTY; MAX_OPS_PER_POST],
            reads: [ReadOp::EMPTY; MAX_OPS_PER_POST],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{cap, fold_rate, Lane, LaneConfig};
    use crate::engine::scheduler::slot::Posted;
    use std::time::Duration;

    #[test]
    fn a_lane_measures_its_rate_over_the_time_it_was_busy_not_the_gaps_between_transfers() {
        let config = LaneConfig {
            policy: crate::policy::PostPolicy::default(),
            bytes_in_flight: 64 << 20,
            queue_time: Duration::from_micros(200),
            gather_entries: 1,
        };
        let start = crate::engine::scheduler::tests::clock();
        let mut lane = Lane::new(&crate::engine::scheduler::tests::caps(1), &config, start);
        let at = |micros: u64| start + Duration::from_micros(micros);
        // Each round: 100 KB in flight for 10 us (10 GB/s busy), then 1 ms with nothing in
        // flight. The first sample is dropped (a lane's first posts may map the peer's region).
        for round in 0..20 {
            let began = 1010 * round;
            lane.wake_up(at(began));
            lane.in_flight.push_back(Posted { seq: round + 1, slot: 0, generation: 0, bytes: 100_000 });
            lane.in_flight.pop_front();
            lane.retired(100_000, at(began + 10));
        }
        // Counted over wall time it would read 0.1 GB/s.
        assert!((lane.rate - 1e10).abs() < 1e6, "{} B/s", lane.rate);
    }

    #[test]
    fn a_packed_request_has_no_more_pieces_than_one_post_takes() {
        // Split into its pieces (a transport that refuses gathers), it must still fit a post:
        // a larger one would be answered `QueueFull` at every try.
        let mut caps = crate::engine::scheduler::tests::caps(32);
        caps.max_wrs_per_post = 4;
        let config = LaneConfig {
            policy: crate::policy::PostPolicy::default(),
            bytes_in_flight: 1 << 20,
            queue_time: Duration::from_micros(200),
            gather_entries: 64,
        };
        let lane = Lane::new(&caps, &config, crate::engine::scheduler::tests::clock());
        assert_eq!(lane.max_pieces, 4);
    }

    #[test]
    fn a_rate_sample_spans_a_quarter_of_the_queue_time_and_the_best_one_decays_slowly() {
        let queue = Duration::from_micros(200);
        // Completions one poll drains arrive nanoseconds apart: no sample until 50 us passed.
        assert_eq!(fold_rate(0.0, (256 << 10, Duration::from_nanos(80)), queue), None);
        assert_eq!(fold_rate(0.0, (0, Duration::from_millis(1)), queue), None);
        let first = fold_rate(0.0, (1_000_000, Duration::from_micros(100)), queue).unwrap();
        assert_eq!(first, 1e10);
        // A slower window (held back by the cap, or little to send) lowers it only slowly.
        let after = fold_rate(first, (100_000, Duration::from_micros(100)), queue).unwrap();
        assert_eq!(after, 0.95e10);
        assert_eq!(fold_rate(after, (4_000_000, Duration::from_micros(100)), queue), Some(4e10));
    }

    #[test]
    fn the_bytes_in_flight_follow_the_rate_between_two_blocks_and_the_configured_cap() {
        let queue = Duration::from_micros(200);
        let (block, configured) = (64 << 10, 2 << 20);
        assert_eq!(cap(0.0, queue, block, configured), configured, "unmeasured: the configured cap");
        assert_eq!(cap(5e9, queue, block, configured), 1_000_000, "5 GB/s drains 1 MB in 200 us");
        assert_eq!(cap(1e8, queue, block, configured), 2 * block, "never below two blocks");
        assert_eq!(cap(1e11, queue, block, configured), configured, "never above the configured cap");
    }
}
