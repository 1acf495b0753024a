"""The accuracy sample of a case: the float64 reference of a few (entry, query head) slices, the last
rows of each (the last rows keep the bottom-right causal alignment), and the same slices of a row's
output. Dense and KV-cache cases sample entries 0 and B-1 (heads 0 and H-1); a varlen batch also its
longest sequence. A slice holds at most REF_MAX_ROWS rows and REF_MAX_SCORES scores, so a 128k cache or a
16k sequence costs the reference a second, not the whole problem.

The reference is cutlassfa.reference's: attention_reference for dense cases, kvcache_reference on the
sampled entry's own pages (its block-table row renumbered 0..n-1, so the reference's page lookup is the
one checked, not the bench's gather), varlen_reference on the sampled sequence alone."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inputs import Case, to_numpy64
from .feeds import kind_of
from .rules import REF_MAX_ROWS, REF_MAX_SCORES


def _slices(case: Case) -> list[tuple[int, int]]:
    """(entry or sequence, query head) pairs sampled."""
    picked = {(0, 0), (case.B - 1, case.H - 1)}
    if kind_of(case) == "varlen":
        picked.add((int(np.argmax(case.variant.seqlens_q)), case.H // 2))
    return sorted(picked)


def _lengths(case: Case, b: int) -> tuple[int, int]:
    """(Nq, Nk) of entry or sequence b."""
    kind = kind_of(case)
    if kind == "varlen":
        return case.variant.seqlens_q[b], case.variant.seqlens_k[b]
    if kind in ("paged", "kvcache"):
        return case.Nq, case.variant.cache_seqlens[b]
    return case.Nq, case.Nk


def _ref_rows(nq: int, nk: int) -> int:
    return max(1, min(nq, REF_MAX_ROWS, REF_MAX_SCORES // max(nk, 1)))


def reference_sample(case: Case, q: Any, k: Any, v: Any, index: dict[str, np.ndarray] | None = None,
                     sinks: np.ndarray | None = None, alibi_slopes: np.ndarray | None = None,
                     kv_values: Any = None, q_values: Any = None) -> np.ndarray:
    """float64 reference of the sampled slices, concatenated. q, k, v: the case's own arrays (page pools
    for a paged case, packed arrays for a varlen batch); `index`: the host values of its index arrays;
    `sinks`, `alibi_slopes`: (H,) values of the score-term rows of a dense case, or None; `kv_values`,
    `q_values`: what the K and V slices, the q slices become first (the fp8 rows' runners.fp8_roundtrip),
    or None."""
    from cutlassfa import reference

    kv64 = to_numpy64 if kv_values is None else (lambda x: kv_values(to_numpy64(x)))  # K and V slices
    q64 = to_numpy64 if q_values is None else (lambda x: q_values(to_numpy64(x)))  # the q slices
    kind, group = kind_of(case), case.H // case.Hk
    parts = []
    for b, h in _slices(case):
        nq, nk = _lengths(case, b)
        rows, hk = _ref_rows(nq, nk), h // group
        if kind == "varlen":
            q0, k0 = int(index["cu_seqlens_q"][b]), int(index["cu_seqlens_k"][b])
            qs = q64(q[q0 + nq - rows:q0 + nq, h:h + 1])
            ks, vs = (kv64(x[k0:k0 + nk, hk:hk + 1]) for x in (k, v))
            out, _ = reference.varlen_reference(qs, ks, vs, [0, rows], [0, nk], causal=case.causal)
        elif kind in ("paged", "kvcache"):
            qs = q64(q[b, h, nq - rows:])[None, None]
            if kind == "paged":
                page_size = case.variant.page_size
                pages = index["block_table"][b, :-(-nk // page_size)]
                ks, vs = (kv64(x[pages.tolist(), hk:hk + 1]) for x in (k, v))  # (pages, 1, page_size, d)
                table = np.arange(len(pages), dtype=np.int32)[None]
            else:
                ks, vs = (kv64(x[b, hk:hk + 1, :nk])[None] for x in (k, v))
                table = None
            out, _ = reference.kvcache_reference(qs, ks, vs, cache_seqlens=np.array([nk], np.int32),
                                                 block_table=table, causal=case.causal)
        else:
            qs = q64(q[b, h, nq - rows:])[None, None]
            ks, vs = (kv64(x[b, hk])[None, None] for x in (k, v))
            out, _ = reference.attention_reference(qs, ks, vs, causal=case.causal, window=case.window,
                                                   softcap=case.softcap,
                                                   sinks=None if sinks is None else sinks[h:h + 1],
                                                   alibi_slopes=None if alibi_slopes is None else alibi_slopes[h:h + 1])
        parts.append(out.ravel())
    return np.concatenate(parts)


def output_sample(case: Case, out: Any, index: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """The sampled slices of a row's output: (B, H, Nq, d), or for a varlen batch either our packed
    (total_q, H, d) output (needs `index`) or the anchors' per-sequence (1, H, n, d) outputs."""
    parts = []
    for b, h in _slices(case):
        nq, nk = _lengths(case, b)
        rows = _ref_rows(nq, nk)
        if kind_of(case) != "varlen":
            part = out[b, h, nq - rows:]
        elif isinstance(out, (list, tuple)):
            part = out[b][0, h, nq - rows:]
        else:
            end = int(index["cu_seqlens_q"][b]) + nq
            part = out[end - rows:end, h]
        parts.append(to_numpy64(part).ravel())
    return np.concatenate(parts)
