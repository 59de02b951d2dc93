#!/usr/bin/env python3
"""Each of RUNS sweeps (one process each) printed as one line of median GB/s per power-of-two
block, 4 KiB..8 MiB, 64 MiB transfers: how a path's curve and level move from one process to
the next.

usage: sweep-curves.py BINARY RUNS "PATH FLAGS"   (e.g. "--backend staged --channel shm")"""
import json, os, subprocess, sys, tempfile

binary, runs, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
cache = tempfile.mkdtemp(prefix="rdma-hint-curves-")
env = dict(os.environ, RDMA_HINT_CACHE_DIR=cache)
points = []
for run in range(runs):
    out = os.path.join(cache, f"sweep{run}.json")
    subprocess.run([binary, "sweep", *flags, "--sizes", "4K..8M", "--transfer", "64M", "--no-record",
                    "--json", out], env=env, capture_output=True, check=True)
    sweep = json.load(open(out))
    points = [p for p in sweep["points"] if p["block_bytes"] & (p["block_bytes"] - 1) == 0]
    print(" ".join(f"{p['median_gbps']:5.1f}" for p in points), f" | plateau {sweep['plateau_gbps']:.1f}")
print(" ".join(f"{p['block_bytes'] // 1024:5d}" for p in points), " (KiB)")
