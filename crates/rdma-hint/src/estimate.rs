//! What a transfer will cost: the predicted time of `len` bytes at the hint, with a low and a
//! high bound from the calibration's margins, for an embedder to plan with.
//!
//! The prediction is read off what calibration measured, not off the fitted line (a gradual
//! curve bends away from it): a transfer's first block costs what one signalled block of that
//! size took post to completion, every further block what a block of the hint's size took
//! while streaming, both interpolated between the ladder's sizes (log-linearly in the block
//! size; beyond the largest, per byte). The bounds widen each part by how far calibration's
//! own transfers strayed from their size's median (1st and 99th percentiles): a bound for one
//! transfer, not for the average of many.
//!
//! A machine's level also moves from one process and one minute to the next (the 2-core VM's
//! UCX shm transfers ran at 0.91 of their calibration's medians in some runs and 0.96–1.04 in
//! others; the H200 host's shm level moves with a raw `memcpy`'s), which no single
//! calibration's own spread shows. Where the pair's stored calibration pools earlier ones
//! ([`POOLED_CALIBRATIONS`](crate::calibration::POOLED_CALIBRATIONS) of the last day), each
//! predicts the transfer: the estimate is their median, its bounds the lowest low and the
//! highest high, so they span the levels the pair has been seen at.

use crate::error::Error;
use crate::margins::{LadderTiming, Margins};
use crate::measured;
use crate::open::TransportId;
use crate::Device;
use rdma_hint_core::{HintPolicy, Origin, TransportError};
use serde::Serialize;

/// The predicted time of one transfer, with its bounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Estimate {
    /// Bytes of the transfer.
    pub len_bytes: u64,
    /// The block it is cut into (the hint's), in bytes.
    pub block_bytes: u64,
    /// Where that block comes from (a recorded knee, the calibration or the model).
    pub origin: Origin,
    /// Blocks the transfer is cut into.
    pub blocks: u64,
    /// Predicted time, in seconds.
    pub seconds: f64,
    /// Fastest time the margins allow, in seconds.
    pub low_seconds: f64,
    /// Slowest time the margins allow, in seconds.
    pub high_seconds: f64,
    /// The bandwidth the predicted time implies, in GB/s.
    pub gbps: f64,
    /// The bandwidth of `high_seconds`, in GB/s.
    pub low_gbps: f64,
    /// The bandwidth of `low_seconds`, in GB/s.
    pub high_gbps: f64,
    /// Calibrations of the pair the estimate pools (the stored one and the earlier ones it
    /// pools that have margins).
    pub pooled_calibrations: usize,
}

/// The predicted time of a transfer of `len` bytes from `device` over `transport`, cut at the
/// hint [`hint_set`](crate::calibration::hint_set) chooses, with bounds from the stored calibration's
/// margins. [`Error::NotCalibrated`] until `rdma-hint calibrate` (or
/// [`calibrate`](fn@crate::calibrate)) stored one for the pair; zero bytes is an
/// invalid argument.
///
/// ```
/// use rdma_hint::{estimate, Device, OpenOptions, TransportId};
/// use rdma_hint::calibration::calibrate_loopback;
/// use std::time::Duration;
/// # let cache = std::env::temp_dir().join(format!("rdma-hint-doc-estimate-{}", std::process::id()));
/// # std::env::set_var("RDMA_HINT_CACHE_DIR", &cache);
/// let id = TransportId::STAGED_SHM;
/// // Generous: an idle machine ends at the most rounds long before it, a busy one still fits
/// // the fewest.
/// let calibration = calibrate_loopback(&id, Device::Host(0), &OpenOptions::default(), Duration::from_secs(20))?;
/// match estimate(1 << 30, Device::Host(0), &id) {
///     Ok(one_gib) => {
///         assert!(one_gib.low_seconds <= one_gib.seconds && one_gib.seconds <= one_gib.high_seconds);
///         println!("1 GiB: {:.1} ms ({:.1}…{:.1}), {:.2} GB/s", one_gib.seconds * 1e3,
///                  one_gib.low_seconds * 1e3, one_gib.high_seconds * 1e3, one_gib.gbps);
///     }
///     // A poor fit (a busy machine's, say) is not kept: nothing to estimate from yet.
///     Err(rdma_hint::Error::NotCalibrated { .. }) => assert!(calibration.stored_in.is_none()),
///     Err(other) => return Err(other),
/// }
/// # let _ = std::fs::remove_dir_all(&cache);
/// # Ok::<(), rdma_hint::Error>(())
/// ```
pub fn estimate(len: u64, device: Device, transport: &TransportId) -> Result<Estimate, Error> {
    if len == 0 {
        return Err(Error::Transport(TransportError::InvalidArgument {
            what: "estimate",
            why: "a transfer of 0 bytes takes no time to estimate; give at least 1 byte".into(),
        }));
    }
    crate::open::compiled_in(transport)?;
    let profile = crate::profile_of(device, transport)?;
    let file = measured::cache_file();
    let not_calibrated = || Error::NotCalibrated { device, transport: transport.clone() };
    let calibration = file
        .as_deref()
        .and_then(|file| measured::lookup_calibration(file, device, transport, &profile.versions))
        .ok_or_else(not_calibrated)?;
    let newest = calibration.margins.as_ref().filter(|m| !m.ladder.is_empty()).ok_or_else(not_calibrated)?;
    let hints = measured::hint_set(&profile, &HintPolicy::default(), file.as_deref())?;
    let hint = hints.chosen();
    let estimates = calibration
        .earlier
        .iter()
        .filter_map(|earlier| earlier.margins.as_ref().filter(|m| !m.ladder.is_empty()))
        .chain([newest])
        .map(|margins| predict(len, hint.block_bytes, hint.origin, margins))
        .collect();
    Ok(pooled(estimates))
}

/// The estimate of a pool of calibrations, from each one's (`estimates`, not empty): the
/// median prediction, the lowest low and the highest high bound.
fn pooled(mut estimates: Vec<Estimate>) -> Estimate {
    let count = estimates.len();
    let low_seconds = estimates.iter().map(|e| e.low_seconds).fold(f64::INFINITY, f64::min);
    let high_seconds = estimates.iter().map(|e| e.high_seconds).fold(0.0, f64::max);
    let mut predictions: Vec<f64> = estimates.iter().map(|e| e.seconds).collect();
    let seconds = rdma_hint_core::fit::median(&mut predictions).unwrap_or(f64::NAN);
    Estimate { pooled_calibrations: count, ..estimates.swap_remove(0) }.timed(
        seconds,
        low_seconds,
        high_seconds,
    )
}

impl Estimate {
    /// This estimate with these times (seconds) and the bandwidths they imply.
    fn timed(self, seconds: f64, low_seconds: f64, high_seconds: f64) -> Estimate {
        let gbps_of = |seconds: f64| self.len_bytes as f64 / seconds / 1e9;
        Estimate {
            seconds,
            low_seconds,
            high_seconds,
            gbps: gbps_of(seconds),
            low_gbps: gbps_of(high_seconds),
            high_gbps: gbps_of(low_seconds),
            ..self
        }
    }
}

/// `value(t)` at `block` bytes on `ladder` (ascending): log-linear between neighbours, the
/// smallest size's below it, per byte beyond the largest.
fn interpolate(ladder: &[LadderTiming], block: u64, value: impl Fn(&LadderTiming) -> f64) -> f64 {
    let (first, last) = (ladder[0], ladder[ladder.len() - 1]);
    if block <= first.block_bytes {
        return value(&first);
    }
    if block >= last.block_bytes {
        return value(&last) * block as f64 / last.block_bytes as f64;
    }
    let upper = ladder.iter().position(|t| t.block_bytes >= block).unwrap_or(ladder.len() - 1);
    let (below, above) = (ladder[upper - 1], ladder[upper]);
    let at = ((block as f64).ln() - (below.block_bytes as f64).ln())
        / ((above.block_bytes as f64).ln() - (below.block_bytes as f64).ln());
    value(&below) + at * (value(&above) - value(&below))
}

/// The arithmetic of [`estimate`].
fn predict(len: u64, block: u64, origin: Origin, margins: &Margins) -> Estimate {
    let blocks = len.div_ceil(block);
    let first = len.min(block);
    let further_blocks = len.saturating_sub(block) as f64 / block as f64;
    let part = |single: fn(&LadderTiming) -> f64, stream: fn(&LadderTiming) -> f64| {
        (
            interpolate(&margins.ladder, first, single) * 1e-6,
            further_blocks * interpolate(&margins.ladder, block, stream) * 1e-6,
        )
    };
    let (first_seconds, stream_seconds) = part(|t| t.single_block_us, |t| t.stream_us_per_block);
    let seconds = first_seconds + stream_seconds;
    // Each bound: the medians' own bootstrap interval, widened by how far single transfers
    // strayed from their median.
    let (single, streams) = (margins.single_block_ratio, margins.stream_ratio);
    let (first_low, stream_low) =
        part(|t| t.single_block_us_interval.low, |t| t.stream_us_per_block_interval.low);
    let (first_high, stream_high) =
        part(|t| t.single_block_us_interval.high, |t| t.stream_us_per_block_interval.high);
    let low_seconds = (first_low * single.low + stream_low * streams.low).min(seconds);
    let high_seconds = (first_high * single.high + stream_high * streams.high).max(seconds);
    let untimed = Estimate {
        len_bytes: len,
        block_bytes: block,
        origin,
        blocks,
        seconds: 0.0,
        low_seconds: 0.0,
        high_seconds: 0.0,
        gbps: 0.0,
        low_gbps: 0.0,
        high_gbps: 0.0,
        pooled_calibrations: 1,
    };
    untimed.timed(seconds, low_seconds, high_seconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_hint_core::fit::Interval;

    fn margins() -> Margins {
        let timing = |block_bytes: u64, stream_us_per_block: f64, single_block_us: f64| LadderTiming {
            block_bytes,
            stream_us_per_block,
            single_block_us,
            stream_us_per_block_interval: Interval { low: stream_us_per_block, high: stream_us_per_block },
            single_block_us_interval: Interval { low: single_block_us, high: single_block_us },
        };
        Margins {
            fixed_cost_us: Interval { low: 1.0, high: 3.0 },
            bandwidth_gbps: Interval { low: 8.0, high: 12.0 },
            block_bytes: Interval { low: 65536.0, high: 131072.0 },
            ladder: vec![timing(4096, 1.0, 5.0), timing(16384, 2.0, 7.0), timing(65536, 8.0, 20.0)],
            stream_ratio: Interval { low: 0.9, high: 1.2 },
            single_block_ratio: Interval { low: 0.8, high: 1.5 },
            poor_resamples: 0,
        }
    }

    #[test]
    fn one_block_costs_a_single_block_and_more_stream() {
        let one = predict(65536, 65536, Origin::Calibrated, &margins());
        assert_eq!(one.blocks, 1);
        assert!((one.seconds - 20e-6).abs() < 1e-12, "{one:?}");
        assert!((one.low_seconds - 16e-6).abs() < 1e-12 && (one.high_seconds - 30e-6).abs() < 1e-12);
        // Between two ladder sizes, log-linearly: 8 KiB lies halfway from 4 to 16 KiB.
        let small = predict(8192, 65536, Origin::Calibrated, &margins());
        assert!((small.seconds - 6e-6).abs() < 1e-12, "{small:?}");
        // 1 GiB: the first block, then 16 383 streamed at 8 µs each.
        let big = predict(1 << 30, 65536, Origin::Calibrated, &margins());
        assert!((big.seconds - (20e-6 + 16383.0 * 8e-6)).abs() < 1e-9, "{big:?}");
        assert!(big.low_seconds < big.seconds && big.seconds < big.high_seconds);
        assert!(big.low_gbps < big.gbps && big.gbps < big.high_gbps);
        // Beyond the ladder, per byte: a 256 KiB block streams at 4 × 8 µs.
        let beyond = predict(1 << 20, 256 << 10, Origin::Measured, &margins());
        assert!((beyond.seconds - (80e-6 + 3.0 * 32e-6)).abs() < 1e-9, "{beyond:?}");
    }

    #[test]
    fn a_pool_answers_the_median_and_spans_every_bound() {
        let scaled = |factor: f64| {
            let mut margins = margins();
            for step in &mut margins.ladder {
                step.stream_us_per_block *= factor;
                step.single_block_us *= factor;
                for interval in [&mut step.stream_us_per_block_interval, &mut step.single_block_us_interval] {
                    interval.low *= factor;
                    interval.high *= factor;
                }
            }
            predict(1 << 20, 65536, Origin::Calibrated, &margins)
        };
        let (slow, middle, fast) = (scaled(1.3), scaled(1.0), scaled(0.8));
        let pool = pooled(vec![slow.clone(), middle.clone(), fast.clone()]);
        assert_eq!(pool.pooled_calibrations, 3);
        assert!((pool.seconds - middle.seconds).abs() < 1e-15, "{pool:?}");
        assert!((pool.low_seconds - fast.low_seconds).abs() < 1e-15, "{pool:?}");
        assert!((pool.high_seconds - slow.high_seconds).abs() < 1e-15, "{pool:?}");
        assert!(pool.low_gbps < pool.gbps && pool.gbps < pool.high_gbps);
        // Two: the middle of the two predictions, and one alone is itself.
        let two = pooled(vec![slow.clone(), fast.clone()]);
        assert!((two.seconds - (slow.seconds + fast.seconds) / 2.0).abs() < 1e-15);
        assert_eq!(pooled(vec![middle.clone()]), middle);
    }

    #[test]
    fn a_partial_last_block_is_one_more_block() {
        let estimate = predict(65536 * 3 + 1, 65536, Origin::Measured, &margins());
        assert_eq!(estimate.blocks, 4);
    }
}
