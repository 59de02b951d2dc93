//! Calibration from outside, through the facade only: an embedder's own connected pair,
//! calibrated, then the hint the library answers, then data moved in that hint's blocks.

use rdma_hint::calibration::LoopbackPair;
use rdma_hint::engine::{Chunker, PostPolicy, TransferRequest};
use rdma_hint::model::Origin;
use rdma_hint::{
    calibrate, get_low_latency_rdma_size_hint_with, Arrival, BlockingTransport, Device, Error, OpenOptions,
    TransportError, TransportId, TransportSelector,
};
use std::time::{Duration, Instant};

/// Ten times the library's default budget (as the CLI's tests give theirs): on a machine two
/// busy loops share, one second fitted two rounds of ten block sizes, where a calibration needs
/// more (loaded run 19 of #52); an embedder's CI is rarely idle either.
const BUDGET: Duration = Duration::from_secs(10);

/// `attempt(BUDGET)`, asked once more with three times the budget when the machine was too
/// busy to fit enough rounds in it: the library refuses such a fit rather than answer it (in
/// the Soft-RoCE VM beside two busy loops on its host, 10 s fitted 2 rounds: loaded run 36 of
/// #52). A refused calibration keeps nothing, so the second ask starts clean.
fn patiently<T>(attempt: impl Fn(Duration) -> Result<T, Error>) -> Result<T, Error> {
    match attempt(BUDGET) {
        Err(Error::Transport(TransportError::InvalidArgument { what: "calibration", why })) => {
            eprintln!("calibration refused ({why}); asked again with {:?}", BUDGET * 3);
            attempt(BUDGET * 3)
        }
        other => other,
    }
}

#[test]
fn a_calibrated_hint_is_answered_and_moves_verified_bytes() {
    let cache = std::env::temp_dir().join(format!("rdma-hint-embedder-calibrate-{}", std::process::id()));
    std::env::set_var("RDMA_HINT_CACHE_DIR", &cache);
    let id = TransportId::STAGED_SHM;
    let deadline = Instant::now() + Duration::from_secs(60);
    let pair = LoopbackPair::open(&id, Device::Host(0), 32 << 20, &OpenOptions::default(), deadline).unwrap();
    let calibration =
        patiently(|budget| calibrate(&*pair.sender, Device::Host(0), &pair.local, &pair.remote, budget))
            .unwrap();
    assert!(calibration.elapsed_ms > 0.0 && calibration.points.len() >= 3);
    let hint =
        get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone())).unwrap();
    if calibration.fit.poor.is_none() {
        assert_eq!(hint.origin, Origin::Calibrated);
        assert_eq!(hint.block_bytes, calibration.hint.block_bytes);
    } else {
        assert_ne!(hint.origin, Origin::Calibrated, "a poor fit is not answered");
    }
    // Move 8 MiB in the answered blocks and check every byte.
    let len = 8u64 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    pair.sender.write_region(pair.local.id, 0, &data).unwrap();
    let mut chunker = Chunker::new(PostPolicy::default(), pair.sender.capabilities()).unwrap();
    chunker.set_size_hint(&hint).unwrap();
    chunker
        .transfer_blocking(
            &*pair.sender,
            TransferRequest::single(&pair.local, 0, &pair.remote, 0, len).notify(5),
            deadline,
        )
        .unwrap();
    let mut arrivals = [Arrival::EMPTY; 4];
    assert!(pair.receiver.wait_arrivals_blocking(&mut arrivals, deadline).unwrap() >= 1);
    let mut landed = vec![0u8; len as usize];
    pair.receiver.read_region(pair.target.id, 0, &mut landed).unwrap();
    assert!(landed == data);
    // A second calibration pools with the first: the hint answers the median of both runs' own
    // blocks. Forgetting the pair's calibrations leaves none behind.
    let second =
        patiently(|budget| calibrate(&*pair.sender, Device::Host(0), &pair.local, &pair.remote, budget))
            .unwrap();
    if calibration.fit.poor.is_none() && second.fit.poor.is_none() {
        assert_eq!(
            second.pooled_blocks_bytes,
            [calibration.own_block_bytes.unwrap(), second.own_block_bytes.unwrap()]
        );
        let pooled =
            get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone())).unwrap();
        assert_eq!(pooled.block_bytes, second.hint.block_bytes);
    }
    // A recalibration (after moving a card) starts a new pool of its own run.
    let fresh = patiently(|budget| {
        rdma_hint::calibration::recalibrate_loopback(&id, Device::Host(0), &OpenOptions::default(), budget)
    })
    .unwrap();
    if fresh.fit.poor.is_none() {
        assert_eq!(fresh.pooled_blocks_bytes, [fresh.own_block_bytes.unwrap()]);
        assert_eq!(Some(fresh.hint.block_bytes), fresh.own_block_bytes);
    }
    assert!(rdma_hint::calibration::forget_calibrations(Device::Host(0), &id).unwrap().is_some());
    let forgotten = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id)).unwrap();
    assert_ne!(forgotten.origin, Origin::Calibrated, "forgotten: {forgotten:?}");
    let _ = std::fs::remove_dir_all(cache);
}
