//! Arbitrary bytes into the staged backend's handshake and frame decoders: a typed error or a
//! value that re-encodes to the same bytes, never a panic, never an unbounded allocation.
#![no_main]

#[path = "common/round_trip.rs"]
mod round_trip;

use libfuzzer_sys::fuzz_target;
use rdma_hint_staged::wire::{Frame, Hello, HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    if let Some(hello) = round_trip::hello(data, |reader| Hello::decode(reader), Hello::encode) {
        assert!(hello.regions.iter().all(|r| r.len > 0));
    }
    if data.len() >= HEADER_BYTES {
        let mut header = [0u8; HEADER_BYTES];
        header.copy_from_slice(&data[..HEADER_BYTES]);
        if let Ok(frame) = Frame::decode(&header) {
            let again = frame.encode();
            assert_eq!(Frame::decode(&again).ok(), Some(frame));
        }
    }
});
