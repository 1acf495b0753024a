"""The all-gather of a sharded decode step's partial rows, timed alone: NCCL's all_gather against an all-gather
made of one one-shot all-reduce over symmetric memory (each rank writes its part into its own slot of a
W-slot buffer whose other slots stay zero, and the sum over the ranks is the gather, exactly: x + 0 = x).

    torchrun --nproc_per_node 4 scripts/cp_collective_probe.py --json probe.json
    python scripts/cp_collective_probe.py --device cpu

sharded_decode's step at B 1 (32 heads, d 128: 16.5 KB of float32 rows a rank) spends ~55 us beside its decode
kernel (bench/NOTES-context-parallel.md); a small NCCL all_gather is latency-bound, while a one-shot
all-reduce reads its peers' buffers over NVLink in one kernel. Each variant is captured into a CUDA graph
with `--calls` collectives in a row and timed over `--replays` replays (the slowest rank, median of
`--iters` rounds); on the CPU (gloo) NCCL's row is plain calls and the symmetric-memory row says why it did
not run. Every variant's result is checked against the ranks' parts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cp_bench and ring_bench beside this file
from cp_bench import graph_timed  # noqa: E402
from ring_bench import init_group  # noqa: E402

from cutlassfa._context_parallel import all_gather_tensor  # noqa: E402  (after cp_bench's path set-up)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--floats", type=int, nargs="+", default=[32 * 129, 8 * 32 * 129, 64 * 32 * 129],
                   help="float32 values a rank contributes (default: B 1, 8 and 64 of 32 heads x (d 128 + lse))")
    p.add_argument("--calls", type=int, default=10, help="collectives in a row inside one captured graph")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def per_call_s(fn, device: torch.device, args: argparse.Namespace) -> float:
    """Seconds a collective: `--calls` of them in one graph, timed as cp_bench times a step (plain calls on the
    CPU)."""
    def many():
        for _ in range(args.calls):
            fn()

    return graph_timed(many, device, args) / args.calls


def nccl_all_gather(part: torch.Tensor, world: int):
    out = torch.empty(world * part.numel(), dtype=part.dtype, device=part.device)
    return out, lambda: all_gather_tensor(out, part, None)  # sharded_decode's own call


def symmetric_all_gather(part: torch.Tensor, rank: int, world: int):
    """The one-shot all-reduce over a symmetric W-slot buffer; raises where this PyTorch or device has none."""
    import torch.distributed._symmetric_memory as symm_mem

    n = part.numel()
    buffer = symm_mem.empty(world * n, dtype=part.dtype, device=part.device)
    symm_mem.rendezvous(buffer, dist.group.WORLD.group_name)
    buffer.zero_()
    dist.barrier()
    mine = buffer[rank * n:(rank + 1) * n]
    out = torch.empty_like(buffer)
    group = dist.group.WORLD.group_name

    def gather():
        mine.copy_(part)
        torch.ops.symm_mem.one_shot_all_reduce_out(buffer, "sum", group, out)

    return out, gather


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = init_group(args.device)
    rows = []
    for floats in args.floats:
        part = torch.full((floats,), float(rank + 1), device=device)
        part[::7] = -float("inf")  # an empty split's lse: -inf + 0 must stay -inf
        expected = torch.cat([torch.full((floats,), float(r + 1), device=device) for r in range(world)])
        expected.view(world, floats)[:, ::7] = -float("inf")
        for name in ("nccl", "symmetric_memory"):
            row = dict(variant=name, W=world, floats=floats, bytes=4 * floats)
            try:
                out, fn = nccl_all_gather(part, world) if name == "nccl" else symmetric_all_gather(part, rank, world)
                row["s"] = per_call_s(fn, device, args)
                fn()
                row["exact"] = bool(torch.equal(out, expected))
            except Exception as error:  # noqa: BLE001 - recorded as the row's reason, on every rank alike
                row["unavailable"] = f"{type(error).__name__}: {error}"[:300]
            rows.append(row)
    if rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        for row in rows:
            timing = f"{row['s'] * 1e6:.2f} us, exact {row['exact']}" if "s" in row else row["unavailable"]
            print(f"{row['variant']:>16} W {row['W']} {row['bytes']:>8} B a rank: {timing}")
        if args.json is not None:
            args.json.write_text(json.dumps(dict(device=name, torch=torch.__version__, rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    code = main()
    dist.destroy_process_group()
    sys.exit(code)
