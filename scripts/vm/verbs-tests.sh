#!/usr/bin/env bash
# The verbs backend's real-traffic tests (backends/verbs/tests/rxe.rs) inside a qemu VM with a
# Soft-RoCE device: builds the test binary here, boots the VM (host root shared read-only, so
# the binary runs there unchanged) and runs it with RDMA_HINT_REQUIRE_RXE=1, so a missing device
# fails instead of skipping. Needs root; installs qemu, the Debian kernel and rdma-core on first
# use (scripts/vm/run-in-vm.sh). Under software emulation it moves KiBs–MiBs, not GiBs.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/vm/rxe-test-binary.sh
RXE_VM_TIMEOUT="${RXE_VM_TIMEOUT:-900}" ./scripts/vm/run-in-vm.sh "RDMA_HINT_REQUIRE_RXE=1 RUST_BACKTRACE=1 $bin --test-threads=1 --color never"
