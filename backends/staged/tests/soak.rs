//! Soak: many transfers over several connections at once, bytes verified, memory flat. Alone in
//! its own test binary because it reads process-wide resident memory.

mod common;

use common::{chunker, deadline, loopback, pair};
use rdma_hint_chunker::Transfer;
use rdma_hint_integration_tests::resident_kib;
use rdma_hint_staged::StagedChannel;
use rdma_hint_transport::{Arrival, Transport};

/// Soak: four connections at once, 200 transfers each of pseudo-random sizes up to 1 MiB, every
/// transfer's bytes verified on its receiver; resident memory stays flat.
#[test]
fn soak_four_connections_two_hundred_transfers_each() {
    let run = |seed: u64, channel: StagedChannel| {
        let p = pair(channel, 1 << 20, loopback());
        let mut chunker = chunker(&p.sender, 64 * 1024);
        let mut state = seed | 1;
        for round in 0..200u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = 1 + state % (1 << 20) / 2;
            let byte = (state >> 32) as u8;
            p.sender.write_region(p.source.id, 0, &vec![byte; len as usize]).unwrap();
            let transfer = Transfer::new(&p.source, &p.remote, len).notify(round);
            rdma_hint_transport::blocking::block_on(chunker.write(&p.sender, transfer, deadline(20)))
                .unwrap();
            let mut arrivals = [Arrival::EMPTY; 1];
            rdma_hint_transport::blocking::block_on(p.receiver.wait_arrivals(&mut arrivals, deadline(20)))
                .unwrap();
            assert_eq!(arrivals[0].imm, round);
            let mut arrived = vec![0u8; len as usize];
            p.receiver.read_region(p.target.id, 0, &mut arrived).unwrap();
            assert!(arrived.iter().all(|b| *b == byte), "seed {seed} round {round}: {len} B");
        }
    };
    run(99, StagedChannel::Tcp); // warm the allocator before measuring
    let before = resident_kib();
    std::thread::scope(|scope| {
        for (seed, channel) in [
            (1, StagedChannel::Tcp),
            (2, StagedChannel::Tcp),
            (3, StagedChannel::SharedMemory),
            (4, StagedChannel::SharedMemory),
        ] {
            scope.spawn(move || run(seed, channel));
        }
    });
    let grown = resident_kib().saturating_sub(before);
    assert!(grown < 32 * 1024, "resident memory grew by {grown} KiB over 800 transfers");
}
