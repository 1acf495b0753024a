"""Exact float64 attention: the one reference every backend and test is measured against.

Conventions (shared with :func:`cutlassfa.forward`):

* shapes (B, H, N, d) or (B, N, d) (3-D means one head; results keep the input's rank);
* GQA: query head ``h`` reads key/value head ``h // (Hq // Hkv)``;
* which keys a query sees is :mod:`cutlassfa.masks`: bottom-right aligned (offset Nk - Nq), causal
  = window (-1, 0); a row that sees no key has output 0 and lse ``-inf`` (never NaN);
* scores are ``s = scale * q_i . k_j``, capped to ``softcap * tanh(s / softcap)`` when softcap > 0;
* lse is the natural log of the softmax denominator, ``log(sum_j exp(s_ij))`` of the capped scores;
* attention sinks (one logit per query head) add ``exp(sink_h)`` to that denominator and nothing to the
  numerator: a row that sees no key then has output 0 and lse ``sink_h``;
* ALiBi slopes (per query head, or per batch entry and query head) add ``-slope * |i + Nk - Nq - j|`` to
  the (capped) score of query i and key j (Nk: the entry's keys).

The score matrix is materialized in float64, but in chunks of query rows (and batches) so
that a long sequence never needs the whole Nq x Nk matrix at once.

The inference modes (KV caches, paged caches, appended keys, varlen batches) are expressed through the
dense reference: each sequence's keys are gathered into a contiguous float64 copy and attended densely.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import masks
from ._options import dequantized, kvcache_layout, per_head, varlen_layout
from .masks import Window, resolve_window

__all__ = ["attention_reference", "kvcache_reference", "varlen_reference", "rel_l2", "naive_same_precision",
           "causal_mask"]

# Upper bound on the float64 score elements held at once (32 MiB); tests lower it to exercise
# the chunking.
_CHUNK_ELEMS = 1 << 22


def causal_mask(nq: int, nk: int, row_start: int = 0, row_stop: int | None = None) -> np.ndarray:
    """Boolean (rows, nk) mask, True where query row i may see key j (bottom-right aligned)."""
    return masks.dense_mask(nq, nk, masks.CAUSAL, row_start=row_start, row_stop=row_stop)


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


def _softcap(softcap: Any) -> float:
    """The oracle's own guard: a cap below 0 (or not finite) means nothing it could compute."""
    value = float(softcap)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0 disables it), got {softcap}")
    return value


def _sinks(sinks: Any, heads: int) -> np.ndarray | None:
    """sinks as float64 (heads,), or None."""
    if sinks is None:
        return None
    value = np.asarray(sinks).astype(np.float64)
    if value.shape != (heads,):
        raise ValueError(f"sinks must have shape ({heads},), one per query head, got {value.shape}")
    return value


def _alibi(slopes: Any, batch: int, heads: int) -> np.ndarray | None:
    """ALiBi slopes as float64 (batch, heads), or None."""
    return per_head(slopes, batch, heads, "alibi_slopes", dtype=np.float64)


def _default_scale(d: int, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)


def attention_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: Window | tuple[int, int] | None = None,
    softcap: float = 0.0,
    sinks: Any = None,
    alibi_slopes: Any = None,
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact attention in float64.

    Args:
        q: (B, Hq, Nq, d) or (B, Nq, d), any numpy float dtype (ml_dtypes.bfloat16 included).
        k, v: (B, Hkv, Nk, d) or (B, Nk, d); Hq must be a multiple of Hkv.
        causal: bottom-right aligned causal mask (FlashAttention-2 convention), window (-1, 0).
        softmax_scale: defaults to 1/sqrt(d).
        window: (left, right) keys around each query's aligned position, -1 unbounded (masks.py).
        softcap: > 0 caps the scores to softcap * tanh(s / softcap); 0 disables.
        sinks: None or (Hq,) attention-sink logits: row i of head h has the denominator
            sum_j exp(s_ij) + exp(sinks[h]) (not capped, no value).
        alibi_slopes: None or (Hq,) / (B, Hq): the capped score of query i and key j gains
            -slope * |i + Nk - Nq - j|.
        q_descale, k_descale, v_descale: None (1), or dequantization scales (fp8 attention): a scalar,
            (Hkv,) or (B, Hkv); the inputs are q * q_descale (head h: its K/V head's entry), k * k_descale
            and v * v_descale in float64 (_options.dequantized).

    Returns:
        (out, lse): out float64 with q's shape; lse float64 (B, Hq, Nq) or (B, Nq) for 3-D input.
        Rows that see no key give out 0 and lse -inf. NaN in an input propagates to the rows that
        read it.
    """
    hkv = 1 if np.ndim(k) == 3 else np.shape(k)[1]
    q, k, v = (dequantized(x, descale, name, hkv, dtype=np.float64)
               for x, descale, name in ((q, q_descale, "q_descale"), (k, k_descale, "k_descale"),
                                        (v, v_descale, "v_descale")))
    q4, k4, v4, was_3d = _as_4d(q, k, v)
    out, lse = _dense(q4, k4, v4, _default_scale(q4.shape[3], softmax_scale), resolve_window(causal, window),
                      _softcap(softcap), sinks=_sinks(sinks, q4.shape[1]),
                      alibi=_alibi(alibi_slopes, q4.shape[0], q4.shape[1]))
    return (out[:, 0], lse[:, 0]) if was_3d else (out, lse)


def _dense(q4: np.ndarray, k4: np.ndarray, v4: np.ndarray, scale: float, window: Window,
           softcap: float, present: np.ndarray | None = None, sinks: np.ndarray | None = None,
           alibi: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact attention of 4-D q (B, Hq, Nq, d) against k, v (B, Hkv, Nk, d): (out, lse) float64.
    present: None, or (Nk,) bools, False for keys that count as masked for every row (missing pages).
    sinks: None, or (Hq,) float64 sink logits. alibi: None, or (B, Hq) float64 slopes."""
    b, hq, nq, d = q4.shape
    hkv, nk = k4.shape[1], k4.shape[2]
    out = np.zeros((b, hq, nq, d), dtype=np.float64)
    lse = np.full((b, hq, nq), -np.inf, dtype=np.float64)
    if sinks is not None and out.size:
        lse[...] = sinks[None, :, None]  # rows that see no key (all of them without keys)
    if out.size == 0 or nk == 0 or hkv == 0:
        return out, lse

    group = hq // hkv
    sink_block = None if sinks is None else sinks.reshape(1, hkv, group, 1, 1)
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
            mask = None if window.is_full else masks.dense_mask(nq, nk, window, row_start=i0, row_stop=i1)
            if present is not None and not present.all():
                keep = np.broadcast_to(present, (i1 - i0, nk))
                mask = keep if mask is None else mask & keep
            bias = None
            if alibi is not None:  # -slope * |i + Nk - Nq - j|
                bias = -alibi[b0:b1].reshape(b1 - b0, hkv, group, 1, 1) * masks.alibi_distances(nq, nk, i0, i1)
            o, l_ = _exact_block(qb, kb, vb, scale, softcap, mask, sink_block, bias)
            out[b0:b1, :, i0:i1] = o.reshape(b1 - b0, hq, i1 - i0, d)
            lse[b0:b1, :, i0:i1] = l_.reshape(b1 - b0, hq, i1 - i0)
    return out, lse


def _exact_block(
    qb: np.ndarray, kb: np.ndarray, vb: np.ndarray, scale: float, softcap: float, mask: np.ndarray | None,
    sink: np.ndarray | None = None, bias: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax attention of one chunk; qb (..., rows, d), kb/vb (..., Nk, d), mask (rows, Nk); sink: the
    rows' sink logits broadcast as (..., 1, 1), or None; bias: added to the capped scores (ALiBi), or None."""
    s = np.matmul(qb, np.swapaxes(kb, -1, -2)) * scale  # (..., rows, Nk)
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    visible = np.ones(s.shape[-2], dtype=bool) if mask is None else mask.any(axis=-1)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    # Rows with no visible key (and no sink) have max -inf; shift by 0 instead so exp gives 0, not NaN.
    m = np.where(visible[:, None], s.max(axis=-1, keepdims=True), -np.inf)
    counted = visible[:, None]
    if sink is not None:
        m = np.maximum(m, sink)  # the sink is one more term of the denominator
        counted = counted | (sink > -np.inf)
    m = np.where(counted, m, 0.0)
    # invalid='ignore': only reachable with inf/NaN inputs, whose NaN we want to propagate.
    with np.errstate(invalid="ignore"):
        p = np.exp(s - m)
        l_ = p.sum(axis=-1, keepdims=True)
        if sink is not None:
            l_ = l_ + np.exp(sink - m)
        l_safe = np.where(counted, l_, 1.0)
        out = np.matmul(p, vb) / l_safe
        lse = np.where(counted, m + np.log(l_safe), -np.inf)[..., 0]
    return out, lse


# ---- inference modes, through the dense reference -------------------------------------------------

def kvcache_reference(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    *,
    cache_seqlens: Any = None,
    cache_leftpad: Any = None,
    block_table: Any = None,
    k_new: np.ndarray | None = None,
    v_new: np.ndarray | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: Window | tuple[int, int] | None = None,
    softcap: float = 0.0,
    sinks: Any = None,
    alibi_slopes: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
    q_descale: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact attention of q against a KV cache, in float64. Never modifies k_cache / v_cache.

    Args:
        q: (B, Hq, Nq, d).
        k_cache, v_cache: (B, Hkv, Ncache, d), or with block_table paged (num_pages, Hkv, page_size, d):
            key position p of entry b is row p % page_size of page block_table[b, p // page_size].
        cache_seqlens: (B,) keys already in each entry (all Ncache when None).
        cache_leftpad: (B,) keys of entry b before it are ignored.
        block_table: (B, max_pages) int page indices (paged caches).
        k_new, v_new: (B, Hkv, Nnew, d) keys/values that follow the cache's, as if appended at
            cache_seqlens[b]; attended from a copy, the caches are left as they are.
        causal, softmax_scale, window, softcap, sinks, alibi_slopes: as :func:`attention_reference`; the
            alignment (and ALiBi's distance) is
            bottom-right against L_b = cache_seqlens[b] + Nnew: query i sees key j <= i + L_b - Nq.
        block_table values are taken as the kernels take a device table: keys (cached or new) behind
            an entry outside [0, num_pages) count as masked (masks.page_present); lengths as the kernels
            take device ones: L_b and the leftpad clamped to the capacity, new rows past it (or all of
            them for a negative cache_seqlens[b]) dropped (_options.KVCacheArgs).
        k_descale, v_descale: None (1), or float32 dequantization scales (FlashAttention-3's): a scalar,
            (Hkv,) or (B, Hkv). Entry b's keys and values of head h, cached and new, are
            k * k_descale[b, h] and v * v_descale[b, h] in float64 (e.g. float8_e4m3fn caches).
        q_descale: the same for q (fp8 attention), head h reading its K/V head's entry.

    Returns:
        (out float64 (B, Hq, Nq, d), lse float64 (B, Hq, Nq)).
    """
    q = dequantized(q, q_descale, "q_descale", k_cache.shape[1], dtype=np.float64) if q_descale is not None \
        else np.asarray(q)
    args = kvcache_layout(q, k_cache, v_cache, cache_seqlens=cache_seqlens, cache_leftpad=cache_leftpad,
                          block_table=block_table, k_new=k_new)
    win, cap = resolve_window(causal, window), _softcap(softcap)
    b, hq, nq, d = q.shape
    sink = _sinks(sinks, hq)
    slopes = _alibi(alibi_slopes, b, hq)
    scale = _default_scale(d, softmax_scale)
    k_scales = per_head(k_descale, b, k_cache.shape[1], "k_descale", one_value=True)
    v_scales = per_head(v_descale, b, k_cache.shape[1], "v_descale", one_value=True)
    out = np.zeros((b, hq, nq, d), dtype=np.float64)
    lse = np.full((b, hq, nq), -np.inf, dtype=np.float64)
    for i in range(b):
        # The entry's keys(i) keys: the cache's, then the appended ones that fit (unchecked lengths clamped).
        appended = args.appended(i)
        keys, values = (_cache_entry(c, i, args.keys(i) - appended, args) for c in (k_cache, v_cache))
        if appended:
            keys = np.concatenate([keys, np.asarray(k_new[i, :, :appended], dtype=np.float64)], axis=1)
            values = np.concatenate([values, np.asarray(v_new[i, :, :appended], dtype=np.float64)], axis=1)
        # Not in place: a float64 contiguous cache's entry is a view of the cache.
        if k_scales is not None:
            keys = keys * k_scales[i].astype(np.float64)[:, None, None]
        if v_scales is not None:
            values = values * v_scales[i].astype(np.float64)[:, None, None]
        # Leftpad hides the keys before it without moving the alignment (offset L_b - Nq): the same
        # as dropping them, which leaves (L_b - leftpad) - Nq counted from the first kept key.
        lp = args.leftpad(i)
        present = None
        if args.paged:
            positions = np.arange(keys.shape[1])
            present = masks.page_present(args.block_table[i, positions // args.page_size], k_cache.shape[0])[lp:]
        # (Dropping the leftpad keys moves the diagonal and every key alike: ALiBi's distances stay.)
        o, l_ = _dense(q[i : i + 1], keys[None, :, lp:], values[None, :, lp:], scale, win, cap, present, sink,
                       None if slopes is None else slopes[i : i + 1])
        out[i], lse[i] = o[0], l_[0]
    return out, lse


def _cache_entry(cache: np.ndarray, i: int, length: int, args: Any) -> np.ndarray:
    """Keys [0, length) of entry i as a float64 (Hkv, length, d) copy."""
    if not args.paged:
        return np.asarray(cache[i, :, :length], dtype=np.float64)
    positions = np.arange(length)
    pages = args.block_table[i, positions // args.page_size]
    present = masks.page_present(pages, cache.shape[0])  # a missing page's keys: zeros, masked by the caller
    rows = np.zeros((length, cache.shape[1], cache.shape[3]), dtype=np.float64)
    rows[present] = cache[pages[present], :, (positions % args.page_size)[present]]  # (L, Hkv, d)
    return rows.transpose(1, 0, 2)


def varlen_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: Window | tuple[int, int] | None = None,
    softcap: float = 0.0,
    sinks: Any = None,
    alibi_slopes: Any = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact attention of a batch of sequences of different lengths, packed, in float64.

    q (total_q, Hq, d), k and v (total_k, Hkv, d); sequence b is rows [cu_seqlens_q[b],
    cu_seqlens_q[b+1]) of q and [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k and v (prefix sums, int).
    The mask (causal, window) is aligned bottom-right within each sequence; empty sequences are allowed;
    softcap, sinks, alibi_slopes and the descales (one row per sequence) as :func:`attention_reference`. cu_seqlens
    values are taken as the kernels take device ones: each sequence's first row clamped to [0, total], its
    length to [0, max_seqlen] (the total when None) and to the array (_options.VarlenArgs.rows); rows no
    sequence covers are 0 with lse -inf.

    Returns:
        (out float64 (total_q, Hq, d), lse float64 (Hq, total_q)).
    """
    args = varlen_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    hkv = np.shape(k)[1]
    rows = [args.rows(i, np.shape(q)[0], np.shape(k)[0]) for i in range(args.batch)]
    q = dequantized(q, q_descale, "q_descale", hkv, dtype=np.float64, entries=[r[:2] for r in rows])
    k, v = (dequantized(x, descale, name, hkv, dtype=np.float64, entries=[r[2:] for r in rows])
            for x, descale, name in ((k, k_descale, "k_descale"), (v, v_descale, "v_descale")))
    win, cap = resolve_window(causal, window), _softcap(softcap)
    total_q, hq, d = q.shape
    sink = _sinks(sinks, hq)
    slopes = _alibi(alibi_slopes, args.batch, hq)
    scale = _default_scale(d, softmax_scale)
    out = np.zeros((total_q, hq, d), dtype=np.float64)
    lse = np.full((hq, total_q), -np.inf, dtype=np.float64)
    for i in range(args.batch):
        q0, q1, k0, k1 = args.rows(i, total_q, k.shape[0])
        # rows (n, H, d) -> (1, H, n, d)
        o, l_ = _dense(*(x[None].transpose(0, 2, 1, 3) for x in (q[q0:q1], k[k0:k1], v[k0:k1])), scale, win, cap,
                       sinks=sink, alibi=None if slopes is None else slopes[i : i + 1])
        out[q0:q1] = o[0].transpose(1, 0, 2)
        lse[:, q0:q1] = l_[0]
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
    window: Window | tuple[int, int] | None = None,
    softcap: float = 0.0,
    sinks: Any = None,
    alibi_slopes: Any = None,
    p_dtype: Any = None,
) -> np.ndarray:
    """Naive attention whose intermediates are rounded to `dtype`, returned as float64.

    Mirrors FlashAttention's test yardstick (a PyTorch computation in the input dtype): q is
    scaled and rounded, S = qK^T accumulates in float32 and is rounded to `dtype` (and rounded again
    after softcap * tanh(S / softcap) when softcap > 0), the softmax (with the sinks' terms in its
    denominator) is evaluated in float32 and rounded, and O = PV accumulates in float32 and is rounded. The error of
    this against :func:`attention_reference` is what a same-precision implementation "costs";
    FlashAttention asserts its own error stays within 2x of it.

    `p_dtype` (fp8 attention's yardstick: float8_e4m3fn): P V's operand is P = exp(S - max) rounded to
    p_dtype, as the fp8 kernels feed their second GEMM (FlashAttention-3, cuDNN), and the row's sum
    divides the product afterwards, in float32.
    """
    rnd = _rounder(dtype)
    q4, k4, v4, was_3d = _as_4d(np.asarray(q), np.asarray(k), np.asarray(v))
    b, hq, nq, d = q4.shape
    hkv, nk = k4.shape[1], k4.shape[2]
    scale = _default_scale(d, softmax_scale)
    win, cap = resolve_window(causal, window), _softcap(softcap)
    out = np.zeros((b, hq, nq, d), dtype=np.float64)
    if out.size and nk and hkv:
        group = hq // hkv
        qs = rnd(rnd(q4) * np.float32(scale)).reshape(b, hkv, group, nq, d)
        kr, vr = rnd(k4)[:, :, None], rnd(v4)[:, :, None]
        s = rnd(np.matmul(qs, np.swapaxes(kr, -1, -2)))  # (B, Hkv, group, Nq, Nk)
        if cap > 0:
            s = rnd(np.float32(cap) * np.tanh(s / np.float32(cap)))
        slopes = _alibi(alibi_slopes, b, hq)
        if slopes is not None:  # the ALiBi term in float32, the sum rounded
            distance = masks.alibi_distances(nq, nk).astype(np.float32)
            s = rnd(s - slopes.astype(np.float32).reshape(b, hkv, group, 1, 1) * distance)
        mask = masks.dense_mask(nq, nk, win)
        visible = mask.any(axis=-1)[:, None]
        s = np.where(mask, s, -np.inf)
        m = np.where(visible, s.max(axis=-1, keepdims=True), -np.inf)
        sink = _sinks(sinks, hq)
        counted = visible
        if sink is not None:
            sink = sink.astype(np.float32).reshape(1, hkv, group, 1, 1)
            m, counted = np.maximum(m, sink), visible | (sink > -np.inf)
        m = np.where(counted, m, 0.0)
        with np.errstate(invalid="ignore"):
            e = np.exp(s - m)
            total = e.sum(axis=-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - m))
            if p_dtype is None:
                p = rnd(e / np.where(counted, total, 1.0))
                o = np.matmul(p, vr)
            else:
                o = np.matmul(_rounder(p_dtype)(e), vr) / np.where(counted, total, 1.0)
        out = rnd(o).astype(np.float64).reshape(b, hq, nq, d)
    return out[:, 0] if was_3d else out
