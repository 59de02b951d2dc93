//! The fuzz targets' hello seeds decode with today's wire format and re-encode to the same
//! bytes, so every fuzz run starts past the preamble (a stale seed would only exercise the
//! version check).

use std::path::PathBuf;

/// Decodes `seed` with `decode`, and checks it re-encodes to exactly the seed.
fn round_trips<H>(
    name: &str,
    seed: &[u8],
    decode: impl FnOnce(&mut &[u8]) -> Option<H>,
    encode: impl FnOnce(&H) -> Vec<u8>,
) {
    let hello = decode(&mut &seed[..]).unwrap_or_else(|| panic!("{name} does not decode"));
    assert_eq!(encode(&hello), seed, "{name} does not round-trip");
}

fn seed(path: &str) -> Vec<u8> {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds").join(path);
    std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

#[test]
fn every_hello_seed_decodes_and_round_trips() {
    use rdma_hint_staged::wire::Hello as Staged;
    use rdma_hint_ucx::wire::Hello as Ucx;
    use rdma_hint_verbs::wire::Hello as Verbs;
    for name in ["staged_wire/hello-tcp", "staged_wire/hello-shm"] {
        round_trips(name, &seed(name), |r| Staged::decode(r).ok(), Staged::encode);
    }
    for name in ["ucx_wire/one_region", "ucx_wire/one_region_and_ring"] {
        round_trips(name, &seed(name), |r| Ucx::decode(r).ok(), Ucx::encode);
    }
    let name = "verbs_wire/one_region";
    round_trips(name, &seed(name), |r| Verbs::decode(r).ok(), Verbs::encode);
}
