//! `rdma-hint calibrate`: fit `o` and `B` on the live path in about a second and store the
//! calibrated hint; `probe --calibrate` does it for every path it can open.

use crate::units::format_bytes;
use rdma_hint::calibration::{calibrate_loopback, Calibration};
use rdma_hint::OpenOptions;
use serde::Serialize;

/// What `calibrate --json` prints: the hint's numbers first, then the whole calibration.
#[derive(Serialize)]
pub(crate) struct CalibrationJson<'a> {
    block_bytes: u64,
    align_bytes: u64,
    origin: rdma_hint::model::Origin,
    fixed_cost_us: f64,
    bandwidth_gbps: f64,
    fit_r2: f64,
    fit_max_relative_error: f64,
    fit_poor: Option<&'a str>,
    /// The central 90 % of the bootstrap, flattened for scripts (none for a poor fit).
    fixed_cost_us_low: Option<f64>,
    fixed_cost_us_high: Option<f64>,
    bandwidth_gbps_low: Option<f64>,
    bandwidth_gbps_high: Option<f64>,
    block_bytes_low: Option<f64>,
    block_bytes_high: Option<f64>,
    measured_longer: bool,
    /// The block this run answered alone; `block_bytes` is the pool's median.
    own_block_bytes: Option<u64>,
    pooled_blocks_bytes: &'a [u64],
    elapsed_ms: f64,
    budget_ms: f64,
    stored_in: Option<String>,
    calibration: &'a Calibration,
}

impl<'a> CalibrationJson<'a> {
    pub(crate) fn new(calibration: &'a Calibration) -> CalibrationJson<'a> {
        let margins = calibration.margins.as_ref();
        CalibrationJson {
            block_bytes: calibration.hint.block_bytes,
            align_bytes: calibration.hint.align_bytes,
            origin: calibration.hint.origin,
            fixed_cost_us: calibration.fit.fixed_cost_us,
            bandwidth_gbps: calibration.fit.bandwidth_gbps,
            fit_r2: calibration.fit.r2,
            fit_max_relative_error: calibration.fit.max_relative_error,
            fit_poor: calibration.fit.poor.as_deref(),
            fixed_cost_us_low: margins.map(|m| m.fixed_cost_us.low),
            fixed_cost_us_high: margins.map(|m| m.fixed_cost_us.high),
            bandwidth_gbps_low: margins.map(|m| m.bandwidth_gbps.low),
            bandwidth_gbps_high: margins.map(|m| m.bandwidth_gbps.high),
            block_bytes_low: margins.map(|m| m.block_bytes.low),
            block_bytes_high: margins.map(|m| m.block_bytes.high),
            measured_longer: calibration.measured_longer,
            own_block_bytes: calibration.own_block_bytes,
            pooled_blocks_bytes: &calibration.pooled_blocks_bytes,
            elapsed_ms: calibration.elapsed_ms,
            budget_ms: calibration.budget_ms,
            stored_in: calibration.stored_in.as_ref().map(|p| p.display().to_string()),
            calibration,
        }
    }
}

/// The report, perftest style: the ladder, the fit, the hint.
pub(crate) fn text(calibration: &Calibration) -> String {
    let mut out = format!(
        "# rdma-hint calibrate: {} from {}, {} block sizes in {} interleaved rounds, {:.0} ms of a {:.0} ms budget\n{:>10} {:>10} {:>11} {:>5} {:>10}\n",
        calibration.transport,
        calibration.source,
        calibration.points.len(),
        calibration.rounds,
        calibration.elapsed_ms,
        calibration.budget_ms,
        "block",
        "GB/s",
        "µs/block",
        "runs",
        "per run"
    );
    for point in &calibration.points {
        let dropped = calibration.fit.dropped.iter().find(|d| d.block_bytes == point.block_bytes);
        out.push_str(&format!(
            "{:>10} {:>10.3} {:>11.2} {:>5} {:>10}{}\n",
            format_bytes(point.block_bytes),
            point.gbps,
            point.us_per_block,
            point.runs,
            format_bytes(point.transfer_bytes),
            dropped.map(|d| format!("  (left out: {})", d.why)).unwrap_or_default()
        ));
    }
    let fit = &calibration.fit;
    out.push_str(&format!(
        "fit t(s) = o + s/B: o = {:.2} µs, B = {:.3} GB/s, R² {:.4}, largest error {:.0} % over {} of {} sizes\n",
        fit.fixed_cost_us,
        fit.bandwidth_gbps,
        fit.r2,
        fit.max_relative_error * 100.0,
        fit.kept_bytes.len(),
        calibration.points.len()
    ));
    if let Some(margins) = &calibration.margins {
        out.push_str(&format!(
            "90 % intervals (bootstrap): o {:.2}…{:.2} µs, B {:.3}…{:.3} GB/s, hinted block {}…{}{}\n",
            margins.fixed_cost_us.low,
            margins.fixed_cost_us.high,
            margins.bandwidth_gbps.low,
            margins.bandwidth_gbps.high,
            format_bytes(margins.block_bytes.low as u64),
            format_bytes(margins.block_bytes.high as u64),
            if calibration.measured_longer {
                " (measured longer: the first rounds' interval was wider)"
            } else {
                ""
            }
        ));
    }
    if calibration.fit.poor.is_none() {
        let (fixed_cost_us, bandwidth_gbps) = hint_costs(calibration);
        out.push_str(&format!(
            "the hint uses o = {fixed_cost_us:.2} µs, B = {bandwidth_gbps:.3} GB/s: the resampled fits' medians, as stored\n"
        ));
    }
    if let Some(flat) = &calibration.flatness {
        out.push_str(&format!(
            "flatness: plateau {:.3} GB/s; the smallest block moves {:.2} of it, the hinted block {:.2}\n",
            flat.plateau_gbps, flat.smallest_block_share, flat.hinted_block_share
        ));
    }
    if let Some(why) = &fit.poor {
        out.push_str(&format!("poor fit: {why}\n"));
    } else if fit.gradual {
        out.push_str(
            "the curve bends more gradually than o + s/B (sizes left out above): the hint aims further\n",
        );
    }
    if calibration.pooled_blocks_bytes.len() > 1 {
        let blocks: Vec<String> = calibration.pooled_blocks_bytes.iter().map(|b| format_bytes(*b)).collect();
        out.push_str(&format!(
            "pooled: the median of the last {} calibrations' blocks ({}, this run's last; --fresh forgets them)\n",
            blocks.len(),
            blocks.join(", ")
        ));
    }
    let hint = &calibration.hint;
    out.push_str(&format!(
        "hint: {} blocks, {} aligned ({}), predicted {:.3} GB/s = {:.2} of B\n",
        format_bytes(hint.block_bytes),
        format_bytes(hint.align_bytes),
        format!("{:?}", hint.origin).to_lowercase(),
        hint.predicted_gbps,
        hint.efficiency
    ));
    match &calibration.stored_in {
        Some(path) => out.push_str(&format!("stored: {}\n", path.display())),
        None => out.push_str(&format!(
            "stored: nothing ({})\n",
            calibration.not_stored.as_deref().unwrap_or("not asked to")
        )),
    }
    out
}

/// The `o` and `B` the calibrated hint is computed from (and the cache keeps): the resampled
/// fits' medians, which can differ from the one direct fit by a few percent; a poor fit's
/// own, where nothing is kept.
fn hint_costs(calibration: &rdma_hint::calibration::Calibration) -> (f64, f64) {
    match &calibration.fit.poor {
        None => (calibration.hint.fixed_cost_us, calibration.hint.bandwidth_gbps),
        Some(_) => (calibration.fit.fixed_cost_us, calibration.fit.bandwidth_gbps),
    }
}

/// Calibrates every (source, transport) pair of `report` this process can open, one after
/// another; returns one line per pair (what it found, or why it could not).
pub(crate) fn every_path(
    report: &rdma_hint::probing::ProbeReport,
    options: &OpenOptions,
    budget: std::time::Duration,
) -> Vec<String> {
    let mut lines = Vec::new();
    for hint in &report.hints {
        let line = match calibrate_loopback(&hint.transport, hint.source, options, budget) {
            Ok(c) => format!(
                "calibrated {} over {}: o = {:.2} µs, B = {:.3} GB/s{}, R² {:.3} in {:.0} ms → {} ({}){}",
                c.source,
                c.transport,
                hint_costs(&c).0,
                hint_costs(&c).1,
                if c.fit.poor.is_none() { " (the resampled fits' medians, as stored)" } else { "" },
                c.fit.r2,
                c.elapsed_ms,
                format_bytes(c.hint.block_bytes),
                format!("{:?}", c.hint.origin).to_lowercase(),
                c.fit.poor.as_ref().map(|why| format!("; poor fit: {why}")).unwrap_or_default()
            ),
            Err(e) => format!("calibrate {} over {}: {e}", hint.source, hint.transport),
        };
        lines.push(line);
    }
    lines
}
