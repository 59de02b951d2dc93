#!/usr/bin/env bash
# The CI fuzz smoke campaign: every target for SECONDS (default 20) via run.sh.
# Installs cargo-fuzz 0.13.2 if it is missing.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --version 0.13.2 --locked --quiet
fi
exec ./run.sh -max_total_time="${1:-20}"
