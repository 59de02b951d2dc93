//! The same futures under smol (async-io's reactor, smol's executor): nothing in rdma-hint
//! depends on tokio.

use rdma_hint_embedder::{ids, join, verified_transfer};

#[test]
fn pairs_move_verified_bytes_under_smol() {
    for id in ids() {
        let (a, b) = smol::block_on(join(
            verified_transfer(&id, 1, 4 << 20),
            verified_transfer(&id, 2, (4 << 20) + 5),
        ));
        assert!(a.unwrap_or_else(|e| panic!("{e}")) > 0);
        assert!(b.unwrap_or_else(|e| panic!("{e}")) > 0);
    }
}

#[test]
fn pairs_move_verified_bytes_with_the_blocking_api() {
    for id in ids() {
        let blocks = rdma_hint::block_on(verified_transfer(&id, 3, 1 << 20));
        assert!(blocks.unwrap_or_else(|e| panic!("{e}")) > 0);
    }
}
