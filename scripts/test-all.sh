#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: formatting, lints (default and all features),
# every unit, integration and doc test, the verbs tests inside the Soft-RoCE VM, a fuzz smoke
# run. Run from anywhere as root on Debian 12.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never
# CI runs as root: the two-host tests in network namespaces must run, not skip.
if [ "$(id -u)" = 0 ]; then export RDMA_HINT_REQUIRE_NETNS=1; fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (default features)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo clippy (all features: verbs, ucx, cuda)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
echo "== cargo doc (warnings are errors: broken intra-doc links, missing docs), default and all features"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked -q
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --locked -q
echo "== cargo test (all features)"
cargo test --workspace --all-features --locked
echo "== an embedder outside the workspace (facade only): tokio, smol, blocking; staged, then UCX too"
embedder=(--manifest-path tests/embedder/Cargo.toml --locked)
cargo fmt "${embedder[0]}" "${embedder[1]}" -- --check
CARGO_TARGET_DIR="$PWD/target" cargo clippy "${embedder[@]}" --all-targets --features ucx -- -D warnings
CARGO_TARGET_DIR="$PWD/target" cargo test "${embedder[@]}"
CARGO_TARGET_DIR="$PWD/target" cargo test "${embedder[@]}" --features ucx
echo "== verbs backend over Soft-RoCE, inside a qemu VM"
if [ "$(id -u)" = 0 ]; then
    ./scripts/vm/verbs-tests.sh
    echo "== verbs across two Soft-RoCE VMs (two hosts over a RoCE link)"
    ./scripts/vm/verbs-two-vms.sh
else
    echo "skipped: the Soft-RoCE VM needs root (CI runs as root)"
fi
echo "== fuzz smoke (20 s per target)"
./fuzz/smoke.sh 20
echo "== rdma-hint probe --json on this machine"
cargo run -q --locked -p rdma-hint-cli --all-features -- probe --json >/dev/null
echo "test-all: OK"
