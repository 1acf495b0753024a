"""Validation of the attention-variant arguments: window, softcap, head dim, KV caches, varlen.

Every function is pure: it reads shapes, dtypes and host index values, returns the normalized
arguments, and raises ``ValueError`` / ``TypeError`` naming the offending argument; it writes nothing.
The API calls them for every backend before anything is computed or written.

Arrays are described by anything with ``.shape`` and ``.dtype`` (numpy arrays, or the API's
``ArrayInfo``, whose dtype is a name such as "float16" or "int32"). Index arguments (cache_seqlens,
cache_leftpad, block_table, cu_seqlens_*) are either host values (numpy arrays, Python sequences) or
descriptors of device arrays. Host values are checked in full. For device arrays only shape and dtype
are checked here: their values would need a device synchronization, so the kernels stay bounds-safe
instead (each function says how).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .masks import Window, resolve_window

__all__ = ["HEAD_DIM_MULTIPLE", "MAX_HEAD_DIM", "check_head_dim", "check_window", "check_softcap",
           "check_num_splits", "host_index_array", "KVCacheArgs", "check_kvcache", "VarlenArgs", "check_varlen"]

HEAD_DIM_MULTIPLE = 8
MAX_HEAD_DIM = 256
_INT32_MAX = 2**31 - 1


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_head_dim(d: int) -> int:
    """The head dim (last dim of q, k, v): a multiple of 8 from 8 to 256."""
    if not _is_int(d) or d < HEAD_DIM_MULTIPLE or d > MAX_HEAD_DIM or d % HEAD_DIM_MULTIPLE:
        raise ValueError(f"head dim (last dim of q, k, v) must be a multiple of {HEAD_DIM_MULTIPLE} from "
                         f"{HEAD_DIM_MULTIPLE} to {MAX_HEAD_DIM}, got {d}")
    return int(d)


def check_window(window: Any, causal: bool) -> Window:
    """window: None, a Window, or a pair (left, right) of ints >= -1 (-1: unbounded on that side).
    Returns the window that (causal, window) mean together (see :func:`masks.resolve_window`)."""
    if window is not None and not isinstance(window, Window):
        if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
            raise TypeError(f"window must be a pair (left, right) of ints or None, got {window!r}")
        left, right = window
        if not (_is_int(left) and _is_int(right)):
            raise TypeError(f"window must be a pair (left, right) of ints, got {window!r}")
        if left < -1 or right < -1 or max(left, right) > _INT32_MAX:
            raise ValueError(f"window sides must be -1 (unbounded) or in [0, 2^31), got {tuple(window)}")
        window = Window(int(left), int(right))
    return resolve_window(bool(causal), window)


def check_softcap(softcap: Any) -> float:
    """softcap: a finite float >= 0 (0 disables capping)."""
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.integer, np.floating)):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    value = float(softcap)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0 disables it), got {softcap}")
    return value


def check_num_splits(num_splits: Any) -> int | None:
    """num_splits: None (the backend chooses) or an int >= 1 (1: the keys in one pass)."""
    if num_splits is None:
        return None
    if not _is_int(num_splits):
        raise TypeError(f"num_splits must be an int or None, got {type(num_splits).__name__}")
    if num_splits < 1 or num_splits > _INT32_MAX:
        raise ValueError(f"num_splits must be an int >= 1 (or None: the backend chooses), got {num_splits}")
    return int(num_splits)


# --------------------------------------------------------------------------------------------------
# Index arrays
# --------------------------------------------------------------------------------------------------

def host_index_array(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Host values of an index argument as an int32 array of `shape`; None for a device array, whose
    dtype must then be int32 (its values are not read)."""
    if isinstance(value, (np.ndarray, list, tuple)) or isinstance(getattr(value, "array", None), np.ndarray):
        try:
            array = np.asarray(getattr(value, "array", value))
        except ValueError:  # a ragged nested sequence
            raise ValueError(f"{name} must be a rectangular array") from None
        if array.size and array.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
        if array.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
        if array.size and (array.min() < -_INT32_MAX - 1 or array.max() > _INT32_MAX):
            raise ValueError(f"{name} holds values outside the int32 range")
        return array.astype(np.int32)
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        raise TypeError(f"{name} must be an integer array, got {type(value).__name__}")
    if value.dtype != "int32":
        raise TypeError(f"{name} must be an int32 array, got dtype {value.dtype}")
    if tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(value.shape)}")
    return None


def _index_shape(value: Any, name: str) -> tuple[int, ...]:
    """Shape of an index argument: a host array-like or a device array descriptor."""
    if hasattr(value, "shape"):
        return tuple(int(n) for n in value.shape)
    try:
        return np.shape(value)
    except ValueError:  # a ragged nested sequence
        raise ValueError(f"{name} must be a rectangular array") from None


def _shape(array: Any, name: str, ndim: int, layout: str) -> tuple[int, ...]:
    shape = tuple(int(n) for n in array.shape)
    if len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {shape}")
    return shape


# --------------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KVCacheArgs:
    """Validated KV-cache arguments. Index fields hold host int32 values, or None where the argument is
    a device array (values unread)."""

    paged: bool
    capacity: int  # keys an entry can hold: Ncache, or max_pages * page_size
    page_size: int  # keys per page (paged); the cache length for a contiguous cache
    n_new: int  # keys appended per entry (k_new's length; 0 without k_new)
    cache_seqlens: np.ndarray | None  # (B,) keys in each entry before appending
    cache_leftpad: np.ndarray | None  # (B,) first valid key of each entry (zeros when not given)
    block_table: np.ndarray | None  # (B, max_pages) page of each entry's p-th block (paged)


def check_kvcache(q: Any, k_cache: Any, v_cache: Any, *, cache_seqlens: Any = None, cache_leftpad: Any = None,
                  block_table: Any = None, k_new: Any = None, v_new: Any = None,
                  check_pages: bool = True) -> KVCacheArgs:
    """Validate attention of q (B, Hq, Nq, d) against a KV cache.

    k_cache, v_cache: (B, Hkv, Ncache, d), or with block_table (B, max_pages) paged caches
    (num_pages, Hkv, page_size, d). cache_seqlens (B,): keys [0, L_b) of entry b are attended, L_b =
    cache_seqlens[b] + Nnew (all Ncache when not given; required with block_table or k_new).
    cache_leftpad (B,): keys before it are ignored (0 <= cache_leftpad[b] <= cache_seqlens[b]).
    k_new, v_new (B, Hkv, Nnew, d) of the cache's dtype: written at [cache_seqlens[b], L_b).

    Host index values are checked: L_b <= the cache length; leftpad in range; the block_table entries
    the attended and appended keys use (the first ceil(L_b / page_size) of row b; later ones are never
    read) within [0, num_pages). For device index arrays these checks would need a sync, so the
    kernels must stay bounds-safe on their own: clamp L_b to the cache length and leftpad to [0, L_b],
    and read nothing through a page index outside [0, num_pages) (its keys count as masked).
    check_pages=False takes host block_table values unchecked, as a device table's are (the cpu backend
    and the reference then give what the kernels give for them: see page_present).
    """
    b, hq, _, d = _shape(q, "q", 4, "(B, Hq, Nq, d)")
    paged = block_table is not None
    slots, hkv, per_slot = _cache_shape(k_cache, v_cache, b, hq, d, paged)
    table, capacity = None, per_slot
    if paged:
        table_shape = _index_shape(block_table, "block_table")
        if len(table_shape) != 2:
            raise ValueError(f"block_table must be 2-D (B, max_pages), got shape {table_shape}")
        table = host_index_array(block_table, "block_table", (b, table_shape[1]))
        capacity = table_shape[1] * per_slot
        if cache_seqlens is None:
            raise ValueError("cache_seqlens is required with block_table (a paged cache)")
    n_new = _new_keys(k_new, v_new, k_cache, b, hkv, d)
    if n_new is not None and cache_seqlens is None:
        raise ValueError("cache_seqlens is required with k_new (it says where the new keys go)")
    n_new = n_new or 0

    if cache_seqlens is None:
        seqlens = np.full(b, capacity, dtype=np.int32)
    else:
        seqlens = host_index_array(cache_seqlens, "cache_seqlens", (b,))
    if seqlens is not None and b:
        if seqlens.min() < 0:
            raise ValueError(f"cache_seqlens must be >= 0, got {seqlens.min()}")
        worst = int(np.argmax(seqlens))
        if int(seqlens[worst]) + n_new > capacity:
            raise ValueError(f"cache_seqlens[{worst}] = {seqlens[worst]}" + (f" + {n_new} new keys" if n_new else "")
                             + f" exceeds the cache length {capacity}")

    leftpad = np.zeros(b, np.int32) if cache_leftpad is None else host_index_array(cache_leftpad, "cache_leftpad", (b,))
    if leftpad is not None and b:
        limit = seqlens if seqlens is not None else np.full(b, capacity)
        bad = np.flatnonzero((leftpad < 0) | (leftpad > limit))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"cache_leftpad[{i}] = {leftpad[i]} is outside [0, cache_seqlens[{i}] = {limit[i]}]")

    if table is not None and seqlens is not None and check_pages:
        for i in range(b):
            used = table[i, : -(-(int(seqlens[i]) + n_new) // per_slot)]
            if used.size and (used.min() < 0 or used.max() >= slots):
                raise ValueError(f"block_table[{i}] holds page indices outside [0, {slots}) "
                                 f"(k_cache has {slots} pages)")
    return KVCacheArgs(paged, capacity, per_slot, n_new, seqlens, leftpad, table)


def _cache_shape(k_cache: Any, v_cache: Any, b: int, hq: int, d: int, paged: bool) -> tuple[int, int, int]:
    """(batch or pages, Hkv, Ncache or page_size) of the caches, checked against q."""
    layout = "(num_pages, Hkv, page_size, d)" if paged else "(B, Hkv, Ncache, d)"
    shape = _shape(k_cache, "k_cache", 4, layout)
    if tuple(v_cache.shape) != shape:
        raise ValueError(f"v_cache must have k_cache's shape {shape}, got {tuple(v_cache.shape)}")
    slots, hkv, per_slot, dk = shape
    if dk != d:
        raise ValueError(f"k_cache's head dim {dk} differs from q's {d}")
    if hkv == 0 and hq != 0 or hkv != 0 and hq % hkv:
        raise ValueError(f"the heads of q ({hq}) must be a multiple of the heads of k_cache ({hkv})")
    if not paged and slots != b:
        raise ValueError(f"k_cache must have q's batch size {b} (or pass block_table for a paged cache), got {slots}")
    if paged and per_slot < 1:
        raise ValueError(f"k_cache's page size (dim 2) must be >= 1, got {per_slot}")
    return slots, hkv, per_slot


def _new_keys(k_new: Any, v_new: Any, k_cache: Any, b: int, hkv: int, d: int) -> int | None:
    """Nnew, the length of k_new and v_new (B, Hkv, Nnew, d); None when they are not given."""
    if (k_new is None) != (v_new is None):
        raise ValueError(f"{'v_new' if v_new is None else 'k_new'} is missing: k_new and v_new go together")
    if k_new is None:
        return None
    n_new = _shape(k_new, "k_new", 4, "(B, Hkv, Nnew, d)")[2]
    if tuple(k_new.shape) != (b, hkv, n_new, d):
        raise ValueError(f"k_new must have shape (B, Hkv, Nnew, d) = {(b, hkv, n_new, d)}, got {tuple(k_new.shape)}")
    if tuple(v_new.shape) != tuple(k_new.shape):
        raise ValueError(f"v_new must have k_new's shape {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
    for array, name in ((k_new, "k_new"), (v_new, "v_new")):
        if array.dtype != k_cache.dtype:
            raise TypeError(f"{name} must have the cache's dtype {k_cache.dtype}, got {array.dtype}")
    return n_new


# --------------------------------------------------------------------------------------------------
# varlen
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VarlenArgs:
    """Validated varlen arguments: B sequences; cu_seqlens host int32 (B+1,) or None (device)."""

    batch: int
    cu_seqlens_q: np.ndarray | None
    cu_seqlens_k: np.ndarray | None
    max_seqlen_q: int | None
    max_seqlen_k: int | None


def check_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *, max_seqlen_q: Any = None,
                 max_seqlen_k: Any = None) -> VarlenArgs:
    """Validate a varlen batch: q (total_q, Hq, d), k and v (total_k, Hkv, d); cu_seqlens_q and
    cu_seqlens_k int32 (B+1,) prefix sums: 0 first, non-decreasing, ending at total_q / total_k
    (sequence b is rows [cu[b], cu[b+1]); empty sequences allowed). max_seqlen_q / max_seqlen_k:
    None or ints >= every sequence's length (they size the kernels' grids).

    For device cu_seqlens the values need a sync: only dtype and shape are checked, and the kernels
    clamp each sequence to [0, total) and to max_seqlen (rows beyond it are then not computed).
    """
    total_q, hq, d = _shape(q, "q", 3, "(total_q, Hq, d)")
    total_k, hkv, dk = _shape(k, "k", 3, "(total_k, Hkv, d)")
    if tuple(v.shape) != (total_k, hkv, dk):
        raise ValueError(f"v must have k's shape {(total_k, hkv, dk)}, got {tuple(v.shape)}")
    if dk != d:
        raise ValueError(f"k's head dim {dk} differs from q's {d}")
    if hkv == 0 and hq != 0 or hkv != 0 and hq % hkv:
        raise ValueError(f"the heads of q ({hq}) must be a multiple of the heads of k and v ({hkv})")
    lengths = {}
    for cu, name, total in ((cu_seqlens_q, "cu_seqlens_q", total_q), (cu_seqlens_k, "cu_seqlens_k", total_k)):
        shape = _index_shape(cu, name)
        if len(shape) != 1 or shape[0] < 1:
            raise ValueError(f"{name} must be 1-D (B+1,) with B >= 0, got shape {shape}")
        values = host_index_array(cu, name, shape)
        if values is not None:
            if values[0] != 0:
                raise ValueError(f"{name} must start at 0, got {values[0]}")
            if (np.diff(values) < 0).any():
                raise ValueError(f"{name} must be non-decreasing, got {values.tolist()}")
            if values[-1] != total:
                raise ValueError(f"{name} ends at {values[-1]} but the total length (dim 0) is {total}")
        lengths[name] = (shape[0], values)
    (nq_cu, cu_q), (nk_cu, cu_k) = lengths["cu_seqlens_q"], lengths["cu_seqlens_k"]
    if nq_cu != nk_cu:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length B+1, got {nq_cu} and {nk_cu}")
    maxima = []
    for value, name, cu in ((max_seqlen_q, "max_seqlen_q", cu_q), (max_seqlen_k, "max_seqlen_k", cu_k)):
        if value is not None:
            if not _is_int(value):
                raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
            longest = int(np.diff(cu).max()) if cu is not None and len(cu) > 1 else 0
            if value < 0 or value > _INT32_MAX or value < longest:
                raise ValueError(f"{name} = {value} must be >= the longest sequence ({longest}) and < 2^31")
            value = int(value)
        maxima.append(value)
    return VarlenArgs(nq_cu - 1, cu_q, cu_k, *maxima)
