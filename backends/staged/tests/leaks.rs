//! Resource accounting over 100 connect/transfer/drop cycles. Alone in its own test binary
//! because it counts process-wide descriptors and threads.

mod common;

use common::{chunker, deadline, loopback, pair};
use rdma_hint_chunker::Transfer;
use rdma_hint_integration_tests::{open_fds, threads};
use rdma_hint_staged::StagedChannel;
use rdma_hint_transport::{Arrival, Transport};
use std::sync::Mutex;
use std::time::Duration;

/// The counts are process-wide: the tests of this binary take turns.
static ALONE: Mutex<()> = Mutex::new(());

/// Shared regions still mapped in this process (ours and peers', all `memfd:rdma-hint-region`).
fn shm_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:rdma-hint-region"))
        .count()
}

#[test]
fn a_hundred_cycles_leak_no_descriptors_threads_or_shm_mappings() {
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Settle anything a previous cycle in this process left to the scheduler.
    let measure = || (open_fds(), threads(), shm_mappings());
    for channel in StagedChannel::ALL {
        let warm = pair(channel, 64 * 1024, loopback());
        drop(warm);
        std::thread::sleep(Duration::from_millis(50));
        let before = measure();
        for cycle in 0..100u32 {
            let p = pair(channel, 64 * 1024, loopback());
            p.sender.write_region(p.source.id, 0, &[cycle as u8; 64 * 1024]).unwrap();
            let mut chunker = chunker(&p.sender, 16 * 1024);
            let transfer = Transfer::new(&p.source, &p.remote, 64 * 1024).notify(cycle);
            rdma_hint_transport::blocking::block_on(chunker.write(&p.sender, transfer, deadline(10)))
                .unwrap();
            let mut arrivals = [Arrival::EMPTY; 1];
            rdma_hint_transport::blocking::block_on(p.receiver.wait_arrivals(&mut arrivals, deadline(10)))
                .unwrap();
            let mut arrived = [0u8; 64 * 1024];
            p.receiver.read_region(p.target.id, 0, &mut arrived).unwrap();
            assert!(arrived.iter().all(|b| *b == cycle as u8), "cycle {cycle}");
        }
        std::thread::sleep(Duration::from_millis(50));
        let after = measure();
        assert_eq!(before, after, "{channel:?}: (fds, threads, shm files) before and after 100 cycles");
    }
}

/// The fault case repeated: 100 transfers whose receiver is dropped mid-way (the sender fails
/// with a typed error) leave descriptors, threads and shm files as they were.
#[test]
fn a_hundred_failed_transfers_leak_nothing() {
    use rdma_hint_chunker::TransferError;
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let measure = || (open_fds(), threads(), shm_mappings());
    for channel in StagedChannel::ALL {
        drop(pair(channel, 64 * 1024, loopback()));
        std::thread::sleep(Duration::from_millis(50));
        let before = measure();
        let mut failed = 0;
        for cycle in 0..100u32 {
            let len = 32 << 20;
            let p = pair(channel, len, loopback());
            let mut chunker = chunker(&p.sender, 4096);
            let receiver = p.receiver;
            let closer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(500));
                drop(receiver);
            });
            let result = rdma_hint_transport::blocking::block_on(chunker.write(
                &p.sender,
                Transfer::new(&p.source, &p.remote, len),
                deadline(20),
            ));
            closer.join().unwrap();
            if let Err(e) = &result {
                assert!(matches!(e, TransferError::Transport { .. }), "{channel:?} cycle {cycle}: {e}");
                failed += 1;
            }
        }
        assert!(failed >= 90, "{channel:?}: only {failed} of 100 transfers saw the receiver go");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(before, measure(), "{channel:?}: (fds, threads, shm files) after 100 failed transfers");
    }
}
