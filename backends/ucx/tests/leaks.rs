//! Resource accounting over 100 connect/transfer/drop cycles per scope. Alone in its own test
//! binary because it counts process-wide descriptors and threads.

mod common;

use common::{chunker, loopback, pair, round_trip, SCOPES};
use rdma_hint_integration_tests::{open_fds, threads};
use std::sync::Mutex;
use std::time::Duration;

/// The counts are process-wide: the tests of this binary take turns.
static ALONE: Mutex<()> = Mutex::new(());

#[test]
fn a_hundred_cycles_leak_no_descriptors_or_threads() {
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for tls in SCOPES {
        // UCX sets up process-wide state (its async thread, config) on first use.
        drop(pair(tls, 64 * 1024, loopback()));
        std::thread::sleep(Duration::from_millis(50));
        let before = (open_fds(), threads());
        for cycle in 0..100u32 {
            let p = pair(tls, 64 * 1024, loopback());
            let mut chunker = chunker(&p.sender, 16 * 1024);
            round_trip(&p, &mut chunker, 64 * 1024, cycle as u8, cycle);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(before, (open_fds(), threads()), "{tls}: (fds, threads) before and after 100 cycles");
    }
}

/// The fault case repeated: 100 transfers whose receiver is dropped mid-way (the sender fails
/// with a typed error) leave descriptors and threads as they were.
#[test]
fn a_hundred_failed_transfers_leak_nothing() {
    use rdma_hint_chunker::{Transfer, TransferError};
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for tls in SCOPES {
        let mut failed = 0;
        drop(pair(tls, 64 * 1024, loopback()));
        std::thread::sleep(Duration::from_millis(50));
        let before = (open_fds(), threads());
        for cycle in 0..100u32 {
            let len = 32 << 20;
            let p = pair(tls, len, loopback());
            let mut chunker = chunker(&p.sender, 4096);
            let receiver = p.receiver;
            let closer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(500));
                drop(receiver);
            });
            let result = rdma_hint_transport::blocking::block_on(chunker.write(
                &p.sender,
                Transfer::new(&p.source, &p.remote, len),
                common::deadline(20),
            ));
            closer.join().unwrap();
            if let Err(e) = &result {
                assert!(matches!(e, TransferError::Transport { .. }), "{tls} cycle {cycle}: {e}");
                failed += 1;
            }
        }
        assert!(failed >= 90, "{tls}: only {failed} of 100 transfers saw the receiver go");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(before, (open_fds(), threads()), "{tls}: (fds, threads) after 100 failed transfers");
    }
}
