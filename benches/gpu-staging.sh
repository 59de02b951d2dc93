#!/usr/bin/env bash
# GPU staging on a machine with an NVIDIA GPU: our pipeline (benches/examples/gpu_staging.rs)
# next to a PyTorch chunked copy loop (benches/gpu_staging_torch.py) in the same run, with
# ratios. Build here, run there:
#   cargo build --release -p rdma-hint-benches --example gpu_staging
#   BIN=target/release/examples/gpu_staging benches/gpu-staging.sh [TOTAL_MIB]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
total=${1:-1024}
bin=${BIN:-$here/../target/release/examples/gpu_staging}
raw=$("$bin" "$total")
ours=$(printf '%s\n' "$raw" | sed -n 's/^JSON //p')
hint=$(printf '%s\n' "$raw" | sed -n 's/^HINT //p')
printf '%s\n' "$raw" | grep '^#' || true
torch=$(EXTRA_BLOCKS=$hint python3 "$here/gpu_staging_torch.py" "$total" | sed -n 's/^JSON //p')
python3 - "$ours" "$torch" "$hint" <<'PY'
import json, sys
ours = {r["block_bytes"]: r for r in map(json.loads, sys.argv[1].splitlines())}
torch = {r["block_bytes"]: r for r in map(json.loads, sys.argv[2].splitlines())}
hint = int(sys.argv[3]) if sys.argv[3].isdigit() else None
print(f"{'block':>8} | {'ours G2G':>9} {'torch G2G':>9} {'ratio':>6} | {'ours D2H':>9} {'torch D2H':>9} {'ratio':>6} | {'ours H2D':>9} | verified")
for block in sorted(ours):
    o, t = ours[block], torch.get(block, {})
    tg, td = t.get("torch_gpu_to_gpu_gbps", float("nan")), t.get("torch_d2h_gbps", float("nan"))
    print(f"{block:>8} | {o['gpu_to_gpu_gbps']:9.2f} {tg:9.2f} {o['gpu_to_gpu_gbps']/tg:6.2f} | "
          f"{o['d2h_gbps']:9.2f} {td:9.2f} {o['d2h_gbps']/td:6.2f} | {o['h2d_gbps']:9.2f} | "
          f"{o['verified'] and t.get('verified', False)}")
plateau = max(r["gpu_to_gpu_gbps"] for r in ours.values())
knee = min(b for b, r in ours.items() if r["gpu_to_gpu_gbps"] >= 0.9 * plateau)
d2h_plateau = max(r["d2h_gbps"] for r in ours.values())
print(f"plateau {plateau:.2f} GB/s GPU->GPU, {d2h_plateau:.2f} GB/s D2H; knee (90 % of plateau) at {knee} B")
if hint:
    at = ours[hint]
    print(f"model hint {hint} B: GPU->GPU {at['gpu_to_gpu_gbps']:.2f} GB/s = {at['gpu_to_gpu_gbps']/plateau:.3f} of plateau, "
          f"D2H {at['d2h_gbps']:.2f} GB/s = {at['d2h_gbps']/d2h_plateau:.3f}; hint/knee = {hint/knee:.2f}")
PY
