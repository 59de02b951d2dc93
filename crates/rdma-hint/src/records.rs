//! What this machine measured, kept across runs: recorded knees and calibrations, and the
//! model's, calibrated and recorded hints side by side.

use crate::cache::HintCache;
use crate::measured::{self, HintSet};
use crate::{profile_of, Device, Error, TransportId};
use rdma_hint_core::HintPolicy;

/// Records a measured knee for `device` over `transport` (as `rdma-hint sweep` does) in the
/// cache file, keyed by the versions the machine runs now, and drops the in-process cache so
/// the next hint uses it. Returns the file written.
pub fn record_measurement(
    device: Device,
    transport: &TransportId,
    knee_bytes: u64,
    plateau_gbps: f64,
) -> Result<std::path::PathBuf, Error> {
    let profile = &profile_of(device, transport)?;
    let file = measured::cache_file().ok_or_else(|| Error::Cache {
        why: "no cache directory: set RDMA_HINT_CACHE_DIR, XDG_CACHE_HOME or HOME".into(),
    })?;
    let entry = measured::MeasuredHint {
        source: device,
        transport: transport.clone(),
        versions: profile.versions.clone(),
        knee_bytes,
        plateau_gbps,
        measured_at_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    measured::store(&file, entry)
        .map_err(|e| Error::Cache { why: format!("writing {}: {e}", file.display()) })?;
    HintCache::global().clear();
    Ok(file)
}

/// Forgets the stored calibrations of `device` over `transport`, the pooled ones included (the
/// next calibration starts a new pool): after moving a card or a NIC the driver versions do not
/// tell. Returns the calibration file, or `None` without a cache directory.
pub fn forget_calibrations(
    device: Device,
    transport: &TransportId,
) -> Result<Option<std::path::PathBuf>, Error> {
    let Some(file) = measured::cache_file() else { return Ok(None) };
    let calibrations = measured::calibration_file(&file);
    measured::store_calibration(&file, device, transport, None)
        .map_err(|e| Error::Cache { why: format!("writing {}: {e}", calibrations.display()) })?;
    HintCache::global().clear();
    Ok(Some(calibrations))
}

/// The model's, the calibrated and the recorded hint of `device` over `transport`, kept apart
/// (`rdma-hint sweep` compares all three with the curve it measures).
pub fn hint_set(device: Device, transport: &TransportId) -> Result<HintSet, Error> {
    let profile = profile_of(device, transport)?;
    Ok(measured::hint_set(&profile, &HintPolicy::default(), measured::cache_file().as_deref())?)
}
