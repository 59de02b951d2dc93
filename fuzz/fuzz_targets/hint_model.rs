//! Arbitrary profiles and policies: a valid hint or a typed error, never a panic or a 0.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_hint_core::validate::{validate_hint, HintLimits};
use rdma_hint_core::{compute_hint, HintError, HintPolicy, PathClass, PathProfile, SourceKind};

fn f64_at(data: &[u8], at: usize) -> f64 {
    let mut bytes = [0u8; 8];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = data.get(at + i).copied().unwrap_or(0);
    }
    f64::from_le_bytes(bytes)
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    f64_at(data, at).to_bits()
}

fuzz_target!(|data: &[u8]| {
    let mut profile = if data.first().copied().unwrap_or(0) & 1 == 0 {
        PathProfile::example_host_nic()
    } else {
        PathProfile::example_gpu_nic()
    };
    profile.transport.wire_gbps = f64_at(data, 1);
    profile.transport.per_op_overhead_us = f64_at(data, 9);
    profile.transport.max_msg_bytes = u64_at(data, 17);
    profile.transport.mtu_bytes = Some(u64_at(data, 25) >> (u64_at(data, 25) % 64));
    profile.source.memory_bytes = Some(u64_at(data, 33));
    profile.bridges = (u64_at(data, 41) % 64) as u32;
    profile.path_class = PathClass::ALL[(u64_at(data, 49) % 7) as usize];
    if let SourceKind::Gpu(gpu) = &mut profile.source.kind {
        gpu.vmm_granularity_bytes = Some(u64_at(data, 57));
    }
    let policy = HintPolicy {
        target_efficiency: f64_at(data, 65),
        latency_budget_us: Some(f64_at(data, 73)),
        min_block_bytes: u64_at(data, 81),
        max_block_bytes: u64_at(data, 89),
    };
    match compute_hint(&profile, &policy) {
        Ok(hint) => {
            assert!(hint.block_bytes > 0);
            validate_hint(&hint, &HintLimits::from_profile(&profile))
                .expect("model produced an invalid hint");
        }
        Err(HintError::Unsupported { fallback, .. }) => assert!(!fallback.is_empty()),
        Err(_) => {}
    }
});
