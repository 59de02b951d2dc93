//! Unit tests of `model`.

use super::*;
use crate::profile::{GpuFacts, SourceFacts, TransportFacts};
use crate::validate::{validate_hint, HintLimits};
use crate::GIB;

fn staged_shm() -> TransportFacts {
    TransportFacts {
        id: TransportId::STAGED_SHM,
        kind: TransportKind::Staged,
        wire_gbps: 10.0,
        nic_pcie: None,
        per_op_overhead_us: 1.0,
        mtu_bytes: None,
        max_msg_bytes: 1 << 40,
        max_payload_bytes: None,
        queried_from_backend: false,
        rate_note: None,
    }
}

#[test]
fn hint_matches_closed_form() {
    let profile = PathProfile::example_host_nic();
    let hint = compute_hint(&profile, &HintPolicy::default()).unwrap();
    // o = 0.35 µs per op + 1 bridge × 0.1 µs; B = 25 GB/s wire (< Gen4 x16 PCIe).
    assert!((hint.fixed_cost_us - 0.45).abs() < 1e-9);
    assert!((hint.bandwidth_gbps - 25.0).abs() < 1e-9);
    let ideal: f64 = 9.0 * 0.45 * 25.0 * 1e3; // 101 250 B
    assert_eq!(hint.align_bytes, 4096, "MTU binds");
    assert_eq!(hint.block_bytes, (ideal / 4096.0).ceil() as u64 * 4096);
    assert!(hint.efficiency >= 0.9);
    validate_hint(&hint, &HintLimits::from_profile(&profile)).unwrap();
}

#[test]
fn gpu_behind_extra_switch_gets_a_different_hint() {
    let direct = PathProfile::example_gpu_nic();
    let mut behind_switch = direct.clone();
    behind_switch.path_class = PathClass::Pxb;
    behind_switch.bridges = 3;
    let a = compute_hint(&direct, &HintPolicy::default()).unwrap();
    let b = compute_hint(&behind_switch, &HintPolicy::default()).unwrap();
    assert!(b.block_bytes > a.block_bytes, "{} vs {}", a.block_bytes, b.block_bytes);
}

#[test]
fn gpu_without_gpudirect_is_unsupported_with_fallback() {
    let mut profile = PathProfile::example_gpu_nic();
    if let SourceKind::Gpu(gpu) = &mut profile.source.kind {
        gpu.gpudirect_rdma = Some(false);
    }
    match compute_hint(&profile, &HintPolicy::default()) {
        Err(HintError::Unsupported { fallback, .. }) => assert!(fallback.contains("staged")),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn gpu_across_numa_nodes_is_unsupported() {
    let mut profile = PathProfile::example_gpu_nic();
    profile.path_class = PathClass::Sys;
    assert!(matches!(compute_hint(&profile, &HintPolicy::default()), Err(HintError::Unsupported { .. })));
}

#[test]
fn gpu_through_host_bridge_is_capped() {
    let mut profile = PathProfile::example_gpu_nic();
    profile.path_class = PathClass::Phb;
    let hint = compute_hint(&profile, &HintPolicy::default()).unwrap();
    assert_eq!(hint.bandwidth_gbps, GPU_PHB_CAP_GBPS);
}

#[test]
fn latency_budget_caps_the_block() {
    let profile = PathProfile::example_gpu_nic();
    let policy = HintPolicy { latency_budget_us: Some(3.0), ..HintPolicy::default() };
    let hint = compute_hint(&profile, &policy).unwrap();
    assert!(hint.predicted_latency_us <= 3.0 + 64.0 * 1024.0 / 50e3);
    assert!(hint.reasons.iter().any(|r| r.why.contains("latency budget")));
}

#[test]
fn staged_gpu_pays_a_copy_engine_launch() {
    let mut profile = PathProfile::example_gpu_nic();
    profile.transport = staged_shm();
    profile.path_class = PathClass::NoNic;
    let hint = compute_hint(&profile, &HintPolicy::default()).unwrap();
    assert!((hint.fixed_cost_us - (1.0 + COPY_ENGINE_LAUNCH_US)).abs() < 1e-9);
    assert_eq!(hint.bandwidth_gbps, 10.0);
}

#[test]
fn tiny_max_message_below_alignment_is_unsupported() {
    let mut profile = PathProfile::example_gpu_nic();
    profile.transport.max_msg_bytes = 4096; // GPU needs 64 KiB alignment
    assert!(matches!(compute_hint(&profile, &HintPolicy::default()), Err(HintError::Unsupported { .. })));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let mut profile = PathProfile::example_host_nic();
    profile.transport.wire_gbps = f64::NAN;
    assert!(matches!(
        compute_hint(&profile, &HintPolicy::default()),
        Err(HintError::InvalidProfile { field: "wire_gbps", .. })
    ));
    let mut profile = PathProfile::example_host_nic();
    profile.transport.mtu_bytes = Some(1500);
    assert!(matches!(
        compute_hint(&profile, &HintPolicy::default()),
        Err(HintError::InvalidProfile { field: "mtu_bytes", .. })
    ));
    let mut profile = PathProfile::example_host_nic();
    profile.transport.per_op_overhead_us = 0.0;
    profile.bridges = 0;
    assert!(compute_hint(&profile, &HintPolicy::default()).is_err());
    for policy in [
        HintPolicy { target_efficiency: 1.0, ..HintPolicy::default() },
        HintPolicy { target_efficiency: 0.0, ..HintPolicy::default() },
        HintPolicy { latency_budget_us: Some(-1.0), ..HintPolicy::default() },
        HintPolicy { min_block_bytes: 0, ..HintPolicy::default() },
        HintPolicy { max_block_bytes: 1, ..HintPolicy::default() },
    ] {
        assert!(matches!(
            compute_hint(&PathProfile::example_host_nic(), &policy),
            Err(HintError::InvalidPolicy { .. })
        ));
    }
}

/// Found by the `hint_model` fuzz target: a negligible fixed cost rounds the efficiency to
/// exactly 1.0, which validation once refused; absurd rates and costs are input errors.
#[test]
fn fuzz_regression_efficiency_rounds_to_one() {
    let mut profile = PathProfile::example_host_nic();
    profile.transport.per_op_overhead_us = 1e-300;
    profile.bridges = 0;
    let hint = compute_hint(&profile, &HintPolicy::default()).unwrap();
    assert_eq!(hint.efficiency, 1.0);
    validate_hint(&hint, &HintLimits::from_profile(&profile)).unwrap();
    for (rate, cost) in [(f64::MAX, 1.0), (1.0, f64::MAX), (f64::INFINITY, 1.0), (1.0, -1.0)] {
        profile.transport.wire_gbps = rate;
        profile.transport.per_op_overhead_us = cost;
        assert!(matches!(
            compute_hint(&profile, &HintPolicy::default()),
            Err(HintError::InvalidProfile { .. })
        ));
    }
}

/// Found by the CI fuzz smoke: a policy minimum near `u64::MAX` made rounding up to the
/// alignment saturate to an unaligned block.
#[test]
fn fuzz_regression_rounding_near_u64_max_stays_aligned() {
    let mut profile = PathProfile::example_host_nic();
    profile.transport.max_msg_bytes = u64::MAX;
    profile.transport.mtu_bytes = None;
    profile.source.memory_bytes = Some(u64::MAX);
    let policy = HintPolicy {
        target_efficiency: 0.5,
        latency_budget_us: None,
        min_block_bytes: u64::MAX - 231,
        max_block_bytes: u64::MAX,
    };
    let hint = compute_hint(&profile, &policy).unwrap();
    assert_eq!(hint.block_bytes % hint.align_bytes, 0);
    validate_hint(&hint, &HintLimits::from_profile(&profile)).unwrap();
}

#[test]
fn small_memory_bounds_the_block() {
    let profile = PathProfile {
        source: SourceFacts { memory_bytes: Some(20 * KIB), ..SourceFacts::host(0) },
        transport: staged_shm(),
        path_class: PathClass::NoNic,
        bridges: 0,
        versions: Default::default(),
    };
    let hint = compute_hint(&profile, &HintPolicy::default()).unwrap();
    assert_eq!(hint.block_bytes, 20 * KIB, "memory (20 KiB) bounds the 90 KB s*");
    validate_hint(&hint, &HintLimits::from_profile(&profile)).unwrap();
}

mod properties {
    use super::*;
    use crate::pcie::PcieLink;
    use proptest::prelude::*;

    fn any_profile() -> impl Strategy<Value = PathProfile> {
        (
            0.01f64..1000.0,
            0.0f64..100.0,
            proptest::option::of(8u32..=12),
            1u64..(1 << 40),
            proptest::option::of(1u64..(1 << 40)),
            any::<bool>(),
            0u32..6,
            0usize..7,
            proptest::option::of((1u32..6, 1u32..=16)),
        )
            .prop_map(|(rate, overhead, mtu_shift, max_msg, memory, gpu, bridges, class, pcie)| {
                let class = PathClass::ALL[class];
                let pcie = pcie.map(|(generation, width)| PcieLink {
                    speed_gts: 2.5 * f64::from(1 << generation),
                    width,
                });
                let mut source = SourceFacts { memory_bytes: memory, pcie, ..SourceFacts::host(0) };
                if gpu {
                    source.id = SourceId::Gpu(0);
                    source.kind =
                        SourceKind::Gpu(GpuFacts { gpudirect_rdma: Some(true), ..GpuFacts::default() });
                }
                PathProfile {
                    source,
                    transport: TransportFacts {
                        id: TransportId::Verbs("test".into()),
                        kind: TransportKind::Verbs,
                        wire_gbps: rate,
                        nic_pcie: None,
                        per_op_overhead_us: overhead,
                        mtu_bytes: mtu_shift.map(|s| 1 << s),
                        max_msg_bytes: max_msg,
                        max_payload_bytes: None,
                        queried_from_backend: false,
                        rate_note: None,
                    },
                    path_class: class,
                    bridges,
                    versions: Default::default(),
                }
            })
    }

    proptest! {
        #[test]
        fn every_profile_gives_a_valid_hint_or_a_typed_error(
            profile in any_profile(),
            eta in 0.01f64..0.99,
            budget in proptest::option::of(0.01f64..10_000.0),
        ) {
            let policy = HintPolicy { target_efficiency: eta, latency_budget_us: budget, ..HintPolicy::default() };
            match compute_hint(&profile, &policy) {
                Ok(hint) => {
                    prop_assert!(hint.block_bytes > 0);
                    prop_assert!(hint.align_bytes.is_power_of_two());
                    prop_assert_eq!(hint.block_bytes % hint.align_bytes, 0);
                    prop_assert!(hint.block_bytes <= profile.transport.max_msg_bytes);
                    prop_assert!(hint.efficiency > 0.0 && hint.efficiency <= 1.0);
                    prop_assert!(validate_hint(&hint, &HintLimits::from_profile(&profile)).is_ok());
                }
                Err(HintError::Unsupported { fallback, .. }) => prop_assert!(!fallback.is_empty()),
                Err(HintError::InvalidProfile { .. }) => {}
                Err(other) => prop_assert!(false, "unexpected error {other:?}"),
            }
        }
    }

    #[test]
    fn huge_memory_sources_do_not_overflow() {
        let mut profile = PathProfile::example_gpu_nic();
        profile.source.memory_bytes = Some(u64::MAX);
        profile.transport.max_msg_bytes = u64::MAX;
        let policy =
            HintPolicy { max_block_bytes: u64::MAX, latency_budget_us: None, ..HintPolicy::default() };
        let hint = compute_hint(&profile, &policy).unwrap();
        assert!(hint.block_bytes < GIB);
    }
}
