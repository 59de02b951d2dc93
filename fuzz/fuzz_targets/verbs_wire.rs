//! Arbitrary bytes into the verbs backend's hello decoder (the QP exchange): a typed error or a
//! hello that re-encodes to the same bytes with every field in range, never a panic.
#![no_main]

#[path = "common/round_trip.rs"]
mod round_trip;

use libfuzzer_sys::fuzz_target;
use rdma_hint_verbs::wire::Hello;

fuzz_target!(|data: &[u8]| {
    if let Some(hello) = round_trip::hello(data, |reader| Hello::decode(reader), Hello::encode) {
        assert!(hello.qpn > 0 && hello.qpn < 1 << 24 && hello.psn < 1 << 24);
        assert!((1..=5).contains(&hello.mtu));
        assert!(hello.regions.iter().all(|r| r.len > 0 && r.address.checked_add(r.len).is_some()));
    }
});
