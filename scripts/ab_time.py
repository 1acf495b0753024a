"""GPU time of `cutlassfa.forward` on a few shapes, for comparing two builds with the same timer: run it once
per build (PYTHONPATH pointing at each install), alternating, and compare the medians. CUDA events around
`--calls` back-to-back calls, median of `--repeats`; prints one JSON line per shape.
    PYTHONPATH=/tmp/site_before python3 scripts/ab_time.py --shape 2,16,16384,128,causal,bfloat16 ..."""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import cutlassfa


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", required=True, help="B,H,N,d,causal|full,dtype")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    for text in args.shape:
        b, h, n, d, mask, dtype = text.split(",")
        b, h, n, d = int(b), int(h), int(n), int(d)
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=getattr(torch, dtype)).transpose(1, 2)
                   for _ in range(3))
        causal = mask == "causal"
        for _ in range(3):
            cutlassfa.forward(q, k, v, causal=causal)
        times = []
        for _ in range(args.repeats):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.calls):
                cutlassfa.forward(q, k, v, causal=causal)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / args.calls)
        flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
        ms = statistics.median(times)
        print(json.dumps({"tag": args.tag, "shape": text, "ms": round(ms, 4), "min_ms": round(min(times), 4),
                          "tflops": round(flops / ms / 1e9, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
