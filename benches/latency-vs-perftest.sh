#!/usr/bin/env bash
# Per-block latency in BusyPoll mode vs the peer tools, same sizes, same run.
#
#   ucx:   write_lat ucx:shm SIZE  vs  ucx_perftest -t ucp_put_lat -s SIZE   (UCX_TLS=shm,self, loopback)
#   verbs: write_lat verbs:rxe0 SIZE  vs  ib_write_lat -d rxe0 -s SIZE      (inside the Soft-RoCE VM; root)
#
# Both tools time a ping-pong and report half the round trip; write_lat does the same with
# writes-with-immediate (the receiver learns of each write from an arrival, not by polling
# memory) and also reports the post-to-completion time of one signalled write. REPEAT runs
# each (default 5, alternating); prints medians of the runs' p50 (and p99) in µs and the ratio.
# Usage: benches/latency-vs-perftest.sh [ucx|verbs|all]   (raw output: benches/results/latency-*.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
export PATH="$HOME/.cargo/bin:$PATH"
sizes=${SIZES:-"8 4096 65536"}
repeat=${REPEAT:-5}
iterations=${ITERATIONS:-20000}

if [ "$which" = ucx ] || [ "$which" = all ]; then
    for package in ucx-utils libucx-dev clang libclang-dev; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
            apt-get install -y -qq --no-install-recommends "$package" >/dev/null
    done
    cargo build -q --release --locked -p rdma-hint-benches --features ucx --example write_lat
    ours=target/release/examples/write_lat
    export UCX_NET_DEVICES=lo UCX_TLS=shm,self
    port=$((20000 + RANDOM % 20000))
    median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
    printf '# UCX over shm on loopback, BusyPoll, %s iterations, median of %s runs (µs)\n' "$iterations" "$repeat"
    printf '%8s %16s %16s %16s %16s %7s\n' size "put_lat p50" "ours p50 (p99)" "completion p50" "(p99)" ratio
    for size in $sizes; do
        theirs_all=() mine_all=() mine99_all=() done_all=() done99_all=()
        for _ in $(seq "$repeat"); do
            port=$((port + 1))
            timeout 120 ucx_perftest -t ucp_put_lat -s "$size" -n "$iterations" -p "$port" >/dev/null 2>&1 &
            sleep 0.5
            theirs_all+=("$(timeout 120 ucx_perftest 127.0.0.1 -t ucp_put_lat -s "$size" -n "$iterations" -p "$port" 2>/dev/null |
                awk '/^Final:/ { print $3 }')")
            wait || true
            port=$((port + 1))
            "$ours" ucx:shm "$size" serve "127.0.0.1:$port" "$iterations" >/dev/null 2>&1 &
            sleep 0.5
            out=$("$ours" ucx:shm "$size" run "127.0.0.1:$port" "$iterations")
            wait || true
            mine_all+=("$(awk '$2 == "pingpong" { print $3 }' <<<"$out")")
            mine99_all+=("$(awk '$2 == "pingpong" { print $4 }' <<<"$out")")
            done_all+=("$(awk '$2 == "completion" { print $3 }' <<<"$out")")
            done99_all+=("$(awk '$2 == "completion" { print $4 }' <<<"$out")")
        done
        theirs=$(median "${theirs_all[@]}") mine=$(median "${mine_all[@]}")
        awk -v s="$size" -v a="$theirs" -v b="$mine" -v b99="$(median "${mine99_all[@]}")" \
            -v c="$(median "${done_all[@]}")" -v c99="$(median "${done99_all[@]}")" 'BEGIN {
            printf "%8d %16.2f %9.2f (%5.2f) %16.2f %16.2f %7.2f\n", s, a, b, b99, c, c99, (a > 0 ? b / a : 0) }'
    done
fi

if [ "$which" = verbs ] || [ "$which" = all ]; then
    cargo build -q --release --locked -p rdma-hint-benches --features verbs --example write_lat
    ours=$PWD/target/release/examples/write_lat
    vm_iterations=${VM_ITERATIONS:-1000}
    RXE_VM_RWDIR=$PWD ./scripts/vm/run-in-vm.sh "
set -u
median() { printf '%s\\n' \"\$@\" | sort -g | awk '{ v[NR] = \$1 } END { print v[int((NR + 1) / 2)] }'; }
printf '# verbs on Soft-RoCE (rxe0, emulated CPU), BusyPoll, $vm_iterations iterations, median of $repeat runs (µs)\n'
printf '%8s %16s %16s %16s %16s %7s\n' size 'ib_write_lat p50' 'ours p50 (p99)' 'completion p50' '(p99)' ratio
port=7600
for size in $sizes; do
    theirs_all='' mine_all='' mine99_all='' done_all='' done99_all=''
    for _ in \$(seq $repeat); do
        ib_write_lat -d \$RXE_DEV -F -s \$size -n $vm_iterations >/dev/null 2>&1 &
        sleep 1
        theirs_all=\"\$theirs_all \$(ib_write_lat -d \$RXE_DEV -F -s \$size -n $vm_iterations \$RXE_IP 2>/dev/null | awk -v s=\$size '\$1 == s { print \$5 }')\"
        wait
        port=\$((port + 1))
        $ours verbs:\$RXE_DEV \$size serve \$RXE_IP:\$port $vm_iterations >/dev/null 2>&1 &
        sleep 1
        out=\$($ours verbs:\$RXE_DEV \$size run \$RXE_IP:\$port $vm_iterations)
        wait
        mine_all=\"\$mine_all \$(echo \"\$out\" | awk '\$2 == \"pingpong\" { print \$3 }')\"
        mine99_all=\"\$mine99_all \$(echo \"\$out\" | awk '\$2 == \"pingpong\" { print \$4 }')\"
        done_all=\"\$done_all \$(echo \"\$out\" | awk '\$2 == \"completion\" { print \$3 }')\"
        done99_all=\"\$done99_all \$(echo \"\$out\" | awk '\$2 == \"completion\" { print \$4 }')\"
    done
    awk -v s=\$size -v a=\"\$(median \$theirs_all)\" -v b=\"\$(median \$mine_all)\" -v b99=\"\$(median \$mine99_all)\" \\
        -v c=\"\$(median \$done_all)\" -v c99=\"\$(median \$done99_all)\" 'BEGIN {
        printf \"%8d %16.2f %9.2f (%5.2f) %16.2f %16.2f %7.2f\n\", s, a, b, b99, c, c99, (a > 0 ? b / a : 0) }'
done
"
fi
