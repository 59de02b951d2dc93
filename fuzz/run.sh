#!/usr/bin/env bash
# Builds every cargo-fuzz target (stable toolchain, no sanitizer) and runs each for RUNS
# executions (default 1 000 000). Crashes land in fuzz/artifacts/<target>/ and fail the script.
# Needs cargo-fuzz: cargo install cargo-fuzz --version 0.13.2 --locked
set -euo pipefail
cd "$(dirname "$0")"
runs=${1:-1000000}
cargo +stable fuzz build -s none -O
for target in $(cargo +stable fuzz list); do
    mkdir -p "corpus/$target" "artifacts/$target"
    # Seeds (valid inputs the target would take ages to guess) live in fuzz/seeds/<target>/.
    if [ -d "seeds/$target" ]; then cp -n "seeds/$target"/* "corpus/$target/"; fi
    # Inputs that once crashed stay in the corpus as regression cases.
    if [ -d "regressions/$target" ]; then cp -n "regressions/$target"/* "corpus/$target/"; fi
    echo "== $target: $runs runs"
    ./target/x86_64-unknown-linux-gnu/release/"$target" "corpus/$target" -runs="$runs" -max_len=256 \
        -artifact_prefix="artifacts/$target/" 2>&1 | grep -E "^(Done|==|INFO: Seed)|panicked|ERROR" || true
    if ls "artifacts/$target"/crash-* >/dev/null 2>&1; then
        echo "crash found in $target: see fuzz/artifacts/$target/" >&2
        exit 1
    fi
done
