//! The staged backend over real shm and TCP loopback connections, block sizes 16 KiB … 4 MiB:
//! `cargo bench -p rdma-hint-benches --bench staged` (compare runs with `--save-baseline NAME`
//! and `--baseline NAME`; HTML reports land in `target/criterion`).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdma_hint::engine::{BlockSpec, Chunker, PostPolicy, TransferRequest};
use rdma_hint::{open, BlockingTransport, Device, MemoryKind, OpenOptions, PeerEndpoint, TransportId};
use std::time::{Duration, Instant};

const TRANSFER: u64 = 16 << 20;
const BLOCKS: [u64; 5] = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

fn staged(c: &mut Criterion) {
    for (id, group_name) in [(TransportId::STAGED_SHM, "staged_shm"), (TransportId::STAGED_TCP, "staged_tcp")]
    {
        let deadline = Instant::now() + Duration::from_secs(3600);
        let receiver = open(&id, &OpenOptions::default()).expect("open");
        let target = receiver.register(MemoryKind::Host, TRANSFER).expect("register");
        let address = receiver.bind("127.0.0.1:0".parse().expect("address")).expect("bind");
        let accepting = std::thread::spawn(move || {
            receiver.connect_blocking(PeerEndpoint::Listen(address), &[target.id], deadline).expect("accept");
            receiver
        });
        let sender = open(&id, &OpenOptions::default()).expect("open");
        let source = sender.register(MemoryKind::Host, TRANSFER).expect("register");
        let remote = sender.connect_blocking(PeerEndpoint::Dial(address), &[], deadline).expect("dial")[0];
        let _receiver = accepting.join().expect("receiver");

        let mut group = c.benchmark_group(group_name);
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        group.throughput(Throughput::Bytes(TRANSFER));
        for block in BLOCKS {
            let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).expect("policy");
            chunker.set_hint(Device::Host(0), BlockSpec::new(block, 4096).expect("spec"));
            group.bench_with_input(BenchmarkId::from_parameter(block), &block, |b, _| {
                b.iter(|| {
                    chunker
                        .transfer_blocking(
                            &*sender,
                            TransferRequest::single(&source, 0, &remote, 0, TRANSFER),
                            deadline,
                        )
                        .expect("transfer")
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, staged);
criterion_main!(benches);
