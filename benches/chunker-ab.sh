#!/usr/bin/env bash
# Two builds of the chunker's users in one run, alternating (old, then new): posting cost in
# instructions (callgrind), calibrate three times per path, sweeps, in_place_bw; then the
# engine against write_lat for the builds in ENGINE_DIR (ENGINE_SIDES), if given. DIR holds
# old/ and new/, each with the release `rdma-hint` (built --features ucx) and the
# `posting_cost` and `in_place_bw` examples. Needs valgrind.
# Usage: DIR=dir [ENGINE_DIR=dir ENGINE_SIDES="a b"] benches/chunker-ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${DIR:?DIR holds old/ and new/}
out=${OUT:-$(mktemp -d)}
export UCX_NET_DEVICES=lo
echo "== host: $(nproc) cores; $(uptime)"
instructions() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 >/dev/null | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'; }
for side in old new; do
  for block in 4096 65536 1048576; do
    blocks=$(( (64 << 20) / block )); bin=$dir/$side/posting_cost
    c=$(( $(instructions $bin chunker $block 3) - $(instructions $bin chunker $block 1) ))
    h=$(( $(instructions $bin hand $block 3) - $(instructions $bin hand $block 1) ))
    awk -v s=$side -v b=$block -v n=$blocks -v c=$c -v h=$h 'BEGIN { printf "posting-cost %s %8d: chunker %.1f Ir/blk, hand %.1f\n", s, b, c/(2*n), h/(2*n) }'
  done
done 2>&1 | tee $out/posting-cost.txt
for round in 1 2 3; do
  for side in old new; do
    for path in "staged shm" "staged tcp" "ucx shm"; do
      set -- $path
      export RDMA_HINT_CACHE_DIR=$(mktemp -d)
      echo "calibrate $side $1:$2 round $round $(timeout 20 $dir/$side/rdma-hint calibrate --backend $1 --channel $2 --fresh --json 2>&1 | tr -d '\n' | cut -c1-300)"
    done
  done
done 2>&1 | tee $out/calibrate.txt
for round in 1 2; do
  for side in old new; do
    for path in "staged shm" "ucx shm"; do
      set -- $path
      export RDMA_HINT_CACHE_DIR=$(mktemp -d)
      echo "== sweep $side $1:$2 round $round"
      timeout 90 $dir/$side/rdma-hint sweep --backend $1 --channel $2 --sizes 4K..1M --transfer 16M --iters 3 --latency-samples 100 --no-record 2>&1 | tail -14
    done
  done
done 2>&1 | tee $out/sweep.txt
for round in 1 2; do
  for side in old new; do
    echo "== in_place_bw $side round $round"
    timeout 90 $dir/$side/in_place_bw --mib 256 --runs 3 --ids staged:shm,ucx:shm 2>&1 | tail -8
  done
done 2>&1 | tee $out/in_place.txt
if [ -n "${ENGINE_DIR:-}" ]; then
  echo "== engine vs write_lat"
  BIN=$ENGINE_DIR SIDES="${ENGINE_SIDES:-old new}" REPEAT=3 timeout 400 benches/engine-vs-write-lat.sh 2>&1 | tee $out/engine-vs-write-lat.txt
fi
