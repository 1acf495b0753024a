"""fp8 attention's accuracy report (issue 42): q, k and v quantized to float8_e4m3fn with per-tensor amax / 448
scales, run through `cutlassfa.forward` (q_descale / k_descale / v_descale, bfloat16 out), and compared with

* the float64 attention of the dequantized inputs (the kernel's own error),
* the float64 attention of the unquantized bfloat16 inputs (the quantization error a user pays), and
* the same float64 attention with P = exp(S - max) rounded to e4m3 before P V (the error of the fp8
  algorithm itself, FlashAttention-3's and cuDNN's, in exact arithmetic otherwise: the yardstick),

on standard normal inputs and on inputs with outlier channels (a few columns of q and k times 20 before
quantization, as activations with outlier features have). Shapes: the accuracy gate's (B 2, 4:4 and 4:1
heads, N 1-257, Nq != Nk) and a longer (1, 8:2, 1024) row, causal and not, at each head dim asked for.
Reports max and median rel-L2 per (inputs, head dim, causal) and the largest lse error (natural log, rows
that see a key). float64 references on the arrays' device (torch).

    python scripts/fp8_accuracy.py [--backend tensorcore] [--head-dims 64,128,256] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any

import torch

import cutlassfa

E4M3_MAX = 448.0
OUTLIER_CHANNELS = 4
OUTLIER_FACTOR = 20.0
SHAPES = [(2, 4, 4, nq, nk) for nq, nk in ((1, 1), (77, 77), (128, 128), (257, 257), (1, 257), (77, 257), (257, 128))]
SHAPES += [(2, 4, 1, 257, 257), (2, 4, 1, 77, 257), (1, 8, 2, 1024, 1024)]


def quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as e4m3 with one scale for the tensor (its amax to e4m3's largest), and the descale back."""
    descale = (x.abs().amax().float() / E4M3_MAX).clamp_min(1e-12)
    return (x.float() / descale).to(torch.float8_e4m3fn), descale


def attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                p_e4m3: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention in float64 ((B, H, N, d), GQA by repetition, bottom-right causal); with `p_e4m3`, P =
    exp(S - max) is rounded to e4m3 before P V and the row's float64 sum divides the product."""
    q, k, v = (x.double() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    nq, nk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        rows = torch.arange(nq, device=q.device)[:, None] + (nk - nq)
        s = s.masked_fill(torch.arange(nk, device=q.device)[None, :] > rows, -math.inf)
    m = s.amax(-1, keepdim=True)
    seen = torch.isfinite(m)
    e = torch.exp(s - torch.where(seen, m, torch.zeros_like(m)))
    total = e.sum(-1, keepdim=True)
    if p_e4m3:
        e = e.to(torch.float8_e4m3fn).double()
    out = torch.where(seen, (e @ v) / torch.where(seen, total, torch.ones_like(total)), torch.zeros_like(q[..., :1]))
    lse = torch.where(seen, m + torch.log(total), torch.full_like(m, -math.inf))[..., 0]
    return out, lse


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    norm = float(ref.norm())
    return float((x.double() - ref).norm()) / norm if norm else float((x.double() - ref).norm())


def inputs(kind: str, shape: tuple[int, ...], d: int, device: str, gen: torch.Generator) -> list[torch.Tensor]:
    b, hq, hkv, nq, nk = shape
    q = torch.randn(b, hq, nq, d, generator=gen).to(device, torch.bfloat16)
    k, v = (torch.randn(b, hkv, nk, d, generator=gen).to(device, torch.bfloat16) for _ in range(2))
    if kind == "outliers":  # the same few channels of q and k, as outlier features are
        channels = torch.randperm(d, generator=gen)[:OUTLIER_CHANNELS].to(device)
        q[..., channels] *= OUTLIER_FACTOR
        k[..., channels] *= OUTLIER_FACTOR
    return [q, k, v]


def measure(backend: str, head_dims: list[int], device: str, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (inputs, head dim, causal): the errors over SHAPES."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for kind in ("random", "outliers"):
        for d in head_dims:
            for causal in (False, True):
                kernel, user, algorithm, lse_err = [], [], [], 0.0
                for shape in SHAPES:
                    q, k, v = inputs(kind, shape, d, device, gen)
                    (q8, qd), (k8, kd), (v8, vd) = (quantized(x) for x in (q, k, v))
                    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device=device)  # poisoned
                    out, lse = cutlassfa.forward(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal,
                                                 out_dtype=torch.bfloat16, out=out, backend=backend, return_lse=True)
                    dq, dk, dv = (x8.double() * s for x8, s in ((q8, qd), (k8, kd), (v8, vd)))
                    ref, ref_lse = attention64(dq, dk, dv, causal)
                    kernel.append(rel_l2(out, ref))
                    user.append(rel_l2(out, attention64(q, k, v, causal)[0]))
                    algorithm.append(rel_l2(attention64(dq, dk, dv, causal, p_e4m3=True)[0], ref))
                    seen = torch.isfinite(ref_lse)
                    if bool(seen.any()):
                        lse_err = max(lse_err, float((lse.double() - ref_lse)[seen].abs().max()))
                rows.append({"inputs": kind, "d": d, "causal": causal, "cases": len(SHAPES),
                             "kernel_max": max(kernel), "kernel_median": statistics.median(kernel),
                             "vs_bf16_max": max(user), "vs_bf16_median": statistics.median(user),
                             "e4m3_p_max": max(algorithm), "e4m3_p_median": statistics.median(algorithm),
                             "lse_max_abs": lse_err})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| inputs | d | causal | vs fp64 of dequantized: max / median | exact fp8 algorithm (P in e4m3): "
             "max / median | vs unquantized bf16: max / median | lse max abs |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['inputs']} | {r['d']} | {'yes' if r['causal'] else 'no'} | {r['kernel_max']:.4f} / "
                     f"{r['kernel_median']:.4f} | {r['e4m3_p_max']:.4f} / {r['e4m3_p_median']:.4f} | "
                     f"{r['vs_bf16_max']:.4f} / {r['vs_bf16_median']:.4f} | {r['lse_max_abs']:.2e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="tensorcore")
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    dims = [int(x) for x in args.head_dims.split(",")]
    rows = measure(args.backend, dims, args.device, args.seed)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "device": args.device, "cutlassfa": cutlassfa.__version__,
                       "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
