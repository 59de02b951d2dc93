#!/usr/bin/env bash
# Prints the packages the machine has that apt would remove, upgrade or downgrade to install
# "$@" ("name version, ..."); prints nothing when apt can install them as the machine is. When
# apt cannot plan the install at all (a held package, one it does not know), its errors go to
# stderr and the exit status is 3. Used by install-deps.sh and vm/run-in-vm.sh: no package is
# installed at the cost of one the machine has.
set -euo pipefail
if ! plan=$(apt-get install -s --no-install-recommends "$@" 2>&1); then
    grep -E '^E:' <<<"$plan" >&2 || tail -n5 <<<"$plan" >&2
    exit 3
fi
awk '$1 == "Remv" || ($1 == "Inst" && $3 ~ /^\[/) { print $2, $3 }' <<<"$plan" |
    tr -d '[]' | paste -sd, - | sed 's/,/, /g'
