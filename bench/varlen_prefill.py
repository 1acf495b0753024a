"""Varlen prefill against a dense call: a batch of sequences of mixed lengths packed without padding
(`cutlassfa.varlen_forward`), causal, against `cutlassfa.forward` on a dense batch of as many sequences
at the batch's mean length. TFLOP/s count only the visible query-key pairs (causal, Nq = Nk: n (n + 1)
/ 2 a sequence and head), so the two are comparable although the varlen batch holds more pairs.

    python bench/varlen_prefill.py [--batch 16] [--min-len 64] [--max-len 8192] [--heads 32:8] [--d 128]

Timings: CUDA events, the two calls interleaved, median of --repeats. Before timing, every sequence of
the varlen output is checked against a dense call on that sequence alone (same backend: both must
agree to rounding), and the shortest sequence against an fp64 reference.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

import cutlassfa
from cutlassfa.reference import rel_l2, varlen_reference


def visible_pairs(lengths: list[int]) -> int:
    return sum(n * (n + 1) // 2 for n in lengths)


def host(t: torch.Tensor) -> np.ndarray:
    """A CUDA tensor on the host in float32 (bf16 values are exact there; numpy has no bfloat16)."""
    return t.float().cpu().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--heads", default="32:8", help="Hq:Hkv")
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    hq, hkv = (int(x) for x in args.heads.split(":"))
    dtype = getattr(torch, args.dtype)
    rng = np.random.default_rng(args.seed)
    lengths = [int(n) for n in rng.integers(args.min_len, args.max_len + 1, args.batch)]
    mean_len = round(sum(lengths) / len(lengths))
    total = sum(lengths)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)

    q, k, v = randn(total, hq, args.d), randn(total, hkv, args.d), randn(total, hkv, args.d)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device="cuda")
    dq, dk, dv = randn(args.batch, hq, mean_len, args.d), randn(args.batch, hkv, mean_len, args.d), \
        randn(args.batch, hkv, mean_len, args.d)

    def run_varlen() -> torch.Tensor:
        return cutlassfa.varlen_forward(q, k, v, cu, cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths),
                                        causal=True)

    def run_dense() -> torch.Tensor:
        return cutlassfa.forward(dq, dk, dv, causal=True)

    # Correctness first: each packed sequence against a dense call on it alone, the shortest against fp64.
    out = torch.full((total, hq, args.d), float("nan"), device="cuda", dtype=dtype)
    out.copy_(run_varlen())
    worst = 0.0
    for b, n in enumerate(lengths):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        alone = cutlassfa.forward(*(t[rows].transpose(0, 1).unsqueeze(0) for t in (q, k, v)), causal=True)
        worst = max(worst, rel_l2(host(out[rows]), host(alone[0].transpose(0, 1))))
    b = int(np.argmin(lengths))
    rows = slice(int(cu[b]), int(cu[b + 1]))
    one = [0, lengths[b]]  # the shortest sequence as a batch of one
    ref, _ = varlen_reference(host(q[rows]), host(k[rows]), host(v[rows]), one, one, causal=True)
    fp64_err = rel_l2(host(out[rows]), ref)
    print(f"lengths {lengths} (mean {mean_len}, total {total})")
    print(f"varlen vs each sequence alone: worst rel-L2 {worst:.2e}; shortest vs fp64: {fp64_err:.2e}")
    if not (worst < 1e-2 and fp64_err < 2e-2):
        raise SystemExit("varlen output disagrees with the dense calls or the reference")

    for _ in range(3):
        run_varlen(), run_dense()
    times: dict[str, list[float]] = {"varlen": [], "dense": []}
    for _ in range(args.repeats):
        for name, f in (("varlen", run_varlen), ("dense", run_dense)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            f()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    flops = {"varlen": 4.0 * hq * args.d * visible_pairs(lengths),
             "dense": 4.0 * hq * args.d * visible_pairs([mean_len] * args.batch)}
    tflops = {}
    for name in times:
        ms = statistics.median(times[name])
        tflops[name] = flops[name] / ms * 1e-9
        print(f"{name:7s} {ms:8.3f} ms  {tflops[name]:6.1f} TFLOP/s")
    print(f"varlen / dense TFLOP/s: {tflops['varlen'] / tflops['dense']:.3f}  ({args.dtype}, Hq:Hkv {hq}:{hkv}, "
          f"d {args.d}, backend chosen: {cutlassfa.select_backend(dq, dk, dv, causal=True)})")


if __name__ == "__main__":
    main()
