#!/usr/bin/env bash
# Hint fidelity: for every path, RUNS times `rdma-hint calibrate` then a sweep whose sizes
# include the model's, the calibrated and the recorded hint; prints each hint's share of the
# robust plateau (median of the three best medians) and its ratio to the robust knee, and
# whether the calibrated one meets "≥ 0.90 of the plateau and ≤ 2× the knee".
#
#   benches/fidelity.sh [OUT_DIR]          (default target/fidelity)
#   RDMA_HINT_BIN=path  RUNS=3  PATHS="staged:shm@host:0 ucx:tcp@host:0 staged:shm@gpu:0 verbs:rxe0@host:0"
#   SIZES=4K..1M  SWEEP_ARGS="--iters 2 --transfer 4M"  CALIBRATE_ARGS="--budget-ms 3000"
#   (slow paths: Soft-RoCE under emulation moves ≈ 20 MB/s)
#
# Raw JSON per run lands in OUT_DIR (cal-*.json, sweep-*.json, sweep-*.txt); the summary is
# printed and written to OUT_DIR/summary.txt. The sweeps do not record their knee
# (`--no-record`), so every run starts from the same cache: its own, in OUT_DIR/cache.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/fidelity}
bin=${RDMA_HINT_BIN:-target/release/rdma-hint}
runs=${RUNS:-3}
mkdir -p "$out"
export RDMA_HINT_CACHE_DIR="$out/cache" UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
if [ -z "${PATHS:-}" ]; then
    PATHS="staged:shm@host:0 staged:tcp@host:0"
    "$bin" probe --json | grep -q '"ucx:shm"' && PATHS="$PATHS ucx:shm@host:0 ucx:tcp@host:0"
    "$bin" probe --json | grep -q '"gpu:0"' && PATHS="$PATHS staged:shm@gpu:0 staged:tcp@gpu:0"
fi
for path in $PATHS; do
    transport=${path%@*} source=${path#*@}
    backend=${transport%%:*} channel=${transport#*:}
    # verbs:DEVICE names a device, the others a channel.
    path_args=(--backend "$backend" --channel "$channel")
    [ "$backend" = verbs ] && path_args=(--backend verbs --device "$channel")
    sizes=${SIZES:-4K..16M}
    [ -z "${SIZES:-}" ] && [ "${source%%:*}" = gpu ] && sizes=64K..16M
    for run in $(seq 1 "$runs"); do
        tag="${backend}-${channel}-${source/:/}-$run"
        # shellcheck disable=SC2086 # the *_ARGS are word lists on purpose
        "$bin" calibrate "${path_args[@]}" --source "$source" ${CALIBRATE_ARGS:-} --json >"$out/cal-$tag.json"
        # shellcheck disable=SC2086
        "$bin" sweep "${path_args[@]}" --source "$source" --sizes "$sizes" ${SWEEP_ARGS:-} \
            --no-record --json "$out/sweep-$tag.json" --plot "$out/sweep-$tag.svg" >"$out/sweep-$tag.txt"
    done
done
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import glob, json, os, sys
out = sys.argv[1]
print(f"{'path':<28} {'run':>3} {'cal block':>10} {'o µs':>6} {'B GB/s':>7} {'R²':>6} {'ms':>4} | "
      f"{'plateau':>7} {'knee':>8} | {'model':>14} {'calibrated':>14} {'verdict':>7}")
kib = lambda b: f"{b / 1024:.0f}K" if b < 1 << 20 else f"{b / (1 << 20):.1f}M"
for cal_file in sorted(glob.glob(os.path.join(out, "cal-*.json"))):
    tag = os.path.basename(cal_file)[4:-5]
    c = json.load(open(cal_file))
    s = json.load(open(os.path.join(out, f"sweep-{tag}.json")))
    h = s["hints"]
    cal = h.get("calibrated")
    ok = cal is not None and cal["efficiency"] >= 0.90 and cal["over_knee"] <= 2.0
    fmt = lambda v: f"{kib(v['block_bytes'])} {v['efficiency']:.2f}/{v['over_knee']:.1f}x" if v else "-"
    name, run = tag.rsplit("-", 1)
    print(f"{name:<28} {run:>3} {kib(c['block_bytes']):>10} {c['fixed_cost_us']:>6.2f} {c['bandwidth_gbps']:>7.2f} "
          f"{c['fit_r2']:>6.3f} {c['elapsed_ms']:>4.0f} | {s['plateau_gbps']:>7.2f} {kib(s['knee_bytes']):>8} | "
          f"{fmt(h['model']):>14} {fmt(cal):>14} {'meets' if ok else 'misses':>7}")
PY
