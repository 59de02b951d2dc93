//! Arbitrary bytes into the UCX backend's hello decoder and packed-rkey check: a typed error or
//! a hello that re-encodes to the same bytes (every rkey in it passing the layout check), never
//! a panic, never an unbounded allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_hint_ucx::wire::{check_packed_rkey, Hello};

fuzz_target!(|data: &[u8]| {
    let mut reader = data;
    if let Ok(hello) = Hello::decode(&mut reader) {
        let consumed = data.len() - reader.len();
        assert_eq!(hello.encode(), &data[..consumed], "hello round trip");
        assert!(!hello.worker_address.is_empty());
        for region in &hello.regions {
            assert!(region.len > 0 && region.address.checked_add(region.len).is_some());
            assert!(check_packed_rkey(&region.rkey).is_ok());
        }
    }
    let _ = check_packed_rkey(data);
});
