//! Arbitrary bytes, cut into pieces of arbitrary sizes, into the control channel's reader
//! (`ControlReader`: regions exposed and withdrawn after connect, their answers, the goodbye):
//! every message it delivers re-encodes to exactly the bytes it was read from, every
//! descriptor passed the hello's checks, nothing is delivered after a refused frame, and it
//! never holds more than one frame. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_hint_oob::{Control, ControlReader, HelloLimits, MAX_CONTROL_BODY, MAX_REGION_ID};

const LIMITS: HelloLimits = HelloLimits { max_connection_bytes: 0, max_key_bytes: 64, known_flags: 1 };

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else { return };
    let piece = usize::from(cut % 32) + 1;
    let mut reader = ControlReader::new(LIMITS);
    let mut delivered = Vec::new();
    let mut refused = false;
    for chunk in bytes.chunks(piece) {
        if reader.feed(chunk, &mut |message| delivered.push(message)).is_err() {
            refused = true;
            break;
        }
    }
    let mut encoded = Vec::new();
    for message in &delivered {
        if let Control::Expose { descriptor, .. } = message {
            assert!(descriptor.id < MAX_REGION_ID && descriptor.len > 0 && descriptor.key.len() <= 64);
            assert!(descriptor.address.checked_add(descriptor.len).is_some());
        }
        if let Control::Withdraw { id, .. } = message {
            assert!(*id < MAX_REGION_ID);
        }
        message.encode(&mut encoded);
    }
    // What was delivered is a prefix of the input, re-encoded byte for byte; what follows it
    // is an unfinished frame (or the refused one).
    assert_eq!(&bytes[..encoded.len()], &encoded[..], "a message does not re-encode to its bytes");
    if !refused {
        assert!(bytes.len() - encoded.len() < 3 + MAX_CONTROL_BODY, "more than one frame held back");
    }
});
