"""Exact float64 attention: the one reference every backend and test is measured against.

Conventions (shared with :func:`cutlassfa.forward`):

* shapes (B, H, N, d) or (B, N, d) (3-D means one head; results keep the input's rank);
* GQA: query head ``h`` reads key/value head ``h // (Hq // Hkv)``;
* causal is bottom-right aligned as in FlashAttention-2: query ``i`` sees key ``j`` iff
  ``j <= i + Nk - Nq``; a row that sees no key has output 0 and lse ``-inf`` (never NaN);
* lse is the natural log of the softmax denominator, ``log(sum_j exp(scale * q_i . k_j))``.

The score matrix is materialized in float64, but in chunks of query rows (and batches) so
that a long sequence never needs the whole Nq x Nk matrix at once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["attention_reference", "rel_l2", "naive_same_precision", "causal_mask"]

# Upper bound on the float64 score elements held at once (32 MiB); tests lower it to exercise
# the chunking.
_CHUNK_ELEMS = 1 << 22


def causal_mask(nq: int, nk: int, row_start: int = 0, row_stop: int | None = None) -> np.ndarray:
    """Boolean (rows, nk) mask, True where query row i may see key j (bottom-right aligned)."""
    row_stop = nq if row_stop is None else row_stop
    rows = np.arange(row_start, row_stop)[:, None]
    cols = np.arange(nk)[None, :]
    return cols <= rows + (nk - nq)


def _as_4d(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Check ranks/shapes and return 4-D views plus whether the input was 3-D."""
    if not (q.ndim == k.ndim == v.ndim) or q.ndim not in (3, 4):
        raise ValueError(f"q, k, v must all be 3-D or all 4-D, got {q.shape}, {k.shape}, {v.shape}")
    was_3d = q.ndim == 3
    if was_3d:
        q, k, v = q[:, None], k[:, None], v[:, None]
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    b, hq, _, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"q {q.shape} and k {k.shape} disagree on batch or head dim")
    hkv = k.shape[1]
    if hkv == 0 and hq != 0 or hkv and hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    return q, k, v, was_3d


def _default_scale(d: int, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)


def attention_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact attention in float64.

    Args:
        q: (B, Hq, Nq, d) or (B, Nq, d), any numpy float dtype (ml_dtypes.bfloat16 included).
        k, v: (B, Hkv, Nk, d) or (B, Nk, d); Hq must be a multiple of Hkv.
        causal: bottom-right aligned causal mask (FlashAttention-2 convention).
        softmax_scale: defaults to 1/sqrt(d).

    Returns:
        (out, lse): out float64 with q's shape; lse float64 (B, Hq, Nq) or (B, Nq) for 3-D input.
        Rows that see no key give out 0 and lse -inf. NaN in an input propagates to the rows that
        read it.
    """
    q4, k4, v4, was_3d = _as_4d(np.asarray(q), np.asarray(k), np.asarray(v))
    b, hq, nq, d = q4.shape
    hkv, nk = k4.shape[1], k4.shape[2]
    scale = _default_scale(d, softmax_scale)
    out = np.zeros((b, hq, nq, d), dtype=np.float64)
    lse = np.full((b, hq, nq), -np.inf, dtype=np.float64)
    if out.size == 0 or nk == 0 or hkv == 0:
        return (out[:, 0], lse[:, 0]) if was_3d else (out, lse)

    group = hq // hkv
    # Work unit: nb batches x all heads x `rows` query rows, bounded by _CHUNK_ELEMS scores.
    per_batch = hq * nq * nk
    if per_batch <= _CHUNK_ELEMS:
        nb, rows = max(1, _CHUNK_ELEMS // per_batch), nq
    else:
        nb, rows = 1, max(1, _CHUNK_ELEMS // (hq * nk))
    for b0 in range(0, b, nb):
        b1 = min(b, b0 + nb)
        # (nb, Hkv, 1, Nk, d): the singleton axis broadcasts over the query heads of a group.
        kb = k4[b0:b1].astype(np.float64)[:, :, None]
        vb = v4[b0:b1].astype(np.float64)[:, :, None]
        for i0 in range(0, nq, rows):
            i1 = min(nq, i0 + rows)
            qb = q4[b0:b1, :, i0:i1].astype(np.float64).reshape(b1 - b0, hkv, group, i1 - i0, d)
            o, l_ = _exact_block(qb, kb, vb, scale, causal_mask(nq, nk, i0, i1) if causal else None)
            out[b0:b1, :, i0:i1] = o.reshape(b1 - b0, hq, i1 - i0, d)
            lse[b0:b1, :, i0:i1] = l_.reshape(b1 - b0, hq, i1 - i0)
    return (out[:, 0], lse[:, 0]) if was_3d else (out, lse)


def _exact_block(
    qb: np.ndarray, kb: np.ndarray, vb: np.ndarray, scale: float, mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax attention of one chunk; qb (..., rows, d), kb/vb (..., Nk, d), mask (rows, Nk)."""
    s = np.matmul(qb, np.swapaxes(kb, -1, -2)) * scale  # (..., rows, Nk)
    visible = np.ones(s.shape[-2], dtype=bool) if mask is None else mask.any(axis=-1)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    # Fully masked rows have max -inf; shift by 0 instead so exp gives 0 rather than NaN.
    m = s.max(axis=-1, keepdims=True)
    m = np.where(visible[:, None], m, 0.0)
    # invalid='ignore': only reachable with inf/NaN inputs, whose NaN we want to propagate.
    with np.errstate(invalid="ignore"):
        p = np.exp(s - m)
        l_ = p.sum(axis=-1, keepdims=True)
        l_safe = np.where(visible[:, None], l_, 1.0)
        out = np.matmul(p, vb) / l_safe
        lse = np.where(visible[:, None], m + np.log(l_safe), -np.inf)[..., 0]
    return out, lse


def rel_l2(out: Any, ref: Any) -> float:
    """Relative L2 error ||out - ref|| / ||ref||, computed in float64.

    Positions where both are exactly equal (including equal infinities, e.g. the -inf lse of a
    fully masked row) contribute nothing. Any NaN, or any other non-finite mismatch, gives inf.
    When ||ref|| is 0 the absolute norm ||out - ref|| is returned.
    """
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    if o.shape != r.shape:
        raise ValueError(f"shape mismatch: {o.shape} vs {r.shape}")
    if np.isnan(o).any() or np.isnan(r).any():
        return math.inf
    same = o == r
    if not np.isfinite(o[~same]).all() or not np.isfinite(r[~same]).all():
        return math.inf
    err = float(np.linalg.norm(o[~same] - r[~same]))
    ref_norm = float(np.linalg.norm(r[np.isfinite(r)]))
    return err / ref_norm if ref_norm > 0 else err


def _rounder(dtype: Any):
    """Function rounding a float32 array to `dtype` and back (round-to-nearest-even)."""
    dt = np.dtype(dtype)
    return lambda x: np.asarray(x, dtype=np.float32).astype(dt).astype(np.float32)


def naive_same_precision(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    dtype: Any,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> np.ndarray:
    """Naive attention whose intermediates are rounded to `dtype`, returned as float64.

    Mirrors FlashAttention's test yardstick (a PyTorch computation in the input dtype): q is
    scaled and rounded, S = qK^T accumulates in float32 and is rounded to `dtype`, the softmax is
    evaluated in float32 and rounded, and O = PV accumulates in float32 and is rounded. The error of
    this against :func:`attention_reference` is what a same-precision implementation "costs";
    FlashAttention asserts its own error stays within 2x of it.
    """
    rnd = _rounder(dtype)
    q4, k4, v4, was_3d = _as_4d(np.asarray(q), np.asarray(k), np.asarray(v))
    b, hq, nq, d = q4.shape
    hkv, nk = k4.shape[1], k4.shape[2]
    scale = _default_scale(d, softmax_scale)
    out = np.zeros((b, hq, nq, d), dtype=np.float64)
    if out.size and nk and hkv:
        group = hq // hkv
        qs = rnd(rnd(q4) * np.float32(scale)).reshape(b, hkv, group, nq, d)
        kr, vr = rnd(k4)[:, :, None], rnd(v4)[:, :, None]
        s = rnd(np.matmul(qs, np.swapaxes(kr, -1, -2)))  # (B, Hkv, group, Nq, Nk)
        mask = causal_mask(nq, nk) if causal else np.ones((nq, nk), dtype=bool)
        visible = mask.any(axis=-1)[:, None]
        s = np.where(mask, s, -np.inf)
        m = np.where(visible, s.max(axis=-1, keepdims=True), 0.0)
        with np.errstate(invalid="ignore"):
            e = np.exp(s - m)
            p = rnd(e / np.where(visible, e.sum(axis=-1, keepdims=True), 1.0))
        out = rnd(np.matmul(p, vr)).astype(np.float64).reshape(b, hq, nq, d)
    return out[:, 0] if was_3d else out
