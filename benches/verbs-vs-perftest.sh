#!/usr/bin/env bash
# Verbs backend vs ib_write_bw on the same Soft-RoCE link, in the same VM run.
#
# Builds benches/examples/verbs_write_bw.rs here, boots the Soft-RoCE VM (scripts/vm/run-in-vm.sh,
# root; installs qemu, the kernel, rdma-core and perftest on first use) and, for each size, runs
#   ib_write_bw -d rxe0 -F -s SIZE -n N            (server + client in the VM)
#   verbs_write_bw rxe0 SIZE serve|run ... N        (ours, server + client in the VM)
# REPEAT times each (default 3, alternating), printing the median average bandwidth of each
# (MB/s = 2^20 B/s, as perftest reports) and their ratio. OPS=read compares reads instead:
# ib_read_bw (its default outstanding reads) against verbs_write_bw ... read.
# The VM emulates its CPU (no KVM here): absolute numbers are tiny, the ratio is the point.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build -q --release --locked -p rdma-hint-benches --features verbs --example verbs_write_bw
ours=$PWD/target/release/examples/verbs_write_bw
case ${OPS:-write} in
    write) tool=ib_write_bw ours_run=run ;;
    read) tool=ib_read_bw ours_run=read ;;
    *) echo "OPS is write or read" >&2; exit 2 ;;
esac
sizes=${SIZES:-"65536 262144 1048576 4194304"}
budget=${BUDGET_BYTES:-$((16 << 20))}

# Shared read-write at the same path: visible in the VM even for a checkout under /tmp.
RXE_VM_RWDIR=$PWD ./scripts/vm/run-in-vm.sh "
set -u
median() { printf '%s\\n' \"\$@\" | sort -g | awk '{ v[NR] = \$1 } END { print v[int((NR + 1) / 2)] }'; }
printf '%-10s %8s %18s %18s %7s\n' size messages '$tool MB/s' 'rdma-hint MB/s' ratio
port=7500
for size in $sizes; do
    count=\$(( $budget / size )); [ \"\$count\" -lt 16 ] && count=16
    theirs_all='' mine_all=''
    for _ in \$(seq ${REPEAT:-3}); do
        $tool -d \$RXE_DEV -F -s \$size -n \$count >/dev/null 2>&1 &
        sleep 1
        theirs_all=\"\$theirs_all \$($tool -d \$RXE_DEV -F -s \$size -n \$count \$RXE_IP 2>/dev/null | awk -v s=\$size '\$1 == s { print \$4 }')\"
        wait
        port=\$((port + 1))
        $ours \$RXE_DEV \$size serve 127.0.0.1:\$port >/dev/null 2>&1 &
        sleep 1
        mine_all=\"\$mine_all \$($ours \$RXE_DEV \$size $ours_run 127.0.0.1:\$port \$count | awk '/^RESULT/ { print \$2 }')\"
        wait
    done
    theirs=\$(median \$theirs_all)
    mine=\$(median \$mine_all)
    awk -v s=\$size -v n=\$count -v a=\"\${theirs:-0}\" -v b=\"\${mine:-0}\" 'BEGIN {
        printf \"%-10d %8d %18.2f %18.2f %7.2f\n\", s, n, a, b, (a > 0 ? b / a : 0) }'
done
"
