#!/usr/bin/env bash
# The floors hold (docs/architecture.md), keyed on crate names: each workspace crate's normal
# dependencies on other workspace crates point down only, backends never depend on one another,
# the CLI and the benches depend on the facade alone, hint-core does no I/O and no FFI, and no
# crate's modules use each other in a cycle.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
# Floors, bottom up. A crate may depend on crates of lower floors only (the FFI leaves and
# hint-core share floor 0 and do not depend on each other).
floors = {
    "rdma-hint-core": 0, "rdma-hint-ucx-sys": 0,
    "rdma-hint-cuda": 1, "rdma-hint-stream-copy": 1,
    "rdma-hint-backend-core": 2, "rdma-hint-discovery": 2,
    "rdma-hint-oob": 3, "rdma-hint-engine": 3,
    "rdma-hint-verbs": 4, "rdma-hint-ucx": 4, "rdma-hint-staged": 4,
    "rdma-hint": 5,
    "rdma-hint-cli": 6,
}
backends = {"rdma-hint-verbs", "rdma-hint-ucx", "rdma-hint-staged"}
facade_only = {"rdma-hint-cli", "rdma-hint-benches"}
tests = {"rdma-hint-integration-tests", "rdma-hint-conformance"}
meta = json.load(sys.stdin)
members = {p["name"]: p for p in meta["packages"]}
bad = [f"{name}: a workspace crate with no floor in scripts/check-layering.sh"
       for name in members if name not in floors and name not in facade_only | tests]
for name, p in members.items():
    if name not in floors and name not in facade_only | tests:
        continue
    deps = [d["name"] for d in p["dependencies"] if d["kind"] is None and d["name"] in members]
    for dep in deps:
        if name in facade_only:
            if dep != "rdma-hint":
                bad.append(f"{name} depends on {dep}: the CLI and the benches use the facade only")
        elif name in tests:
            continue
        elif name in backends and dep in backends:
            bad.append(f"{name} depends on {dep}: no backend depends on another")
        elif dep not in floors or floors[dep] >= floors[name]:
            bad.append(f"{name} (floor {floors[name]}) depends on {dep} (floor {floors.get(dep)})")
core = members["rdma-hint-core"]
if [d["name"] for d in core["dependencies"] if d["kind"] is None and d["name"] in members]:
    bad.append("rdma-hint-core depends on a workspace crate")
if bad:
    print("\n".join(bad)); sys.exit(1)
print(f"floors hold for {len(members)} crates")
'
# hint-core is pure: no file system, processes or sockets (a SocketAddr in a signature is plain
# data), no libc, no FFI, no unsafe operation. It says `unsafe` only for contracts: the `pub
# unsafe fn` constructors of caller memory by address (caller_memory.rs, which allows exactly
# that) and the `Domain` trait's `unsafe fn access_region_unchecked` (allowed on that method alone), never
# an `unsafe` block or impl; lib.rs denies the rest.
[ -d crates/hint-core/src ] || { echo "no crates/hint-core/src" >&2; exit 1; }
if grep -rnE 'std::(fs|process|env|thread)|std::\{[^}]*\b(fs|process|net|env|thread)\b|std::net::[a-z{]|std::net::(TcpStream|TcpListener|UdpSocket)|\blibc\b|extern "C"|\bunsafe\b' crates/hint-core/src |
    grep -vE '^[^:]+:[0-9]+: *//|deny\(unsafe_code\)|^crates/hint-core/src/caller_memory.rs:[0-9]+:(#!\[allow\(unsafe_code\)\]| *pub unsafe fn )|^crates/hint-core/src/domain.rs:[0-9]+:( *#\[allow\(unsafe_code\)\]| *unsafe fn access_region_unchecked\()'; then
    echo "hint-core must stay pure (no I/O, no FFI, no unsafe operation)" >&2
    exit 1
fi
grep -q '^#!\[deny(unsafe_code)\]' crates/hint-core/src/lib.rs || { echo "hint-core's lib.rs must deny unsafe_code" >&2; exit 1; }
echo "hint-core is pure"
# The engine's scheduler is a state machine without I/O: no transport, no lock, no thread, no
# waker, no clock of its own (time is passed in). Its tests (tests.rs, random_scripts.rs) may
# read the clock.
sched=crates/engine/src/engine/scheduler
[ -d "$sched" ] || { echo "no $sched" >&2; exit 1; }
if grep -rnE 'dyn Transport|Transport::|impl Transport|Instant::now|SystemTime|std::(sync|thread|fs|net|process)|\bWaker\b|\basync\b|\.await\b' "$sched" --include='*.rs' |
    grep -vE "^$sched/(tests|random_scripts)\.rs:|^[^:]+:[0-9]+: *//"; then
    echo "the scheduler must stay without I/O (no transport, lock, thread, waker or clock)" >&2
    exit 1
fi
echo "the scheduler holds no I/O"
# Inside each crate, no two modules use each other (directly or round a ring): a constant or type
# in the wrong file is the usual cause.
python3 scripts/module-cycles.py
