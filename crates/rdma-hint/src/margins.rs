//! What a calibration measured at each ladder size, and how uncertain its figures are: what the
//! hint cache keeps beside the fit and what [`estimate`](crate::estimate) reads.

use rdma_hint_core::fit::Interval;
use serde::{Deserialize, Serialize};

/// How uncertain a calibration's figures are: central [`CONFIDENCE`](rdma_hint_core::fit::CONFIDENCE) intervals from
/// [`RESAMPLES`](crate::calibration::RESAMPLES) bootstrap resamples of the interleaved timings, and the spread of single
/// transfers, which [`estimate`](crate::estimate) turns into a time's bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Margins {
    /// Fixed cost per block `o`, in µs.
    pub fixed_cost_us: Interval,
    /// Bandwidth `B`, in GB/s.
    pub bandwidth_gbps: Interval,
    /// The hinted block the resampled fits give, in bytes.
    pub block_bytes: Interval,
    /// What every ladder size took, measured: the table [`estimate`](crate::estimate)
    /// interpolates, by block size.
    pub ladder: Vec<LadderTiming>,
    /// A streaming transfer's time over its size's median, pooled over the sizes: the
    /// [`PREDICTION_TAIL`](crate::calibration::PREDICTION_TAIL) and `1 − PREDICTION_TAIL` quantiles (unitless).
    pub stream_ratio: Interval,
    /// The same for the one-block transfers: how far a transfer's first block strays.
    pub single_block_ratio: Interval,
    /// Resamples whose fit was poor (left out of the intervals).
    pub poor_resamples: usize,
}

/// One ladder size as calibration timed it, medians over the rounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LadderTiming {
    /// Block size in bytes.
    pub block_bytes: u64,
    /// What each block after a stream's first adds to its time, in µs.
    pub stream_us_per_block: f64,
    /// One signalled transfer of one block, post to completion, in µs.
    pub single_block_us: f64,
    /// The bootstrap interval of `stream_us_per_block`, in µs.
    pub stream_us_per_block_interval: Interval,
    /// The bootstrap interval of `single_block_us`, in µs.
    pub single_block_us_interval: Interval,
}
