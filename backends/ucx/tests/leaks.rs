//! Resource accounting over 100 connect/transfer/drop cycles per scope. Alone in its own test
//! binary because it counts process-wide descriptors and threads.

mod common;

use common::{chunker, loopback, pair, round_trip, SCOPES};
use rdma_hint_integration_tests::{open_fds, threads};
use std::time::Duration;

#[test]
fn a_hundred_cycles_leak_no_descriptors_or_threads() {
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
