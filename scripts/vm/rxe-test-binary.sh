# Sourced by the VM scripts (from the checkout root): builds backends/verbs/tests/rxe.rs and sets
# `bin` to a copy inside the checkout, shared with the VM read-write at the same path
# (RXE_VM_RWDIR). The VM sees the host root read-only but mounts fresh tmpfs on /tmp, so a
# checkout or CARGO_TARGET_DIR under /tmp would otherwise be invisible there.
export PATH="$HOME/.cargo/bin:$PATH"
bin=$(cargo test -q --locked -p rdma-hint-verbs --test rxe --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable") and message["target"]["name"] == "rxe":
        print(message["executable"])')
[ -n "$bin" ] || { echo "$0: no rxe test binary built" >&2; exit 1; }
mkdir -p target/vm
cp "$bin" target/vm/rxe
bin=$PWD/target/vm/rxe
export RXE_VM_RWDIR=$PWD
