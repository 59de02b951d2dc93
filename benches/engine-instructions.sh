#!/usr/bin/env bash
# The engine's own instructions per transfer, which load on the machine moves little (the lane's
# rate sample is timed: a busier machine samples more often, some 20 a transfer): callgrind
# counts what runs inside `Engine::submit` and `Engine::wait_blocking` for `loopback_cost`'s
# engine rounds (a 4 KiB latency-first transfer with an immediate, its arrival, its wait; one
# thread), then what runs inside the transport's `post_writes` and `poll_completions` alone;
# the engine's own share is the difference, per transfer (the 1000 warm-up transfers counted in).
# SIDES="base new" with base/ and new/ under BIN, each holding a `loopback_cost` built with
# symbols (the release profile keeps them), compares two builds.
# Usage: benches/engine-instructions.sh   (BIN=dir; IDS="staged:shm ucx:shm"; N=20000)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "engine-instructions: valgrind is not installed" >&2; exit 1; }
n=${N:-20000}
ids=${IDS:-"staged:shm ucx:shm"}
export UCX_NET_DEVICES=lo
if [ -z "${BIN:-}" ]; then
    cargo build -q --release --locked -p rdma-hint-benches --features ucx --example loopback_cost
    BIN=target/release/examples
fi
count() { # bin id toggles... -> instructions inside the toggled functions
    local bin=$1 id=$2
    shift 2
    valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file=/dev/null --collect-atstart=no "$@" \
        "$bin/loopback_cost" "$id" "$n" 1 engine 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf '%-6s %-12s %14s %18s %12s\n' side id "submit+wait" "transport post+poll" "engine own"
for side in ${SIDES:-.}; do
    for id in $ids; do
        all=$(count "$BIN/$side" "$id" --toggle-collect='rdma_hint_engine::engine::Engine::submit' \
            --toggle-collect='rdma_hint_engine::engine::Engine::wait_blocking')
        transport=$(count "$BIN/$side" "$id" --toggle-collect='*Transport>::post_writes' \
            --toggle-collect='*Transport>::poll_completions')
        transfers=$((n + 1000))
        printf '%-6s %-12s %14d %18d %12d\n' "$side" "$id" $((all / transfers)) $((transport / transfers)) \
            $(((all - transport) / transfers))
    done
done
