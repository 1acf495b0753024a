"""Scaling of packed documents (`ring_varlen_forward`) and sharded-cache decoding (`sharded_decode`) over W
GPUs against one GPU, the slowest rank deciding each time.

    torchrun --nproc_per_node 4 scripts/cp_bench.py --json cp.json
    python scripts/cp_bench.py --device cpu --total 2048 --cache 4096 --heads 4:2 --head-dim 32 --dtype float32

* packed: `--documents` documents whose lengths are drawn (seed `--seed`) log-uniformly between
  `--min-doc` and `--max-doc`, scaled to sum to `--total` (each kept within those bounds), causal; each
  rank holds `shard_varlen` of the batch. T_W = ring_varlen_forward, T_1 = varlen_forward of the whole batch
  on one GPU (run on every rank at once, no communication); efficiency T_1 / (W * T_W); median of
  `--iters` calls after `--warmup`; gather_s (the K/V gather alone) and compute_s (the varlen call alone,
  on keys gathered beforehand). Checked: every rank's rows against T_1's output.
* decode: one query token, `--cache` keys an entry split evenly over the ranks (contiguous, and paged with
  `--page`), B of `--batches`; T_W = one sharded_decode step (its forward, the all_gather of the partial
  rows and the merge), T_1 = forward over the whole cache on one GPU; both captured into a CUDA graph
  and timed over `--replays` replays between events (median of `--iters` rounds). Checked against T_1.
  `--timeline`: also the step's parts on rank 0, one replay under torch.profiler (each device kernel's name,
  start and duration in us; on the CPU, the step's top-level operations): where a step's time goes beside
  the decode kernel (the copies, the all_gather, the merge).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))  # a source checkout, after an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # ring_bench beside this file
import cutlassfa  # noqa: E402
from cutlassfa import _context_parallel, _ring_varlen  # noqa: E402
from cutlassfa._context_parallel import gather_rows  # noqa: E402
from cutlassfa.distributed import ring_varlen_forward, shard_varlen, sharded_decode  # noqa: E402
from ring_bench import init_group  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=["packed", "decode"], choices=["packed", "decode"])
    p.add_argument("--heads", default="32:8", help="Hq:Hkv")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--documents", type=int, default=16)
    p.add_argument("--min-doc", type=int, default=1024)
    p.add_argument("--max-doc", type=int, default=65536)
    p.add_argument("--total", type=int, default=262144)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", type=int, default=1 << 20, help="keys of each decode entry, over all ranks")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--page", type=int, default=256, help="page size of the paged decode shards (0: none)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--gather-groups", type=int, nargs="+", default=[1],
                   help="packed: each number of K/V head groups gathered one after another (a row each)")
    p.add_argument("--timeline", action="store_true", help="decode: the step's kernels on rank 0 (torch.profiler)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def slowest(times: list[float], device: torch.device) -> float:
    """The median over rounds of the slowest rank's time."""
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return statistics.median(t.tolist())


def timed(fn, device: torch.device, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return slowest(times, device)


def captured(fn, device: torch.device, warmup: int):
    """fn captured into a CUDA graph (after warm-up calls on a side stream): the graph's replay; fn itself on the
    CPU."""
    if device.type != "cuda":
        return fn
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup + 1):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def graph_timed(fn, device: torch.device, args: argparse.Namespace) -> float:
    """Seconds per call of fn captured into a CUDA graph (plain calls on the CPU)."""
    if device.type != "cuda":
        return timed(fn, device, args.warmup, args.iters)
    replay = captured(fn, device, args.warmup)
    times = []
    for _ in range(args.iters):
        torch.cuda.synchronize(device)
        dist.barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.replays):
            replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3 / args.replays)
    return slowest(times, device)


def timeline(fn, device: torch.device, args: argparse.Namespace) -> list[dict]:
    """One call of fn (its CUDA graph's replay on a GPU) under torch.profiler on every rank (the call's
    collectives need them all): its device kernels in order (name, start after the first one and duration,
    us); on the CPU its top-level operations."""
    replay = captured(fn, device, args.warmup)
    replay()  # the replay's first run outside the profiler
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    dist.barrier()
    with torch.profiler.profile(activities=activities) as prof:
        replay()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    if device.type == "cuda":
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        events = [e for e in prof.events() if e.cpu_parent is None]
    events.sort(key=lambda e: e.time_range.start)
    first = events[0].time_range.start if events else 0
    return [dict(name=e.name, start_us=e.time_range.start - first, us=e.time_range.elapsed_us()) for e in events]


def rel_l2_all(mine: torch.Tensor, ref: torch.Tensor, device: torch.device) -> float:
    sums = torch.tensor([float((mine.float() - ref.float()).pow(2).sum()), float(ref.float().pow(2).sum())],
                        dtype=torch.float64, device=device)
    dist.all_reduce(sums)
    return float(sums[0].sqrt() / sums[1].sqrt())


def document_lengths(args: argparse.Namespace) -> list[int]:
    """Log-uniform lengths in [min, max], scaled to sum to total (rounding put on the longest)."""
    rng = np.random.default_rng(args.seed)
    raw = np.exp(rng.uniform(np.log(args.min_doc), np.log(args.max_doc), args.documents))
    lengths = np.clip(np.round(raw * args.total / raw.sum()), args.min_doc, args.max_doc).astype(int)
    lengths[np.argmax(lengths)] += args.total - lengths.sum()
    return lengths.tolist()


def packed(rank: int, world: int, device: torch.device, args: argparse.Namespace) -> list[dict]:
    """One row per value of --gather-groups."""
    hq, hkv = (int(h) for h in args.heads.split(":"))
    dtype = getattr(torch, args.dtype)
    lengths = document_lengths(args)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    gen = torch.Generator(device=device).manual_seed(args.seed)
    q, k, v = (torch.randn(args.total, h, args.head_dim, generator=gen, device=device).to(dtype)
               for h in (hq, hkv, hkv))
    q_l, k_l, v_l = (shard_varlen(x, cu, rank, world) for x in (q, k, v))
    cu_dev = torch.as_tensor(cu, dtype=torch.int32, device=device)
    longest = int(max(lengths))

    def single():
        return cutlassfa.varlen_forward(q, k, v, cu_dev, cu_dev, max_seqlen_q=longest, max_seqlen_k=longest,
                                        causal=True)

    t_w, check = {}, {}
    ref = shard_varlen(single(), cu, rank, world)
    for groups in args.gather_groups:
        _context_parallel.GATHER_HEAD_GROUPS = groups
        t_w[groups] = timed(lambda: ring_varlen_forward(q_l, k_l, v_l, cu, cu, causal=True), device, args.warmup,
                            args.iters)
        check[groups] = rel_l2_all(ring_varlen_forward(q_l, k_l, v_l, cu, cu, causal=True), ref, device)
    del ref
    # The breakdown: the gather alone, and the varlen call alone on keys gathered beforehand.
    plan = _ring_varlen._plan(rank, world, tuple(lengths), tuple(lengths), False)
    t_gather = timed(lambda: gather_rows([k_l, v_l], plan.key_rows, 0, None), device, args.warmup, args.iters)
    gathered = gather_rows([k_l, v_l], plan.key_rows, 0, None)
    out = torch.empty_like(q_l)
    cu_q, cu_k = plan.cu_seqlens(device)
    t_compute = timed(lambda: cutlassfa.varlen_forward(q_l, *gathered, cu_q, cu_k, max_seqlen_q=plan.max_q,
                                                       max_seqlen_k=plan.max_k, causal=True, out=out),
                      device, args.warmup, args.iters)
    gathered = None  # noqa: F841  (freed before the one-GPU run)
    t_1 = timed(single, device, args.warmup, args.iters)
    pairs = sum(n * (n + 1) / 2 for n in lengths)
    return [dict(case="packed", W=world, documents=lengths, total=args.total, Hq=hq, Hkv=hkv, d=args.head_dim,
                 dtype=args.dtype, gather_groups=groups, t_w_s=t_w[groups], t_1_s=t_1,
                 efficiency=t_1 / (world * t_w[groups]), check_rel_l2=check[groups], gather_s=t_gather,
                 compute_s=t_compute, tflops_1=4 * pairs * hq * args.head_dim / t_1 / 1e12)
            for groups in args.gather_groups]


def paged_view(cache: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, n, d) as a pool of pages in order and its block table (a copy)."""
    b, h, n, d = cache.shape
    pages = n // page
    pool = cache.reshape(b, h, pages, page, d).permute(0, 2, 1, 3, 4).reshape(b * pages, h, page, d).contiguous()
    table = torch.arange(b * pages, dtype=torch.int32, device=cache.device).reshape(b, pages)
    return pool, table


def decode(rank: int, world: int, device: torch.device, args: argparse.Namespace, batch: int, paged: bool) -> dict:
    hq, hkv = (int(h) for h in args.heads.split(":"))
    dtype = getattr(torch, args.dtype)
    local = args.cache // world
    gen = torch.Generator(device=device).manual_seed(args.seed + batch)
    q = torch.randn(batch, hq, 1, args.head_dim, generator=gen, device=device).to(dtype)
    k_l, v_l = (torch.randn(batch, hkv, local, args.head_dim, generator=gen, device=device).to(dtype) for _ in range(2))
    lens_l = torch.full((batch,), local, dtype=torch.int32, device=device)
    options = {}
    if paged:
        (k_l, table), (v_l, _) = paged_view(k_l, args.page), paged_view(v_l, args.page)
        options["block_table"] = table
    sharded_decode(q, k_l, v_l, cache_seqlens=lens_l, **options)  # checked once, as a decode loop would
    t_w = graph_timed(lambda: sharded_decode(q, k_l, v_l, cache_seqlens=lens_l, check_ranks=False, **options),
                      device, args)
    steps = timeline(lambda: sharded_decode(q, k_l, v_l, cache_seqlens=lens_l, check_ranks=False, **options),
                     device, args) if args.timeline else None
    out_w = sharded_decode(q, k_l, v_l, cache_seqlens=lens_l, **options)
    # One GPU holding every rank's part: the parts gathered (the same random values the ranks hold).
    parts_k = [torch.empty_like(k_l) for _ in range(world)]
    parts_v = [torch.empty_like(v_l) for _ in range(world)]
    dist.all_gather(parts_k, k_l)
    dist.all_gather(parts_v, v_l)
    k_l = v_l = None  # noqa: F841  (freed: one GPU's copy of the whole cache comes next)
    if paged:  # one pool of every rank's pages, each entry's table running over its pages rank by rank
        k_all, v_all = torch.cat(parts_k), torch.cat(parts_v)
        per_rank = table.shape[1]
        full_table = torch.cat([table + r * table.numel() for r in range(world)], dim=1)
        one = dict(block_table=full_table)
        assert full_table.shape[1] == per_rank * world
    else:
        k_all, v_all = torch.cat(parts_k, dim=2), torch.cat(parts_v, dim=2)
        one = {}
    del parts_k, parts_v
    lens_1 = torch.full((batch,), local * world, dtype=torch.int32, device=device)
    t_1 = graph_timed(lambda: cutlassfa.forward(q, k_all, v_all, cache_seqlens=lens_1, causal=True, **one), device,
                      args)
    ref = cutlassfa.forward(q, k_all, v_all, cache_seqlens=lens_1, causal=True, **one)
    check = rel_l2_all(out_w, ref, device) / world ** 0.5  # every rank holds the whole result
    cache_bytes = 2 * batch * hkv * local * world * args.head_dim * q.element_size()
    row = dict(case="decode", paged=paged, page=args.page if paged else None, W=world, B=batch, cache=local * world,
               Hq=hq, Hkv=hkv, d=args.head_dim, dtype=args.dtype, t_w_s=t_w, t_1_s=t_1,
               efficiency=t_1 / (world * t_w), check_rel_l2=check, t_1_tb_per_s=cache_bytes / t_1 / 1e12,
               t_w_tb_per_s_per_gpu=cache_bytes / world / t_w / 1e12)
    if steps is not None:
        row["timeline"] = steps
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = init_group(args.device)
    rows = []
    if "packed" in args.cases:
        rows.extend(packed(rank, world, device, args))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "decode" in args.cases:
        for batch in args.batches:
            for paged in ([False, True] if args.page else [False]):
                rows.append(decode(rank, world, device, args, batch, paged))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"context parallelism, {world} x {name}, {args.dtype}, heads {args.heads}, d {args.head_dim}")
        for row in rows:
            shown = {key: (f"{val:.4g}" if isinstance(val, float) else val) for key, val in row.items()
                     if key not in ("documents", "timeline")}
            print(shown)
        if args.json is not None:
            args.json.write_text(json.dumps(dict(device=name, nccl=".".join(map(str, torch.cuda.nccl.version()))
                                                 if device.type == "cuda" else None, rows=rows), indent=2))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
