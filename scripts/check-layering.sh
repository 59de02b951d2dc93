#!/usr/bin/env bash
# The floors hold (docs/architecture.md): each workspace crate's normal dependencies on other
# workspace crates point down only, backends never depend on one another, the CLI and the
# benches depend on the facade alone, and the model crate does no I/O and no FFI.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
floor = {"model": 0, "sys": 1, "base": 2, "backends": 3, "top": 4}
meta = json.load(sys.stdin)
root = meta["workspace_root"] + "/"
members = {p["name"]: p for p in meta["packages"]}
def place(p):
    rel = p["manifest_path"][len(root):]
    top = rel.split("/")[0]
    return "model" if rel.startswith("base/model/") else top
bad = []
for name, p in members.items():
    here = place(p)
    deps = [d["name"] for d in p["dependencies"] if d["kind"] is None and d["name"] in members]
    for dep in deps:
        there = place(members[dep])
        if here in ("benches",) or name == "rdma-hint-cli":
            if dep != "rdma-hint":
                bad.append(f"{name} depends on {dep}: the CLI and the benches use the facade only")
        elif here in floor and there in floor:
            if floor[there] > floor[here] or (here == "backends" and there == "backends"):
                bad.append(f"{name} ({here}) depends on {dep} ({there})")
        elif here in floor and there not in floor:
            bad.append(f"{name} ({here}) depends on {dep} ({there})")
if bad:
    print("\n".join(bad)); sys.exit(1)
print(f"floors hold for {len(members)} crates")
'
if grep -rnE 'std::(fs|net|process)|\blibc\b|extern "C"|\bunsafe\b' base/model/src | grep -v 'forbid(unsafe_code)\|no `unsafe`'; then
    echo "the model crate must stay pure (no I/O, no FFI, no unsafe)" >&2
    exit 1
fi
echo "the model crate is pure"
