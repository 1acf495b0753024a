"""What fp8 attention's own rounding costs: a numpy model of the sm90ws fp8 kernel's arithmetic, to set
the GPU bounds from (cpp/sm90ws/selftest_fp8.cu computes the same model in C++ on its own inputs).

The kernel computes S = Q K^T exactly (e4m3 products, fp32 accumulation), P = exp(s - m) in fp32, rounds P
to e4m3 for O += P V (fp32 accumulation), and divides by l, the sum of the unrounded P. The model does that
with the row's exact max m (the kernel's reference max moves by the tile: its P are never smaller, so its
rounding is never coarser) and compares against float64 attention of the dequantized inputs; the output's
own rounding (bf16: 2^-9 relative) is reported apart.

    python bench/fp8_rounding_model.py            # the self-test's inputs and the bench shapes' rows
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np


def e4m3(x: np.ndarray) -> np.ndarray:
    """x rounded to float8_e4m3fn (round to nearest even, saturating), back as float64."""
    return np.asarray(x, np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def model_errors(rows: int, keys: int, d: int, amplitude: float, descale: float, causal: bool,
                 seed: int = 0) -> tuple[float, float]:
    """rel-L2 of O against float64 attention of the dequantized inputs: the model (P in e4m3), and the same
    rounded once more to bf16 (what the kernel returns). q, k, v uniform in [-amplitude, amplitude] rounded
    to e4m3, each times `descale`; bottom-right causal when asked."""
    rng = np.random.default_rng(seed)
    q = e4m3(rng.uniform(-amplitude, amplitude, (rows, d))) * descale
    k = e4m3(rng.uniform(-amplitude, amplitude, (keys, d))) * descale
    v = e4m3(rng.uniform(-amplitude, amplitude, (keys, d))) * descale
    s = (q @ k.T) / np.sqrt(d)
    if causal:
        i = np.arange(rows)[:, None] + keys - rows
        s = np.where(np.arange(keys)[None, :] <= i, s, -np.inf)
    visible = np.isfinite(s).any(axis=1)
    s, v_rows = s[visible], v
    p = np.exp(s - s.max(axis=1, keepdims=True))
    l = p.sum(axis=1, keepdims=True)
    ref = (p @ v_rows) / l
    got = (e4m3(p) @ v_rows) / l
    out = got.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    norm = np.linalg.norm(ref)
    return float(np.linalg.norm(got - ref) / norm), float(np.linalg.norm(out - ref) / norm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512, help="query rows sampled per case")
    args = parser.parse_args()
    print("inputs                                    model (P e4m3)   + bf16 out")
    # The self-test's checks: amplitude 3, descales in [0.25, 1) (0.6 here); its timings: amplitude 1,
    # descale 1; the check rows of `cutlassfa check`: descales 1/32 on values up to ~448 (amplitude 14 here).
    for amplitude, descale, label in ((3.0, 0.6, "self-test checks"), (1.0, 1.0, "self-test timings"),
                                      (14.0, 1 / 32, "check rows")):
        for d in (64, 128, 256):
            for keys, causal in ((1000, False), (1000, True), (4096, False)):
                rows = min(args.rows, keys)
                model, with_out = model_errors(rows, keys, d, amplitude, descale, causal)
                print(f"{label:18s} d={d:3d} Nk={keys:5d} causal={int(causal)}   {model:.2e}         {with_out:.2e}")


if __name__ == "__main__":
    main()
