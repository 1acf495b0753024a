"""The HW4 rule over every output of a full-size case: max |out - exact| <= 5e-3 for float32 inputs
uniform in [-3, 3]. The four HW4 shapes (cutlassfa.hw4.FULL_SHAPES) hold 4 to 66 million outputs;
the exact answer is computed in float64, a block of query rows at a time, in numpy or (for torch
tensors, on their device) in PyTorch, so no score matrix larger than a block is ever held.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import hw4

# Scores held at once per block (float64): 2^24 = 128 MiB.
_BLOCK_SCORES = 1 << 24


def hw4_inputs(shape: tuple[int, int, int], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 q, k, v of (B, N, d) `shape`, uniform in [-3, 3] as the HW4 test files (drawn in float32:
    the largest shapes hold 200 M values)."""
    r = np.float32(hw4.INPUT_RANGE)
    return tuple(rng.random(shape, dtype=np.float32) * (2 * r) - r for _ in range(3))


def _blocks(b: int, n: int) -> tuple[int, int]:
    """(batches, rows) per block so that batches x rows x n scores fit _BLOCK_SCORES."""
    if n * n <= _BLOCK_SCORES:
        return max(1, _BLOCK_SCORES // (n * n)), n
    return 1, max(1, _BLOCK_SCORES // n)


def max_abs_error(q: Any, k: Any, v: Any, out: Any) -> float:
    """max |out - softmax(q k^T / sqrt(d)) v| over every element; q, k, v, out (B, N, d), non-causal.
    numpy arrays are compared in numpy, torch tensors in torch on their device; float64 either way.
    NaN anywhere gives inf."""
    if type(q).__module__.split(".")[0] == "torch":
        return _max_abs_error_torch(q, k, v, out)
    return max_abs_errors(q, k, v, [out])[0]


def max_abs_errors(q: np.ndarray, k: np.ndarray, v: np.ndarray, outs: Sequence[np.ndarray]) -> list[float]:
    """max_abs_error of several outputs of the same numpy inputs, the exact answer computed once."""
    q, k, v = (np.asarray(x) for x in (q, k, v))
    b, n, d = q.shape
    scale = d ** -0.5
    nb, rows = _blocks(b, k.shape[1])
    worst = [0.0] * len(outs)
    for b0 in range(0, b, nb):
        kb, vb = k[b0:b0 + nb].astype(np.float64), v[b0:b0 + nb].astype(np.float64)
        for i0 in range(0, n, rows):
            s = np.matmul(q[b0:b0 + nb, i0:i0 + rows].astype(np.float64), kb.swapaxes(1, 2)) * scale
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            exact = np.matmul(p, vb) / p.sum(axis=-1, keepdims=True)
            for j, out in enumerate(outs):
                diff = np.abs(np.asarray(out[b0:b0 + nb, i0:i0 + rows], dtype=np.float64) - exact)
                worst[j] = float("inf") if np.isnan(diff).any() else max(worst[j], float(diff.max(initial=0.0)))
    return worst


def _max_abs_error_torch(q: Any, k: Any, v: Any, out: Any) -> float:
    import torch

    b, n, d = q.shape
    nk = k.shape[1]
    scale = d ** -0.5
    nb, rows = _blocks(b, nk)
    worst = 0.0
    for b0 in range(0, b, nb):
        kb, vb = k[b0:b0 + nb].double(), v[b0:b0 + nb].double()
        for i0 in range(0, n, rows):
            s = torch.matmul(q[b0:b0 + nb, i0:i0 + rows].double(), kb.transpose(1, 2)) * scale
            exact = torch.matmul(torch.softmax(s, dim=-1), vb)
            diff = (out[b0:b0 + nb, i0:i0 + rows].double() - exact).abs()
            if bool(torch.isnan(diff).any()):
                return float("inf")
            worst = max(worst, float(diff.max()))
    return worst


def meets_hw4_rule(error: float) -> bool:
    """The HW4 rule on a max abs error (NaN and inf fail)."""
    return error <= hw4.MAX_ABS_ERROR
