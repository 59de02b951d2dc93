//! Unit tests of `measured`.

use super::*;

/// A calibration entry is input like any cache file: impossible margins are refused.
#[test]
fn calibration_entries_with_impossible_margins_are_refused() {
    use crate::margins::{LadderTiming, Margins};
    use rdma_hint_core::fit::Interval;
    let fine = Interval { low: 1.0, high: 2.0 };
    let step = LadderTiming {
        block_bytes: 4096,
        stream_us_per_block: 1.0,
        single_block_us: 5.0,
        stream_us_per_block_interval: fine,
        single_block_us_interval: fine,
    };
    let margins = Margins {
        fixed_cost_us: fine,
        bandwidth_gbps: fine,
        block_bytes: fine,
        ladder: vec![step, LadderTiming { block_bytes: 8192, ..step }],
        stream_ratio: fine,
        single_block_ratio: fine,
        poor_resamples: 0,
    };
    let entry = CalibratedPath {
        source: SourceId::Host(0),
        transport: TransportId::STAGED_TCP,
        versions: DriverVersions::default(),
        fixed_cost_us: 1.0,
        bandwidth_gbps: 5.0,
        fit_r2: 0.99,
        gradual: false,
        measured_at_unix: 1,
        margins: Some(margins.clone()),
        robust_block_bytes: Some(1 << 20),
        block_rule: Some(BlockRule::Robust),
        own_block_bytes: Some(1 << 20),
        earlier: Vec::new(),
    };
    assert_eq!(entry.check(), Ok(()));
    let broken = |margins: Margins| CalibratedPath { margins: Some(margins), ..entry.clone() };
    let nan = Interval { low: f64::NAN, high: 1.0 };
    assert!(broken(Margins { stream_ratio: nan, ..margins.clone() }).check().is_err());
    assert!(broken(Margins { stream_ratio: Interval { low: 2.0, high: 1.0 }, ..margins.clone() })
        .check()
        .is_err());
    assert!(broken(Margins { ladder: vec![step, step], ..margins.clone() }).check().is_err(), "out of order");
    assert!(broken(Margins { ladder: Vec::new(), ..margins.clone() }).check().is_err());
    assert!(CalibratedPath { robust_block_bytes: Some(u64::MAX), ..entry.clone() }.check().is_err());
    assert!(CalibratedPath { own_block_bytes: Some(0), ..entry.clone() }.check().is_err());
    assert!(CalibratedPath { bandwidth_gbps: f64::INFINITY, ..entry.clone() }.check().is_err());
    // Finite but past what the model takes: refused here, not at every hint (#51).
    assert!(CalibratedPath { bandwidth_gbps: 2e6, ..entry.clone() }.check().is_err());
    assert!(CalibratedPath { fixed_cost_us: 2e6, ..entry.clone() }.check().is_err());
    assert!(CalibratedPath { fixed_cost_us: -1.0, ..entry.clone() }.check().is_err());
    // The pool is input too: its length, its blocks, its dates and its margins.
    let earlier =
        EarlierCalibration { measured_at_unix: 0, block_bytes: 65536, margins: Some(margins.clone()) };
    let pooled = |earlier: Vec<EarlierCalibration>| CalibratedPath { earlier, ..entry.clone() };
    assert_eq!(pooled(vec![earlier.clone(); POOLED_CALIBRATIONS - 1]).check(), Ok(()));
    assert!(pooled(vec![earlier.clone(); POOLED_CALIBRATIONS]).check().is_err(), "too many");
    assert!(pooled(vec![EarlierCalibration { block_bytes: 0, ..earlier.clone() }]).check().is_err());
    assert!(pooled(vec![EarlierCalibration { block_bytes: u64::MAX, ..earlier.clone() }]).check().is_err());
    assert!(pooled(vec![EarlierCalibration { measured_at_unix: 2, ..earlier.clone() }]).check().is_err());
    let out_of_order = vec![EarlierCalibration { measured_at_unix: 1, ..earlier.clone() }, earlier.clone()];
    assert!(pooled(out_of_order).check().is_err(), "oldest first");
    let stale = CalibratedPath {
        measured_at_unix: POOL_MAX_AGE_S + 1,
        earlier: vec![earlier.clone()],
        ..entry.clone()
    };
    assert!(stale.check().is_err(), "more than a day before the newest");
    // Figures that read back as 0 s or infinite seconds.
    for absurd in [1e-320, 1e308] {
        let ladder = vec![LadderTiming { stream_us_per_block: absurd, ..step }];
        assert!(broken(Margins { ladder, ..margins.clone() }).check().is_err(), "{absurd}");
    }
    let upside_down = Margins { stream_ratio: Interval { low: 2.0, high: 1.0 }, ..margins };
    assert!(pooled(vec![EarlierCalibration { margins: Some(upside_down), ..earlier }]).check().is_err());
}

#[test]
fn the_median_of_blocks_is_taken_by_ratio_and_never_blends_two_ladder_blocks() {
    assert_eq!(median_block(&[]), None);
    assert_eq!(median_block(&[20_000]), Some(20_000));
    assert_eq!(median_block(&[288 << 10, 200 << 10]), Some(240 << 10));
    assert_eq!(median_block(&[64 << 10, 16 << 10]), Some(16 << 10));
    assert_eq!(median_block(&[64 << 10, 16 << 10, 32 << 10, 128 << 10]), Some(32 << 10));
    assert_eq!(median_block(&[64 << 10, 36 << 10]), Some(48 << 10));
    assert_eq!(median_block(&[300 << 10, 128 << 10, 200 << 10, 316 << 10, 208 << 10]), Some(208 << 10));
}

#[test]
fn calibrations_pool_the_last_few_of_the_day_and_the_hint_answers_their_median() {
    let profile = PathProfile::example_host_nic();
    let policy = HintPolicy::default();
    let model = compute_hint(&profile, &policy).unwrap();
    let run = |at: u64, fixed_cost_us: f64| {
        let mut entry = CalibratedPath::fitted(&profile, fixed_cost_us, 10.0, false);
        entry.measured_at_unix = at;
        entry.own_block_bytes = Some(calibrated_hint(&profile, &policy, &model, &entry).unwrap().block_bytes);
        entry
    };
    // o = 1, 2 and 4 µs alone answer blocks in that ratio; pooled, the middle one.
    let (first, second, third) = (run(1000, 1.0), run(2000, 4.0), run(3000, 2.0));
    let own = |entry: &CalibratedPath| entry.own_block_bytes.unwrap();
    assert!(own(&first) < own(&third) && own(&third) < own(&second));
    let pooled = third.clone().pooled_with(Some(second.clone().pooled_with(Some(first.clone()))));
    assert_eq!(pooled.pooled_blocks(own(&third)), vec![own(&first), own(&second), own(&third)]);
    let hint = calibrated_hint(&profile, &policy, &model, &pooled).unwrap();
    assert_eq!(hint.block_bytes, own(&third), "the median of the three");
    assert!(hint.reasons.last().unwrap().why.contains("median of the last 3 calibrations"), "{hint:?}");
    let alone = calibrated_hint(&profile, &policy, &model, &second).unwrap();
    assert_eq!(alone.block_bytes, own(&second), "one calibration answers itself");
    assert!(!alone.reasons.iter().any(|r| r.why.contains("median of the last")));
    // At most POOLED_CALIBRATIONS, the newest kept.
    let mut pool = first.clone();
    for at in 1..=10 {
        pool = run(1000 + at * 100, 1.0 + at as f64).pooled_with(Some(pool));
    }
    assert_eq!(pool.earlier.len(), POOLED_CALIBRATIONS - 1);
    assert_eq!(pool.earlier[0].measured_at_unix, 1600, "the oldest dropped first");
    // A day later the pool starts again, and so does a clock that went back; an entry
    // from before pooling (no own block) is not pooled.
    assert!(run(3000 + POOL_MAX_AGE_S + 1, 1.0).pooled_with(Some(pooled.clone())).earlier.is_empty());
    let next = run(3000 + POOL_MAX_AGE_S, 1.0).pooled_with(Some(pooled.clone()));
    assert_eq!(next.earlier.len(), 1, "only the newest is within a day: {:?}", next.earlier);
    assert!(run(500, 1.0).pooled_with(Some(pooled.clone())).earlier.is_empty());
    assert!(run(1500, 1.0).pooled_with(Some(pooled)).earlier.is_empty(), "back between two of the pool");
    let legacy = CalibratedPath { own_block_bytes: None, ..first };
    assert!(run(2000, 1.0).pooled_with(Some(legacy)).earlier.is_empty());
}

#[test]
fn epoch_seconds_read_as_utc_dates() {
    assert_eq!(utc_date_time(0), "1970-01-01 00:00 UTC");
    assert_eq!(utc_date_time(951_782_400), "2000-02-29 00:00 UTC");
    assert_eq!(utc_date_time(1_796_116_830), "2026-12-01 09:20 UTC");
    assert_eq!(utc_date_time(4_107_542_399), "2100-02-28 23:59 UTC");
}
use rdma_hint_core::{compute_hint, HintPolicy, PathProfile};

#[test]
fn stored_entries_apply_only_under_their_versions() {
    let dir = std::env::temp_dir().join(format!("rdma-hint-measured-{}", std::process::id()));
    let file = dir.join("measured.json");
    let versions = DriverVersions { firmware: Some("1.0".into()), ..Default::default() };
    let entry = MeasuredHint {
        source: SourceId::Host(0),
        transport: TransportId::STAGED_SHM,
        versions: versions.clone(),
        knee_bytes: 60_000,
        plateau_gbps: 9.5,
        measured_at_unix: 1,
    };
    store(&file, entry.clone()).unwrap();
    store(&file, MeasuredHint { knee_bytes: 70_000, ..entry.clone() }).unwrap();
    assert_eq!(load(&file).len(), 1, "replaced, not appended");
    let found = lookup(&file, SourceId::Host(0), &TransportId::STAGED_SHM, &versions).unwrap();
    assert_eq!(found.knee_bytes, 70_000);
    let other = DriverVersions { firmware: Some("2.0".into()), ..Default::default() };
    assert!(lookup(&file, SourceId::Host(0), &TransportId::STAGED_SHM, &other).is_none(), "stale");
    let model = compute_hint(&PathProfile::example_host_nic(), &HintPolicy::default()).unwrap();
    let measured = apply(model.clone(), &found);
    assert_eq!(measured.origin, Origin::Measured);
    assert_eq!(measured.block_bytes % measured.align_bytes, 0);
    assert!(measured.block_bytes >= 70_000);
    assert_eq!(measured.bandwidth_gbps, 9.5, "the measured plateau is B");
    // The curve's efficiency, not the model's o with the measured B (#52: a knee measured
    // at 90 % was shown at η 0.243).
    assert!((0.9..1.0).contains(&measured.efficiency), "η {} at the knee", measured.efficiency);
    // A plateau that is positive but denormal is refused as a record, and `apply` (public)
    // bounds the o it would imply rather than answer infinity.
    let crawling = MeasuredHint { plateau_gbps: 5e-321, ..found.clone() };
    assert!(crawling.check().is_err(), "a denormal plateau passed as a record");
    assert!(apply(model.clone(), &crawling).fixed_cost_us <= rdma_hint_core::model::MAX_PER_OP_US);
    assert!(measured.predicted_gbps <= 9.5 && measured.predicted_gbps >= 0.9 * 9.5);
    assert!(
        !measured.reasons.iter().any(|r| matches!(r.factor, Factor::FixedCost | Factor::Bandwidth)),
        "the model's o and B are not the measured hint's reasons: {:?}",
        measured.reasons
    );
    assert!(measured.reasons.last().unwrap().why.contains("1970-01-01 00:00 UTC"), "a date, not a raw epoch");
    assert!(load(&dir.join("missing.json")).is_empty());
    std::fs::write(&file, b"not json").unwrap();
    assert!(load(&file).is_empty(), "a garbled cache is ignored");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_newer_of_calibration_and_recorded_knee_answers() {
    let dir = std::env::temp_dir().join(format!("rdma-hint-newest-{}", std::process::id()));
    let file = dir.join("measured.json");
    let profile = PathProfile::example_host_nic();
    let (source, transport) = (profile.source.id, profile.transport.id.clone());
    let knee = |at| MeasuredHint {
        source,
        transport: transport.clone(),
        versions: profile.versions.clone(),
        knee_bytes: 1 << 20,
        plateau_gbps: 10.0,
        measured_at_unix: at,
    };
    let calibration = |at| CalibratedPath {
        source,
        transport: transport.clone(),
        versions: profile.versions.clone(),
        fixed_cost_us: 1.0,
        bandwidth_gbps: 20.0,
        fit_r2: 0.999,
        gradual: false,
        measured_at_unix: at,
        margins: None,
        robust_block_bytes: None,
        block_rule: None,
        own_block_bytes: None,
        earlier: Vec::new(),
    };
    let policy = HintPolicy::default();
    assert_eq!(hint_set(&profile, &policy, Some(&file)).unwrap().chosen, Origin::Model);
    store(&file, knee(100)).unwrap();
    store_calibration(&file, source, &transport, Some(calibration(200))).unwrap();
    let set = hint_set(&profile, &policy, Some(&file)).unwrap();
    assert_eq!(set.chosen, Origin::Calibrated);
    assert_eq!(set.chosen().origin, Origin::Calibrated);
    assert_eq!(set.recorded.as_ref().unwrap().block_bytes, 1 << 20, "kept apart, not lost");
    let calibrated = set.calibrated.unwrap();
    assert!((calibrated.bandwidth_gbps - 20.0).abs() < 1e-12 && calibrated.fixed_cost_us == 1.0);
    assert!(calibrated.efficiency >= 0.92 - 1e-9, "calibrated hints aim past the policy target");
    let model = compute_hint(&profile, &policy).unwrap();
    let gradual =
        calibrated_hint(&profile, &policy, &model, &CalibratedPath { gradual: true, ..calibration(200) })
            .unwrap();
    assert!(gradual.efficiency >= 0.94 - 1e-9 && gradual.block_bytes > calibrated.block_bytes);
    // A fit that puts the 90 % point at a few KiB (a tiny o) keeps the model's floor.
    let tiny = CalibratedPath { fixed_cost_us: 0.05, bandwidth_gbps: 5.0, ..calibration(200) };
    let floored = calibrated_hint(&profile, &policy, &model, &tiny).unwrap();
    assert!(
        floored.block_bytes >= policy.min_block_bytes,
        "a calibrated {} B block under the {} B floor",
        floored.block_bytes,
        policy.min_block_bytes
    );
    store(&file, knee(300)).unwrap();
    assert_eq!(hint(&profile, &policy, Some(&file)).unwrap().origin, Origin::Measured);
    store_calibration(&file, source, &transport, None).unwrap();
    assert!(hint_set(&profile, &policy, Some(&file)).unwrap().calibrated.is_none(), "removed");
    let _ = std::fs::remove_dir_all(dir);
}
