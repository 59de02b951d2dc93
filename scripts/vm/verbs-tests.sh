#!/usr/bin/env bash
# The verbs backend's real-traffic tests (backends/verbs/tests/conformance.rs: the shared
# contract over rxe0 and what only RDMA has) and the embedder's tests
# over verbs:rxe0 (tests/embedder) inside a qemu VM with a
# Soft-RoCE device: builds the test binary here, boots the VM (host root shared read-only, so
# the binary runs there unchanged) and runs its tests, which are #[ignore]d everywhere else,
# with --ignored (a missing device fails them). Needs root; installs what the VM needs on
# first use (scripts/vm/run-in-vm.sh). Under software emulation it moves KiBs–MiBs, not GiBs.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/vm/rxe-test-binary.sh
# Then the embedder's tests (the facade only, under tokio, smol and the blocking API) over
# verbs:rxe0: 16 concurrent pairs of 1 MiB each (not 32 MiB: the VM has 1 GiB and an emulated
# CPU moving about 20 MB/s).
embedder_env="RDMA_HINT_EMBEDDER_IDS=verbs:rxe0 RDMA_HINT_EMBEDDER_PAIRS=16 RDMA_HINT_EMBEDDER_BYTES=1048576 RDMA_HINT_EMBEDDER_SOFTWARE_NIC=1"
embedder_runs=""
for embedder in "${embedder_bins[@]}"; do
    embedder_runs="$embedder_runs && echo '== $(basename "$embedder") (verbs:rxe0)' && $embedder_env $embedder --test-threads=1 --nocapture --color never"
done
RXE_VM_TIMEOUT="${RXE_VM_TIMEOUT:-900}" ./scripts/vm/run-in-vm.sh \
    "RUST_BACKTRACE=1 $bin --ignored --skip peer_main --test-threads=1 --color never $embedder_runs"
