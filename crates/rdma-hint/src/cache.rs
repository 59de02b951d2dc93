//! Process-wide hint cache: one computation per (source, transport) and driver/firmware versions.

use rdma_hint_core::error::HintError;
use rdma_hint_core::model::SizeHint;
use rdma_hint_core::profile::{DriverVersions, SourceId};
use rdma_hint_core::TransportId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// What a cached hint is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HintKey {
    /// Memory source.
    pub(crate) source: SourceId,
    /// Transport identity (`verbs:mlx5_0`, `staged:tcp`, …).
    pub(crate) transport: TransportId,
}

type Slot = Mutex<Option<(DriverVersions, Result<SizeHint, HintError>)>>;

/// Thread-safe cache of hints (and of "no hint" answers, which are just as stable).
///
/// An entry is valid only for the driver/firmware versions it was computed under: a lookup with
/// other versions recomputes and replaces it. Concurrent callers asking for the same key wait
/// for one computation instead of repeating it (the tests below).
#[derive(Debug, Default)]
pub(crate) struct HintCache {
    slots: Mutex<HashMap<HintKey, Arc<Slot>>>,
}

impl HintCache {
    /// An empty cache.
    pub(crate) fn new() -> HintCache {
        HintCache::default()
    }

    /// The process-wide cache the facade uses.
    pub(crate) fn global() -> &'static HintCache {
        static GLOBAL: OnceLock<HintCache> = OnceLock::new();
        GLOBAL.get_or_init(HintCache::new)
    }

    fn slot(&self, key: &HintKey) -> Arc<Slot> {
        // A panic while holding the lock cannot leave the map half-updated, so poison is ignored.
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.entry(key.clone()).or_default().clone()
    }

    /// The cached answer for `key` under `versions`, computing it with `compute` if it is absent
    /// or was computed under other versions.
    pub(crate) fn get_or_compute(
        &self,
        key: &HintKey,
        versions: &DriverVersions,
        compute: impl FnOnce() -> Result<SizeHint, HintError>,
    ) -> Result<SizeHint, HintError> {
        let slot = self.slot(key);
        let mut entry = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((cached_versions, answer)) = entry.as_ref() {
            if cached_versions == versions {
                return answer.clone();
            }
            tracing::debug!(?key, "hint cache entry stale: driver/firmware versions changed");
        }
        let answer = compute();
        *entry = Some((versions.clone(), answer.clone()));
        answer
    }

    /// Drops every entry.
    pub(crate) fn clear(&self) {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_hint_core::model::{compute_hint, HintPolicy};
    use rdma_hint_core::profile::PathProfile;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn key() -> HintKey {
        HintKey { source: SourceId::Gpu(0), transport: TransportId::Verbs("mlx5_0".into()) }
    }

    #[test]
    fn computes_once_across_threads() {
        let cache = HintCache::new();
        let calls = AtomicUsize::new(0);
        let profile = PathProfile::example_gpu_nic();
        let versions = DriverVersions::default();
        std::thread::scope(|scope| {
            for _ in 0..16 {
                scope.spawn(|| {
                    let hint = cache
                        .get_or_compute(&key(), &versions, || {
                            calls.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(5));
                            compute_hint(&profile, &HintPolicy::default())
                        })
                        .unwrap();
                    assert!(hint.block_bytes > 0);
                });
            }
        });
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn new_driver_version_invalidates() {
        let cache = HintCache::new();
        let profile = PathProfile::example_gpu_nic();
        let old = DriverVersions { firmware: Some("28.39.1002".into()), ..Default::default() };
        let new = DriverVersions { firmware: Some("28.41.1000".into()), ..Default::default() };
        let calls = AtomicUsize::new(0);
        let compute = || {
            calls.fetch_add(1, Ordering::SeqCst);
            compute_hint(&profile, &HintPolicy::default())
        };
        cache.get_or_compute(&key(), &old, compute).unwrap();
        cache.get_or_compute(&key(), &old, compute).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        cache.get_or_compute(&key(), &new, compute).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
