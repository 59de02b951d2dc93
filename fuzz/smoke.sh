#!/usr/bin/env bash
# The CI fuzz smoke campaign: every cargo-fuzz target for SECONDS (default 20) from its seeds.
# Installs cargo-fuzz 0.13.2 if it is missing. Fails on any crash.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-20}
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --version 0.13.2 --locked --quiet
fi
cargo +stable fuzz build -s none -O
for target in $(cargo +stable fuzz list); do
    mkdir -p "corpus/$target" "artifacts/$target"
    if [ -d "seeds/$target" ]; then cp -n "seeds/$target"/* "corpus/$target/"; fi
    # Inputs that once crashed stay in the corpus as regression cases.
    if [ -d "regressions/$target" ]; then cp -n "regressions/$target"/* "corpus/$target/"; fi
    echo "== fuzz smoke: $target for ${seconds} s"
    ./target/x86_64-unknown-linux-gnu/release/"$target" "corpus/$target" -max_total_time="$seconds" \
        -max_len=256 -artifact_prefix="artifacts/$target/" 2>&1 | grep -E "^(Done|#[0-9]+ +DONE)|panicked|ERROR" || true
    if ls "artifacts/$target"/crash-* >/dev/null 2>&1; then
        echo "crash found in $target: see fuzz/artifacts/$target/" >&2
        exit 1
    fi
done
