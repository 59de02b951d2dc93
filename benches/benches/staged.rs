//! The staged backend over real shm and TCP loopback connections, block sizes 16 KiB … 4 MiB:
//! `cargo bench -p rdma-hint-benches --bench staged` (compare runs with `--save-baseline NAME`
//! and `--baseline NAME`; HTML reports land in `target/criterion`).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer};
use rdma_hint_core::{MemoryKind, PeerEndpoint, SourceId, Transport};
use rdma_hint_staged::{StagedChannel, StagedTransport};
use std::time::{Duration, Instant};

const TRANSFER: u64 = 16 << 20;
const BLOCKS: [u64; 5] = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

fn staged(c: &mut Criterion) {
    for channel in StagedChannel::ALL {
        let deadline = Instant::now() + Duration::from_secs(3600);
        let receiver = StagedTransport::new(channel);
        let target = receiver.register(MemoryKind::Host, TRANSFER).expect("register");
        let address = receiver.bind("127.0.0.1:0".parse().expect("address")).expect("bind");
        let accepting = std::thread::spawn(move || {
            pollster::block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline))
                .expect("accept");
            receiver
        });
        let sender = StagedTransport::new(channel);
        let source = sender.register(MemoryKind::Host, TRANSFER).expect("register");
        let remote =
            pollster::block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline)).expect("dial")[0];
        let _receiver = accepting.join().expect("receiver");

        let mut group = c.benchmark_group(format!("staged_{}", channel.name()));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        group.throughput(Throughput::Bytes(TRANSFER));
        for block in BLOCKS {
            let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).expect("policy");
            chunker.set_hint(SourceId::Host(0), BlockSpec::new(block, 4096).expect("spec"));
            group.bench_with_input(BenchmarkId::from_parameter(block), &block, |b, _| {
                b.iter(|| {
                    pollster::block_on(chunker.write(
                        &sender,
                        Transfer::new(&source, &remote, TRANSFER),
                        deadline,
                    ))
                    .expect("transfer")
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, staged);
criterion_main!(benches);
