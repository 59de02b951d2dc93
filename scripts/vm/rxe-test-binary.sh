# Sourced by the VM scripts (from the checkout root): builds backends/verbs/tests/conformance.rs
# (the shared contract over rxe0 and the verbs-only tests) and the
# embedder's tests (tests/embedder, feature verbs) and copies them into target/vm/ inside the
# checkout, shared with the VM read-write at the same path (RXE_VM_RWDIR): `bin` is the verbs
# test, `embedder_bins` the embedder's. The VM sees the host root read-only but mounts fresh
# tmpfs on /tmp, so a checkout or CARGO_TARGET_DIR under /tmp would otherwise be invisible.
export PATH="$HOME/.cargo/bin:$PATH"
test_executables() { # cargo test arguments...; prints "name path" per test executable
    cargo test -q --locked --no-run --message-format=json "$@" |
        python3 -c 'import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable") and "test" in message["target"]["kind"]:
        print(message["target"]["name"], message["executable"])'
}
mkdir -p target/vm
bin=$(test_executables -p rdma-hint-verbs --test conformance | awk '$1 == "conformance" { print $2 }')
[ -n "$bin" ] || { echo "$0: no verbs conformance test binary built" >&2; exit 1; }
cp "$bin" target/vm/verbs-conformance
bin=$PWD/target/vm/verbs-conformance
embedder_bins=()
while read -r name path; do
    cp "$path" "target/vm/embedder-$name"
    embedder_bins+=("$PWD/target/vm/embedder-$name")
done < <(CARGO_TARGET_DIR="$PWD/target" test_executables --manifest-path tests/embedder/Cargo.toml --features verbs --tests)
[ "${#embedder_bins[@]}" -gt 0 ] || { echo "$0: no embedder test binaries built" >&2; exit 1; }
export RXE_VM_RWDIR=$PWD
