//! Measured hints: the knee `rdma-hint sweep` found and the `o`/`B` `rdma-hint calibrate`
//! fitted, kept in cache files and preferred over the model while the driver and firmware
//! versions are the ones they were measured under. Of a recorded knee and a calibration, the
//! newer one wins.

use rdma_hint_core::model::{
    bounded_block, compute_hint_fitted, rate, Factor, FittedCosts, Reason, MAX_PER_OP_US,
};
use rdma_hint_core::TransportId;
use rdma_hint_core::{
    compute_hint, DriverVersions, HintError, HintPolicy, Origin, PathProfile, SizeHint, SourceId,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A fitted path: what `rdma-hint calibrate` stores (only fits that are not poor).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CalibratedPath {
    /// Memory source.
    pub source: SourceId,
    /// Transport id (`staged:shm`, …).
    pub transport: TransportId,
    /// Versions the calibration ran under; the entry is ignored under any others.
    pub versions: DriverVersions,
    /// Fitted fixed cost per block `o`, in µs.
    pub fixed_cost_us: f64,
    /// Fitted bandwidth `B`, in GB/s.
    pub bandwidth_gbps: f64,
    /// R² of the fit.
    pub fit_r2: f64,
    /// The fit left points out as off the line (see `PathFit::gradual`): the hint aims further.
    #[serde(default)]
    pub gradual: bool,
    /// When it was measured (seconds since the Unix epoch).
    pub measured_at_unix: u64,
    /// The figures' intervals, for [`estimate`](crate::estimate) (none in files written
    /// before calibrations had margins).
    #[serde(default)]
    pub margins: Option<crate::margins::Margins>,
    /// The block calibration chose from its curve when the fit's interval stayed too wide to
    /// pick one (the robust choice), in bytes; `None`: the hint follows from `o` and `B`.
    #[serde(default)]
    pub robust_block_bytes: Option<u64>,
    /// The rule that chose `robust_block_bytes` (none in files written before it was kept:
    /// their reason names every rule).
    #[serde(default)]
    pub block_rule: Option<BlockRule>,
    /// The block this calibration answered alone, before it was pooled with the earlier ones,
    /// in bytes (none in files written before calibrations were pooled).
    #[serde(default)]
    pub own_block_bytes: Option<u64>,
    /// Earlier calibrations of the pair, oldest first, that the hint and
    /// [`estimate`](crate::estimate) pool with this one: at most [`POOLED_CALIBRATIONS`] − 1,
    /// none measured more than [`POOL_MAX_AGE_S`] before it.
    #[serde(default)]
    pub earlier: Vec<EarlierCalibration>,
}

/// Which rule chose a calibration's block from its measured curve, instead of the block the
/// fitted line gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BlockRule {
    /// The resampled fits disagreed by more than 2×: the smallest block whose lower bound
    /// still reaches the target efficiency, or the measured knee where that is smaller.
    Robust,
    /// The curve reaches 97 % of its plateau only past the line's block.
    Raised,
    /// The line promises more at its block than the curve's plateau.
    Lowered,
}

impl BlockRule {
    /// Why the block was chosen, in the words of a hint's reason.
    pub(crate) fn why(self) -> &'static str {
        match self {
            BlockRule::Raised => "the measured curve reaches 97 % of its plateau only at a larger block, which is answered as the ladder block nearest to it (at most twice the ladder block where it reaches 90 %, and twice the line's block)",
            BlockRule::Lowered => "the line promises more at its block than the measured curve's plateau, so the block where the curve reaches 97 % of that plateau is answered",
            BlockRule::Robust => "the resampled fits disagree by more than 2×, so the robust choice is answered: the smallest block whose lower bound still reaches the target efficiency (the top of the interval), or the measured knee where that is smaller, and never below the middle of the fits",
        }
    }
}

/// How many calibrations of one pair (source, transport, versions) the hint pools, the newest
/// included. One calibration answers its own second: on the 2-core machine one process fitted
/// `o` = 4.7–6.4 µs over loopback tcp and the next 7.0–8.9 µs, each with a tight interval of
/// its own, and calibrated blocks of consecutive runs spread up to 2.5×. The median of the
/// last few answers the machine instead of one run's spell.
pub const POOLED_CALIBRATIONS: usize = 5;
/// Oldest an earlier calibration may be, measured before the newest, to be pooled with it: a
/// day, in seconds. Older ones are dropped when a calibration is stored.
pub(crate) const POOL_MAX_AGE_S: u64 = 24 * 3600;

/// An earlier calibration of the same pair, as the newest one pools it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub(crate) struct EarlierCalibration {
    /// When it was measured (seconds since the Unix epoch).
    pub measured_at_unix: u64,
    /// The block it answered alone (under the default policy, as `rdma-hint calibrate`
    /// computes it), in bytes.
    pub block_bytes: u64,
    /// Its margins: [`estimate`](crate::estimate)'s bounds span every pooled calibration's.
    #[serde(default)]
    pub margins: Option<crate::margins::Margins>,
}

impl CalibratedPath {
    /// An entry for `profile`'s path with the fitted `o` (µs) and `B` (GB/s), measured now,
    /// without margins: what a hint is computed from.
    pub(crate) fn fitted(
        profile: &PathProfile,
        fixed_cost_us: f64,
        bandwidth_gbps: f64,
        gradual: bool,
    ) -> CalibratedPath {
        CalibratedPath {
            source: profile.source.id,
            transport: profile.transport.id.clone(),
            versions: profile.versions.clone(),
            fixed_cost_us,
            bandwidth_gbps,
            fit_r2: 1.0,
            gradual,
            measured_at_unix: 0,
            margins: None,
            robust_block_bytes: None,
            block_rule: None,
            own_block_bytes: None,
            earlier: Vec::new(),
        }
    }

    /// This calibration pooled with `previous`, the pair's stored one (same key): `previous`
    /// and the calibrations it pooled become [`CalibratedPath::earlier`], the newest
    /// [`POOLED_CALIBRATIONS`] − 1 of those measured at most [`POOL_MAX_AGE_S`] before this one
    /// (and not after it: a clock that went back starts a new pool). Entries without
    /// [`CalibratedPath::own_block_bytes`] (files from before pooling) are not pooled.
    pub(crate) fn pooled_with(mut self, previous: Option<CalibratedPath>) -> CalibratedPath {
        let now = self.measured_at_unix;
        // A stored calibration from after this one: the clock went back, and a new pool starts.
        let Some(previous) = previous.filter(|previous| previous.measured_at_unix <= now) else {
            return self;
        };
        let mut earlier = previous.earlier;
        if let Some(block_bytes) = previous.own_block_bytes {
            earlier.push(EarlierCalibration {
                measured_at_unix: previous.measured_at_unix,
                block_bytes,
                margins: previous.margins,
            });
        }
        earlier.retain(|e| e.measured_at_unix <= now && now - e.measured_at_unix <= POOL_MAX_AGE_S);
        let surplus = earlier.len().saturating_sub(POOLED_CALIBRATIONS - 1);
        earlier.drain(..surplus);
        self.earlier = earlier;
        self
    }

    /// The blocks the pool answered alone, oldest first, this calibration's last (given its
    /// own block).
    pub(crate) fn pooled_blocks(&self, own_block_bytes: u64) -> Vec<u64> {
        self.earlier.iter().map(|e| e.block_bytes).chain([own_block_bytes]).collect()
    }
}

/// The median of block sizes, taken by ratio: the middle one, or for an even count the
/// geometric mean of the two middle ones (200 and 288 KiB pool to 240 KiB), except where both
/// are ladder blocks (powers of two, as calibration's ladder is): then the smaller, because
/// their blend is a block no run measured, and 32 and 64 KiB pooled to 45 KiB fell past twice
/// a 16 KiB knee over the 2-core VM's shm. The smaller, because a block too small costs a share
/// of the bandwidth where one too large holds the link for longer than its latency promised.
pub(crate) fn median_block(blocks: &[u64]) -> Option<u64> {
    let mut sorted = blocks.to_vec();
    sorted.sort_unstable();
    let middle = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[middle]),
        _ => {
            let (below, above) = (sorted[middle - 1], sorted[middle]);
            if below.is_power_of_two() && above.is_power_of_two() {
                Some(below)
            } else {
                Some(((below as f64) * (above as f64)).sqrt().round() as u64)
            }
        }
    }
}

/// Entries kept per (source, transport) in a cache file.
trait Entry: Serialize + DeserializeOwned {
    fn key(&self) -> (SourceId, &TransportId, &DriverVersions);

    /// Whether the entry's values can be used (a cache file is input, not truth).
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

impl Entry for MeasuredHint {
    fn key(&self) -> (SourceId, &TransportId, &DriverVersions) {
        (self.source, &self.transport, &self.versions)
    }

    fn check(&self) -> Result<(), String> {
        if self.knee_bytes == 0 || self.knee_bytes > MAX_RECORDED_KNEE_BYTES {
            return Err(format!("knee {} B outside 1 B ..= {MAX_RECORDED_KNEE_BYTES} B", self.knee_bytes));
        }
        if !(MIN_RECORDED_PLATEAU_GBPS..=MAX_RECORDED_PLATEAU_GBPS).contains(&self.plateau_gbps) {
            return Err(format!(
                "plateau {} GB/s outside [{MIN_RECORDED_PLATEAU_GBPS}, {MAX_RECORDED_PLATEAU_GBPS}]",
                self.plateau_gbps
            ));
        }
        Ok(())
    }
}

impl Entry for CalibratedPath {
    fn key(&self) -> (SourceId, &TransportId, &DriverVersions) {
        (self.source, &self.transport, &self.versions)
    }

    fn check(&self) -> Result<(), String> {
        // The model's own bounds: an entry it would refuse must be ignored here, not fail
        // every hint of its path later.
        let fitted = FittedCosts { fixed_cost_us: self.fixed_cost_us, bandwidth_gbps: self.bandwidth_gbps };
        fitted.check().map_err(|error| error.to_string())?;
        let earlier_blocks = self.earlier.iter().map(|e| e.block_bytes);
        for block in
            [self.robust_block_bytes, self.own_block_bytes].into_iter().flatten().chain(earlier_blocks)
        {
            if block == 0 || block > MAX_RECORDED_KNEE_BYTES {
                return Err(format!("a block of {block} B outside 1 B ..= {MAX_RECORDED_KNEE_BYTES} B"));
            }
        }
        if self.earlier.len() >= POOLED_CALIBRATIONS {
            return Err(format!(
                "{} earlier calibrations pooled, at most {} kept",
                self.earlier.len(),
                POOLED_CALIBRATIONS - 1
            ));
        }
        if self.earlier.windows(2).any(|pair| pair[0].measured_at_unix > pair[1].measured_at_unix) {
            return Err("earlier calibrations out of order".into());
        }
        for earlier in &self.earlier {
            if earlier.measured_at_unix > self.measured_at_unix
                || self.measured_at_unix - earlier.measured_at_unix > POOL_MAX_AGE_S
            {
                return Err("an earlier calibration measured after the newest or a day before it".into());
            }
            if let Some(margins) = &earlier.margins {
                check_margins(margins)?;
            }
        }
        match &self.margins {
            Some(margins) => check_margins(margins),
            None => Ok(()),
        }
    }
}

/// Smallest figure (µs, GB/s or a ratio) a stored calibration's margins may hold.
const MIN_STORED_FIGURE: f64 = 1e-6;
/// Largest: a million (µs: a second per block; GB/s; a ratio).
const MAX_STORED_FIGURE: f64 = 1e6;

/// Whether stored margins can be used: plausible figures, ordered intervals, and a ladder of
/// ascending sizes no longer than any calibration measures.
fn check_margins(margins: &crate::margins::Margins) -> Result<(), String> {
    // Plausible, not only positive: a time of 1e-320 µs reads back as 0 s and an estimate of
    // infinite GB/s, one of 1e308 µs as infinite seconds.
    let plausible = |what: &str, value: f64| match (MIN_STORED_FIGURE..=MAX_STORED_FIGURE).contains(&value) {
        true => Ok(()),
        false => Err(format!("{what} {value} outside {MIN_STORED_FIGURE}..={MAX_STORED_FIGURE}")),
    };
    if margins.ladder.is_empty() || margins.ladder.len() > 64 {
        return Err(format!("a ladder of {} sizes", margins.ladder.len()));
    }
    let interval = |what: &str, i: &rdma_hint_core::fit::Interval| {
        plausible(what, i.low)?;
        plausible(what, i.high)?;
        match i.low <= i.high {
            true => Ok(()),
            false => Err(format!("{what} interval {}…{} is upside down", i.low, i.high)),
        }
    };
    interval("stream_ratio", &margins.stream_ratio)?;
    interval("single_block_ratio", &margins.single_block_ratio)?;
    let mut previous = 0;
    for step in &margins.ladder {
        if step.block_bytes <= previous || step.block_bytes > MAX_RECORDED_KNEE_BYTES {
            return Err(format!("ladder block {} B out of order or range", step.block_bytes));
        }
        previous = step.block_bytes;
        plausible("stream_us_per_block", step.stream_us_per_block)?;
        plausible("single_block_us", step.single_block_us)?;
        interval("stream_us_per_block", &step.stream_us_per_block_interval)?;
        interval("single_block_us", &step.single_block_us_interval)?;
    }
    Ok(())
}

fn load_entries<T: Entry>(file: &Path) -> Vec<T> {
    let Some(bytes) = crate::cache_files::read(file) else { return Vec::new() };
    serde_json::from_slice(&bytes).unwrap_or_else(|error| {
        // Ignored, and said so: the hints fall back to the model until a sweep or a calibration
        // rewrites the file.
        tracing::warn!(file = %file.display(), %error, "rdma-hint: ignoring a corrupt hint cache file");
        Vec::new()
    })
}

/// Replaces the entry of `source`/`transport` in `file` by `entry` (none: removes it).
fn store_entry<T: Entry>(
    file: &Path,
    source: SourceId,
    transport: &TransportId,
    entry: Option<T>,
) -> std::io::Result<()> {
    let mut entries: Vec<T> = load_entries(file);
    entries.retain(|e| {
        let (s, t, _) = e.key();
        !(s == source && t == transport)
    });
    entries.extend(entry);
    crate::cache_files::write(file, &serde_json::to_vec_pretty(&entries).map_err(std::io::Error::other)?)
}

fn lookup_entry<T: Entry>(
    file: &Path,
    source: SourceId,
    transport: &TransportId,
    versions: &DriverVersions,
) -> Option<T> {
    let entry = load_entries::<T>(file).into_iter().find(|e| e.key() == (source, transport, versions))?;
    match entry.check() {
        Ok(()) => Some(entry),
        Err(why) => {
            tracing::warn!(file = %file.display(), %source, %transport, why, "rdma-hint: ignoring an invalid hint cache entry");
            None
        }
    }
}

/// One measured result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MeasuredHint {
    /// Memory source.
    pub source: SourceId,
    /// Transport id (`staged:shm`, …).
    pub transport: TransportId,
    /// Versions the sweep ran under; the entry is ignored under any others.
    pub versions: DriverVersions,
    /// Smallest block reaching 90 % of the plateau, in bytes.
    pub knee_bytes: u64,
    /// Plateau bandwidth in GB/s.
    pub plateau_gbps: f64,
    /// When it was measured (seconds since the Unix epoch).
    pub measured_at_unix: u64,
}

/// The cache file: `$RDMA_HINT_CACHE_DIR/measured.json`, else `$XDG_CACHE_HOME/rdma-hint/…`,
/// else `~/.cache/rdma-hint/…` (absolute paths only). `None` without one, or when the directory
/// is not this user's alone (said once, as a warning): the cache is a trust boundary.
pub(crate) fn cache_file() -> Option<PathBuf> {
    Some(crate::cache_files::cache_dir()?.join("measured.json"))
}

/// The largest knee a record may hold: no transport's sweet spot lies past it, and a larger
/// one would size every sweep's region to it.
pub(crate) const MAX_RECORDED_KNEE_BYTES: u64 = 1 << 30;
/// The largest plateau a record may hold, in GB/s (a hundred times any link today).
pub(crate) const MAX_RECORDED_PLATEAU_GBPS: f64 = 10_000.0;
/// The smallest, in GB/s (a kilobyte a second): below it the fixed cost a knee implies runs
/// off every bound (a denormal plateau made it infinite).
pub(crate) const MIN_RECORDED_PLATEAU_GBPS: f64 = 1e-6;

/// The calibration file beside the measured-knee file `file`: `calibrated.json`.
pub(crate) fn calibration_file(file: &Path) -> PathBuf {
    file.with_file_name("calibrated.json")
}

/// Every entry in `file` (none if it is missing or unreadable: a cache, not a source of truth).
#[cfg(test)]
pub(crate) fn load(file: &Path) -> Vec<MeasuredHint> {
    load_entries(file)
}

/// Stores `entry` in `file`, replacing the entry of the same source and transport.
pub(crate) fn store(file: &Path, entry: MeasuredHint) -> std::io::Result<()> {
    store_entry(file, entry.source, &entry.transport.clone(), Some(entry))
}

/// Stores a calibration in the calibration file beside `file`, replacing the one of the same
/// source and transport; `None` removes it (and the calibrations it pools).
pub(crate) fn store_calibration(
    file: &Path,
    source: SourceId,
    transport: &TransportId,
    entry: Option<CalibratedPath>,
) -> std::io::Result<()> {
    store_entry(&calibration_file(file), source, transport, entry)
}

/// The entry for this pair under exactly these versions; stale entries are ignored.
pub(crate) fn lookup(
    file: &Path,
    source: SourceId,
    transport: &TransportId,
    versions: &DriverVersions,
) -> Option<MeasuredHint> {
    lookup_entry(file, source, transport, versions)
}

/// The calibration for this pair under exactly these versions, from the file beside `file`.
pub(crate) fn lookup_calibration(
    file: &Path,
    source: SourceId,
    transport: &TransportId,
    versions: &DriverVersions,
) -> Option<CalibratedPath> {
    lookup_entry(&calibration_file(file), source, transport, versions)
}

/// Share of the efficiency a policy leaves on the table that a calibrated hint aims to win
/// back, for a curve the line fits whole (GPU copies: exactly `o + s/B`): with the default 0.9
/// target, 0.92 of the fitted `B`, 1.28× past the fitted 90 % point.
pub(crate) const CALIBRATION_MARGIN: f64 = 0.2;
/// The same for a curve that bends more gradually than the line (points dropped as off the
/// line, `PathFit::gradual`: host memcpy and socket paths): 0.94 of `B`, 1.74× past the fitted
/// 90 % point.
///
/// A hint meets its target when it reaches 0.90 of the measured plateau at no more than 2× the
/// measured knee. On this project's machines, gradual curves reach 0.90 of their plateau later
/// than their line does, exact ones right where it does; over 60 calibrate + sweep runs on
/// 2-core and H200 hosts (`benches/fidelity.sh`), these two margins met that target more
/// often (44) than one margin for both (37 at 0.93).
pub(crate) const GRADUAL_CALIBRATION_MARGIN: f64 = 0.4;

/// The policy a calibrated hint is computed under: `policy`'s target raised by
/// [`CALIBRATION_MARGIN`] (or [`GRADUAL_CALIBRATION_MARGIN`]), within the model's bounds: the
/// policy's smallest block (16 KiB by default), or the smallest block the calibration measured
/// if that is larger (a fit says nothing below its ladder). A fit of a busy machine that puts
/// the 90 % point at a few KiB is not answered below the documented floor.
pub(crate) fn calibrated_policy(policy: &HintPolicy, model: &SizeHint, gradual: bool) -> HintPolicy {
    let eta = policy.target_efficiency;
    let margin = if gradual { GRADUAL_CALIBRATION_MARGIN } else { CALIBRATION_MARGIN };
    HintPolicy {
        target_efficiency: (eta + margin * (1.0 - eta)).min(0.999),
        min_block_bytes: policy.min_block_bytes.max(ladder_alignment(model)),
        ..policy.clone()
    }
}

/// The hint from a stored calibration (`model`: the model's hint of the same path, whose
/// alignment bounds the calibrated block from below).
pub(crate) fn calibrated_hint(
    profile: &PathProfile,
    policy: &HintPolicy,
    model: &SizeHint,
    calibration: &CalibratedPath,
) -> Result<SizeHint, HintError> {
    let costs =
        FittedCosts { fixed_cost_us: calibration.fixed_cost_us, bandwidth_gbps: calibration.bandwidth_gbps };
    let policy = calibrated_policy(policy, model, calibration.gradual);
    let mut hint = compute_hint_fitted(profile, &policy, costs)?;
    if let Some(block) = calibration.robust_block_bytes {
        let bounded = bounded_block(profile, &policy, block, hint.align_bytes).unwrap_or(hint.block_bytes);
        let bandwidth = hint.bandwidth_gbps;
        hint = hint.rescaled(bounded, bandwidth);
        let why = match calibration.block_rule {
            Some(rule) => format!("chosen by calibration from its curve: {}", rule.why()),
            None => "chosen by calibration from its margins: where the resampled fits' interval was too wide to pick a block, its top or the measured curve's knee (97 % of its plateau), the smaller; where the measured curve reaches 97 % of its plateau only past the line's block, that crossing, at most twice the ladder block where it reaches 90 % and twice the line's block, as the ladder block nearest to it".to_string(),
        };
        hint.reasons.push(Reason::new(Factor::Calibrated, format!("{bounded} B"), why));
    }
    hint.reasons.push(Reason::new(
        Factor::Calibrated,
        format!("R² {:.3}", calibration.fit_r2),
        format!("fitted by `rdma-hint calibrate` on {}", utc_date_time(calibration.measured_at_unix)),
    ));
    if !calibration.earlier.is_empty() {
        let blocks = calibration.pooled_blocks(hint.block_bytes);
        let pooled = median_block(&blocks)
            .and_then(|median| bounded_block(profile, &policy, median, hint.align_bytes))
            .unwrap_or(hint.block_bytes);
        let kib: Vec<String> = blocks.iter().map(|b| format!("{:.0}", *b as f64 / 1024.0)).collect();
        hint.reasons.push(Reason::new(
            Factor::Calibrated,
            format!("{pooled} B"),
            format!(
                "the median of the last {} calibrations' blocks ({} KiB, this one's last; first on {}): one run answers its own second",
                blocks.len(),
                kib.join(", "),
                utc_date_time(calibration.earlier[0].measured_at_unix)
            ),
        ));
        let bandwidth = hint.bandwidth_gbps;
        hint = hint.rescaled(pooled, bandwidth);
    }
    Ok(hint)
}

/// The three hints of one pair, kept apart: the model's, the calibrated one and the recorded
/// knee (each when the cache files hold one under the current versions).
#[derive(Debug, Clone)]
pub struct HintSet {
    /// The model's hint from its constants.
    pub model: SizeHint,
    /// From `o` and `B` fitted by `rdma-hint calibrate`.
    pub calibrated: Option<SizeHint>,
    /// The knee recorded by `rdma-hint sweep`.
    pub recorded: Option<SizeHint>,
    /// Which one [`hint`](crate::hint) answers: the newer of calibrated and recorded (the recorded knee
    /// when both are of the same second), else the model's.
    pub chosen: Origin,
}

impl HintSet {
    /// The hint [`hint`](crate::hint) answers.
    pub fn chosen(&self) -> &SizeHint {
        match self.chosen {
            Origin::Calibrated => self.calibrated.as_ref().unwrap_or(&self.model),
            Origin::Measured => self.recorded.as_ref().unwrap_or(&self.model),
            Origin::Model => &self.model,
        }
    }
}

/// All three hints of `profile` (see [`HintSet`]).
pub(crate) fn hint_set(
    profile: &PathProfile,
    policy: &HintPolicy,
    file: Option<&Path>,
) -> Result<HintSet, HintError> {
    let model = compute_hint(profile, policy)?;
    let (source, transport, versions) = (profile.source.id, &profile.transport.id, &profile.versions);
    let recorded = file.and_then(|file| lookup(file, source, transport, versions));
    let calibration = file.and_then(|file| lookup_calibration(file, source, transport, versions));
    let chosen = match (&recorded, &calibration) {
        (Some(r), Some(c)) if r.measured_at_unix >= c.measured_at_unix => Origin::Measured,
        (_, Some(_)) => Origin::Calibrated,
        (Some(_), None) => Origin::Measured,
        (None, None) => Origin::Model,
    };
    let calibrated = calibration.map(|c| calibrated_hint(profile, policy, &model, &c)).transpose()?;
    let recorded = recorded.map(|r| apply(model.clone(), &r));
    Ok(HintSet { model, calibrated, recorded, chosen })
}

/// The hint for `profile`: the model's, unless `file` (or the calibration file beside it)
/// holds a knee or a calibration measured under the same versions — the newer of the two wins.
/// The one place the facade and the probe compute hints.
pub(crate) fn hint(
    profile: &PathProfile,
    policy: &HintPolicy,
    file: Option<&Path>,
) -> Result<SizeHint, HintError> {
    hint_set(profile, policy, file).map(|set| set.chosen().clone())
}

/// The model's hint with the measured knee as its block (rounded up to the alignment) and the
/// measured plateau as its bandwidth `B`. Efficiency and latency follow from the curve, not
/// from the model's constants: the knee is where the curve reached 90 % of its plateau, so
/// the fixed cost `o` is the one that puts the knee there (`o = knee/B · (1/0.9 − 1)`). The
/// model's own `B`, `o` and efficiency reasons go: mixed with a measured `B` they predicted
/// a quarter of the plateau at a knee the sweep measured at 90 %.
pub(crate) fn apply(mut hint: SizeHint, measured: &MeasuredHint) -> SizeHint {
    // Checked: `lookup` bounds the knee, but `apply` is public and a knee near u64::MAX
    // wrapped to a zero block here once.
    let block = measured
        .knee_bytes
        .clamp(1, MAX_RECORDED_KNEE_BYTES)
        .checked_next_multiple_of(hint.align_bytes)
        .unwrap_or(hint.block_bytes);
    let plateau = measured.plateau_gbps;
    let bandwidth = if plateau.is_finite() && plateau > 0.0 { plateau } else { hint.bandwidth_gbps };
    let knee = measured.knee_bytes.clamp(1, MAX_RECORDED_KNEE_BYTES) as f64;
    // Bytes per µs at B GB/s: B · 10³.
    // Within the model's bounds whatever the plateau (a denormal one would make it infinite).
    hint.fixed_cost_us = (knee / (bandwidth * 1e3) * (1.0 / KNEE_SHARE - 1.0)).min(MAX_PER_OP_US);
    hint.reasons.retain(|reason| {
        !matches!(reason.factor, Factor::Bandwidth | Factor::FixedCost | Factor::Efficiency)
    });
    hint = hint.rescaled(block, bandwidth);
    hint.origin = Origin::Measured;
    hint.reasons.push(Reason::new(
        Factor::Measured,
        format!("{:.2} µs", hint.fixed_cost_us),
        format!(
            "o implied by the measured curve: the knee reaches {:.0} % of the plateau",
            KNEE_SHARE * 100.0
        ),
    ));
    hint.reasons.push(Reason::new(
        Factor::Measured,
        format!("{block} B"),
        format!(
            "measured knee {} B (90 % of a {} plateau, now B) by `rdma-hint sweep` on {}",
            measured.knee_bytes,
            rate(measured.plateau_gbps),
            utc_date_time(measured.measured_at_unix)
        ),
    ));
    hint
}

/// The share of its plateau a measured curve reaches at its knee (sweep's robust knee).
const KNEE_SHARE: f64 = 0.9;

/// `2026-12-01 09:20 UTC` for seconds since the Unix epoch (the proleptic Gregorian calendar,
/// Howard Hinnant's days-to-civil algorithm; no time-zone database needed).
pub(crate) fn utc_date_time(unix_seconds: u64) -> String {
    let days = unix_seconds / 86_400;
    let (hour, minute) = (unix_seconds % 86_400 / 3600, unix_seconds % 3600 / 60);
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

/// The alignment a measured ladder keeps on this path: the model's, at least 4 KiB for host
/// memory (a page, the staged ring's slot) and 64 KiB for GPU memory (a GPUDirect page).
pub fn ladder_alignment(hint: &SizeHint) -> u64 {
    match hint.source {
        SourceId::Gpu(_) => hint.align_bytes.max(64 << 10),
        SourceId::Host(_) => hint.align_bytes.max(4 << 10),
    }
}

#[cfg(test)]
mod tests;
