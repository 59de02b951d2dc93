#!/usr/bin/env bash
# The engine of two builds in one run, alternating: per build, write_lat's post-to-completion
# of one 4 KiB write (the transport's own figure) and the engine bench's rows (4 KiB alone and
# behind 1 GiB transfers by default). DIR holds one folder per build (SIDES), each with the
# release `engine` and `write_lat` examples (and a REV file naming the commit); on a machine
# without UCX installed, lib/ beside them holds its libraries (lib/ucx its modules).
# Usage: DIR=dir SIDES="base head" ROUNDS=2 ROWS=behind benches/engine-ab.sh
set -uo pipefail
cd "${DIR:?DIR holds one folder per build}"
[ -d lib ] && export LD_LIBRARY_PATH=$PWD/lib UCX_MODULE_DIR=$PWD/lib/ucx
export UCX_NET_DEVICES=lo
rounds=${ROUNDS:-2}
ids=${IDS:-staged:shm,staged:tcp,ucx:shm}
sides=${SIDES:-base head}
echo "cores $(nproc); $(uptime);$(for side in $sides; do printf ' %s %s' "$side" "$(cat "$side/REV" 2>/dev/null)"; done)"
completion() {
    local port=$((40000 + RANDOM % 20000))
    "./$1/write_lat" "$2" 4096 serve "127.0.0.1:$port" 20000 >/dev/null 2>&1 &
    sleep 0.5
    timeout 60 "./$1/write_lat" "$2" 4096 run "127.0.0.1:$port" 20000 2>&1 | grep "RESULT completion"
    wait
}
for round in $(seq "$rounds"); do
    for side in $sides; do
        for id in ${ids//,/ }; do echo "$side $id write_lat $(completion "$side" "$id")"; done
        echo "== $side engine round $round"
        timeout 250 "./$side/engine" --runs 3 --mib 256 --bulk-mib 1024 --rows "${ROWS:-behind}" --ids "$ids" 2>&1 |
            sed "s/^/$side /"
    done
done
