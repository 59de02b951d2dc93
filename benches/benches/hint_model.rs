//! Cost of computing a hint (it runs once per device at init, then comes from the cache).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use rdma_hint::calibration::{HintCache, HintKey};
use rdma_hint::model::{compute_hint, DriverVersions, HintPolicy, PathProfile};

fn hint_model(c: &mut Criterion) {
    let policy = HintPolicy::default();
    let gpu = PathProfile::example_gpu_nic();
    c.bench_function("compute_hint/gpu_pix", |b| b.iter(|| compute_hint(black_box(&gpu), &policy)));
    let cache = HintCache::new();
    let key = HintKey { source: gpu.source.id, transport: gpu.transport.id.clone() };
    let versions = DriverVersions::default();
    c.bench_function("hint_cache/hit", |b| {
        b.iter(|| cache.get_or_compute(black_box(&key), &versions, || compute_hint(&gpu, &policy)))
    });
}

criterion_group!(benches, hint_model);
criterion_main!(benches);
