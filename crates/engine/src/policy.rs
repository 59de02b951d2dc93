//! How blocks become work requests: batch size per doorbell, signalling, window.

use crate::error::{PlanError, TransferError};
use rdma_hint_core::Capabilities;
use serde::Serialize;

/// Posting policy.
///
/// * `wrs_per_doorbell` (N): work requests per `post_writes` call (NCCL posts 8; perftest's
///   `--post_list` any);
/// * `signal_every` (k): every k-th work request of a doorbell, its last and a transfer's last
///   ask for a completion (perftest's `cq_mod`); one completion retires every request posted
///   before it on its lane;
/// * `window` (W): work requests outstanding at most (bounded by `max_qp_wr` and the CQ).
///
/// W ≥ N and W ≥ k, so a whole batch can always be posted and a signalled request is always
/// outstanding when a transfer waits. W ≥ 2N keeps the queue from draining while it waits.
///
/// ```
/// use rdma_hint_engine::PostPolicy;
/// let policy = PostPolicy::default();
/// assert_eq!((policy.wrs_per_doorbell, policy.signal_every, policy.window), (8, 8, 64));
/// assert!(PostPolicy { window: 4, ..policy }.validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PostPolicy {
    /// Work requests per doorbell (N).
    pub wrs_per_doorbell: u32,
    /// Signal every k-th work request (and the last).
    pub signal_every: u32,
    /// Work requests outstanding at most (W).
    pub window: u32,
}

impl Default for PostPolicy {
    fn default() -> Self {
        PostPolicy { wrs_per_doorbell: 8, signal_every: 8, window: 64 }
    }
}

impl PostPolicy {
    /// Checks the relations between N, k and W.
    pub fn validate(&self) -> Result<(), TransferError> {
        let PostPolicy { wrs_per_doorbell, signal_every, window } = *self;
        if wrs_per_doorbell == 0 || signal_every == 0 || window == 0 {
            return Err(PlanError::InvalidPolicy(format!(
                "wrs_per_doorbell ({wrs_per_doorbell}), signal_every ({signal_every}) and window ({window}) must be at least 1"
            )).into());
        }
        if window < wrs_per_doorbell {
            return Err(PlanError::InvalidPolicy(format!(
                "window {window} is smaller than a batch of {wrs_per_doorbell} work requests"
            ))
            .into());
        }
        if window < signal_every {
            return Err(PlanError::InvalidPolicy(format!(
                "window {window} is smaller than the signalling interval {signal_every}: the pipeline would wait with no completion coming"
            )).into());
        }
        Ok(())
    }

    /// This policy within a transport's limits: N ≤ `max_wrs_per_post`, W ≤
    /// `max_outstanding_wrs`, then k ≤ W.
    pub fn fitted_to(&self, caps: &Capabilities) -> PostPolicy {
        let window = self.window.min(caps.max_outstanding_wrs).max(1);
        let wrs_per_doorbell = self.wrs_per_doorbell.min(caps.max_wrs_per_post).min(window).max(1);
        PostPolicy { wrs_per_doorbell, signal_every: self.signal_every.min(window).max(1), window }
    }

    /// Which of `count` blocks of a transfer on an idle lane ask for a completion, in block
    /// order: in each batch of N, every k-th and the batch's last; and the transfer's last.
    ///
    /// ```
    /// use rdma_hint_engine::PostPolicy;
    /// let policy = PostPolicy { signal_every: 4, ..PostPolicy::default() };
    /// let signalled: Vec<u64> = (0..10).zip(policy.signalled_blocks(10)).filter(|b| b.1).map(|b| b.0).collect();
    /// assert_eq!(signalled, [3, 7, 9]);
    /// ```
    pub fn signalled_blocks(&self, count: u64) -> impl Iterator<Item = bool> {
        let (per_post, every) =
            (u64::from(self.wrs_per_doorbell.max(1)), u64::from(self.signal_every.max(1)));
        (0..count).map(move |index| {
            let in_batch = index % per_post + 1;
            in_batch.is_multiple_of(every) || in_batch == per_post || index + 1 == count
        })
    }

    /// Signalled work requests of a transfer of `count` blocks on an idle lane.
    pub fn signalled_count(&self, count: u64) -> u64 {
        // A batch of n asks for ⌈n / k⌉: the multiples of k, and its last unless it is one.
        let (per_post, every) =
            (u64::from(self.wrs_per_doorbell.max(1)), u64::from(self.signal_every.max(1)));
        count / per_post * per_post.div_ceil(every) + (count % per_post).div_ceil(every)
    }

    /// Batch `batch` of a plan with `count` blocks, as a range of block indices.
    pub fn batch(&self, batch: u64, count: u64) -> std::ops::Range<u64> {
        let start = (batch * u64::from(self.wrs_per_doorbell)).min(count);
        start..self.batch_end(start, count)
    }

    /// The block index one past the batch that starts at block `start` (of `count`).
    pub fn batch_end(&self, start: u64, count: u64) -> u64 {
        (start + u64::from(self.wrs_per_doorbell)).min(count)
    }

    /// Number of batches (doorbells) for `count` blocks.
    pub fn batch_count(&self, count: u64) -> u64 {
        count.div_ceil(u64::from(self.wrs_per_doorbell))
    }
}
