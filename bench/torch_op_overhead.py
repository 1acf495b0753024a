"""Per-call host cost of the ways a torch tensor can reach cutlassfa: what registering the operator
costs by registration style (with an empty kernel), what the routing check costs, and the whole call
through the operator and around it.

    python bench/torch_op_overhead.py                  # CPU tensors
    python bench/torch_op_overhead.py --device cuda    # CUDA tensors (one synchronize at the end)

Each row: microseconds per call, best of `--repeats` runs of `--calls` back-to-back calls.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

import cutlassfa
from cutlassfa.integrations import torch as cutlassfa_torch


def per_call_us(call: Callable[[], object], calls: int, repeats: int, sync: Callable[[], None]) -> float:
    for _ in range(min(calls, 1000)):
        call()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def empty_operators(out: torch.Tensor, lse: torch.Tensor) -> tuple[dict[str, Callable], torch.library.Library]:
    """The same empty kernel (returns preallocated tensors) behind each registration style, and the
    library object that must stay alive while they are called."""
    schema = "(Tensor q, Tensor k, Tensor v, bool causal=False, float? softmax_scale=None) -> (Tensor, Tensor)"
    library = torch.library.Library("cutlassfa_overhead", "DEF")
    key = "CUDA" if out.is_cuda else "CPU"

    def kernel(q, k, v, causal=False, softmax_scale=None):
        return out, lse

    for name in ("library", "library_autograd"):
        library.define(name + schema)
        library.impl(name, kernel, key)
    torch.library.register_autograd("cutlassfa_overhead::library_autograd", lambda ctx, *grads: None,
                                    setup_context=lambda ctx, inputs, output: None, lib=library)

    @torch.library.custom_op("cutlassfa_overhead::custom_op", mutates_args=())
    def custom_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  softmax_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return out.clone(), lse.clone()  # custom_op outputs may not alias: clone, timed separately below

    ops = torch.ops.cutlassfa_overhead
    return {"python function (no operator)": kernel, "Library define/impl": ops.library.default,
            "Library define/impl + register_autograd": ops.library_autograd.default,
            "torch.library.custom_op (incl. 2 clones)": custom_op,
            "  the 2 clones alone": lambda *a, **k: (out.clone(), lse.clone())}, library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--shape", default="1,1,16,64", help="B,H,N,d (default: the tiny call of the overhead issue)")
    parser.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    shape = tuple(int(s) for s in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    q = torch.randn(shape, device=args.device, dtype=dtype)
    k, v = torch.randn_like(q), torch.randn_like(q)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    out, lse = cutlassfa_torch.eager_forward(q, k, v, causal=True, return_lse=True)

    rows: list[tuple[str, float]] = []
    operators, _library = empty_operators(out, lse)
    def time_call(call: Callable[[], object]) -> float:
        return per_call_us(call, args.calls, args.repeats, sync)

    for name, op in operators.items():
        rows.append((f"empty kernel: {name}", time_call(lambda: op(q, k, v, causal=True))))
    rows.append(("routing check (maybe_route -> None)", time_call(lambda: cutlassfa_torch.maybe_route(q, k, v))))
    full = {
        "cutlassfa: direct call (eager_forward)": lambda: cutlassfa_torch.eager_forward(q, k, v, causal=True),
        "cutlassfa: integrations.torch.forward (check + direct)": lambda: cutlassfa_torch.forward(q, k, v, causal=True),
        "cutlassfa: through torch.ops.cutlassfa.forward": lambda: cutlassfa_torch.op_forward(q, k, v, causal=True),
    }
    if args.device == "cuda":
        full["cutlassfa.forward"] = lambda: cutlassfa.forward(q, k, v, causal=True)
        full["torch SDPA (reference point)"] = lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True)
    for name, call in full.items():
        rows.append((name, time_call(call)))

    print(f"torch {torch.__version__}, {args.device}, {args.dtype} {shape}, "
          f"best of {args.repeats} x {args.calls} calls")
    width = max(len(name) for name, _ in rows)
    for name, us in rows:
        print(f"{name:<{width}}  {us:8.2f} us/call")


if __name__ == "__main__":
    main()
