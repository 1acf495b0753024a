"""fp8 attention's accuracy report (issue 42): q, k and v quantized to float8_e4m3fn with per-tensor amax / 448
scales, run through `cutlassfa.forward` (q_descale / k_descale / v_descale, bfloat16 out), and compared with

* the float64 attention of the dequantized inputs (the kernel's own error),
* the float64 attention of the unquantized bfloat16 inputs (the quantization error a user pays), and
* the same attention with P = exp(S - max) rounded to e4m3 before P V, in float32 otherwise (the error of
  the fp8 algorithm itself, FlashAttention-3's and cuDNN's: the gate's fp8 yardstick),

on standard normal inputs and on inputs with outlier channels (a few columns of q and k times 20 before
quantization, as activations with outlier features have). Shapes: the accuracy gate's (B 2, 4:4 and 4:1
heads, N 1-257, Nq != Nk) and a longer (1, 8:2, 1024) row, causal and not, at each head dim asked for.
Reports max and median rel-L2 per (inputs, head dim, causal) and the largest lse error (natural log, rows
that see a key). The references are the package's (cutlassfa.reference: attention_reference, and
naive_same_precision with p_dtype e4m3 for the algorithm), on the host.

    python scripts/fp8_accuracy.py [--backend tensorcore] [--head-dims 64,128,256] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import ml_dtypes
import numpy as np
import torch

import cutlassfa
from cutlassfa.reference import attention_reference, naive_same_precision, rel_l2

E4M3_MAX = 448.0
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
OUTLIER_CHANNELS = 4
OUTLIER_FACTOR = 20.0
SHAPES = [(2, 4, 4, nq, nk) for nq, nk in ((1, 1), (77, 77), (128, 128), (257, 257), (1, 257), (77, 257), (257, 128))]
SHAPES += [(2, 4, 1, 257, 257), (2, 4, 1, 77, 257), (1, 8, 2, 1024, 1024)]


def quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as e4m3 with one scale for the tensor (its amax to e4m3's largest), and the descale back."""
    descale = (x.abs().amax().float() / E4M3_MAX).clamp_min(1e-12)
    return (x.float() / descale).to(torch.float8_e4m3fn), descale


def host64(x: torch.Tensor) -> np.ndarray:
    return x.double().cpu().numpy()


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
                    dq, dk, dv = (host64(x8) * float(s) for x8, s in ((q8, qd), (k8, kd), (v8, vd)))
                    ref, ref_lse = attention_reference(dq, dk, dv, causal=causal)
                    kernel.append(rel_l2(host64(out), ref))
                    user.append(rel_l2(host64(out), attention_reference(*map(host64, (q, k, v)), causal=causal)[0]))
                    algorithm.append(rel_l2(naive_same_precision(dq, dk, dv, np.float32, causal=causal, p_dtype=E4M3),
                                            ref))
                    seen = np.isfinite(ref_lse)
                    if seen.any():
                        lse_err = max(lse_err, float(np.abs(host64(lse) - ref_lse)[seen].max()))
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
