"""What each row of a case is fed. Our rows and `read` take the case's own arrays: q, k, v (for a paged
case k and v are the page pools) and then the index arrays of its mode: cache_seqlens (and block_table)
for a KV-cache case, cu_seqlens_q and cu_seqlens_k for a varlen batch. The anchors take the dense
equivalent, built once outside the timing:

- paged: the pages gathered into a contiguous (B, Hkv, Nk, d) cache, entry by entry (the same keys and
  values the block table names, in key order);
- varlen: (1, H, n, d) views of each sequence of the packed arrays (FlashAttention's (B, N, H, d) layout,
  no copy), one SDPA call per sequence;
- otherwise q, k, v themselves.

Index arrays are int32 on the arrays' device (what a serving stack passes); their host values are kept
for the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._inputs import Case
from ..check.variant_inputs import index_to_framework
from .frames import Frame


@dataclass
class Feed:
    """One copy of a case's inputs. `own`: (q, k, v, *index arrays) as our rows call with; `dense`: the
    anchors' (q, k, v), None until built; `index`: the host values of the index arrays, by name."""

    own: tuple[Any, ...]
    dense: tuple[Any, ...] | None = None
    index: dict[str, np.ndarray] = field(default_factory=dict)


def kind_of(case: Case) -> str:
    """"paged", "kvcache" (contiguous cache), "varlen" or "dense"."""
    var = case.variant
    if var is None or var.kind == "dense":
        return "dense"
    if var.kind == "kvcache":
        return "paged" if var.page_size else "kvcache"
    return var.kind


def fed_as(case: Case, feed: str) -> str:
    """What a row fed `feed` ("own" or "dense") takes on this case, in words (the JSON's `fed`)."""
    kind = kind_of(case)
    if feed == "dense" and kind == "paged":
        return "the pages gathered into a contiguous (B, Hkv, Nk, d) cache"
    if feed == "dense" and kind == "varlen":
        return "one call per sequence on (1, H, n, d) views of the packed arrays"
    if kind == "paged":
        return "page pools (num_pages, Hkv, page_size, d), a shuffled block_table, cache_seqlens"
    if kind == "kvcache":
        return "a contiguous (B, Hkv, Nk, d) cache, cache_seqlens"
    if kind == "varlen":
        return "packed (total, H, d) arrays, cu_seqlens_q, cu_seqlens_k"
    return "dense q, k, v"


def pages_per_entry(case: Case) -> int:
    return -(-case.Nk // case.variant.page_size)


def own_shapes(case: Case) -> list[tuple[int, ...]]:
    """Shapes of q, k, v as our rows take them."""
    kind = kind_of(case)
    if kind == "paged":
        pool = (case.B * pages_per_entry(case), case.Hk, case.variant.page_size, case.d)
        return [(case.B, case.H, case.Nq, case.d), pool, pool]
    if kind == "varlen":
        total_q, total_k = sum(case.variant.seqlens_q), sum(case.variant.seqlens_k)
        return [(total_q, case.H, case.d), (total_k, case.Hk, case.d), (total_k, case.Hk, case.d)]
    return case.shapes()


def block_table(case: Case, seed: int) -> np.ndarray:
    """(B, pages an entry) int32: a random permutation of the pool's pages, so that no entry's pages are
    in order or next to each other (as in a serving cache after some traffic)."""
    per_entry = pages_per_entry(case)
    order = np.random.default_rng(seed).permutation(case.B * per_entry)
    return order.reshape(case.B, per_entry).astype(np.int32)


def index_arrays(case: Case, seed: int) -> dict[str, np.ndarray]:
    """Host values of the mode's index arrays, in the order our rows take them."""
    kind, var = kind_of(case), case.variant
    if kind in ("paged", "kvcache"):
        index = {"cache_seqlens": np.array(var.cache_seqlens, np.int32)}
        if kind == "paged":
            index["block_table"] = block_table(case, seed)
        return index
    if kind == "varlen":
        return {name: np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                for name, lengths in (("cu_seqlens_q", var.seqlens_q), ("cu_seqlens_k", var.seqlens_k))}
    return {}


def make_feed(case: Case, frame: Frame, seed: int) -> Feed:
    """Random q, k, v of the case's dtype (seeds seed * 1000 + 0, 1, 2 in every mode) and the index arrays
    on the frame's device."""
    arrays = tuple(frame.randn(s, case.dtype, seed * 1000 + i) for i, s in enumerate(own_shapes(case)))
    index = index_arrays(case, seed)
    return Feed(arrays + tuple(index_to_framework(x, frame.name) for x in index.values()), index=index)


def clone_feed(frame: Frame, feed: Feed) -> Feed:
    """A copy at other addresses (the L2 rotation): the arrays cloned, the dense equivalent rebuilt later."""
    return Feed(tuple(frame.clone(x) for x in feed.own), index=feed.index)


def with_dense(case: Case, frame: Frame, feed: Feed) -> Feed:
    """`feed` with its dense equivalent (see the module's docstring)."""
    q, k, v = feed.own[:3]
    kind = kind_of(case)
    if kind == "paged":
        table = feed.index["block_table"]
        feed.dense = (q, gather_pages(frame, k, table, case.Nk), gather_pages(frame, v, table, case.Nk))
    elif kind == "varlen":
        feed.dense = tuple(split_sequences(x, feed.index[name])
                           for x, name in ((q, "cu_seqlens_q"), (k, "cu_seqlens_k"), (v, "cu_seqlens_k")))
    else:
        feed.dense = (q, k, v)
    return feed


def gather_pages(frame: Frame, pool: Any, table: np.ndarray, nk: int) -> Any:
    """The contiguous (B, Hkv, nk, d) cache that `table` makes of `pool` (num_pages, Hkv, page_size, d):
    key p of entry b is row p % page_size of page table[b, p // page_size]. Entry by entry, so that the
    gather holds one entry's copy beside the result, not a second cache."""
    _, hk, page_size, d = pool.shape
    dense = frame.empty_like(pool, (table.shape[0], hk, nk, d))
    for b, pages in enumerate(table):
        rows = pool[pages.tolist()]  # (pages, Hkv, page_size, d); a list indexes numpy, torch and CuPy alike
        dense[b] = rows.swapaxes(0, 1).reshape(hk, len(pages) * page_size, d)[:, :nk]
    return dense


def split_sequences(packed: Any, cu_seqlens: np.ndarray) -> tuple[Any, ...]:
    """(1, H, n, d) views of the sequences of a packed (total, H, d) array."""
    return tuple(packed[int(a):int(b)].swapaxes(0, 1)[None] for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:]))


def host_feed(case: Case, frame: Frame, feed: Feed) -> Feed:
    """The feed as host numpy arrays (for rows that run on the CPU)."""
    floats = tuple(frame.to_host(x, case.dtype) for x in feed.own[:3])
    return Feed(floats + tuple(feed.index.values()), index=feed.index)


def working_set(case: Case, frame: Frame, feed: Feed, dense: bool) -> int:
    """Bytes one call's copy of the inputs spans: q, k, v and o, and a gathered dense cache when the
    anchors are fed one (varlen views and plain cases share our arrays)."""
    q, k, v = feed.own[:3]
    gathered = frame.nbytes(k) + frame.nbytes(v) if dense and kind_of(case) == "paged" else 0
    return 2 * frame.nbytes(q) + frame.nbytes(k) + frame.nbytes(v) + gathered
