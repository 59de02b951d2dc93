#!/usr/bin/env bash
# Per-block latency in BusyPoll mode vs the peer tools, same sizes, same run.
#
#   local (loopback, this machine):
#     write_lat ucx:shm     vs  ucx_perftest -t ucp_put_lat and -t ucp_am_lat  (UCX_TLS=shm,self)
#     write_lat staged:shm  vs  ucx_perftest -t ucp_put_lat (the raw shared-memory write)
#     write_lat staged:tcp  vs  sockperf ping-pong --tcp, blocking (its default) and --nonblocked
#   verbs: write_lat verbs:rxe0 SIZE  vs  ib_write_lat and ib_read_lat -d rxe0 -s SIZE  (Soft-RoCE VM; root)
#
# Every tool times a ping-pong and reports half the round trip; write_lat does the same with
# writes-with-immediate (the receiver learns of each write from an arrival, not by polling
# memory; each write's completion is drained after its answer came), then reports the
# post-to-completion time of one signalled write and of one signalled read (verbs: against
# ib_read_lat, which times the same), and the wake-up: half the round trip of a write that
# reaches a receiver sleeping in Adaptive mode after 10 ms of silence. REPEAT runs
# each (default 5, alternating); prints medians of the runs' p50 (and p99) in µs and the ratio
# of ours to the first peer. sockperf's smallest message is 14 B (its header): it runs 14 B
# where the others run 8 B, and at most 65000 B (its largest) where they run 64 KiB.
# Usage: benches/latency-vs-perftest.sh [local|verbs|all]   (raw output: benches/results/latency-*.txt)
# IDS="staged:tcp" runs the local part for those transports only.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
export PATH="$HOME/.cargo/bin:$PATH"
sizes=${SIZES:-"8 4096 65536"}
repeat=${REPEAT:-5}
iterations=${ITERATIONS:-20000}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

if [ "$which" = local ] || [ "$which" = all ]; then
    # WRITE_LAT: a write_lat built elsewhere (a machine without cargo, where the peer tools are
    # on PATH already).
    ours=${WRITE_LAT:-target/release/examples/write_lat}
    if [ -z "${WRITE_LAT:-}" ]; then
        for package in ucx-utils sockperf libucx-dev clang libclang-dev; do
            dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
                apt-get install -y -qq --no-install-recommends "$package" >/dev/null
        done
        cargo build -q --release --locked -p rdma-hint-benches --features ucx --example write_lat
    fi
    export UCX_NET_DEVICES=lo UCX_TLS=shm,self
    # Each tool run listens on a port of its own (the functions run in subshells: a counter
    # would not survive them).
    fresh_port() { echo $((20000 + RANDOM % 40000)); }
    perftest() { # test size -> p50 µs
        local port
        port=$(fresh_port)
        timeout 120 ucx_perftest -t "$1" -s "$2" -n "$iterations" -p "$port" >/dev/null 2>&1 &
        sleep 0.5
        timeout 120 ucx_perftest 127.0.0.1 -t "$1" -s "$2" -n "$iterations" -p "$port" 2>/dev/null |
            awk '/^Final:/ { print $3 }'
        wait || true
    }
    sockperf_pp() { # size flags... -> "p50 p99" µs
        local size=$1
        shift
        local port
        port=$(fresh_port)
        sockperf server --tcp -i 127.0.0.1 -p "$port" "$@" >/dev/null 2>&1 &
        local server=$!
        sleep 1
        timeout 60 sockperf ping-pong --tcp -i 127.0.0.1 -p "$port" -m "$((size < 14 ? 14 : (size > 65000 ? 65000 : size)))" -t 3 "$@" 2>&1 |
            awk '/percentile 50.000/ { p50 = $NF } /percentile 99.000/ { p99 = $NF } END { print p50, p99 }'
        kill "$server" 2>/dev/null
        wait "$server" 2>/dev/null || true
    }
    write_lat() { # id size -> the RESULT lines
        local port
        port=$(fresh_port)
        "$ours" "$1" "$2" serve "127.0.0.1:$port" "$iterations" >/dev/null 2>&1 &
        sleep 0.5
        "$ours" "$1" "$2" run "127.0.0.1:$port" "$iterations"
        wait || true
    }
    for id in ${IDS:-ucx:shm staged:shm staged:tcp}; do
        case $id in
            ucx:shm) peers="put_lat am_lat" ;;
            staged:shm) peers="put_lat" ;;
            staged:tcp) peers="sockperf sockperf-busy" ;;
        esac
        printf '# %s on loopback, BusyPoll, %s iterations, median of %s runs (µs)\n' "$id" "$iterations" "$repeat"
        printf '%8s' size
        for peer in $peers; do printf ' %14s' "$peer p50"; done
        printf ' %16s %16s %10s %18s %8s\n' "ours p50 (p99)" "completion p50" "read p50" "wake-up p50 (p99)" ratio
        for size in $sizes; do
            declare -A got=()
            for _ in $(seq "$repeat"); do
                for peer in $peers; do
                    case $peer in
                        put_lat) value=$(perftest ucp_put_lat "$size") ;;
                        am_lat) value=$(perftest ucp_am_lat "$size") ;;
                        sockperf) value=$(sockperf_pp "$size" | awk '{ print $1 }') ;;
                        sockperf-busy) value=$(sockperf_pp "$size" --nonblocked | awk '{ print $1 }') ;;
                    esac
                    got[$peer]="${got[$peer]:-} $value"
                done
                out=$(write_lat "$id" "$size")
                for field in pingpong:3 pingpong99:4 completion:3 read:3 wakeup:3 wakeup99:4; do
                    name=${field%%:*} column=${field##*:}
                    value=$(awk -v n="${name%99}" -v c="$column" '$2 == n { print $c }' <<<"$out")
                    got[$name]="${got[$name]:-} $value"
                done
            done
            printf '%8d' "$size"
            first=""
            for peer in $peers; do
                value=$(median ${got[$peer]})
                first=${first:-$value}
                printf ' %14.2f' "$value"
            done
            mine=$(median ${got[pingpong]})
            awk -v b="$mine" -v b99="$(median ${got[pingpong99]})" -v c="$(median ${got[completion]})" \
                -v r="$(median ${got[read]})" -v w="$(median ${got[wakeup]})" -v w99="$(median ${got[wakeup99]})" \
                -v a="$first" 'BEGIN {
                printf " %9.2f (%5.2f) %16.2f %10.2f %9.2f (%6.1f) %8.2f\n", b, b99, c, r, w, w99, (a > 0 ? b / a : 0) }'
            unset got
        done
        echo
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
printf '%8s %16s %16s %16s %16s %16s %7s %16s %10s %7s\n' size 'ib_write_lat p50' 'ours p50 (p99)' 'completion p50' '(p99)' 'wake-up p50' ratio 'ib_read_lat p50' 'read p50' ratio
port=7600
for size in $sizes; do
    theirs_all='' mine_all='' mine99_all='' done_all='' done99_all='' wake_all='' theirs_read_all='' read_all=''
    for _ in \$(seq $repeat); do
        ib_write_lat -d \$RXE_DEV -F -s \$size -n $vm_iterations >/dev/null 2>&1 &
        sleep 1
        theirs_all=\"\$theirs_all \$(ib_write_lat -d \$RXE_DEV -F -s \$size -n $vm_iterations \$RXE_IP 2>/dev/null | awk -v s=\$size '\$1 == s { print \$5 }')\"
        wait
        ib_read_lat -d \$RXE_DEV -F -s \$size -n $vm_iterations >/dev/null 2>&1 &
        sleep 1
        theirs_read_all=\"\$theirs_read_all \$(ib_read_lat -d \$RXE_DEV -F -s \$size -n $vm_iterations \$RXE_IP 2>/dev/null | awk -v s=\$size '\$1 == s { print \$5 }')\"
        wait
        port=\$((port + 1))
        $ours verbs:\$RXE_DEV \$size serve \$RXE_IP:\$port $vm_iterations >/tmp/write_lat_serve.log 2>&1 &
        sleep 1
        out=\$($ours verbs:\$RXE_DEV \$size run \$RXE_IP:\$port $vm_iterations)
        wait \$! || { echo \"the serving side failed (\$size B):\"; cat /tmp/write_lat_serve.log; }
        mine_all=\"\$mine_all \$(echo \"\$out\" | awk '\$2 == \"pingpong\" { print \$3 }')\"
        mine99_all=\"\$mine99_all \$(echo \"\$out\" | awk '\$2 == \"pingpong\" { print \$4 }')\"
        done_all=\"\$done_all \$(echo \"\$out\" | awk '\$2 == \"completion\" { print \$3 }')\"
        done99_all=\"\$done99_all \$(echo \"\$out\" | awk '\$2 == \"completion\" { print \$4 }')\"
        wake_all=\"\$wake_all \$(echo \"\$out\" | awk '\$2 == \"wakeup\" { print \$3 }')\"
        read_all=\"\$read_all \$(echo \"\$out\" | awk '\$2 == \"read\" { print \$3 }')\"
    done
    awk -v s=\$size -v a=\"\$(median \$theirs_all)\" -v b=\"\$(median \$mine_all)\" -v b99=\"\$(median \$mine99_all)\" \\
        -v c=\"\$(median \$done_all)\" -v c99=\"\$(median \$done99_all)\" -v w=\"\$(median \$wake_all)\" \\
        -v ra=\"\$(median \$theirs_read_all)\" -v r=\"\$(median \$read_all)\" 'BEGIN {
        printf \"%8d %16.2f %9.2f (%5.2f) %16.2f %16.2f %16.2f %7.2f %16.2f %10.2f %7.2f\n\", s, a, b, b99, c, c99, w,
            (a > 0 ? b / a : 0), ra, r, (ra > 0 ? r / ra : 0) }'
done
"
fi
