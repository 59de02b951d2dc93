//! How blocks become work requests: batch size per doorbell, signalling, window.

use crate::error::PlanError;
use rdma_hint_transport::Capabilities;
use serde::Serialize;

/// Posting policy.
///
/// * `wrs_per_doorbell` (N): work requests per `post_writes` call (NCCL posts 8; perftest's
///   `--post_list` any);
/// * `signal_every` (k): every k-th block and the last one ask for a completion (perftest's
///   `cq_mod`); one completion retires every block posted before it;
/// * `window` (W): work requests outstanding at most (bounded by `max_qp_wr` and the CQ).
///
/// W ≥ N and W ≥ k, so the pipeline can always post a whole batch and always has a signalled
/// request outstanding when it waits. W ≥ 2k keeps the queue from draining while waiting.
///
/// ```
/// use rdma_hint_chunker::PostPolicy;
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
    pub fn validate(&self) -> Result<(), PlanError> {
        let PostPolicy { wrs_per_doorbell, signal_every, window } = *self;
        if wrs_per_doorbell == 0 || signal_every == 0 || window == 0 {
            return Err(PlanError::InvalidPolicy(format!(
                "wrs_per_doorbell ({wrs_per_doorbell}), signal_every ({signal_every}) and window ({window}) must be at least 1"
            )));
        }
        if window < wrs_per_doorbell {
            return Err(PlanError::InvalidPolicy(format!(
                "window {window} is smaller than a batch of {wrs_per_doorbell} work requests"
            )));
        }
        if window < signal_every {
            return Err(PlanError::InvalidPolicy(format!(
                "window {window} is smaller than the signalling interval {signal_every}: the pipeline would wait with no completion coming"
            )));
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

    /// Whether block `index` of `count` asks for a completion.
    pub fn is_signalled(&self, index: u64, count: u64) -> bool {
        (index + 1) % u64::from(self.signal_every) == 0 || index + 1 == count
    }

    /// Batch `batch` of a plan with `count` blocks, as a range of block indices.
    pub fn batch(&self, batch: u64, count: u64) -> std::ops::Range<u64> {
        let n = u64::from(self.wrs_per_doorbell);
        let start = (batch * n).min(count);
        start..(start + n).min(count)
    }

    /// Number of batches (doorbells) for `count` blocks.
    pub fn batch_count(&self, count: u64) -> u64 {
        count.div_ceil(u64::from(self.wrs_per_doorbell))
    }
}
