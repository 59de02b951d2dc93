//! The margins of a good calibration: every figure's interval, and what each ladder size
//! took, measured.

use super::choice::Spread;
use super::rounds::Rounds;
use super::{median, PREDICTION_TAIL, RESAMPLES};
use crate::margins::{LadderTiming, Margins};
use rdma_hint_core::fit::{median_interval, Interval, PathFit};

/// The margins of `fit` from the rounds timed over `sizes` and the spread of their resampled
/// fits.
pub(super) fn margins_of(rounds: &Rounds, sizes: &[(u64, u64)], spread: &Spread, fit: &PathFit) -> Margins {
    let blocks = spread.block_bytes;
    // A stream's blocks after its first: what one more block adds, the stream's median
    // less its first block, over the blocks that follow it.
    let ladder_timings: Vec<LadderTiming> = rounds
        .samples
        .iter()
        .zip(&rounds.singles)
        .zip(sizes)
        .filter_map(|((size, single), &(block, len))| {
            let blocks = (len / block) as f64;
            let after_first = |stream_s: f64, single_s: f64| {
                ((stream_s - single_s) / (blocks - 1.0)).max(stream_s / blocks / 2.0) * 1e6
            };
            let stream_s = size.median()?.seconds_per_block * blocks;
            let single_s = median(&mut single.clone());
            // How sure each median is: the bootstrap interval of it.
            let stream_interval = median_interval(&size.seconds_per_block, RESAMPLES, block)?;
            let single_interval = median_interval(single, RESAMPLES, block)?;
            Some(LadderTiming {
                block_bytes: size.block_bytes,
                stream_us_per_block: after_first(stream_s, single_s),
                single_block_us: single_s * 1e6,
                stream_us_per_block_interval: Interval {
                    low: after_first(stream_interval.low * blocks, single_interval.high),
                    high: after_first(stream_interval.high * blocks, single_interval.low),
                },
                single_block_us_interval: Interval {
                    low: single_interval.low * 1e6,
                    high: single_interval.high * 1e6,
                },
            })
        })
        .collect();
    // Every timed transfer over its size's median, streams and single blocks apart: a
    // transfer's first block strays as one-block transfers did, the rest as streams.
    let ratio = |values: Vec<f64>| {
        Interval::between(&values, PREDICTION_TAIL, 1.0 - PREDICTION_TAIL)
            .unwrap_or(Interval { low: 1.0, high: 1.0 })
    };
    let stream_ratio = ratio(
        rounds
            .samples
            .iter()
            .filter_map(|size| {
                let median = size.median()?.seconds_per_block;
                Some(size.seconds_per_block.iter().map(move |t| t / median))
            })
            .flatten()
            .collect(),
    );
    let single_block_ratio = ratio(
        rounds
            .singles
            .iter()
            .flat_map(|times| {
                let median = median(&mut times.clone());
                times.iter().map(move |t| t / median)
            })
            .collect(),
    );
    Margins {
        fixed_cost_us: spread.fixed_cost_us.including(fit.fixed_cost_us),
        bandwidth_gbps: spread.bandwidth_gbps.including(fit.bandwidth_gbps),
        block_bytes: blocks,
        ladder: ladder_timings,
        stream_ratio,
        single_block_ratio,
        poor_resamples: spread.poor,
    }
}
