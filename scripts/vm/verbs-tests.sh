#!/usr/bin/env bash
# The verbs backend's real-traffic tests (backends/verbs/tests/rxe.rs) inside a qemu VM with a
# Soft-RoCE device: builds the test binary here, boots the VM (host root shared read-only, so
# the binary runs there unchanged) and runs it with RDMA_HINT_REQUIRE_RXE=1, so a missing device
# fails instead of skipping. Needs root; installs qemu, the Debian kernel and rdma-core on first
# use (scripts/vm/run-in-vm.sh). Under software emulation it moves KiBs–MiBs, not GiBs.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
bin=$(cargo test -q --locked -p rdma-hint-verbs --test rxe --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable") and message["target"]["name"] == "rxe":
        print(message["executable"])')
[ -n "$bin" ] || { echo "$0: no rxe test binary built" >&2; exit 1; }
# The VM sees the host root read-only but mounts fresh tmpfs on /tmp: a checkout under /tmp (or a
# CARGO_TARGET_DIR there) would be invisible, so the binary goes into the checkout, which is
# shared with the VM read-write at the same path.
mkdir -p target/vm
cp "$bin" target/vm/rxe
bin=$PWD/target/vm/rxe
export RXE_VM_RWDIR=$PWD
RXE_VM_TIMEOUT="${RXE_VM_TIMEOUT:-900}" ./scripts/vm/run-in-vm.sh "RDMA_HINT_REQUIRE_RXE=1 RUST_BACKTRACE=1 $bin --test-threads=1 --color never"
