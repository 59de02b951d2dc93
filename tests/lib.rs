//! Helpers shared by the integration tests: where the sysfs fixture trees are.

use std::path::PathBuf;

/// Root of a sysfs fixture tree under `tests/fixtures/sysfs/`.
pub fn sysfs_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/sysfs").join(name)
}
