"""The KV-cache and varlen options of a call as the numpy code reads them (the cpu backend,
cutlassfa.cpu, and the float64 reference): which keys an entry holds and where they live.

Nothing here validates. A call is validated once, by the extension (cpp/bindings/request.cpp), whatever
its entry: `cutlassfa.forward` and `varlen_forward`, the torch operator's fake path, JAX's trace time,
`supports`. The numpy code then reads the validated arguments, and any index values it is handed are
taken as the kernels take device values: a block_table entry outside [0, num_pages) is no page (its
keys are masked, masks.page_present).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["KVCacheArgs", "kvcache_layout", "VarlenArgs", "varlen_layout", "per_head", "dequantized", "softmax_scale"]


def softmax_scale(head_dim: int, given: float | None) -> float:
    """The scale of the scores: `given`, or 1/sqrt(head_dim) when None (the extension's default)."""
    return 1.0 / math.sqrt(head_dim) if given is None else float(given)


def per_head(value: Any, batch: int, heads: int, name: str, *, one_value: bool = False,
             dtype: Any = np.float32) -> np.ndarray | None:
    """A per-head float argument (ALiBi slopes, descales) as a read-only (batch, heads) array of `dtype`:
    (heads,) for every entry, (batch, heads) as it is, and with `one_value` a scalar for every entry and
    head. None stays None (nothing to apply costs nothing). Another shape is a ValueError naming it (the
    reference and the cpu backend may be called directly, without the extension's validation)."""
    if value is None:
        return None
    array = np.asarray(value).astype(dtype)
    shapes = (((),) if one_value else ()) + ((heads,), (batch, heads))
    if array.shape not in shapes:
        raise ValueError(f"{name} must have shape {' or '.join(map(str, shapes))}, got {array.shape}")
    return np.broadcast_to(array, (batch, heads))


def dequantized(x: Any, descale: Any, name: str, heads_kv: int, *, dtype: Any,
                entries: list[tuple[int, int]] | None = None) -> np.ndarray:
    """fp8 attention's operand `x` times its descale, as `dtype`: x (B, H, N, d), (B, N, d) (one head), or
    with `entries` (each entry's rows [start, stop)) a varlen (total, H, d). descale as per_head takes it
    with `one_value`, per K/V head: head h of H reads entry h // (H / heads_kv) (q's grouped heads, as
    FlashAttention-3's q_descale; H = heads_kv for k and v). None: 1."""
    values = np.asarray(x).astype(dtype)
    if descale is None:
        return values
    heads = 1 if values.ndim == 3 and entries is None else values.shape[1]
    batch = len(entries) if entries is not None else values.shape[0]
    scales = np.repeat(per_head(descale, batch, heads_kv, name, one_value=True).astype(dtype), heads // heads_kv,
                       axis=1)  # (batch, heads)
    if entries is not None:
        for b, (start, stop) in enumerate(entries):
            values[start:stop] *= scales[b][None, :, None]
        return values
    return values * (scales[:, :, None] if values.ndim == 3 else scales[:, :, None, None])


def _ints(value: Any) -> np.ndarray:
    return np.asarray(value).astype(np.int64)


@dataclass(frozen=True)
class KVCacheArgs:
    """The layout of a KV-cache call; index fields as host int64 arrays."""

    paged: bool
    capacity: int  # keys an entry can hold: Ncache, or max_pages * page_size
    page_size: int  # keys per page (paged); the cache length for a contiguous cache
    n_new: int  # keys appended per entry (k_new's length; 0 without k_new)
    cache_seqlens: np.ndarray  # (B,) keys in each entry before appending
    cache_leftpad: np.ndarray  # (B,) first valid key of each entry (zeros when not given)
    block_table: np.ndarray | None  # (B, max_pages) page of each entry's p-th block (paged)

    # Index values nobody checked (a device array is not read on the host; the numpy code may be called
    # directly) follow the kernels' rules (cpp/include/cutlassfa/rules.h, src/append_kv.cu): lengths are
    # clamped to what the cache holds, and appended rows that would land outside it are dropped.

    def keys(self, b: int) -> int:
        """Keys of entry b after appending: cache_seqlens[b] + n_new within [0, capacity]
        (rules::cache_entry_keys)."""
        return min(max(int(self.cache_seqlens[b]) + self.n_new, 0), self.capacity)

    def leftpad(self, b: int) -> int:
        """Hidden keys at the front of entry b, within [0, keys(b)] (rules::entry_leftpad)."""
        return min(max(int(self.cache_leftpad[b]), 0), self.keys(b))

    def appended(self, b: int) -> int:
        """How many of entry b's n_new rows are written: those at positions [cache_seqlens[b], capacity),
        none when cache_seqlens[b] < 0. They are the last of its keys(b) keys."""
        start = int(self.cache_seqlens[b])
        return 0 if start < 0 else max(min(self.n_new, self.capacity - start), 0)


def kvcache_layout(q: Any, k_cache: Any, v_cache: Any, *, cache_seqlens: Any = None, cache_leftpad: Any = None,
                   block_table: Any = None, k_new: Any = None) -> KVCacheArgs:
    """q (B, Hq, Nq, d) against caches (B, Hkv, Ncache, d), or with block_table (B, max_pages) paged
    caches (num_pages, Hkv, page_size, d). Entry b attends keys [cache_leftpad[b], cache_seqlens[b] +
    Nnew) (all Ncache when cache_seqlens is not given); k_new (B, Hkv, Nnew, d) goes at
    [cache_seqlens[b], cache_seqlens[b] + Nnew)."""
    b = q.shape[0]
    paged = block_table is not None
    page_size = int(k_cache.shape[2])
    table = _ints(block_table) if paged else None
    capacity = table.shape[1] * page_size if paged else page_size
    seqlens = np.full(b, capacity, np.int64) if cache_seqlens is None else _ints(cache_seqlens).reshape(b)
    leftpad = np.zeros(b, np.int64) if cache_leftpad is None else _ints(cache_leftpad).reshape(b)
    n_new = 0 if k_new is None else int(k_new.shape[2])
    return KVCacheArgs(paged, capacity, page_size, n_new, seqlens, leftpad, table)


@dataclass(frozen=True)
class VarlenArgs:
    """The layout of a varlen batch: B sequences; cu_seqlens host int64 (B+1,)."""

    batch: int
    cu_seqlens_q: np.ndarray
    cu_seqlens_k: np.ndarray
    max_seqlen_q: int | None
    max_seqlen_k: int | None

    def rows(self, b: int, total_q: int, total_k: int) -> tuple[int, int, int, int]:
        """Sequence b's rows [q0, q1) of q and [k0, k1) of k and v. Unchecked cu_seqlens (device values)
        follow the kernels' rule (rules::varlen_entry_begin / varlen_entry_rows): the first row within
        [0, total], the length within [0, max_seqlen] (the total when None) and within the array."""
        def clamp(cu: np.ndarray, longest: int | None, total: int) -> tuple[int, int]:
            first = min(max(int(cu[b]), 0), total)
            most = min(total if longest is None else int(longest), total - first)
            return first, first + min(max(int(cu[b + 1]) - first, 0), most)

        return (*clamp(self.cu_seqlens_q, self.max_seqlen_q, total_q),
                *clamp(self.cu_seqlens_k, self.max_seqlen_k, total_k))


def varlen_layout(cu_seqlens_q: Any, cu_seqlens_k: Any, *, max_seqlen_q: int | None = None,
                  max_seqlen_k: int | None = None) -> VarlenArgs:
    """Sequence b is rows [cu[b], cu[b+1]) of q (cu_seqlens_q) and of k and v (cu_seqlens_k)."""
    cu_q, cu_k = _ints(cu_seqlens_q).reshape(-1), _ints(cu_seqlens_k).reshape(-1)
    return VarlenArgs(len(cu_q) - 1, cu_q, cu_k, max_seqlen_q, max_seqlen_k)
