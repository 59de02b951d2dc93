#!/usr/bin/env bash
# How often `estimate`'s bounds hold once a path's calibrations pool, as an embedder's do after
# `rdma-hint calibrate` ran a few times: per path, CALIBRATIONS runs of `rdma-hint calibrate`
# (each its own process) into a fresh cache, then `estimate_bounds --stored` (1 000 transfers
# of mixed sizes, in another process) against the pool. Prints estimate_bounds' table per path.
#
# usage: benches/estimate-bounds-pooled.sh CALIBRATIONS RDMA_HINT ESTIMATE_BOUNDS PATH...
#   PATH like "staged:shm", "ucx:tcp", "staged:shm gpu:0"
#   e.g. benches/estimate-bounds-pooled.sh 3 target/release/rdma-hint \
#            target/release/examples/estimate_bounds staged:shm staged:tcp ucx:shm
set -euo pipefail
calibrations=$1 rdma_hint=$2 estimate_bounds=$3
shift 3
for path in "$@"; do
    read -r id source <<<"$path"
    source=${source:-host:0}
    cache=$(mktemp -d)
    export RDMA_HINT_CACHE_DIR=$cache
    blocks=()
    for _ in $(seq 1 "$calibrations"); do
        blocks+=("$("$rdma_hint" calibrate --backend "${id%%:*}" --channel "${id#*:}" --source "$source" --json |
            python3 -c 'import json, sys; c = json.load(sys.stdin); print(c["own_block_bytes"] or 0, c["block_bytes"], sep="->")')")
    done
    echo "# $id from $source: $calibrations calibrations, own->pooled blocks (B): ${blocks[*]}"
    "$estimate_bounds" --stored --ids "$id" --source "$source"
    rm -rf "$cache"
done
