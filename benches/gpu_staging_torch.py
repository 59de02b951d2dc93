"""PyTorch yardstick for GPU staging: chunked non_blocking copies through pinned memory.

For each block size, moves TOTAL bytes (default 1 GiB) as
  * D2H: GPU tensor chunk -> pinned ring slot, and
  * GPU->GPU: chunk -> pinned ring slot -> other GPU tensor, on the current stream,
best of 3 timed rounds after a warm-up, and prints one JSON object per size.
Usage: python3 benches/gpu_staging_torch.py [TOTAL_MIB]
"""
import json
import os
import sys
import time

import torch

BLOCKS = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def timed(fn):
    best = float("inf")
    for round_ in range(4):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if round_ > 0:
            best = min(best, time.perf_counter() - start)
    return best


def main():
    total = (int(sys.argv[1]) if len(sys.argv) > 1 else 1024) << 20
    extra = [int(b) for b in os.environ.get("EXTRA_BLOCKS", "").split(",") if b.isdigit()]
    src = torch.randint(0, 255, (total,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for block in sorted(set(BLOCKS + extra)):
        slots = max(8, min(1024, (64 << 20) // block))
        ring = torch.empty(slots * block, dtype=torch.uint8, pin_memory=True)

        # A block that does not divide the total leaves a short tail, copied like the rest.
        spans = [(i * block, min((i + 1) * block, total)) for i in range((total + block - 1) // block)]

        def d2h():
            for i, (lo, hi) in enumerate(spans):
                s = i % slots
                ring[s * block:s * block + hi - lo].copy_(src[lo:hi], non_blocking=True)

        def g2g():
            for i, (lo, hi) in enumerate(spans):
                s = i % slots
                slot = ring[s * block:s * block + hi - lo]
                slot.copy_(src[lo:hi], non_blocking=True)
                dst[lo:hi].copy_(slot, non_blocking=True)

        d2h_s = timed(d2h)
        g2g_s = timed(g2g)
        verified = bool(torch.equal(src, dst))
        print("JSON " + json.dumps({
            "block_bytes": block,
            "torch_d2h_gbps": round(total / d2h_s / 1e9, 3),
            "torch_gpu_to_gpu_gbps": round(total / g2g_s / 1e9, 3),
            "verified": verified,
        }), flush=True)


if __name__ == "__main__":
    main()
