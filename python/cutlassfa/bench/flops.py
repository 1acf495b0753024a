"""FLOP and byte counts: the work of attention is 4·d FLOP (two GEMMs of 2 FLOP per multiply-add) for
each query-key pair that the mask lets through. Counting the visible pairs exactly, rather than halving
for causal, keeps TFLOP/s honest for Nq != Nk (100 x 300 bottom-right causal is 0.835 of dense, not 0.5),
and the same count serves sliding windows and per-sequence lengths. Decode is bound by memory instead:
its rate is the bytes a call must move at least (q, k and v read once, o written once) per second.
A KV-cache case counts the keys each entry attends (cache_seqlens), a varlen batch each sequence's own
lengths; a paged cache moves the same bytes as a contiguous one."""

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
    """attention_flops of a bench case: its window, and the per-entry lengths of a KV-cache or varlen case."""
    return 4.0 * case.H * case.d * case_pairs(case)


def case_pairs(case) -> int:
    """Visible query-key pairs of one head of a case, summed over its batch."""
    window = case_window(case)
    return sum(count * visible_pairs(nq, nk, causal=case.causal, window=window)
               for (nq, nk), count in _lengths(case).items())


def case_scores(case) -> int:
    """Score elements a backend that materializes S holds for the whole case: H x sum of Nq x Nk."""
    return case.H * sum(count * nq * nk for (nq, nk), count in _lengths(case).items())


def _lengths(case) -> dict[tuple[int, int], int]:
    """{(Nq, Nk): how many entries have it}: B x (Nq, Nk) for a dense case, cache_seqlens for a KV-cache
    case, the sequences of a varlen batch."""
    variant = case.variant
    if variant is not None and variant.kind == "varlen":
        pairs = list(zip(variant.seqlens_q, variant.seqlens_k))
    elif variant is not None and variant.kind == "kvcache" and variant.cache_seqlens:
        pairs = [(case.Nq, n) for n in variant.cache_seqlens]
    else:
        return {(case.Nq, case.Nk): case.B}
    counts: dict[tuple[int, int], int] = {}
    for pair in pairs:
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def attention_bytes(B: int, H: int, Hk: int, Nq: int, Nk: int, d: int, itemsize: int) -> int:
    """Bytes one call must move at least: q and o (B, H, Nq, d), k and v (B, Hk, Nk, d), once each."""
    return itemsize * d * (2 * B * H * Nq + 2 * B * Hk * Nk)


def case_bytes(case) -> int:
    """attention_bytes of a bench case: q and o once, and the keys and values each entry attends once (a
    paged cache's pages hold the same bytes as a contiguous cache)."""
    itemsize = 4 if case.dtype == "float32" else 2
    lengths = _lengths(case).items()
    queries = sum(count * nq for (nq, _), count in lengths)
    keys = sum(count * nk for (_, nk), count in lengths)
    return itemsize * case.d * (2 * case.H * queries + 2 * case.Hk * keys)
