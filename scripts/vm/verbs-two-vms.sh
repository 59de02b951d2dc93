#!/usr/bin/env bash
# Two hosts over a real RoCE link: two Soft-RoCE VMs (scripts/vm/run-in-vm.sh two-VM mode; their
# eth0s exchange frames as UDP datagrams on the host's loopback), the verbs conformance binary's
# peer roles (instance `rxe`) as a receiver in VM b and a sender in VM a, 1 MiB+3 of random
# data, bytes verified by the receiver.
# About 30 s; scripts/test-all.sh (so CI) runs it as root after the one-VM tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/vm/rxe-test-binary.sh
len=$(( (1 << 20) + 3 ))
peer="$bin --exact peer_main --ignored --nocapture --test-threads=1 --color never"
out=$(mktemp -d)
export RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-900} RXE_VM_LINK_PORT=${RXE_VM_LINK_PORT:-47910}
RXE_VM_NODE=b ./scripts/vm/run-in-vm.sh \
    "RDMA_HINT_CONFORMANCE_BACKEND=rxe RDMA_HINT_PEER=receiver LISTEN=10.77.1.2:7600 LEN=$len SEED=11 STAY_S=0 timeout 600 $peer" >"$out/b.log" 2>&1 &
receiver=$!
RXE_VM_NODE=a ./scripts/vm/run-in-vm.sh \
    "RDMA_HINT_CONFORMANCE_BACKEND=rxe RDMA_HINT_PEER=sender DIAL=10.77.1.2:7600 LEN=$len SEED=11 $peer" >"$out/a.log" 2>&1 || true
wait "$receiver" || true
grep -h "SENT\|RESULT\|panicked" "$out/a.log" "$out/b.log" || true
if grep -q "RESULT OK $len" "$out/b.log" && grep -q "SENT $len" "$out/a.log"; then
    rm -rf "$out"
    echo "two VMs: $len B written from VM a to VM b over RoCE, verified"
else
    # Kept for reading when it fails: the one thing this script leaves behind.
    echo "two VMs: FAILED (logs in $out)" >&2
    exit 1
fi
