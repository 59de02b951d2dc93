#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine (as root): install what is needed, build `rdma-hint`
# with every backend compiled in, probe this machine, then confirm the hint with a block-size
# sweep on the embedded default backend (staged, shared memory, in-process loopback).
# Writes sweep.json and sweep.svg here; the measured knee becomes this machine's hint.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -p rdma-hint-cli --all-features
./target/release/rdma-hint probe "$@"
./target/release/rdma-hint sweep --backend staged --loopback --sizes 4K..16M --json sweep.json --plot sweep.svg
