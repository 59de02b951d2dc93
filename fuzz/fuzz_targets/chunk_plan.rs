//! Arbitrary (region, offset, len, block, align) → a typed error or a plan whose invariants hold:
//! [offset, offset+len) covered exactly once, in order, fixed length but the last, nothing past it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_hint_engine::{BlockSpec, ChunkPlan};

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(bytes)
}

fuzz_target!(|data: &[u8]| {
    let align = u64_at(data, 0) >> (u64_at(data, 0) % 64);
    let block = u64_at(data, 8) % (1 << 24);
    let region = u64_at(data, 16);
    let offset = u64_at(data, 24);
    let len = u64_at(data, 32) % (1 << 26);
    let Ok(spec) = BlockSpec::new(block, align) else { return };
    let Ok(plan) = ChunkPlan::new(region, offset, len, spec) else { return };
    if plan.block_count() > 1 << 16 {
        return; // invariants are per block; keep each input fast
    }
    let mut cursor = offset;
    let count = plan.block_count();
    for (i, b) in plan.blocks().enumerate() {
        assert_eq!(b.offset, cursor);
        assert!(b.len > 0 && b.len <= block);
        assert!(b.offset + b.len <= region);
        assert_eq!(plan.block(i as u64), b);
        if i as u64 + 1 < count {
            assert_eq!(b.len, block);
        }
        cursor += b.len;
    }
    assert_eq!(cursor, offset + len);
});
