#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine (as root): install what is needed, build the
# `rdma-hint` command with every backend compiled in, and probe this machine.
# Extra arguments go to `rdma-hint probe` (e.g. --json, --sysfs-root DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -p rdma-hint-cli --all-features
./target/release/rdma-hint probe "$@"
