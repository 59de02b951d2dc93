//! Arbitrary bytes into everything that stands before UCX: the hello decoder, the packed-rkey
//! check and the worker-address screen. A typed error or a hello that re-encodes to the same
//! bytes (every rkey in it passing the layout check, a screened address zero-padded), never a
//! panic, never an unbounded allocation.
#![no_main]

#[path = "common/round_trip.rs"]
mod round_trip;

use libfuzzer_sys::fuzz_target;
use rdma_hint_ucx::wire::{
    check_packed_rkey, screen_worker_address, Hello, RING_BYTES, WORKER_ADDRESS_PADDING,
};

fuzz_target!(|data: &[u8]| {
    if let Some(hello) = round_trip::hello(data, |reader| Hello::decode(reader), Hello::encode) {
        assert!(!hello.worker_address.is_empty());
        let ours = [hello.worker_address[0], 0, 0, 0, 0, 0, 0, 0, 0];
        if let Ok(padded) = screen_worker_address(&hello.worker_address, &ours) {
            assert_eq!(padded.len(), hello.worker_address.len() + WORKER_ADDRESS_PADDING);
            assert!(padded[hello.worker_address.len()..].iter().all(|b| *b == 0));
        }
        for region in &hello.regions {
            assert!(region.len > 0 && region.address.checked_add(region.len).is_some());
            assert!(check_packed_rkey(&region.key).is_ok());
        }
        if let Some(ring) = &hello.ring {
            assert!(
                ring.address > 0 && ring.address % 64 == 0 && ring.address.checked_add(RING_BYTES).is_some()
            );
            assert!(check_packed_rkey(&ring.rkey).is_ok());
        }
    }
    let _ = check_packed_rkey(data);
    let _ = screen_worker_address(data, &[1; 9]);
});
