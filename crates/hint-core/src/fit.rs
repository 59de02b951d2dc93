//! Calibration: fitting `t(s) = o + s/B` to per-block times measured on the live path, and the
//! robust statistics a block-size curve is judged by (plateau, knee).
//!
//! The fit is least squares on per-block time with each point weighted by `1/t`: unweighted,
//! the largest blocks' microseconds of noise would swamp `o`; weighted by `1/t²` (relative
//! error), the smallest blocks would set `B`. `o` is where the line meets `s = 0`. Two kinds of points fall outside
//! the model's shape and are dropped before and during the fit, each with its reason:
//!
//! * a block past the end of the plateau that moves below [`FALLOFF_SHARE`] of the robust
//!   plateau: the model's bandwidth never falls with size, a cache or ring limit does;
//! * a point the line misses by more than [`OUTLIER_RELATIVE_ERROR`] of its time, worst first
//!   (small blocks of a curve that rises more gradually than `o + s/B`, noise).
//!
//! A fit is *poor* when fewer than [`MIN_KEPT`] points remain, when it keeps less than half of
//! them, when `o` or `B` is not positive, or when R² on the kept points is below [`MIN_R2`].
//!
//! ```
//! use rdma_hint_core::fit::{fit_path, BlockTiming};
//! // A path with o = 2 µs and B = 10 GB/s, measured exactly.
//! let timings: Vec<BlockTiming> = (12..=22)
//!     .map(|log2| {
//!         let block_bytes = 1u64 << log2;
//!         BlockTiming { block_bytes, seconds_per_block: 2e-6 + block_bytes as f64 / 10e9 }
//!     })
//!     .collect();
//! let fit = fit_path(&timings).unwrap();
//! assert!((fit.fixed_cost_us - 2.0).abs() < 1e-6);
//! assert!((fit.bandwidth_gbps - 10.0).abs() < 1e-6);
//! assert!(fit.poor.is_none());
//! ```

use serde::{Deserialize, Serialize};

/// A block slower than this share of the best smaller block's bandwidth is past the plateau.
pub const FALLOFF_SHARE: f64 = 0.95;
/// A kept point's time may differ from the line by at most this share of it.
pub const OUTLIER_RELATIVE_ERROR: f64 = 0.25;
/// A negative intercept this close to zero (as a share of the smallest block's time) is a flat
/// curve whose line cannot resolve `o`; `o` is then read off the three smallest blocks (the
/// median of their time beyond `s/B`).
pub const FLAT_INTERCEPT_SHARE: f64 = 0.25;
/// Fewest points a fit keeps.
pub const MIN_KEPT: usize = 3;
/// Lowest R² (weighted like the fit, on per-block time of the kept points) of a good fit.
pub const MIN_R2: f64 = 0.95;

/// The typical per-block time at one block size (a median of several timed transfers).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BlockTiming {
    /// Block size in bytes.
    pub block_bytes: u64,
    /// Wall time per block while streaming, in seconds.
    pub seconds_per_block: f64,
}

impl BlockTiming {
    /// Streaming bandwidth at this block size, in GB/s.
    pub fn gbps(&self) -> f64 {
        self.block_bytes as f64 / self.seconds_per_block / 1e9
    }
}

/// A point the fit left out, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DroppedPoint {
    /// Block size in bytes.
    pub block_bytes: u64,
    /// Why it was left out.
    pub why: String,
}

/// The fitted path: `o`, `B`, and how well the line describes the points.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathFit {
    /// Fixed cost per block `o`, in µs.
    pub fixed_cost_us: f64,
    /// Bandwidth `B`, in GB/s.
    pub bandwidth_gbps: f64,
    /// R² of the line on the kept points' per-block times.
    pub r2: f64,
    /// Largest relative difference between a kept point's time and the line.
    pub max_relative_error: f64,
    /// Block sizes the line was fitted to, in bytes.
    pub kept_bytes: Vec<u64>,
    /// Points left out, with reasons.
    pub dropped: Vec<DroppedPoint>,
    /// Blocks smaller than every kept one were left out for being off the line: the curve
    /// bends more gradually than `o + s/B`, so its knee lies further out than the line's. A
    /// dip (a point off the line with kept blocks on both sides) does not count.
    pub gradual: bool,
    /// Why the fit should not be trusted, if it should not.
    pub poor: Option<String>,
}

/// Why no line could be fitted at all.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    /// Fewer distinct block sizes than a line needs.
    #[error("a fit needs at least {MIN_KEPT} distinct block sizes, got {0}")]
    TooFewSizes(usize),
    /// A timing that is not a positive finite number, or a zero block.
    #[error("block {block_bytes} B: {seconds} s per block is not a positive time")]
    InvalidTiming {
        /// Block size in bytes.
        block_bytes: u64,
        /// The offending time.
        seconds: f64,
    },
}

/// Weighted least squares `t = a + b·s` over `points`, each weighted by `1/t` (see the
/// [module](self) docs); `None` when all sizes are equal.
fn least_squares(points: &[BlockTiming]) -> Option<(f64, f64)> {
    let weight = |p: &BlockTiming| 1.0 / p.seconds_per_block;
    let total: f64 = points.iter().map(weight).sum();
    let mean_s = points.iter().map(|p| weight(p) * p.block_bytes as f64).sum::<f64>() / total;
    let mean_t = points.iter().map(|p| weight(p) * p.seconds_per_block).sum::<f64>() / total;
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for p in points {
        let ds = p.block_bytes as f64 - mean_s;
        sxx += weight(p) * ds * ds;
        sxy += weight(p) * ds * (p.seconds_per_block - mean_t);
    }
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    Some((mean_t - slope * mean_s, slope))
}

fn r_squared(points: &[BlockTiming], intercept: f64, slope: f64) -> f64 {
    let weight = |p: &BlockTiming| 1.0 / p.seconds_per_block;
    let sum: f64 = points.iter().map(weight).sum();
    let mean_t = points.iter().map(|p| weight(p) * p.seconds_per_block).sum::<f64>() / sum;
    let (mut residual, mut total) = (0.0, 0.0);
    for p in points {
        let predicted = intercept + slope * p.block_bytes as f64;
        residual += weight(p) * (p.seconds_per_block - predicted).powi(2);
        total += weight(p) * (p.seconds_per_block - mean_t).powi(2);
    }
    if total > 0.0 {
        1.0 - residual / total
    } else {
        0.0
    }
}

/// Fits `t(s) = o + s/B` to `timings` (any order, one per block size), dropping points outside
/// the model's shape (see the [module](self) docs).
pub fn fit_path(timings: &[BlockTiming]) -> Result<PathFit, FitError> {
    if let Some(bad) = timings
        .iter()
        .find(|t| t.block_bytes == 0 || !(t.seconds_per_block.is_finite() && t.seconds_per_block > 0.0))
    {
        return Err(FitError::InvalidTiming { block_bytes: bad.block_bytes, seconds: bad.seconds_per_block });
    }
    let mut sorted = timings.to_vec();
    sorted.sort_by_key(|t| t.block_bytes);
    sorted.dedup_by_key(|t| t.block_bytes);
    if sorted.len() < MIN_KEPT {
        return Err(FitError::TooFewSizes(sorted.len()));
    }
    let total = sorted.len();
    let all = sorted.clone();
    let mut dropped = Vec::new();
    // Past the plateau: larger than the largest block near the robust plateau, and slower.
    let curve: Vec<(u64, f64)> = sorted.iter().map(|t| (t.block_bytes, t.gbps())).collect();
    let plateau = robust_plateau(&curve).unwrap_or(0.0);
    let last_on_plateau =
        curve.iter().filter(|p| p.1 >= FALLOFF_SHARE * plateau).map(|p| p.0).max().unwrap_or(u64::MAX);
    let mut kept = Vec::with_capacity(total);
    for timing in sorted {
        let gbps = timing.gbps();
        if timing.block_bytes > last_on_plateau && gbps < FALLOFF_SHARE * plateau {
            dropped.push(DroppedPoint {
                block_bytes: timing.block_bytes,
                why: format!(
                    "{gbps:.3} GB/s, below {:.0} % of the plateau {plateau:.3} GB/s past its end: a cache or ring limit",
                    FALLOFF_SHARE * 100.0
                ),
            });
        } else {
            kept.push(timing);
        }
    }
    let past_plateau = dropped.len();
    let (mut intercept, mut slope) = least_squares(&kept).ok_or(FitError::TooFewSizes(kept.len()))?;
    loop {
        let relative = |p: &BlockTiming| {
            (p.seconds_per_block - intercept - slope * p.block_bytes as f64).abs() / p.seconds_per_block
        };
        let (worst, error) = kept
            .iter()
            .enumerate()
            .map(|(i, p)| (i, relative(p)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, 0.0));
        if error <= OUTLIER_RELATIVE_ERROR || kept.len() <= MIN_KEPT {
            break;
        }
        let point = kept.remove(worst);
        dropped.push(DroppedPoint {
            block_bytes: point.block_bytes,
            why: format!(
                "{:.0} % off the line (more than {:.0} %)",
                error * 100.0,
                OUTLIER_RELATIVE_ERROR * 100.0
            ),
        });
        match least_squares(&kept) {
            Some((a, b)) => (intercept, slope) = (a, b),
            None => break,
        }
    }
    let max_relative_error = kept
        .iter()
        .map(|p| (p.seconds_per_block - intercept - slope * p.block_bytes as f64).abs() / p.seconds_per_block)
        .fold(0.0, f64::max);
    let r2 = r_squared(&kept, intercept, slope);
    // A flat curve: the line meets s = 0 a little below zero. Within FLAT_INTERCEPT_SHARE of the
    // smallest kept block's time that is "no measurable fixed cost", not a misfit.
    // A flat curve: the line meets s = 0 at or a little below zero, and says nothing about o.
    // The smallest blocks do: o is the median of their time beyond s/B.
    let smallest_time = kept.first().map_or(0.0, |p| p.seconds_per_block);
    if intercept <= 0.0 && -intercept <= FLAT_INTERCEPT_SHARE * smallest_time && slope > 0.0 {
        let mut beyond: Vec<f64> = all
            .iter()
            .take(3)
            .map(|p| (p.seconds_per_block - slope * p.block_bytes as f64).max(0.0))
            .collect();
        beyond.sort_by(f64::total_cmp);
        intercept = beyond.get(beyond.len() / 2).copied().unwrap_or(0.0);
    }
    let fixed_cost_us = intercept * 1e6;
    let bandwidth_gbps = if slope > 0.0 { 1.0 / slope / 1e9 } else { f64::INFINITY };
    let poor = if kept.len() < MIN_KEPT || kept.len() * 2 < total {
        Some(format!(
            "the line fits {} of {total} block sizes: the curve is not of the shape o + s/B",
            kept.len()
        ))
    } else if slope <= 0.0 {
        Some("time per block does not grow with the block: no bandwidth to fit".to_string())
    } else if intercept < 0.0 {
        Some(format!(
            "the fitted fixed cost is {fixed_cost_us:.2} µs (not positive): the curve is not of the shape o + s/B"
        ))
    } else if r2 < MIN_R2 {
        Some(format!("R² {r2:.3} is below {MIN_R2}: the times scatter too much for a line"))
    } else {
        None
    };
    // Off the line at the curve's small end: the curve bends more gradually than the line. A
    // point off the line between kept ones is a dip (a busy moment, a protocol switch) and
    // says nothing about where the knee lies.
    let smallest_kept = kept.first().map_or(u64::MAX, |p| p.block_bytes);
    let gradual = dropped[past_plateau..].iter().any(|d| d.block_bytes < smallest_kept);
    dropped.sort_by_key(|d| d.block_bytes);
    Ok(PathFit {
        gradual,
        fixed_cost_us,
        bandwidth_gbps,
        r2,
        max_relative_error,
        kept_bytes: kept.iter().map(|p| p.block_bytes).collect(),
        dropped,
        poor,
    })
}

/// Confidence of the intervals calibration reports: the central 90 % of the bootstrap.
pub const CONFIDENCE: f64 = 0.9;

/// Every per-block time measured at one block size: one per timed transfer, the transfers of
/// all sizes interleaved in time (so a spell of load falls on all of them alike).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockSamples {
    /// Block size in bytes.
    pub block_bytes: u64,
    /// Wall time per block of each timed transfer, in seconds.
    pub seconds_per_block: Vec<f64>,
}

impl BlockSamples {
    /// The median time: what [`fit_path`] takes for this size. `None` without samples.
    pub fn median(&self) -> Option<BlockTiming> {
        let mut times = self.seconds_per_block.clone();
        let seconds_per_block = median(&mut times)?;
        Some(BlockTiming { block_bytes: self.block_bytes, seconds_per_block })
    }
}

/// A two-sided interval of a fitted figure, in the figure's unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Lower bound.
    pub low: f64,
    /// Upper bound.
    pub high: f64,
}

impl Interval {
    /// The central [`CONFIDENCE`] share of `values` (at least one): its 5th and 95th
    /// percentiles. `None` without finite values.
    ///
    /// ```
    /// use rdma_hint_core::fit::Interval;
    /// let values: Vec<f64> = (0..=100).map(f64::from).collect();
    /// let interval = Interval::central(&values).unwrap();
    /// assert!((interval.low - 5.0).abs() < 1e-9 && (interval.high - 95.0).abs() < 1e-9);
    /// ```
    pub fn central(values: &[f64]) -> Option<Interval> {
        let tail = (1.0 - CONFIDENCE) / 2.0;
        Interval::between(values, tail, 1.0 - tail)
    }

    /// Widened, where it must be, to hold `point`: a percentile interval of resampled fits
    /// need not hold the fit of all the data, which is the figure it is reported beside.
    ///
    /// ```
    /// use rdma_hint_core::fit::Interval;
    /// let interval = Interval { low: 0.9, high: 1.2 }.including(0.85);
    /// assert_eq!((interval.low, interval.high), (0.85, 1.2));
    /// ```
    pub fn including(self, point: f64) -> Interval {
        if !point.is_finite() {
            return self;
        }
        Interval { low: self.low.min(point), high: self.high.max(point) }
    }

    /// The `low_quantile` and `high_quantile` (0…1) of `values`. `None` without finite values.
    pub fn between(values: &[f64], low_quantile: f64, high_quantile: f64) -> Option<Interval> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        Some(Interval { low: quantile(&sorted, low_quantile)?, high: quantile(&sorted, high_quantile)? })
    }

    /// `high / low`: how many times wider the top is than the bottom (infinite for a bottom
    /// at or below zero).
    pub fn ratio(&self) -> f64 {
        if self.low > 0.0 {
            self.high / self.low
        } else {
            f64::INFINITY
        }
    }
}

/// The `q` quantile (0…1) of `sorted` (ascending), interpolated between neighbours.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let position = q.clamp(0.0, 1.0) * last as f64;
    let (below, above) = (position.floor() as usize, position.ceil() as usize);
    let weight = position - below as f64;
    Some(sorted[below] * (1.0 - weight) + sorted[above] * weight)
}

/// The median of `values` (sorted in place), interpolated for an even count; `None` when
/// empty.
///
/// ```
/// assert_eq!(rdma_hint_core::fit::median(&mut [3.0, 1.0, 2.0, 10.0]), Some(2.5));
/// assert_eq!(rdma_hint_core::fit::median(&mut []), None);
/// ```
pub fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    quantile(values, 0.5)
}

/// A small deterministic generator (SplitMix64) for resampling: the same samples always give
/// the same intervals.
struct SplitMix(u64);

impl SplitMix {
    fn below(&mut self, bound: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % bound as u64) as usize
    }

    /// The median of one bootstrap resample of `values` (as many draws, with replacement),
    /// drawn into `drawn`, which is reused across calls.
    fn resampled_median(&mut self, values: &[f64], drawn: &mut Vec<f64>) -> Option<f64> {
        drawn.clear();
        drawn.extend((0..values.len()).map(|_| values[self.below(values.len())]));
        median(drawn)
    }
}

/// Fits of `resamples` bootstrap resamples of `samples`: each size's times drawn with
/// replacement (as many as were measured), their medians fitted like the measured ones
/// ([`fit_path`]). Poor fits are included (each says so); sizes without samples are skipped.
/// Deterministic: resample `i` always draws the same.
///
/// ```
/// use rdma_hint_core::fit::{bootstrap_fits, BlockSamples, Interval};
/// // o = 2 µs, B = 10 GB/s, each size measured five times with ±5 % noise.
/// let samples: Vec<BlockSamples> = (12..=22)
///     .map(|log2| {
///         let block = 1u64 << log2;
///         let exact = 2e-6 + block as f64 / 10e9;
///         let seconds_per_block = [0.95, 1.0, 1.05, 0.98, 1.02].iter().map(|f| exact * f).collect();
///         BlockSamples { block_bytes: block, seconds_per_block }
///     })
///     .collect();
/// let fits = bootstrap_fits(&samples, 200);
/// let o: Vec<f64> = fits.iter().map(|f| f.fixed_cost_us).collect();
/// let interval = Interval::central(&o).unwrap();
/// assert!(interval.low < 2.0 && 2.0 < interval.high && interval.ratio() < 2.0, "{interval:?}");
/// ```
pub fn bootstrap_fits(samples: &[BlockSamples], resamples: usize) -> Vec<PathFit> {
    let mut random = SplitMix(0x5eed_cafe_f00d_0001);
    let mut fits = Vec::with_capacity(resamples);
    let mut drawn = Vec::new();
    for _ in 0..resamples {
        let timings: Vec<BlockTiming> = samples
            .iter()
            .filter(|s| !s.seconds_per_block.is_empty())
            .filter_map(|size| {
                let seconds_per_block = random.resampled_median(&size.seconds_per_block, &mut drawn)?;
                Some(BlockTiming { block_bytes: size.block_bytes, seconds_per_block })
            })
            .collect();
        if let Ok(fit) = fit_path(&timings) {
            fits.push(fit);
        }
    }
    fits
}

/// The central [`CONFIDENCE`] interval of the median of `values` over `resamples` bootstrap
/// resamples (`seed` picks the draws). `None` without values.
///
/// ```
/// use rdma_hint_core::fit::median_interval;
/// let interval = median_interval(&[1.0, 2.0, 3.0, 4.0, 5.0], 200, 7).unwrap();
/// assert!(interval.low >= 1.0 && interval.low < 3.0 && interval.high > 3.0 && interval.high <= 5.0);
/// ```
pub fn median_interval(values: &[f64], resamples: usize, seed: u64) -> Option<Interval> {
    if values.is_empty() {
        return None;
    }
    let mut random = SplitMix(0x5eed_cafe_f00d_0004 ^ seed);
    let mut drawn = Vec::with_capacity(values.len());
    let medians: Vec<f64> =
        (0..resamples).filter_map(|_| random.resampled_median(values, &mut drawn)).collect();
    Interval::central(&medians)
}

/// The robust knee at `share` of the plateau ([`robust_knee_at`] of [`robust_plateau`]) of
/// the median curve of each of `resamples` bootstrap resamples of `samples`, in bytes
/// (resamples without a knee are skipped). Deterministic, like [`bootstrap_fits`].
pub fn bootstrap_knees(samples: &[BlockSamples], resamples: usize, share: f64) -> Vec<u64> {
    let mut random = SplitMix(0x5eed_cafe_f00d_0003);
    let mut drawn = Vec::new();
    (0..resamples)
        .filter_map(|_| {
            let curve: Vec<(u64, f64)> = samples
                .iter()
                .filter(|s| !s.seconds_per_block.is_empty())
                .filter_map(|size| {
                    let seconds = random.resampled_median(&size.seconds_per_block, &mut drawn)?;
                    Some((size.block_bytes, size.block_bytes as f64 / seconds / 1e9))
                })
                .collect();
            robust_knee_at(&curve, robust_plateau(&curve)?, share)
        })
        .collect()
}

/// Points averaged over: the three best.
pub const PLATEAU_POINTS: usize = 3;
/// Share of the plateau the knee reaches.
pub const KNEE_SHARE: f64 = 0.9;

/// The robust plateau of a bandwidth curve: the median of its [`PLATEAU_POINTS`] best averages
/// (the best one alone when fewer are given), in the curve's unit. `None` for an empty curve.
///
/// ```
/// // One spike (20) does not move it.
/// let curve = [(4096, 3.0), (65536, 9.0), (1 << 20, 20.0), (1 << 22, 10.0), (1 << 24, 9.5)];
/// assert_eq!(rdma_hint_core::fit::robust_plateau(&curve), Some(10.0));
/// ```
pub fn robust_plateau(curve: &[(u64, f64)]) -> Option<f64> {
    let mut rates: Vec<f64> = curve.iter().map(|p| p.1).filter(|r| r.is_finite()).collect();
    rates.sort_by(|a, b| b.total_cmp(a));
    match rates.len() {
        0 => None,
        n if n < PLATEAU_POINTS => Some(rates[0]),
        _ => Some(rates[PLATEAU_POINTS / 2]),
    }
}

/// The robust knee: the smallest block that reaches [`KNEE_SHARE`] of `plateau` *together with
/// the next larger block of the curve*, so one lucky point does not set it. The largest block
/// counts alone. `None` when no block qualifies.
///
/// ```
/// use rdma_hint_core::fit::robust_knee;
/// // 8 KiB is lucky (its neighbour falls back): the knee is 64 KiB.
/// let curve = [(4096, 5.0), (8192, 9.5), (16384, 7.0), (65536, 9.2), (131072, 9.8)];
/// assert_eq!(robust_knee(&curve, 10.0), Some(65536));
/// ```
pub fn robust_knee(curve: &[(u64, f64)], plateau: f64) -> Option<u64> {
    robust_knee_at(curve, plateau, KNEE_SHARE)
}

/// [`robust_knee`] at `share` of the plateau instead of [`KNEE_SHARE`].
pub fn robust_knee_at(curve: &[(u64, f64)], plateau: f64, share: f64) -> Option<u64> {
    let mut sorted = curve.to_vec();
    sorted.sort_by_key(|p| p.0);
    let reaches = |rate: f64| rate >= share * plateau;
    sorted.iter().enumerate().find_map(|(i, &(block, rate))| {
        let next_reaches = sorted.get(i + 1).is_none_or(|next| reaches(next.1));
        (reaches(rate) && next_reaches).then_some(block)
    })
}

/// Where the curve crosses `share` of the plateau on its way to the [`robust_knee_at`] of that
/// share: between the knee and the block before it, interpolated in log2 of the block, in
/// bytes (the knee itself when it is the smallest block). A dip past the crossing moves the
/// knee, and with it the crossing, to the next block that holds the share with its neighbour.
///
/// ```
/// use rdma_hint_core::fit::crossing_at;
/// // 16 KiB reaches 0.91 of the plateau, 32 KiB 0.99: 0.95 is crossed half-way (in log2).
/// let curve = [(8192, 8.0), (16384, 9.1), (32768, 9.9), (65536, 10.0), (131072, 10.0)];
/// let crossing = crossing_at(&curve, 10.0, 0.95).unwrap();
/// assert!((crossing - 16384.0 * 2f64.powf(0.5)).abs() < 1.0);
/// ```
pub fn crossing_at(curve: &[(u64, f64)], plateau: f64, share: f64) -> Option<f64> {
    let mut sorted = curve.to_vec();
    sorted.sort_by_key(|p| p.0);
    let knee = robust_knee_at(&sorted, plateau, share)?;
    let at = sorted.iter().position(|p| p.0 == knee)?;
    let Some(&(below, below_rate)) = at.checked_sub(1).and_then(|i| sorted.get(i)) else {
        return Some(knee as f64);
    };
    let (knee_share, below_share) = (sorted[at].1 / plateau, below_rate / plateau);
    let step = (knee as f64 / below as f64).log2();
    let part = ((share - below_share) / (knee_share - below_share)).clamp(0.0, 1.0);
    Some(below as f64 * (step * part).exp2())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hockney(o_us: f64, gbps: f64, log2s: std::ops::RangeInclusive<u32>) -> Vec<BlockTiming> {
        log2s
            .map(|l| {
                let s = 1u64 << l;
                BlockTiming { block_bytes: s, seconds_per_block: o_us * 1e-6 + s as f64 / (gbps * 1e9) }
            })
            .collect()
    }

    #[test]
    fn falloff_past_the_plateau_is_dropped_with_its_reason() {
        let mut timings = hockney(3.0, 10.0, 12..=21);
        // 4 MiB and 8 MiB fall to 7 GB/s (a cache limit).
        for s in [1u64 << 22, 1 << 23] {
            timings.push(BlockTiming { block_bytes: s, seconds_per_block: s as f64 / 7e9 });
        }
        let fit = fit_path(&timings).unwrap();
        assert!((fit.bandwidth_gbps - 10.0).abs() < 0.01, "{fit:?}");
        assert!((fit.fixed_cost_us - 3.0).abs() < 0.01);
        assert_eq!(fit.dropped.len(), 2);
        assert!(fit.dropped.iter().all(|d| d.why.contains("past its end")), "{fit:?}");
        assert!(fit.poor.is_none());
        assert!(!fit.gradual, "an exact line with a falloff is not a gradual curve");
    }

    #[test]
    fn one_noisy_point_is_an_outlier_not_the_answer() {
        let mut timings = hockney(2.0, 5.0, 12..=22);
        timings[8].seconds_per_block *= 3.0;
        let fit = fit_path(&timings).unwrap();
        assert!((fit.bandwidth_gbps - 5.0).abs() < 0.05, "{fit:?}");
        assert_eq!(fit.dropped.len(), 1);
        assert_eq!(fit.dropped[0].block_bytes, 1 << 20);
        assert!(!fit.gradual, "a dip between kept blocks is not a gradual curve: {fit:?}");
    }

    #[test]
    fn small_blocks_off_the_line_make_a_gradual_curve() {
        let mut timings = hockney(2.0, 5.0, 12..=22);
        // 4 KiB and 8 KiB take half the time the line says (a curve that rises gradually).
        for timing in &mut timings[..2] {
            timing.seconds_per_block *= 0.5;
        }
        let fit = fit_path(&timings).unwrap();
        assert_eq!(fit.dropped.iter().map(|d| d.block_bytes).collect::<Vec<_>>(), [4096, 8192], "{fit:?}");
        assert!(fit.gradual, "{fit:?}");
    }

    #[test]
    fn a_flat_or_falling_curve_is_poor() {
        // Every block takes the same time: no bandwidth term.
        let flat: Vec<BlockTiming> =
            (12..=20).map(|l| BlockTiming { block_bytes: 1 << l, seconds_per_block: 1e-3 }).collect();
        let fit = fit_path(&flat).unwrap();
        assert!(fit.poor.is_some(), "{fit:?}");
        // Time that shrinks with size (an inverted curve) is not a path either.
        let inverted: Vec<BlockTiming> = (12..=20)
            .map(|l| BlockTiming { block_bytes: 1 << l, seconds_per_block: 1e-3 / f64::from(l) })
            .collect();
        assert!(fit_path(&inverted).unwrap().poor.is_some());
    }

    #[test]
    fn garbage_timings_are_typed_errors() {
        assert_eq!(fit_path(&hockney(1.0, 1.0, 12..=13)), Err(FitError::TooFewSizes(2)));
        let mut nan = hockney(1.0, 1.0, 12..=16);
        nan[2].seconds_per_block = f64::NAN;
        assert!(matches!(fit_path(&nan), Err(FitError::InvalidTiming { .. })));
        let mut zero = hockney(1.0, 1.0, 12..=16);
        zero[0].block_bytes = 0;
        assert!(matches!(fit_path(&zero), Err(FitError::InvalidTiming { .. })));
    }

    #[test]
    fn plateau_and_knee_ignore_single_points() {
        assert_eq!(robust_plateau(&[]), None);
        assert_eq!(robust_plateau(&[(1, 4.0), (2, 5.0)]), Some(5.0));
        let curve = [(4096, 9.5), (8192, 6.0), (16384, 9.4), (32768, 9.6), (65536, 10.0)];
        let plateau = robust_plateau(&curve).unwrap();
        assert_eq!(plateau, 9.6);
        assert_eq!(robust_knee(&curve, plateau), Some(16384));
        assert_eq!(robust_knee(&curve, 100.0), None);
        // The largest block alone can be the knee of a curve that only rises.
        assert_eq!(robust_knee(&[(1, 1.0), (2, 2.0), (4, 9.0)], 9.0), Some(4));
    }
}
