#!/usr/bin/env bash
# Installs what building and testing rdma-hint needs on Debian 12, skipping what is present.
# Run as root. Idempotent: a second run installs nothing.
set -euo pipefail

# libucx-dev + clang/libclang-dev: the UCX backend's bindgen -sys crate (no-install-recommends keeps
# libtool out); cmake + clang: rdma-mummy-sys (the verbs backend's run-time libibverbs loader).
# benches/ucx-vs-perftest.sh installs ucx-utils itself; scripts/vm/run-in-vm.sh brings qemu, the
# Debian kernel, the rxe provider and perftest for the Soft-RoCE VM.
packages=(ca-certificates curl build-essential pkg-config python3 iproute2 libucx-dev clang libclang-dev cmake)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Never at the cost of a package the machine has: no removal, no upgrade, no downgrade.
    if ! changes=$("$(dirname "$0")/apt-changes.sh" "${missing[@]}"); then
        echo "install-deps: apt cannot plan installing ${missing[*]} (its errors are above)" >&2
        exit 2
    fi
    if [ -n "$changes" ]; then
        echo "install-deps: installing ${missing[*]} would remove or change $changes; install them yourself without that" >&2
        exit 2
    fi
    echo "install-deps: installing ${missing[*]}"
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: installing the Rust toolchain (rustup, stable, minimal + rustfmt + clippy)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
        sh -s -- -y --profile minimal --component rustfmt,clippy
fi
