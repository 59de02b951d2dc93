//! Chunker cost per block and throughput, against a hand-written posting loop.
//!
//! * `null/*`: planning + posting on a transport that moves nothing → ns per block;
//! * `hand_loop/*`: the same batches and signalling posted by a minimal hand-written loop;
//! * `loopback/*`: real `memcpy` transfers through the loopback transport → GB/s, next to one
//!   plain `memcpy` of the whole transfer (`loopback/memcpy_whole`).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdma_hint::engine::{BlockSpec, Chunker, LoopbackTransport, PostPolicy, TransferRequest};
use rdma_hint::Device;
use rdma_hint::{MemoryKind, PeerEndpoint, RemoteRegion, Transport};
use rdma_hint_benches::{block_on, hand_written_loop, NullTransport};
use std::time::{Duration, Instant};

const BLOCKS: [u64; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
const NULL_TRANSFER: u64 = 64 << 20;
const LOOPBACK_TRANSFER: u64 = 32 << 20;

fn label(block: u64) -> String {
    if block >= 1 << 20 {
        format!("{}MiB", block >> 20)
    } else {
        format!("{}KiB", block >> 10)
    }
}

fn posting(c: &mut Criterion) {
    let policy = PostPolicy::default();
    let mut group = c.benchmark_group("null");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for block in BLOCKS {
        let transport = NullTransport::new(256);
        let local = transport.region(0, NULL_TRANSFER);
        let remote = RemoteRegion { id: local.id, len: NULL_TRANSFER };
        let mut chunker = Chunker::new(policy, transport.capabilities()).expect("policy");
        chunker.set_hint(Device::Host(0), BlockSpec::new(block, 4096).expect("spec"));
        group.throughput(Throughput::Elements(NULL_TRANSFER / block));
        group.bench_with_input(BenchmarkId::from_parameter(label(block)), &block, |b, _| {
            let deadline = Instant::now() + Duration::from_secs(3600);
            b.iter(|| {
                block_on(chunker.transfer(
                    &transport,
                    TransferRequest::single(&local, 0, &remote, 0, NULL_TRANSFER),
                    deadline,
                ))
                .expect("transfer")
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("hand_loop");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for block in BLOCKS {
        let transport = NullTransport::new(256);
        group.throughput(Throughput::Elements(NULL_TRANSFER / block));
        group.bench_with_input(BenchmarkId::from_parameter(label(block)), &block, |b, &block| {
            b.iter(|| hand_written_loop(&transport, NULL_TRANSFER, block, &policy))
        });
    }
    group.finish();
}

fn loopback(c: &mut Criterion) {
    let mut group = c.benchmark_group("loopback");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let transport = LoopbackTransport::new(256);
    let src = transport.register(MemoryKind::Host, LOOPBACK_TRANSFER).expect("register");
    let dst = transport.register(MemoryKind::Host, LOOPBACK_TRANSFER).expect("register");
    let deadline = Instant::now() + Duration::from_secs(3600);
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().expect("address"));
    let remote = block_on(transport.connect(listen, &[dst.id], deadline)).expect("connect")[0];
    // Yardstick: one plain memcpy of the whole transfer, no blocks.
    let source = vec![1u8; LOOPBACK_TRANSFER as usize];
    let mut target = vec![0u8; LOOPBACK_TRANSFER as usize];
    group.throughput(Throughput::Bytes(LOOPBACK_TRANSFER));
    group.bench_function("memcpy_whole", |b| b.iter(|| target.copy_from_slice(&source)));
    for block in BLOCKS {
        let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).expect("policy");
        chunker.set_hint(Device::Host(0), BlockSpec::new(block, 4096).expect("spec"));
        group.throughput(Throughput::Bytes(LOOPBACK_TRANSFER));
        group.bench_with_input(BenchmarkId::from_parameter(label(block)), &block, |b, _| {
            b.iter(|| {
                block_on(chunker.transfer(
                    &transport,
                    TransferRequest::single(&src, 0, &remote, 0, LOOPBACK_TRANSFER),
                    deadline,
                ))
                .expect("transfer")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, posting, loopback);
criterion_main!(benches);
