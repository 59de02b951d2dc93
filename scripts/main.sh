#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine (as root): install what is needed, build `rdma-hint`
# with every backend compiled in, probe this machine, then confirm the hint with a block-size
# sweep on the embedded default backend (staged, shared memory, in-process loopback), after a
# one-second calibration of that path whose hint the sweep then judges next to the model's.
# Writes target/rdma-hint-main/sweep.json and sweep.svg (inside the ignored target/ folder) and
# says so; the measured knee becomes this machine's hint (rdma-hint's hint cache).
# Knobs for the test suite, which runs this script quickly: RDMA_HINT_BIN (use this binary, do
# not install or build) and RDMA_HINT_SWEEP_SIZES (default 4K..16M).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RDMA_HINT_BIN:-}
if [ -z "$bin" ]; then
    ./scripts/install-deps.sh
    export PATH="$HOME/.cargo/bin:$PATH"
    cargo build --release --locked -p rdma-hint-cli --all-features
    bin=./target/release/rdma-hint
fi
out=target/rdma-hint-main
mkdir -p "$out"
"$bin" probe "$@"
"$bin" calibrate --backend staged --channel shm
"$bin" sweep --backend staged --loopback --sizes "${RDMA_HINT_SWEEP_SIZES:-4K..16M}" \
    --json "$out/sweep.json" --plot "$out/sweep.svg"
