//! Helpers shared by the integration tests of every crate: sysfs fixture trees, peer processes,
//! two-host network namespaces, test payloads and process accounting.
#![forbid(unsafe_code)]

#[path = "harness/data.rs"]
mod data;
#[path = "harness/netns.rs"]
mod netns;
#[path = "harness/peer.rs"]
mod peer;
#[path = "harness/process.rs"]
mod process;

pub use data::{first_mismatch, random_bytes};
pub use netns::{ip, is_root, netns_available, TwoHosts};
pub use peer::{env, peer_role, Peer, EXPECT_WITHIN, ROLE_VAR};
pub use process::{count_entries, held, held_change, open_fds, resident_kib, threads};

use std::path::PathBuf;

/// Root of a sysfs fixture tree under `tests/fixtures/sysfs/`.
pub fn sysfs_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/sysfs").join(name)
}
