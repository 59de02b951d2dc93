#!/usr/bin/env bash
# Builds every cargo-fuzz target (stable toolchain, no sanitizer) and runs each from its seeds
# and past crash inputs. The budget is libFuzzer's: `./run.sh -runs=1000000` (default) or
# `./run.sh -max_total_time=20`. Crashes, OOMs and timeouts land in fuzz/artifacts/<target>/ and
# any of them fails the script. Dependencies come from the committed fuzz/Cargo.lock.
# Needs cargo-fuzz: cargo install cargo-fuzz --version 0.13.2 --locked
set -euo pipefail
cd "$(dirname "$0")"
budget=${1:--runs=1000000}
cargo +stable fuzz build -s none -O
for target in $(cargo +stable fuzz list); do
    mkdir -p "corpus/$target" "artifacts/$target"
    # Seeds (valid inputs the target would take ages to guess) and inputs that once crashed.
    for dir in seeds regressions; do
        if [ -d "$dir/$target" ]; then cp -n "$dir/$target"/* "corpus/$target/"; fi
    done
    echo "== $target: $budget"
    ./target/x86_64-unknown-linux-gnu/release/"$target" "corpus/$target" "$budget" -max_len=256 \
        -artifact_prefix="artifacts/$target/" 2>&1 | grep -E "^Done|panicked|ERROR" || true
    # Any artifact fails the run: crash-*, but also oom-*, timeout-*, leak-*, slow-unit-*.
    if [ -n "$(ls -A "artifacts/$target")" ]; then
        echo "fuzzing $target left artifacts (crash, oom, timeout...): see fuzz/artifacts/$target/" >&2
        ls -l "artifacts/$target" >&2
        exit 1
    fi
done
