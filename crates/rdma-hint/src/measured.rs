//! Measured hints: what `rdma-hint sweep` found, kept in a cache file and preferred over the
//! model while the driver and firmware versions are the ones it was measured under.

use rdma_hint_core::model::{efficiency, rate, Factor, Reason};
use rdma_hint_core::{
    compute_hint, DriverVersions, HintError, HintPolicy, Origin, PathProfile, SizeHint, SourceId,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One measured result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredHint {
    /// Memory source.
    pub source: SourceId,
    /// Transport id (`staged:shm`, …).
    pub transport: String,
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
/// else `~/.cache/rdma-hint/…`.
pub fn cache_file() -> Option<PathBuf> {
    let dir = std::env::var_os("RDMA_HINT_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("rdma-hint")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rdma-hint")))?;
    Some(dir.join("measured.json"))
}

/// Every entry in `file` (none if it is missing or unreadable: a cache, not a source of truth).
pub fn load(file: &Path) -> Vec<MeasuredHint> {
    std::fs::read(file).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default()
}

/// Stores `entry` in `file`, replacing the entry of the same source and transport.
pub fn store(file: &Path, entry: MeasuredHint) -> std::io::Result<()> {
    let mut entries = load(file);
    entries.retain(|e| !(e.source == entry.source && e.transport == entry.transport));
    entries.push(entry);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temporary = file.with_extension("json.tmp");
    std::fs::write(&temporary, serde_json::to_vec_pretty(&entries).map_err(std::io::Error::other)?)?;
    std::fs::rename(temporary, file)
}

/// The entry for this pair under exactly these versions; stale entries are ignored.
pub fn lookup(
    file: &Path,
    source: SourceId,
    transport: &str,
    versions: &DriverVersions,
) -> Option<MeasuredHint> {
    load(file).into_iter().find(|e| e.source == source && e.transport == transport && &e.versions == versions)
}

/// The hint for `profile`: the model's, with the knee measured under the same versions
/// applied when `file` holds one. The one place the facade and the probe compute hints.
pub fn hint(profile: &PathProfile, policy: &HintPolicy, file: Option<&Path>) -> Result<SizeHint, HintError> {
    let hint = compute_hint(profile, policy)?;
    let measured =
        file.and_then(|file| lookup(file, profile.source.id, &profile.transport.id, &profile.versions));
    Ok(match measured {
        Some(measured) => apply(hint, &measured),
        None => hint,
    })
}

/// The model's hint with the measured knee as its block (rounded up to the alignment) and the
/// measured plateau as its bandwidth `B`; efficiency and latency follow from the model's fixed
/// cost `o` with that `B`.
pub fn apply(mut hint: SizeHint, measured: &MeasuredHint) -> SizeHint {
    let block = measured.knee_bytes.div_ceil(hint.align_bytes).max(1) * hint.align_bytes;
    if measured.plateau_gbps.is_finite() && measured.plateau_gbps > 0.0 {
        hint.bandwidth_gbps = measured.plateau_gbps;
    }
    hint.block_bytes = block;
    hint.efficiency = efficiency(block, hint.fixed_cost_us, hint.bandwidth_gbps);
    hint.predicted_gbps = hint.bandwidth_gbps * hint.efficiency;
    hint.predicted_latency_us = hint.fixed_cost_us + block as f64 / (hint.bandwidth_gbps * 1e3);
    hint.origin = Origin::Measured;
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

/// `2026-12-01 09:20 UTC` for seconds since the Unix epoch (the proleptic Gregorian calendar,
/// Howard Hinnant's days-to-civil algorithm; no time-zone database needed).
pub fn utc_date_time(unix_seconds: u64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_seconds_read_as_utc_dates() {
        assert_eq!(utc_date_time(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date_time(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_date_time(1_796_116_830), "2026-12-01 09:20 UTC");
        assert_eq!(utc_date_time(4_107_542_399), "2100-02-28 23:59 UTC");
    }
    use rdma_hint_core::{compute_hint, HintPolicy, PathProfile};

    #[test]
    fn stored_entries_apply_only_under_their_versions() {
        let dir = std::env::temp_dir().join(format!("rdma-hint-measured-{}", std::process::id()));
        let file = dir.join("measured.json");
        let versions = DriverVersions { firmware: Some("1.0".into()), ..Default::default() };
        let entry = MeasuredHint {
            source: SourceId::Host(0),
            transport: "staged:shm".into(),
            versions: versions.clone(),
            knee_bytes: 60_000,
            plateau_gbps: 9.5,
            measured_at_unix: 1,
        };
        store(&file, entry.clone()).unwrap();
        store(&file, MeasuredHint { knee_bytes: 70_000, ..entry.clone() }).unwrap();
        assert_eq!(load(&file).len(), 1, "replaced, not appended");
        let found = lookup(&file, SourceId::Host(0), "staged:shm", &versions).unwrap();
        assert_eq!(found.knee_bytes, 70_000);
        let other = DriverVersions { firmware: Some("2.0".into()), ..Default::default() };
        assert!(lookup(&file, SourceId::Host(0), "staged:shm", &other).is_none(), "stale");
        let model = compute_hint(&PathProfile::example_host_nic(), &HintPolicy::default()).unwrap();
        let measured = apply(model.clone(), &found);
        assert_eq!(measured.origin, Origin::Measured);
        assert_eq!(measured.block_bytes % measured.align_bytes, 0);
        assert!(measured.block_bytes >= 70_000);
        assert_eq!(measured.bandwidth_gbps, 9.5, "the measured plateau is B");
        assert!(
            measured.reasons.last().unwrap().why.contains("1970-01-01 00:00 UTC"),
            "a date, not a raw epoch"
        );
        assert!(load(&dir.join("missing.json")).is_empty());
        std::fs::write(&file, b"not json").unwrap();
        assert!(load(&file).is_empty(), "a garbled cache is ignored");
        let _ = std::fs::remove_dir_all(dir);
    }
}
