"""FLOP and byte counts: the work of attention is 4·d FLOP (two GEMMs of 2 FLOP per multiply-add) for
each query-key pair that the mask lets through. Counting the visible pairs exactly, rather than halving
for causal, keeps TFLOP/s honest for Nq != Nk (100 x 300 bottom-right causal is 0.835 of dense, not 0.5),
and the same count serves sliding windows and per-sequence lengths. Decode is bound by memory instead:
its rate is the bytes a call must move at least (q, k and v read once, o written once) per second."""

from __future__ import annotations

from typing import Iterable

import numpy as np


Window = tuple[int | None, int | None]  # (left, right) keys around the diagonal; None: unbounded


def visible_pairs(nq: int, nk: int, *, causal: bool = False, window: Window | None = None) -> int:
    """Query-key pairs (i, j) that are seen, with bottom-right alignment: query i sits at key position
    i + Nk - Nq. `causal`: j <= that position. `window=(left, right)`: j within [pos - left, pos + right]
    (None for unbounded on that side). Exact, in O(Nq)."""
    if nq <= 0 or nk <= 0:
        return 0
    position = np.arange(nq, dtype=np.int64) + (nk - nq)
    lo = np.zeros(nq, dtype=np.int64)
    hi = np.full(nq, nk - 1, dtype=np.int64)
    if causal:
        hi = np.minimum(hi, position)
    if window is not None:
        left, right = window
        if left is not None:
            lo = np.maximum(lo, position - left)
        if right is not None:
            hi = np.minimum(hi, position + right)
    return int(np.maximum(hi - lo + 1, 0).sum())


def attention_flops(B: int, H: int, Nq: int, Nk: int, d: int, causal: bool, window: Window | None = None) -> float:
    """4 * B * H * d * (visible query-key pairs): two GEMMs of 2 FLOP per multiply-add."""
    return 4.0 * B * H * d * visible_pairs(Nq, Nk, causal=causal, window=window)


def varlen_flops(H: int, d: int, lengths: Iterable[tuple[int, int]], causal: bool,
                 window: Window | None = None) -> float:
    """The same for a batch of sequences of their own (Nq, Nk) lengths."""
    return 4.0 * H * d * sum(visible_pairs(nq, nk, causal=causal, window=window) for nq, nk in lengths)


def case_window(case) -> Window | None:
    """A case's window in this module's convention (None for an unbounded side), or None."""
    window = case.window
    if window is None:
        return None
    return (None if window[0] < 0 else window[0], None if window[1] < 0 else window[1])


def case_flops(case) -> float:
    """attention_flops of a bench case (its window included)."""
    return attention_flops(case.B, case.H, case.Nq, case.Nk, case.d, case.causal, case_window(case))


def attention_bytes(B: int, H: int, Hk: int, Nq: int, Nk: int, d: int, itemsize: int) -> int:
    """Bytes one call must move at least: q and o (B, H, Nq, d), k and v (B, Hk, Nk, d), once each."""
    return itemsize * d * (2 * B * H * Nq + 2 * B * Hk * Nk)
