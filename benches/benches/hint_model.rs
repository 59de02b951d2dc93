//! Cost of computing a hint (it runs once per device at init), and of asking for it again (the
//! process-wide cache answers).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use rdma_hint::model::{compute_hint, HintPolicy, PathProfile};
use rdma_hint::{get_low_latency_rdma_size_hint_with, Device, TransportId, TransportSelector};

fn hint_model(c: &mut Criterion) {
    let policy = HintPolicy::default();
    let gpu = PathProfile::example_gpu_nic();
    c.bench_function("compute_hint/gpu_pix", |b| b.iter(|| compute_hint(black_box(&gpu), &policy)));
    // What an embedder calls on every transfer: discovery and the model ran on the first call.
    let shm = TransportSelector::Id(TransportId::STAGED_SHM);
    get_low_latency_rdma_size_hint_with(Device::Host(0), &shm).expect("staged:shm has a hint on any machine");
    c.bench_function("hint/warm_staged_shm", |b| {
        b.iter(|| get_low_latency_rdma_size_hint_with(black_box(Device::Host(0)), &shm))
    });
}

criterion_group!(benches, hint_model);
criterion_main!(benches);
