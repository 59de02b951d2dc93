#!/usr/bin/env bash
# Issue #28's measurements on a GPU host in one device call: per path a raw copy's level
# (stream_copy, no library code), then the rule over 5 runs (calibration-spread.py, a fresh pool
# per path), then estimate's bounds after 3 pooled calibrations (estimate-bounds-pooled.sh).
# BIN holds rdma-hint (built --features cuda), estimate_bounds and stream_copy, carried there:
#   cargo build --release --target-dir target/device -p rdma-hint-cli --features cuda
#   cargo build --release --target-dir target/device -p rdma-hint-benches --example estimate_bounds --example stream_copy
#
# usage: benches/gpu-host-calibration.sh BIN
set -u
bin=$1
export PYTHONUNBUFFERED=1
echo "# $(date -u '+%F %H:%M UTC'), $(nproc) cores, $(nvidia-smi -L 2>/dev/null | head -1)"
for path in "staged shm" "staged tcp" "staged shm --source gpu:0" "staged tcp --source gpu:0"; do
    echo "== raw copy before: $("$bin/stream_copy" --passes 3)"
    python3 benches/calibration-spread.py "$bin/rdma-hint" 5 "$path"
done
benches/estimate-bounds-pooled.sh 3 "$bin/rdma-hint" "$bin/estimate_bounds" staged:shm staged:tcp "staged:shm gpu:0" "staged:tcp gpu:0"
