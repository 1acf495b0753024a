"""Decode with an fp8 (e4m3) KV cache against the bf16 cache of the same shape, in one run: one query per
entry (bf16 q), d 128, heads 32/8 and 8/1, B in {1, 8, 32}, caches of 2k to 128k keys, contiguous and paged
(16, 64). Per case, interleaved rounds (each a CUDA graph of 5 calls; the median over rounds): cutlassfa on
the bf16 cache, cutlassfa on the fp8 cache (per-head descales), and two read-only kernels, a torch.sum over an
int32 view of the fp8 K and V bytes and of the bf16 ones (the memory roofline of each). Also the relative L2
of the fp8 result against the bf16 one (the quantization error users pay).

    python scripts/fp8_decode_bench.py --json out.json [--quick] [--bf16-only] [--case B,HQ,HKV,KEYS,PAGE ...]
        [--timeline]

--bf16-only: the bf16 cache and its read alone, with any cutlassfa (one from before fp8 caches too): the bf16
path of two builds compared, each run in its own process, against the read row of its own run.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import cutlassfa
from cuda_graphs import graph_of, replay_kernels

GRAPH_CALLS, ROUNDS = 5, 10


def time_interleaved(graphs: dict[str, torch.cuda.CUDAGraph]) -> dict[str, float]:
    """Median milliseconds per call of each graph, rounds interleaved with a rotating first contender."""
    names = list(graphs)
    times = {name: [] for name in names}
    for g in graphs.values():
        g.replay()
    for r in range(ROUNDS):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / GRAPH_CALLS)
    return {name: statistics.median(t) for name, t in times.items()}


def case(b: int, hq: int, hkv: int, keys: int, page: int | None, d: int = 128, fp8: bool = True,
         timeline: bool = False) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(b * 1000003 + keys + (page or 0))
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    if page is None:
        shape, table = (b, hkv, keys, d), None
    else:
        pages = b * keys // page
        shape = (pages, hkv, page, d)
        table = torch.randperm(pages, device="cuda", generator=gen).int().reshape(b, keys // page)
    k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    k_scale, v_scale = (x.float().abs().amax(dim=(0, 2, 3)) / 448 for x in (k, v))  # per K/V head
    k8 = (k.float() / k_scale[None, :, None, None]).to(torch.float8_e4m3fn)
    v8 = (v.float() / v_scale[None, :, None, None]).to(torch.float8_e4m3fn)
    lens = torch.full((b,), keys, dtype=torch.int32, device="cuda")
    common = dict(cache_seqlens=lens, block_table=table)
    out16, out8 = torch.empty_like(q), torch.empty_like(q)
    k8_words, v8_words = k8.view(torch.int32), v8.view(torch.int32)
    k_words, v_words = k.view(torch.int32), v.view(torch.int32)
    calls = {
        "bf16": lambda: cutlassfa.forward(q, k, v, out=out16, **common),
        "fp8": lambda: cutlassfa.forward(q, k8, v8, out=out8, k_descale=k_scale, v_descale=v_scale, **common),
        "read_fp8": lambda: (k8_words.sum(), v8_words.sum()),
        "read_bf16": lambda: (k_words.sum(), v_words.sum()),
    }
    if not fp8:
        calls = {name: calls[name] for name in ("bf16", "read_bf16")}
    graphs = {name: graph_of(torch, call, GRAPH_CALLS) for name, call in calls.items()}
    ms = time_interleaved(graphs)
    torch.cuda.synchronize()
    fp8_bytes = 2 * k8.numel()
    row = dict(b=b, hq=hq, hkv=hkv, keys=keys, page=page, d=d, ms=ms, bf16_cache_mb=2 * fp8_bytes / 2**20,
               bf16_of_read=ms["read_bf16"] / ms["bf16"])
    if fp8:
        error = ((out8.double() - out16.double()).norm() / out16.double().norm()).item()
        row.update(speedup=ms["bf16"] / ms["fp8"], of_read_fp8=ms["read_fp8"] / ms["fp8"],
                   fp8_tb_s=fp8_bytes / ms["fp8"] / 1e9, rel_l2_vs_bf16=error)
    if timeline:
        row["kernels"] = {name: replay_kernels(torch, graphs[name]) for name in graphs if not name.startswith("read")}
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true", help="a few cases only")
    parser.add_argument("--bf16-only", action="store_true", help="the bf16 cache and its read alone")
    parser.add_argument("--case", action="append", help="B,HQ,HKV,KEYS,PAGE (PAGE 0: contiguous; repeatable)")
    parser.add_argument("--timeline", action="store_true", help="the kernels of one replay of each graph")
    args = parser.parse_args()
    batches, lengths, pages = ([8], [8192, 131072], [None, 64]) if args.quick else \
        ([1, 8, 32], [2048, 8192, 32768, 131072], [None, 16, 64])
    cases = [(b, hq, hkv, keys, page) for hq, hkv in ((32, 8), (8, 1)) for b in batches for keys in lengths
             for page in pages]
    if args.case:
        cases = [(b, hq, hkv, keys, page or None) for b, hq, hkv, keys, page in
                 (tuple(int(x) for x in c.split(",")) for c in args.case)]
    rows = []
    for b, hq, hkv, keys, page in cases:
        row = case(b, hq, hkv, keys, page, fp8=not args.bf16_only, timeline=args.timeline)
        rows.append(row)
        line = f"{hq}/{hkv} B {b:2d} L {keys:6d} page {page or '-':>2}: bf16 {row['ms']['bf16']:.4f} ms"
        if not args.bf16_only:
            line += (f" fp8 {row['ms']['fp8']:.4f} ms x{row['speedup']:.2f}, {row['of_read_fp8']:.2f} of "
                     f"the fp8 read ({row['fp8_tb_s']:.2f} TB/s), rel L2 {row['rel_l2_vs_bf16']:.4f}")
        print(f"{line}, bf16 cache {row['bf16_cache_mb']:.0f} MB", flush=True)
        if args.timeline:
            print(f"  kernels: {row['kernels']}", flush=True)
        torch.cuda.empty_cache()
    info = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cutlassfa=cutlassfa.__version__)
    with open(args.json, "w") as f:
        json.dump(dict(info=info, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
