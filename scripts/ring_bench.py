"""Timing of context-parallel `ring_forward` (each of its modes) against single-GPU `forward`.

    torchrun --nproc_per_node 4 scripts/ring_bench.py --seqlens 131072 524288 --json ring.json
    torchrun --nproc_per_node 1 scripts/ring_bench.py --seqlens 131072   # W = 1: the ring's own overhead
    python scripts/ring_bench.py --device cpu --seqlens 512 --heads 4:2 --head-dim 32 --dtype float32  # smoke

(Option names avoid prefixes of torchrun's own options, which it would take for itself.)
For each N of `--seqlens` (the global sequence length), every rank builds the same full q, k, v (seeded), keeps its
shard (`--layout`, zigzag by default) and reports, the slowest rank deciding each time (median of
`--iters` timed calls after `--warmup`):

* ring (per mode of `--modes`: ring, allgather, auto): `ring_forward` on the shards, W GPUs.
* single: `forward` on the full sequence on one GPU (run on every rank at once, no communication).
  Strong-scaling efficiency = T_single / (W * T_ring). `--single-n` times the single-GPU baseline at
  another length when N does not fit one GPU (the efficiency is then per-GPU TFLOP/s of the ring over
  TFLOP/s of the single run: weak scaling).
* compute: the call's attention (and, in ring mode, merges) alone, no exchange. Ring mode: each rank's
  K/V block stands in for the one it would receive (same shapes when the split is even); allgather:
  on the K/V gathered once beforehand.
* exchange: the K/V exchanges alone (ring: the steps' sends and receives; allgather: the gather and
  the copy that orders it), no attention.
  hidden = (compute + exchange - call) / exchange: the share of the exchange time hidden under compute.
* check: every rank's ring output and lse against `forward` of its query chunks on the full keys
  (rel-L2 of out, max |lse| difference), unless `--no-check`.

TFLOP/s = 4 * B * Hq * N^2 * d / t, halved when causal (the visible query-key pairs). `--profile DIR`
writes a torch.profiler trace of one ring call per rank (NCCL kernels beside the attention kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))  # a source checkout, after an installed package
import cutlassfa  # noqa: E402
from cutlassfa import _ring_layout  # noqa: E402
from cutlassfa import _context_parallel, distributed  # noqa: E402
from cutlassfa._context_parallel import gather_rows  # noqa: E402
from cutlassfa.distributed import MODES, _attend, _attend_gathered, _Exchange, _setup, ring_forward, shard  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqlens", type=int, nargs="+", default=[131072, 524288], help="global sequence lengths N")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", default="32:8", help="Hq:Hkv")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--layout", default="zigzag", choices=list(_ring_layout.LAYOUTS))
    p.add_argument("--backend", default="auto")
    p.add_argument("--modes", nargs="+", default=["ring", "allgather", "auto"], choices=list(MODES),
                   help="ring_forward modes to time (auto: the one it chooses, reported as resolved_mode)")
    p.add_argument("--gather-groups", type=int, nargs="+", default=[1],
                   help="allgather and auto: each number of K/V head groups gathered one after another (a row each)")
    p.add_argument("--ring-overlap", nargs="+", default=[None], choices=["on", "off"],
                   help="ring mode: each setting of distributed.RING_OVERLAP (a row each; default: the module's)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--single-n", type=int, default=None, help="length of the single-GPU baseline (default N)")
    p.add_argument("--no-single", action="store_true", help="skip the single-GPU baseline")
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--profile", type=Path, default=None, help="folder for per-rank torch.profiler traces")
    return p.parse_args(argv)


def init_group(device: str) -> tuple[int, int, torch.device]:
    """torchrun's environment, or a one-process group when started with plain python."""
    if "RANK" not in os.environ:
        store = tempfile.mktemp(prefix="cutlassfa_bench_store_")
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}",
                                rank=0, world_size=1)
    else:
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, warmup: int, iters: int) -> float:
    """Median seconds of fn() over `iters` calls, each started together on all ranks (the slowest
    rank's time counts)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        synchronize(device)
        dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist())


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs):
    """Single-device `forward` (CUDA tensors, or CPU tensors for a smoke run)."""
    return cutlassfa.forward(q, k, v, **kwargs)


def tflops(batch: int, heads: int, nq: int, nk: int, d: int, causal: bool, seconds: float) -> float:
    return 4 * batch * heads * nq * nk * d * (0.5 if causal else 1.0) / seconds / 1e12


def check(q, k, v, out, lse, rank: int, world: int, args: argparse.Namespace) -> tuple[float, float]:
    """(rel-L2 of out, max |lse difference|) of this rank's rows against `forward` on the full keys:
    each local run of query positions [s, e) against keys [0, e) (causal, bottom-right: query s + i
    sees keys <= s + i) or all keys."""
    lengths = [shard(q[:, :1, :, :1], r, world, args.layout).shape[2] for r in range(world)]
    err_sq = ref_sq = 0.0
    lse_err = 0.0
    offset = 0
    for start, n in _ring_layout.segments(args.layout, lengths)[rank]:
        stop = start + n
        keys = stop if args.causal else k.shape[2]
        ref, ref_lse = attention(q[:, :, start:stop], k[:, :, :keys], v[:, :, :keys], causal=args.causal,
                                 backend=args.backend, return_lse=True)
        mine = out[:, :, offset:offset + n].float()
        err_sq += float((mine - ref.float()).pow(2).sum())
        ref_sq += float(ref.float().pow(2).sum())
        lse_err = max(lse_err, float((lse[:, :, offset:offset + n] - ref_lse).abs().max()) if n else 0.0)
        offset += n
    sums = torch.tensor([err_sq, ref_sq], dtype=torch.float64, device=q.device)
    worst = torch.tensor([lse_err], dtype=torch.float64, device=q.device)
    dist.all_reduce(sums)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(sums[0].sqrt() / sums[1].sqrt()), float(worst[0])


def breakdown(q_l, k_l, v_l, mode: str, device: torch.device, args: argparse.Namespace) -> dict:
    """The call's compute alone and its exchange alone, and the share of the exchange hidden under the
    compute: (compute + exchange - call) / exchange (0 when nothing overlaps, as in allgather)."""
    ring = _setup(q_l, k_l, v_l, group=None, causal=args.causal, softmax_scale=None, layout=args.layout,
                  backend=args.backend, window=None, mode=mode)
    row = dict(resolved_mode=ring.mode, steps=ring.steps, pieces=len(ring.gathered_plan))
    if ring.mode == "allgather":
        gathered = gather_rows([k_l, v_l], ring.key_order, 2, ring.group)
        out = torch.empty_like(q_l)
        lse = torch.empty(q_l.shape[:-1], dtype=torch.float32, device=device)
        compute = lambda: _attend_gathered(ring, q_l, *gathered, None, None, out, lse)  # noqa: E731
        exchange = lambda: gather_rows([k_l, v_l], ring.key_order, 2, ring.group)  # noqa: E731
    elif len(set(ring.k_lengths)) == 1:  # an even split: the local block stands in for every received one
        acc = torch.zeros(q_l.shape, dtype=torch.float32, device=device)
        acc_lse = torch.full(q_l.shape[:-1], float("-inf"), dtype=torch.float32, device=device)

        def compute() -> None:
            for step in range(ring.steps):
                _attend(ring, step, q_l, (k_l, v_l), acc, acc_lse)

        def exchange() -> None:
            block = (k_l, v_l)
            for step in range(ring.steps - 1):
                block = _Exchange(ring, step, block).wait()
    else:
        return row
    row.update(compute_s=timed(compute, device, args.warmup, args.iters),
               exchange_s=timed(exchange, device, args.warmup, args.iters))
    return row


def run_one(n: int, rank: int, world: int, device: torch.device, args: argparse.Namespace) -> list[dict]:
    """One row per mode of `--modes` at global length n."""
    hq, hkv = (int(h) for h in args.heads.split(":"))
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device=device).manual_seed(n)
    q, k, v = (torch.randn(args.batch, h, n, args.head_dim, generator=gen, device=device, dtype=torch.float32).to(dtype)
               for h in (hq, hkv, hkv))
    q_l, k_l, v_l = (shard(x, rank, world, args.layout).contiguous() for x in (q, k, v))
    base = dict(N=n, W=world, B=args.batch, Hq=hq, Hkv=hkv, d=args.head_dim, dtype=args.dtype, causal=args.causal,
                layout=args.layout)
    rows = []
    settings = [(mode, groups, overlap) for mode in args.modes
                for groups in (args.gather_groups if mode != "ring" else [None])
                for overlap in (args.ring_overlap if mode == "ring" else [None])]
    for mode, groups, overlap in settings:
        if groups is not None:
            _context_parallel.GATHER_HEAD_GROUPS = groups
        if overlap is not None:
            distributed.RING_OVERLAP = overlap == "on"
        elif mode == "ring":
            overlap = "on" if distributed.RING_OVERLAP else "off"
        kwargs = dict(causal=args.causal, layout=args.layout, backend=args.backend, mode=mode)
        row = dict(base, mode=mode, gather_groups=groups, ring_overlap=overlap)
        t_call = timed(lambda: ring_forward(q_l, k_l, v_l, **kwargs), device, args.warmup, args.iters)
        row.update(ring_s=t_call, ring_tflops_per_gpu=tflops(args.batch, hq, n, n, args.head_dim, args.causal,
                                                             t_call) / world)
        row.update(breakdown(q_l, k_l, v_l, mode, device, args))
        if "exchange_s" in row and world > 1:
            row["exchange_hidden"] = (row["compute_s"] + row["exchange_s"] - t_call) / row["exchange_s"]
        if not args.no_check:
            out, lse = ring_forward(q_l, k_l, v_l, return_lse=True, **kwargs)
            row["check_rel_l2"], row["check_lse_max_abs"] = check(q, k, v, out, lse, rank, world, args)
            del out, lse
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=activities) as prof:
                ring_forward(q_l, k_l, v_l, **kwargs)
                synchronize(device)
            prof.export_chrome_trace(str(args.profile / f"ring_N{n}_W{world}_{mode}_rank{rank}.json"))
        rows.append(row)

    if not args.no_single:
        single_n = args.single_n or n
        del q_l, k_l, v_l
        if single_n != n:
            del q, k, v
            q, k, v = (torch.randn(args.batch, h, single_n, args.head_dim, generator=gen, device=device).to(dtype)
                       for h in (hq, hkv, hkv))
        t_single = timed(lambda: attention(q, k, v, causal=args.causal, backend=args.backend), device,
                         args.warmup, args.iters)
        single_tflops = tflops(args.batch, hq, single_n, single_n, args.head_dim, args.causal, t_single)
        for row in rows:
            row.update(single_N=single_n, single_s=t_single, single_tflops=single_tflops,
                       efficiency=row["ring_tflops_per_gpu"] / single_tflops)
    return rows


def report(rows: list[dict]) -> None:
    columns = [("N", "{}"), ("W", "{}"), ("mode", "{}"), ("resolved_mode", "{}"), ("gather_groups", "{}"),
               ("ring_overlap", "{}"), ("ring_s", "{:.4g}"), ("ring_tflops_per_gpu", "{:.4g}"),
               ("single_s", "{:.4g}"), ("single_tflops", "{:.4g}"), ("efficiency", "{:.3f}"),
               ("compute_s", "{:.4g}"), ("exchange_s", "{:.4g}"), ("exchange_hidden", "{:.2f}"),
               ("check_rel_l2", "{:.2e}"), ("check_lse_max_abs", "{:.2e}")]
    print(" | ".join(name for name, _ in columns))
    for row in rows:
        print(" | ".join(fmt.format(row[name]) if row.get(name) is not None else "-" for name, fmt in columns))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = init_group(args.device)
    rows = [row for n in args.seqlens for row in run_one(n, rank, world, device, args)]
    if rank == 0:
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"ring_forward, {world} x {device_name}, {args.dtype}, layout {args.layout}, "
              f"causal {args.causal}, median of {args.iters}")
        report(rows)
        if args.json is not None:
            args.json.write_text(json.dumps(dict(device=device_name, rows=rows), indent=2))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
