#!/usr/bin/env bash
# UCX backend vs ucx_perftest, same transports, sizes and message counts, same run.
#
# For each UCX_TLS scope (shm,self and tcp,self on loopback) and message size, runs
#   ucx_perftest -t ucp_put_bw -s SIZE -n N          (server + client process)
#   ucx_put_bw run ... SIZE N                         (our backend, server + client process)
# REPEAT times each (default 5, alternating), and prints the median bandwidth of each (MB/s,
# UCX's MB = 2^20 bytes) and their ratio. Medians, because a 2-core VM swings ±10 % run to run.
# OPS=get compares reads instead: ucx_perftest -t ucp_get against ucx_put_bw ... read.
# UCX_PUT_BW: a ucx_put_bw built elsewhere (another revision, for a before/after in one run).
# Needs ucx-utils (ucx_perftest) and libucx-dev; installs them when missing (Debian, as root).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
ours=${UCX_PUT_BW:-target/release/examples/ucx_put_bw}
# With UCX_PUT_BW given (a machine without cargo or apt, ucx_perftest on PATH) nothing is built
# or installed.
if [ -z "${UCX_PUT_BW:-}" ]; then
    for package in ucx-utils libucx-dev clang libclang-dev; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
            apt-get install -y -qq --no-install-recommends "$package" >/dev/null
    done
    cargo build -q --release -p rdma-hint-benches --features ucx --example ucx_put_bw
fi
case ${OPS:-put} in
    put) test=ucp_put_bw ours_run=run ;;
    get) test=ucp_get ours_run=read ;;
    *) echo "OPS is put or get" >&2; exit 2 ;;
esac
export UCX_NET_DEVICES=lo  # traffic stays on loopback
sizes=${SIZES:-"65536 262144 1048576 4194304 16777216"}
port=$((20000 + RANDOM % 20000))

perftest() { # tls size count
    port=$((port + 1))
    UCX_TLS=$1 timeout 120 ucx_perftest -t "$test" -s "$2" -n "$3" -p "$port" >/dev/null 2>&1 &
    local server=$!
    sleep 0.5
    UCX_TLS=$1 timeout 120 ucx_perftest 127.0.0.1 -t "$test" -s "$2" -n "$3" -p "$port" 2>/dev/null |
        awk '/^Final:/ { print $7 }'
    wait "$server" || true
}

backend() { # tls size count
    port=$((port + 1))
    "$ours" "$1" "$2" serve "127.0.0.1:$port" >/dev/null 2>&1 &
    local server=$!
    sleep 0.3
    "$ours" "$1" "$2" "$ours_run" "127.0.0.1:$port" "$3" | awk '/^RESULT/ { print $2 }'
    wait "$server" || true
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "# $test against $ours $ours_run"
printf '%-9s %10s %8s %16s %16s %7s\n' UCX_TLS size messages "ucx_perftest MB/s" "rdma-hint MB/s" ratio
for tls in shm,self tcp,self; do
    for size in $sizes; do
        budget=$([ "$tls" = "shm,self" ] && echo $((4 << 30)) || echo $((64 << 20)))
        count=$(( budget / size )); [ "$count" -lt 32 ] && count=32
        theirs_all=() mine_all=()
        for _ in $(seq "${REPEAT:-5}"); do
            theirs_all+=("$(perftest "$tls" "$size" "$count")")
            mine_all+=("$(backend "$tls" "$size" "$count")")
        done
        theirs=$(median "${theirs_all[@]}")
        mine=$(median "${mine_all[@]}")
        awk -v t="$tls" -v s="$size" -v n="$count" -v a="${theirs:-0}" -v b="${mine:-0}" 'BEGIN {
            printf "%-9s %10d %8d %16.1f %16.1f %7.2f\n", t, s, n, a, b, (a > 0 ? b / a : 0) }'
    done
done
