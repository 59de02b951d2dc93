use super::choice::{curve_crossing, nearest_ladder_block, overshoots, raised_block, robust_choice};
use super::ladder::{cut_to, time_cap};
use super::{CURVE_KNEE_SHARE, MIN_BLOCKS_PER_RUN};
use rdma_hint_core::fit::BlockTiming;

/// The loopback tcp ladder of one 2-core calibration (GB/s per block size): it flattens at
/// 5.2-5.5 GB/s, where its fit put `B` at 6.3 GB/s and the block at 784 KiB.
fn tcp_ladder() -> Vec<BlockTiming> {
    [(4u64, 0.33), (8, 0.65), (16, 1.24), (32, 2.19), (64, 2.79), (128, 4.17), (256, 5.21), (512, 5.47)]
        .iter()
        .map(|&(kib, gbps)| BlockTiming {
            block_bytes: kib << 10,
            seconds_per_block: (kib << 10) as f64 / (gbps * 1e9),
        })
        .collect()
}

#[test]
fn a_line_above_the_measured_plateau_yields_to_the_curve() {
    let ladder = tcp_ladder();
    let line = (784u64 << 10) as f64;
    // That fit's line moves 5.8 GB/s at its block, more than any measured block.
    assert!(overshoots(&ladder, 11.04, 6.32, line));
    let crossing = curve_crossing(&ladder, CURVE_KNEE_SHARE).unwrap();
    assert!(crossing > f64::from(128 << 10) && crossing < f64::from(256 << 10), "{crossing}");
    // A line that stays under the plateau at its block keeps its block.
    assert!(!overshoots(&ladder, 11.04, 5.5, (256u64 << 10) as f64));
    assert!(!overshoots(&[], 11.04, 6.32, line), "no curve, no verdict");
}

#[test]
fn a_crossing_is_answered_as_the_nearest_ladder_block_by_ratio() {
    let ladder = || [16.0, 32.0, 64.0, 128.0].into_iter().map(|kib: f64| kib * 1024.0);
    let kib = |block: Option<f64>| block.map(|b| b / 1024.0);
    assert_eq!(kib(nearest_ladder_block(ladder(), 38.0 * 1024.0)), Some(32.0));
    assert_eq!(kib(nearest_ladder_block(ladder(), 46.0 * 1024.0)), Some(64.0));
    // Half-way by ratio (the geometric mean) goes to the smaller block.
    assert_eq!(kib(nearest_ladder_block(ladder(), 32.0 * 1024.0 * 2f64.sqrt())), Some(32.0));
    assert_eq!(kib(nearest_ladder_block(ladder(), 1e9)), Some(128.0));
    assert_eq!(nearest_ladder_block(std::iter::empty(), 1e6), None);
}

#[test]
fn a_raised_answer_stays_within_twice_the_line_once_snapped() {
    // The 2-core VM's staged shm ladder of one first run (GB/s per KiB block): 97 % of the
    // plateau near 70 KiB, 90 % between 16 and 32 KiB, the line at 24 KiB.
    let ladder: Vec<BlockTiming> = [
        (4u64, 11.9),
        (8, 13.4),
        (16, 14.9),
        (32, 15.7),
        (64, 16.2),
        (128, 16.6),
        (256, 16.4),
        (512, 17.0),
        (1024, 16.5),
        (2048, 16.8),
    ]
    .into_iter()
    .map(|(kib, gbps)| {
        let block_bytes = kib << 10;
        BlockTiming { block_bytes, seconds_per_block: block_bytes as f64 / (gbps * 1e9) }
    })
    .collect();
    let crossing = curve_crossing(&ladder, CURVE_KNEE_SHARE);
    assert!(crossing.is_some_and(|c| c > 64.0 * 1024.0), "{crossing:?}");
    assert_eq!(raised_block(&ladder, 24.0 * 1024.0, crossing), Some(32 << 10));
    // A line past the crossing raises nothing; a line of 40 KiB lets 64 KiB through.
    assert_eq!(raised_block(&ladder, 100.0 * 1024.0, crossing), None);
    assert_eq!(raised_block(&ladder, 40.0 * 1024.0, crossing), Some(64 << 10));
}

#[test]
fn the_robust_choice_is_the_smaller_conservative_answer_and_never_below_the_line() {
    const KIB: u64 = 1024;
    // A knee between the line and the interval's top is answered.
    assert_eq!(robust_choice(200e3, Some(440 * KIB), Some(256 * KIB)), Some(256 * KIB));
    // The top where it is smaller than the knee.
    assert_eq!(robust_choice(200e3, Some(300 * KIB), Some(512 * KIB)), Some(300 * KIB));
    // A knee under the line answers the line: the run's answer stays with the others'.
    assert_eq!(robust_choice(300e3, Some(440 * KIB), Some(128 * KIB)), Some(300_000));
    assert_eq!(robust_choice(300e3, None, Some(128 * KIB)), Some(300_000));
    assert_eq!(robust_choice(100e3, None, None), None);
}

#[test]
fn a_cut_keeps_the_fewest_blocks_and_never_lengthens_a_transfer() {
    let per_block = 1.0 / 1024.0;
    let mut sizes = [(4096, 4096 * 100), (8192, 8192 * 100), (65536, 65536 * 10)];
    // 20 blocks' time at the first size's rate; the second probed at 0 s, the third fast.
    cut_to(&mut sizes, &[per_block, 0.0, per_block / 1024.0], 20.0 * per_block);
    assert_eq!(sizes, [(4096, 4096 * 20), (8192, 8192 * 100), (65536, 65536 * 10)]);
    // No time at all: a size keeps its fewest blocks, one that costs nothing its length.
    let mut starved = [(4096, 4096 * 100), (8192, 8192 * 100)];
    cut_to(&mut starved, &[per_block, 0.0], 0.0);
    assert_eq!(starved, [(4096, 4096 * MIN_BLOCKS_PER_RUN), (8192, 8192 * 100)]);
}

#[test]
fn only_the_slowest_transfers_are_cut_and_the_rest_keep_their_length() {
    assert_eq!(time_cap(&[1.0, 2.0, 3.0], 6.0), None, "they fit");
    // 1 + 3 × cap = 5: the 2 s one is cut too, to the slow ones' share.
    let cap = time_cap(&[1.0, 2.0, 30.0, 40.0], 5.0).unwrap();
    assert!((cap - 4.0 / 3.0).abs() < 1e-12, "{cap}");
    // 1 + 2 + 2 × cap = 9: the two fast ones keep their time.
    assert_eq!(time_cap(&[1.0, 2.0, 30.0, 40.0], 9.0), Some(3.0));
    let cap = time_cap(&[0.5, 0.6, 12.0], 2.0).unwrap();
    assert!((cap - 0.9).abs() < 1e-12, "{cap}");
    assert_eq!(time_cap(&[1.0, 1.0], 1.0), Some(0.5), "equal ones are cut alike");
    assert_eq!(time_cap(&[1.0, 2.0], -1.0), Some(0.0), "no time left: the fewest blocks");
}
