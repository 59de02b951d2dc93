#!/usr/bin/env bash
# The declared minimum Rust is true: no locked dependency (of the workspace, the embedder, the
# fuzz targets) declares a `rust-version` above the workspace's.
set -euo pipefail
cd "$(dirname "$0")/.."
declared=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
for manifest in Cargo.toml tests/embedder/Cargo.toml fuzz/Cargo.toml; do
    cargo metadata --format-version 1 --locked --all-features --manifest-path "$manifest" |
        DECLARED=$declared MANIFEST=$manifest python3 -c '
import json, os, sys
def version(text):
    return tuple(int(part) for part in text.split(".")[:3]) + (0,) * (3 - len(text.split(".")[:3]))
declared = os.environ["DECLARED"]
meta = json.load(sys.stdin)
own = {p["id"] for p in meta["packages"] if p["source"] is None}
too_new = ["%s %s needs Rust %s" % (p["name"], p["version"], p["rust_version"]) for p in meta["packages"]
           if p.get("rust_version") and version(p["rust_version"]) > version(declared)]
own_versions = {p["rust_version"] for p in meta["packages"] if p["id"] in own and p.get("rust_version")}
if too_new:
    print("%s: the workspace declares Rust %s, but %s" % (os.environ["MANIFEST"], declared, "; ".join(too_new)))
    sys.exit(1)
if own_versions - {declared}:
    print("%s: crates declare rust-version %s, the workspace %s" % (os.environ["MANIFEST"], sorted(own_versions), declared))
    sys.exit(1)
'
done
echo "rust-version $declared holds for every locked dependency"
