#!/usr/bin/env bash
# Instructions per block of the chunker's posting path vs a hand-written posting loop, counted
# by callgrind (deterministic, unlike wall time on a shared 2-core machine). Both post 64 MiB
# transfers to the null transport with 8 WRs per doorbell, every 8th signalled, window 64.
# Needs valgrind (apt-get install -y --no-install-recommends valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
# POSTING_COST: a posting_cost built elsewhere (another revision, for a before/after).
bin=${POSTING_COST:-target/release/examples/posting_cost}
[ -n "${POSTING_COST:-}" ] || cargo build -q --release -p rdma-hint-benches --example posting_cost

instructions() { # mode block transfers
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$@" 2>&1 >/dev/null |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

printf '%-8s %8s %14s %14s %7s\n' block blocks "chunker Ir/blk" "hand Ir/blk" ratio
for block in 4096 16384 65536 262144 1048576 4194304; do
    blocks=$(( (64 << 20) / block ))
    chunker=$(( $(instructions chunker "$block" 3) - $(instructions chunker "$block" 1) ))
    hand=$(( $(instructions hand "$block" 3) - $(instructions hand "$block" 1) ))
    awk -v b="$block" -v n="$blocks" -v c="$chunker" -v h="$hand" 'BEGIN {
        printf "%-8s %8d %14.1f %14.1f %7.2f\n", b, n, c / (2 * n), h / (2 * n), c / h }'
done
