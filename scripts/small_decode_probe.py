"""Where a small decode call's time goes (one query, bf16, Hq 32, full caches): per call, graph-timed (a CUDA
graph of 8 calls on each of several L2-rotated input copies, median of 7 interleaved rounds), cutlassfa with
its own split count and with 1-32 splits forced, SDPA's cuDNN and FLASH backends; then the kernels of one
graph replay of cutlassfa and cuDNN (profiler: count and mean duration, which for a programmatic dependent
includes its wait). Writes one JSON line a case and `small_decode_probe.json` under --out.

    python scripts/small_decode_probe.py --out /tmp/probe [--case 1,4,2048,128 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import cutlassfa
from cuda_graphs import graph_of, replay_kernels

# (B, Hkv, Nk, d): the decode grid's lowest ratios against the best SDPA backend (2k keys), and 16k.
CASES = [(1, 4, 2048, 128), (1, 8, 2048, 64), (8, 4, 2048, 64), (1, 32, 2048, 64), (8, 8, 2048, 128),
         (1, 8, 16384, 64), (8, 4, 16384, 64), (1, 8, 16384, 128)]
HEADS_Q, CALLS, ROUNDS, L2_BYTES = 32, 8, 7, 60e6


def _case(b: int, hk: int, nk: int, d: int) -> dict:
    kv_bytes = 2 * b * hk * nk * d * 2
    copies = max(2, min(16, int(3 * L2_BYTES / kv_bytes) + 1))  # three L2s of inputs: every call reads DRAM
    def make(*shape: int) -> list[torch.Tensor]:
        return [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]

    qs, ks, vs = make(b, HEADS_Q, 1, d), make(b, hk, nk, d), make(b, hk, nk, d)
    lengths = torch.full((b,), nk, device="cuda", dtype=torch.int32)
    turn = [0]

    def inputs():
        turn[0] = (turn[0] + 1) % copies
        return qs[turn[0]], ks[turn[0]], vs[turn[0]]

    def ours(splits: int | None = None):
        return lambda: cutlassfa.forward(*inputs(), cache_seqlens=lengths, num_splits=splits)

    def sdpa(backend: SDPBackend):
        def call():
            with sdpa_kernel([backend]):
                torch.nn.functional.scaled_dot_product_attention(*inputs(), enable_gqa=True)
        return call

    contenders = {"ours": ours(), "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION),
                  **{f"ours_s{s}": ours(s) for s in (1, 2, 4, 8, 16, 32)}}
    graphs = {name: graph_of(torch, call, CALLS * copies) for name, call in contenders.items()}
    times: dict[str, list[float]] = {name: [] for name in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(ROUNDS):
        for name, graph in graphs.items():
            graph.replay()
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / (CALLS * copies))
    kernels = {name: replay_kernels(torch, graphs[name]) for name in ("ours", "cudnn")}
    plan = cutlassfa.plan(qs[0], ks[0], vs[0], cache_seqlens=lengths)
    return {"case": [b, HEADS_Q, hk, nk, d], "kv_mb": round(kv_bytes / 1e6, 1),
            "us": {name: round(statistics.median(t), 2) for name, t in times.items()},
            "splits": plan["num_splits"], "kernels": kernels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", action="append", help="B,Hkv,Nk,d (repeatable; default: the list above)")
    args = parser.parse_args()
    cases = [tuple(int(x) for x in c.split(",")) for c in args.case] if args.case else CASES
    rows = []
    for case in cases:
        rows.append(_case(*case))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "small_decode_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
