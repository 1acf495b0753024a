"""Independent float64 attention for the tests of masks, windows, softcap, KV caches and varlen.

Shares no code with cutlassfa: the mask is the issue's formula written out, one sequence at a time,
KV caches are gathered position by position with Python loops, and the tolerances of a backend that
computes in float32 and rounds its output once are stated here.
"""

from __future__ import annotations

import math

import numpy as np

from cutlassfa.reference import rel_l2

# float32 accumulation over these small shapes: measured rel-L2 <= ~4e-7 (out) and ~1e-7 (lse).
FP32_TOL = 2e-6
LSE_TOL = 1e-6
# A half-precision output rounded once from float32 is off by at most one unit roundoff per element.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def visible(nq: int, nk: int, left: int = -1, right: int = -1, leftpad: int = 0) -> np.ndarray:
    """(nq, nk) bool: query i sees key j iff i + off - left <= j <= i + off + right, leftpad <= j < nk,
    off = nk - nq, -1 unbounded."""
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    off = nk - nq
    ok = j >= leftpad
    if left >= 0:
        ok = ok & (j >= i + off - left)
    if right >= 0:
        ok = ok & (j <= i + off + right)
    return np.broadcast_to(ok, (nq, nk))


def dense_attention(q, k, v, mask, scale=None, softcap=0.0):
    """One sequence: q (Hq, nq, d), k and v (Hkv, nk, d), mask (nq, nk). Returns float64
    out (Hq, nq, d) and lse (Hq, nq); a row that sees nothing gives 0 and -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    hq, nq, d = q.shape
    hkv = k.shape[0]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((hq, nq, d))
    lse = np.full((hq, nq), -np.inf)
    for h in range(hq):
        kv = h * hkv // hq
        s = scale * q[h] @ k[kv].T
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        for i in range(nq):
            cols = np.flatnonzero(mask[i])
            if cols.size == 0:
                continue
            top = s[i, cols].max()
            w = np.exp(s[i, cols] - top)
            out[h, i] = w @ v[kv, cols] / w.sum()
            lse[h, i] = top + math.log(w.sum())
    return out, lse


def gather_entry(cache, length, pages=None, page_size=None):
    """Keys [0, length) of one cache entry as (Hkv, length, d) float64: `cache` is (Hkv, N, d) for a
    contiguous entry, or the paged cache (num_pages, Hkv, page_size, d) read through `pages`."""
    rows = []
    for p in range(length):
        rows.append(cache[:, p] if pages is None else cache[pages[p // page_size], :, p % page_size])
    if not rows:
        shape = cache.shape
        return np.zeros((shape[0] if pages is None else shape[1], 0, shape[-1]))
    return np.stack(rows, axis=1).astype(np.float64)


def cache_after_append(cache, new, lengths, block_table=None, page_size=None):
    """A copy of `cache` as it must be once `new` (B, Hkv, Nnew, d) is appended at [L_b, L_b + Nnew) of each
    entry b (contiguous, or through block_table), position by position."""
    expect = cache.copy()
    if new is None:
        return expect
    for i, n in enumerate(lengths):
        for t in range(new.shape[2]):
            p = int(n) + t
            if block_table is None:
                expect[i, :, p] = new[i, :, t]
            else:
                expect[block_table[i, p // page_size], :, p % page_size] = new[i, :, t]
    return expect


def assert_matches(out, lse, want_out, want_lse, dtype_name="float32"):
    """A float32-accumulating backend against the float64 oracle: same rows with no key (-inf lse),
    out within one unit roundoff of the output dtype plus float32 noise, lse within LSE_TOL."""
    out = np.asarray(out).astype(np.float64)
    err = rel_l2(out, want_out)
    tol = UNIT_ROUNDOFF[dtype_name] + FP32_TOL
    assert err <= tol, f"out rel-L2 {err:.3e} > {tol:.3e}"
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    assert rel_l2(lse, want_lse) <= LSE_TOL, f"lse rel-L2 {rel_l2(lse, want_lse):.3e}"
