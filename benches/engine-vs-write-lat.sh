#!/usr/bin/env bash
# The engine's small-transfer cost against the transport's own: a 4 KiB latency-first transfer
# on an idle connection, submit to `wait` returning, against the same transport's
# post-to-completion of one signalled 4 KiB write (`write_lat`'s `RESULT completion`), per
# transport id, REPEAT runs alternating (default 5); prints each run's p50 (and p99) in µs, the
# medians, and the ratio engine / write_lat (#54's bound: 2x). The ratio sets like against like:
# `engine --rows alone-busy` runs the transport as `write_lat` does (both sides BusyPoll, the
# peer spinning on its arrivals); `alone` (both sides Adaptive, the default) is printed beside
# it, since there the peer's threads sleep and wake, which `write_lat` never measures.
# SIDES="old new" with old/ and new/ holding both binaries compares two builds in the same run.
# PIN="2,3" runs every process on those CPUs (taskset): on a many-core host, where the threads
# land moves each figure by tens of percent from run to run; pinned, both sides land alike.
# Usage: benches/engine-vs-write-lat.sh   (BIN=dir of built examples; IDS="staged:shm ...")
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${REPEAT:-5}
ids=${IDS:-"staged:shm staged:tcp ucx:shm"}
export UCX_NET_DEVICES=lo
if [ -z "${BIN:-}" ]; then
    cargo build -q --release --locked -p rdma-hint-benches --features ucx --example write_lat --example engine
    BIN=target/release/examples
fi
sides=${SIDES:-.}
pin=()
[ -n "${PIN:-}" ] && pin=(taskset -c "$PIN")
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
completion() { # bin id -> "p50 p99" of write_lat's post-to-completion at 4 KiB
    local port=$((40000 + RANDOM % 20000))
    "${pin[@]}" "$1/write_lat" "$2" 4096 serve "127.0.0.1:$port" 20000 >/dev/null 2>&1 &
    sleep 0.5
    timeout 120 "${pin[@]}" "$1/write_lat" "$2" 4096 run "127.0.0.1:$port" 20000 | awk '/^RESULT completion/ { print $3, $4 }'
    wait
}
declare -A lat eng adaptive
for run in $(seq "$repeat"); do
    for side in $sides; do
        for id in $ids; do
            # A build without the row (older than it) reads "-".
            read -r c50 c99 < <(completion "$BIN/$side" "$id") || c50=- c99=-
            rows=$(timeout 300 "${pin[@]}" "$BIN/$side/engine" --rows alone-busy,alone --ids "$id") || rows=
            read -r e50 e99 < <(awk '/^RESULT alone-busy/ { print $4, $5 }' <<<"$rows") || e50=- e99=-
            read -r a50 a99 < <(awk '/^RESULT alone / { print $4, $5 }' <<<"$rows") || a50=- a99=-
            echo "run $run $side $id: write_lat completion $c50 / $c99 us, engine alone (BusyPoll) $e50 / $e99 us, (Adaptive) $a50 / $a99 us"
            lat[$side $id]+="$c50 "
            eng[$side $id]+="$e50 "
            adaptive[$side $id]+="$a50 "
        done
    done
done
echo "# medians of $repeat runs, p50 in µs"
printf '%-6s %-12s %12s %12s %8s %16s\n' side id write_lat engine ratio "engine Adaptive"
for side in $sides; do
    for id in $ids; do
        # shellcheck disable=SC2086
        c=$(median ${lat[$side $id]}) e=$(median ${eng[$side $id]}) a=$(median ${adaptive[$side $id]})
        ratio=$(awk -v e="$e" -v c="$c" 'BEGIN { if (e == "-" || c == "-") print "-"; else printf "%.2fx", e / c }')
        printf '%-6s %-12s %12s %12s %8s %16s\n' "$side" "$id" "$c" "$e" "$ratio" "$a"
    done
done
