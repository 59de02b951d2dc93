//! Soak: many transfers over several UCX connections at once, bytes verified, memory flat.
//! Alone in its own test binary because it reads process-wide resident memory.

mod common;

use common::{chunker, loopback, pair, round_trip};
use rdma_hint_integration_tests::resident_kib;

/// Four connections at once (two shm, two tcp), 200 transfers each of pseudo-random sizes up to
/// 512 KiB, every transfer's bytes verified; resident memory stays flat.
#[test]
fn soak_four_connections_two_hundred_transfers_each() {
    let run = |seed: u64, tls: &str| {
        let p = pair(tls, 1 << 20, loopback());
        let mut chunker = chunker(&p.sender, 64 * 1024);
        let mut state = seed | 1;
        for round in 0..200u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            round_trip(&p, &mut chunker, 1 + state % (1 << 20) / 2, (state >> 32) as u8, round);
        }
    };
    run(99, "tcp,self"); // warm UCX and the allocator before measuring
    let before = resident_kib();
    std::thread::scope(|scope| {
        for (seed, tls) in [(1, "tcp,self"), (2, "tcp,self"), (3, "shm,self"), (4, "shm,self")] {
            scope.spawn(move || run(seed, tls));
        }
    });
    let grown = resident_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "resident memory grew by {grown} KiB over 800 transfers");
}
