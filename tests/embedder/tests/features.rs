//! A backend this build lacks is `Error::FeatureMissing { feature }` from every entry point an
//! embedder calls with a transport id: `open`, the hint, the hint set, calibration.

use rdma_hint::calibration::{calibrate_loopback, hint_set};
use rdma_hint::{
    get_low_latency_rdma_size_hint_with, open, Device, Error, OpenOptions, TransportId, TransportSelector,
};

fn missing() -> Vec<(TransportId, &'static str)> {
    let mut ids = Vec::new();
    if !cfg!(feature = "ucx") {
        ids.push(("ucx:shm".parse().unwrap(), "ucx"));
    }
    if !cfg!(feature = "verbs") {
        ids.push(("verbs:mlx5_0".parse().unwrap(), "verbs"));
    }
    ids
}

fn assert_missing<T: std::fmt::Debug>(entry: &str, id: &TransportId, wanted: &str, result: Result<T, Error>) {
    match result {
        Err(Error::FeatureMissing { feature, transport }) => {
            assert_eq!(feature, wanted, "{entry}({id})");
            assert_eq!(&transport, id, "{entry}({id})");
        }
        other => panic!("{entry}({id}): {other:?}, not FeatureMissing {{ feature: {wanted:?} }}"),
    }
}

#[test]
fn a_backend_not_compiled_in_names_its_feature_everywhere() {
    let ids = missing();
    if cfg!(all(feature = "ucx", feature = "verbs")) {
        assert!(ids.is_empty());
        return;
    }
    assert!(!ids.is_empty());
    for (id, feature) in ids {
        assert_missing("open", &id, feature, open(&id, &OpenOptions::default()).map(|_| ()));
        assert_missing(
            "get_low_latency_rdma_size_hint_with",
            &id,
            feature,
            get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone())),
        );
        assert_missing("hint_set", &id, feature, hint_set(Device::Host(0), &id));
        assert_missing(
            "calibrate_loopback",
            &id,
            feature,
            calibrate_loopback(
                &id,
                Device::Host(0),
                &OpenOptions::default(),
                std::time::Duration::from_millis(50),
            )
            .map(|_| ()),
        );
    }
}
