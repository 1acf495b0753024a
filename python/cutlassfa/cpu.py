"""The "cpu" backend: the kernels' blockwise online softmax, written with numpy.

Loop order: batch chunk (dense calls) or sequence (KV caches, varlen) -> block of ``block_m`` query
rows -> the key tiles of ``block_n`` keys that :func:`masks.tile_trips` says the block sees, left to
right as the CUDA-core kernels walk them (the tensor-core kernels walk right to left, masked tiles
first; the order changes only the rounding). Per row the loop keeps a running max ``m_i``, a running
sum ``l_i`` and an unnormalized accumulator ``acc``, and divides by ``l_i`` once at the end. Key
tiles outside the window are never loaded, so the cost grows as N x window; only the boundary tiles
are masked element by element. The query heads of a GQA group share K/V and are stacked as the rows
of one GEMM. Memory: the scores of one step (rows x block_n per head), never the N x N matrix.

Split keys (``num_splits`` > 1, Flash-Decoding): the key tiles are cut into that many contiguous
parts, each part runs the loop above on its own, and the parts' (out, lse) are merged by lse
(:func:`merge.merge_attention`), as the GPU kernels' combine step does.

Precision: float32 throughout, as in the GPU kernels, unless an intermediate could overflow float32
(a bound from the inputs' largest magnitudes, e.g. fp32 inputs near 1e19 whose products pass 3.4e38):
then the same loop runs in float64, so finite inputs never overflow. Only a softmax_scale (or
softmax_scale / softcap) so large that the scores overflow float64 is refused, with a ValueError.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from . import masks
from ._kv_sources import DenseKeys, PagedKeys, append_keys, max_abs
from ._options import kvcache_layout, per_head, softmax_scale as softmax_scale_of, varlen_layout
from .merge import merged_float32
from .masks import Window, resolve_window

__all__ = ["forward_cpu", "kvcache_forward_cpu", "varlen_forward_cpu"]

_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
# Scores held per (batch chunk x query block x key tile) step, in elements (16 MiB of float32).
_STEP_ELEMS = 1 << 22
# Largest magnitude any intermediate may reach in float32 (max 2^128) / float64 (max 2^1024).
_FLOAT32_LIMIT = 2.0**120
_FLOAT64_LIMIT = 2.0**1000


def forward_cpu(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool,
    softmax_scale: float | None,
    return_lse: bool,
    out: np.ndarray | None = None,
    window: Window | tuple[int, int] | None = None,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    num_splits: int | None = None,
    block_n: int = 128,
    block_m: int = 128,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Blockwise attention forward on the CPU.

    Args:
        q: (B, Hq, Nq, d); k, v: (B, Hkv, Nk, d); one dtype among float32, float16, bfloat16, any d
            (validated by the extension: `cutlassfa.forward(..., backend="cpu")`; any strides).
        causal: bottom-right aligned mask: query i sees key j iff j <= i + Nk - Nq (window (-1, 0)).
        softmax_scale: None means 1/sqrt(d).
        return_lse: also return the float32 (B, Hq, Nq) natural-log softmax denominator.
        out: optional (B, Hq, Nq, d) array of q's dtype to write into (any strides).
        window: (left, right) of :mod:`cutlassfa.masks`; combines with causal as (left, 0).
        softcap: > 0 caps the scores to softcap * tanh(s / softcap) before the softmax.
        sinks: None or (Hq,) float32 attention-sink logits: each row's softmax denominator gains
            e^sinks[h] (merged once, as a part with no value, after the key tiles and splits).
        alibi_slopes: None, or (Hq,) / (B, Hq) float32 ALiBi slopes: the score of query i and key j gains
            -slope * |i + Nk - Nq - j| after softcap.
        num_splits: None or 1: one pass over the keys; n > 1: the key tiles in n contiguous parts merged
            by lse (the result equals the unsplit one up to rounding; parts beyond the tile count are
            empty).
        block_n: keys per inner-loop step (the kernels' tile N). block_m: query rows per block.

    Returns:
        out, or (out, lse). Rows that see no key give 0 and lse -inf. NaN in an input
        propagates to the rows that read it, as on the GPU.
    """
    _check_blocks(block_m, block_n)
    win, cap, splits = resolve_window(causal, window), float(softcap), num_splits or 1
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    scale = softmax_scale_of(d, softmax_scale)
    if out is None:
        out = np.empty(q.shape, dtype=q.dtype)
    lse = np.full((b, hq, nq), -np.inf, dtype=np.float32)
    if out.size == 0:
        return (out, lse) if return_lse else out
    if nk == 0 or hkv == 0:
        out[...] = 0
        return (out, lse) if return_lse else out

    dtype = _compute_dtype(max_abs(q), max_abs(k), max_abs(v), d, nk, scale, cap)
    slopes = per_head(alibi_slopes, b, hq, "alibi_slopes")
    bm = min(block_m, nq)
    nb = max(1, min(_STEP_ELEMS // (hq * bm * min(block_n, nk)), b))
    with _quiet():
        for b0 in range(0, b, nb):
            b1 = min(b, b0 + nb)
            keys = DenseKeys(k[b0:b1], v[b0:b1])
            for i0, i1, o_blk, lse_blk in _row_blocks(q[b0:b1], keys, nq, nk, win, scale, cap, bm, block_n, dtype,
                                                      splits, sinks, _part(slopes, b0, b1)):
                out[b0:b1, :, i0:i1] = o_blk  # rounds to the input dtype
                lse[b0:b1, :, i0:i1] = lse_blk
    return (out, lse) if return_lse else out


def kvcache_forward_cpu(
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
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    num_splits: int | None = None,
    return_lse: bool = False,
    out: np.ndarray | None = None,
    k_descale: Any = None,
    v_descale: Any = None,
    block_n: int = 128,
    block_m: int = 128,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Attention of q against a KV cache on the CPU, as FlashAttention's flash_attn_with_kvcache.

    Args:
        q: (B, Hq, Nq, d).
        k_cache, v_cache: (B, Hkv, Ncache, d), or with block_table paged (num_pages, Hkv, page_size, d)
            (any strides): key position p of entry b is row p % page_size of page
            block_table[b, p // page_size].
        cache_seqlens: (B,) ints, keys already in each entry (all Ncache when None; needed with
            block_table and k_new). Not modified.
        cache_leftpad: (B,) ints, keys of entry b before it are ignored.
        block_table: (B, max_pages) int page indices.
        k_new, v_new: (B, Hkv, Nnew, d): written INTO k_cache / v_cache at positions
            [cache_seqlens[b], cache_seqlens[b] + Nnew) of entry b, then attended with the rest.
        causal, softmax_scale, window, softcap, sinks, alibi_slopes, num_splits, return_lse: as
            :func:`forward_cpu`, aligned
            bottom-right against L_b = cache_seqlens[b] + Nnew: query i sees key j <= i + L_b - Nq.
        out: optional (B, Hq, Nq, d) array of q's dtype to write into.
        k_descale, v_descale: None (1), or float32 dequantization scales of the caches and of k_new /
            v_new, as FlashAttention-3's: a scalar, (Hkv,) or (B, Hkv); the keys and values of entry b
            and head h are read as k * k_descale[b, h] and v * v_descale[b, h] (e.g. float8_e4m3fn
            caches with a float16 / bfloat16 q; the output keeps q's dtype). The caches store the
            quantized values, and appended keys are written as they come.

    The arguments are those the extension validated (`cutlassfa.forward(..., backend="cpu")` is the
    checked entry). block_table values are taken as the kernels take a device table: keys behind an
    entry outside [0, num_pages) count as masked (never read), appended keys there are dropped
    (masks.page_present); lengths are clamped as the kernels clamp device ones (_options.KVCacheArgs).
    Returns out (B, Hq, Nq, d), or (out, lse float32 (B, Hq, Nq)).
    """
    _check_blocks(block_m, block_n)
    args = kvcache_layout(q, k_cache, v_cache, cache_seqlens=cache_seqlens, cache_leftpad=cache_leftpad,
                          block_table=block_table, k_new=k_new)
    win, cap, splits = resolve_window(causal, window), float(softcap), num_splits or 1
    b, hq, nq, d = q.shape
    out = _output(out, q.shape, q.dtype)
    lse = np.full((b, hq, nq), -np.inf, dtype=np.float32)
    scale = softmax_scale_of(d, softmax_scale)
    slopes = per_head(alibi_slopes, b, hq, "alibi_slopes")
    hkv = k_cache.shape[1]
    k_scales = per_head(k_descale, b, hkv, "k_descale", one_value=True)
    v_scales = per_head(v_descale, b, hkv, "v_descale", one_value=True)
    entries = []
    for i in range(b):
        length, leftpad = args.keys(i), args.leftpad(i)
        k_scale, v_scale = _part(k_scales, i, i + 1), _part(v_scales, i, i + 1)  # (1, Hkv) or None
        # Leftpad hides the keys before it without moving the alignment (offset L_b - Nq): the
        # same as starting the keys there, L_b - leftpad of them, as FlashAttention does.
        if args.paged:
            keys = PagedKeys(k_cache, v_cache, args.block_table[i], args.page_size, leftpad, length,
                             k_scale=k_scale, v_scale=v_scale)
        else:
            keys = DenseKeys(k_cache[i : i + 1, :, leftpad:length], v_cache[i : i + 1, :, leftpad:length],
                             k_scale=k_scale, v_scale=v_scale)
        # Picked before appending, so that a refusal (a scale overflowing float64) writes nothing: from
        # the keys already in the cache and the new ones (descaled as the cache's).
        appended = args.appended(i)
        k_max, v_max = keys.max_abs(max(length - appended - leftpad, 0))
        if appended:
            k_max = max(k_max, max_abs(k_new[i : i + 1, :, :appended], k_scale))
            v_max = max(v_max, max_abs(v_new[i : i + 1, :, :appended], v_scale))
        dtype = _compute_dtype(max_abs(q[i]), k_max, v_max, d, length - leftpad, scale, cap)
        entries.append((keys, length - leftpad, leftpad, dtype))
    if k_new is not None:
        append_keys(k_cache, k_new, args)
        append_keys(v_cache, v_new, args)
    with _quiet():
        for i, (keys, nk, leftpad, dtype) in enumerate(entries):
            # ALiBi counts distances from the entry's own diagonal: with leftpad keys dropped from the
            # front, key j of the kept ones is key leftpad + j, and the diagonal of the same length stays.
            _attend_into(q[i : i + 1], keys, nk, win, scale, cap, block_m, block_n, dtype, out[i : i + 1],
                         lse[i : i + 1], splits, sinks, _part(slopes, i, i + 1))
    return (out, lse) if return_lse else out


def varlen_forward_cpu(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: Window | tuple[int, int] | None = None,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    return_lse: bool = False,
    out: np.ndarray | None = None,
    block_n: int = 128,
    block_m: int = 128,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Attention of a packed batch of sequences of different lengths on the CPU.

    q (total_q, Hq, d), k and v (total_k, Hkv, d), any strides; cu_seqlens_q / cu_seqlens_k (B+1,)
    prefix sums: sequence b is rows [cu[b], cu[b+1]). Masks are aligned bottom-right within each
    sequence; empty sequences are allowed; softcap, sinks and alibi_slopes (a row per sequence) as
    :func:`forward_cpu`. max_seqlen_q / max_seqlen_k size the GPU grids; here they bound unchecked
    lengths as the kernels bound device ones (_options.VarlenArgs.rows). The arguments are those the
    extension validated (`cutlassfa.varlen_forward(..., backend="cpu")` is the checked entry).
    Returns out (total_q, Hq, d), or (out, lse float32 (Hq, total_q)).
    """
    _check_blocks(block_m, block_n)
    args = varlen_layout(cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    win, cap = resolve_window(causal, window), float(softcap)
    total_q, hq, d = q.shape
    out = _output(out, q.shape, q.dtype)
    lse = np.full((hq, total_q), -np.inf, dtype=np.float32)
    scale = softmax_scale_of(d, softmax_scale)
    slopes = per_head(alibi_slopes, args.batch, hq, "alibi_slopes")
    sequences = [args.rows(i, total_q, k.shape[0]) for i in range(args.batch)]
    # One dtype for the batch, picked before anything is written (as the dense call does).
    dtype = _compute_dtype(max_abs(q), max_abs(k), max_abs(v), d, max((k1 - k0 for *_, k0, k1 in sequences),
                                                                    default=0), scale, cap)
    with _quiet():
        for i, (q0, q1, k0, k1) in enumerate(sequences):
            keys = DenseKeys(_rows_as_4d(k[k0:k1]), _rows_as_4d(v[k0:k1]))
            _attend_into(_rows_as_4d(q[q0:q1]), keys, k1 - k0, win, scale, cap, block_m, block_n, dtype,
                         _rows_as_4d(out[q0:q1]), lse[None, :, q0:q1], 1, sinks, _part(slopes, i, i + 1))
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------------
# The online softmax
# --------------------------------------------------------------------------------------------------

def _attend_into(q4: np.ndarray, keys: Any, nk: int, window: Window, scale: float, softcap: float,
                 block_m: int, block_n: int, dtype: np.dtype, out4: np.ndarray, lse3: np.ndarray,
                 splits: int = 1, sinks: np.ndarray | None = None, slopes: np.ndarray | None = None) -> None:
    """Attention of one sequence (q4 (1, Hq, Nq, d)) against nk keys, written into out4 / lse3."""
    nq = q4.shape[2]
    if out4.size == 0:
        return
    for i0, i1, o_blk, lse_blk in _row_blocks(q4, keys, nq, nk, window, scale, softcap, min(block_m, nq),
                                              block_n, dtype, splits, sinks, slopes):
        out4[:, :, i0:i1] = o_blk
        lse3[:, :, i0:i1] = lse_blk


def _row_blocks(q4: np.ndarray, keys: Any, nq: int, nk: int, window: Window, scale: float, softcap: float,
                block_m: int, block_n: int, dtype: np.dtype, splits: int = 1, sinks: np.ndarray | None = None,
                slopes: np.ndarray | None = None) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """(i0, i1, out, lse) of each block of query rows [i0, i1); with splits > 1, the merge of the
    blocks' results over `splits` contiguous parts of the key tiles; with sinks, the sinks merged in
    once."""
    tiles = -(-nk // block_n)
    parts = [(s * tiles // splits, (s + 1) * tiles // splits) for s in range(splits)]
    for i0 in range(0, nq, block_m):
        i1 = min(nq, i0 + block_m)
        args = (q4[:, :, i0:i1], keys, i0, nq, nk, window, scale, softcap, block_n, dtype, slopes)
        if splits == 1 and sinks is None:
            yield (i0, i1, *_query_block(*args))
        else:
            blocks = [_query_block(*args, tiles=part) for part in parts] if splits > 1 else [_query_block(*args)]
            yield (i0, i1, *_merge_parts(blocks, sinks))


def _merge_parts(parts: list[tuple[np.ndarray, np.ndarray]],
                 sinks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The combine step of split keys: the parts' (out, lse) merged by lse, the sinks (Hq,) once
    (merge.py). The merge works in float32, so the lse are shifted by their row max first: a float64
    block (scores beyond float32's range) then merges without overflow, and the shift is added back in
    the block's dtype."""
    outs, lses = zip(*parts)
    row_max = np.maximum.reduce(lses)
    sink_lse = None if sinks is None else sinks.astype(row_max.dtype)[None, :, None]
    if sink_lse is not None:
        row_max = np.maximum(row_max, sink_lse)
    shift = np.where(row_max == -np.inf, 0, row_max)
    out, lse = merged_float32(outs, [x - shift for x in lses], None if sink_lse is None else sink_lse - shift)
    return out, lse.astype(shift.dtype) + shift


def _query_block(q_blk: np.ndarray, keys: Any, i0: int, nq: int, nk: int, window: Window, scale: float,
                 softcap: float, block_n: int, dtype: np.dtype, slopes: np.ndarray | None = None,
                 tiles: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Online softmax of one block of query rows against the key tiles it sees.

    q_blk (nb, Hq, rows, d) in the input dtype; rows [i0, i0 + rows) of nq; keys of nk. `tiles`: only
    the key tiles [first, last) (one part of split keys); a row that sees no key there gives 0 and lse
    -inf for that part.
    Returns out (nb, Hq, rows, d) and lse (nb, Hq, rows), of `dtype`.
    """
    nb, hq, rows, d = q_blk.shape
    hkv = keys.heads
    group = hq // hkv
    # The query heads of one GQA group share K/V, so stack them as rows of one bigger GEMM.
    tQ = q_blk.astype(dtype).reshape(nb, hkv, group * rows, d)  # (nb, Hkv, group*rows, d)
    m_i = np.full((nb, hkv, group * rows), -np.inf, dtype=dtype)  # running max (log2 units)
    l_i = np.zeros((nb, hkv, group * rows), dtype=dtype)  # running sum of exp2(s - m_i)
    acc = np.zeros((nb, hkv, group * rows, d), dtype=dtype)  # unnormalized output

    trips = masks.tile_trips(i0, i0 + rows, nq, nk, window, block_n)
    lo, hi = masks.row_ranges(np.arange(i0, i0 + rows), nq, nk, window)  # keys [lo, hi) of each row
    first, last = trips.first, trips.last
    some_absent = False
    if tiles is not None:  # the part's keys are whole tiles, so the tiles' masked flags stay right
        first, last = max(first, tiles[0]), min(last, tiles[1])
        j_lo, j_hi = tiles[0] * block_n, min(nk, tiles[1] * block_n)
        lo, hi = np.clip(lo, j_lo, j_hi), np.clip(hi, j_lo, j_hi)
    for n in range(first, last):
        j0, j1 = n * block_n, min(nk, (n + 1) * block_n)
        tK, tV = keys.tile(j0, j1, dtype)  # (nb, Hkv, j1 - j0, d)
        tS = _log2_scores(tQ, tK, scale, softcap)  # (nb, Hkv, group*rows, j1 - j0)
        if slopes is not None:  # ALiBi, after softcap, in log2 units
            tS -= _alibi_log2(slopes, i0, rows, nq, nk, j0, j1, dtype).reshape(tS.shape)
        if trips.is_masked(n):  # boundary tiles only (window edges, diagonal, ragged end)
            _mask_tile(tS, lo - j0, hi - j0, group)
        absent = keys.absent(j0, j1)  # keys on a missing page count as masked (masks.page_present)
        if absent is not None:
            tS[..., absent] = -np.inf
            some_absent = True
        m_new = np.maximum(m_i, tS.max(axis=-1))
        # A row that has seen only masked keys keeps max -inf; shift by 0 so exp2 gives 0, not NaN.
        m_safe = np.where(m_new == -np.inf, dtype.type(0), m_new)
        alpha = np.exp2(m_i - m_safe)  # rescales what was accumulated under the old max
        tP = np.exp2(tS - m_safe[..., None])  # (nb, Hkv, group*rows, j1 - j0)
        l_i = l_i * alpha + tP.sum(axis=-1)
        acc *= alpha[..., None]
        acc += np.matmul(tP, tV)
        m_i = m_new

    # Rows that see no key are decided by position, not by l_i, so a NaN input still shows up as NaN
    # in the rows that read it.
    row_sees_key = np.tile(hi > lo, group)
    if some_absent:  # a row whose keys were all on missing pages saw none (a NaN max is no -inf)
        row_sees_key = row_sees_key & ~(m_i == -np.inf)
    l_safe = np.where(row_sees_key, l_i, dtype.type(1))
    o = np.where(row_sees_key[..., None], acc / l_safe[..., None], dtype.type(0))
    lse = np.where(row_sees_key, (m_i + np.log2(l_safe)) * dtype.type(_LN2), dtype.type(-np.inf))
    return o.reshape(nb, hq, rows, d), lse.reshape(nb, hq, rows)


def _part(per_entry: np.ndarray | None, b0: int, b1: int) -> np.ndarray | None:
    """Rows [b0, b1) of a (batch, heads) per-head argument, or None."""
    return None if per_entry is None else per_entry[b0:b1]


def _alibi_log2(slopes: np.ndarray, i0: int, rows: int, nq: int, nk: int, j0: int, j1: int,
                dtype: np.dtype) -> np.ndarray:
    """(nb, Hq, rows, j1 - j0): slope * log2(e) * |i + nk - nq - j| for rows i0.. and keys j0..j1 (masks.py's
    diagonal), the ALiBi term in the loop's log2 units; reshaped by the caller to the GQA-stacked rows."""
    distance = masks.alibi_distances(nq, nk, i0, i0 + rows, j0, j1)
    return (slopes.astype(dtype) * dtype.type(_LOG2E))[:, :, None, None] * distance.astype(dtype)[None, None]


def _log2_scores(tQ: np.ndarray, tK: np.ndarray, scale: float, softcap: float) -> np.ndarray:
    """Scores in log2 units: log2(e) is folded into the scale once so each softmax step is one exp2.
    With softcap c: c * log2(e) * tanh(scale * q.k / c), FlashAttention's order of operations."""
    dt = tQ.dtype.type
    tS = np.matmul(tQ, np.swapaxes(tK, -1, -2))
    if softcap > 0:
        tS *= dt(scale / softcap)
        np.tanh(tS, out=tS)
        tS *= dt(softcap * _LOG2E)
    else:
        tS *= dt(scale * _LOG2E)
    return tS


def _mask_tile(tS: np.ndarray, lo: np.ndarray, hi: np.ndarray, group: int) -> None:
    """Set the scores of keys outside each row's [lo, hi) (tile-relative) to -inf, in place."""
    nb, hkv, gr, n = tS.shape
    cols = np.arange(n)[None, :]
    hidden = (cols < lo[:, None]) | (cols >= hi[:, None])  # (rows, n)
    np.copyto(tS.reshape(nb, hkv, group, gr // group, n), -np.inf, where=hidden)


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------

def _compute_dtype(q_max: float, k_max: float, v_max: float, d: int, nk: int, scale: float,
                   softcap: float) -> np.dtype:
    """float32 when no intermediate of the loop can pass _FLOAT32_LIMIT, else float64.

    Bounds: every partial sum of q.k is at most d * max|q| * max|k|; the log2 scores add the scale
    (or, capped, at most softcap * log2(e)); acc is at most Nk * max|v| since each weight is <= 1.
    Non-finite inputs (NaN compares false) take float64 too and propagate as NaN there.
    """
    raw = d * q_max * k_max
    if softcap > 0:
        fits32 = raw <= _FLOAT32_LIMIT and scale / softcap <= _FLOAT32_LIMIT and softcap * _LOG2E <= _FLOAT32_LIMIT
    else:
        fits32 = raw * abs(scale) * _LOG2E <= _FLOAT32_LIMIT
    if fits32 and nk * v_max <= _FLOAT32_LIMIT:
        return np.dtype(np.float32)
    if math.isfinite(raw):
        if softcap > 0 and not (scale / softcap <= _FLOAT64_LIMIT and softcap <= _FLOAT64_LIMIT):
            raise ValueError(f"softmax_scale / softcap = {scale / softcap:g} overflows float64")
        if softcap == 0 and not raw * abs(scale) <= _FLOAT64_LIMIT:
            raise ValueError(f"the scores overflow float64: |softmax_scale| * d * max|q| * max|k| = "
                             f"{raw * abs(scale):g}; use a smaller softmax_scale")
    return np.dtype(np.float64)


def _rows_as_4d(x: np.ndarray) -> np.ndarray:
    """(n, H, d) rows of one varlen sequence seen as (1, H, n, d), without a copy."""
    return x.transpose(1, 0, 2)[None]


def _check_blocks(block_m: int, block_n: int) -> None:
    if block_n < 1 or block_m < 1:
        raise ValueError(f"block sizes must be >= 1, got block_m={block_m}, block_n={block_n}")


def _output(out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The array results go to: `out` after checking it, or a new one. Every row gets written."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    if out.shape != shape or out.dtype != dtype:
        raise ValueError(f"out must have shape {shape} and dtype {dtype}, got {out.shape} {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    return out


def _quiet() -> Any:
    """inf/NaN inputs make invalid operations whose NaN propagating to the rows that read them is the
    intended result; a capped score's tanh argument may overflow to inf (tanh saturates, as it
    should); rounding tiny outputs to float16/bfloat16 underflows; lse beyond float32's range is
    stored as inf."""
    return np.errstate(invalid="ignore", over="ignore", under="ignore")
