#!/usr/bin/env bash
# Does the staged shm plateau move from one process to the next, and does a raw copy's level
# move with it? Alternates processes: `stream_copy` (plain and streamed copies of 64 MiB, no
# library code) and a staged shm sweep of 16 KiB..1 MiB, once per build named, ROUNDS times.
# Prints one line per process: the raw copy's GB/s, then each build's sweep plateau and its
# 16/32/64 KiB points, so the spread across processes of each can be read side by side.
#
# usage: benches/shm-plateau-per-process.sh ROUNDS STREAM_COPY BINARY...
#   e.g. benches/shm-plateau-per-process.sh 8 target/release/examples/stream_copy target/release/rdma-hint
set -euo pipefail
rounds=$1 stream_copy=$2
shift 2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export RDMA_HINT_CACHE_DIR=$scratch
echo "# $(date -u '+%F %H:%M UTC'), $(nproc) cores, kernel $(uname -r)," \
    "THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null), shmem THP $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null)"
for round in $(seq 1 "$rounds"); do
    echo "round $round raw: $("$stream_copy" --passes 5)"
    for binary in "$@"; do
        "$binary" sweep --backend staged --channel shm --sizes 16K..1M --transfer 64M --no-record \
            --json "$scratch/sweep.json" >/dev/null &
        sweep=$!
        sleep 0.5
        huge=$(awk '/ShmemHugePages/ {print $2 " kB"}' /proc/meminfo)
        wait "$sweep"
        python3 - "$scratch/sweep.json" "$binary" "$huge" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
points = {p["block_bytes"] >> 10: p["median_gbps"] for p in report["points"]}
print(f"round sweep {sys.argv[2]}: plateau {report['plateau_gbps']:5.2f} GB/s  "
      + "  ".join(f"{kib}K {points[kib]:5.2f}" for kib in (16, 32, 64) if kib in points)
      + f"  shmem huge pages mid-sweep {sys.argv[3]}")
EOF
    done
done
