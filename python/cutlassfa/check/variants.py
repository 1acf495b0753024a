"""The gate's variant cases: sliding windows, softcap, attention sinks, ALiBi, zero-padded head dims, KV
caches, varlen and fp8 attention.

Each SPEC is one variant mode (what `cutlassfa.supports` is asked with) and its causal flag, with a few
shapes. The full matrix takes every spec for each dtype x head dim of `variant_head_dims()`, its
shapes in turn; the quick one takes each (dtype, spec) once, rotating through shapes and head dims,
so that every variant mode is still checked on every dtype. Padded head dims (multiples of 8 between
the compiled widths, run zero-padded to the next compiled tile) get plain cases, chosen so that every
compiled width of every kernel family has a padded neighbour (`padded_head_dims`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from .._inputs import Case, Variant

DENSE_B = 2


@dataclass(frozen=True)
class Spec:
    """One variant mode: the variant, its causal flag and the shapes it is run on: (H, Hk, Nq, Nk) for a
    dense variant, (H, Hk, Nq) for a KV cache (the keys are the variant's), (H, Hk) for varlen."""

    variant: Variant
    causal: bool
    shapes: tuple[tuple[int, ...], ...]


# Windows: left only, two-sided, causal with a left bound, wider than every N, the diagonal alone
# ((0, 0): with Nq > Nk the first rows see no key). Softcap 1.5 on scores ~N(0, 1): the cap bends
# most of them, so a backend that ignores it is far off.
_DENSE = (
    Spec(Variant("window-left", window=(32, -1)), False, ((4, 4, 257, 257), (4, 1, 77, 257))),
    Spec(Variant("window-two-sided", window=(40, 24)), False, ((4, 2, 257, 128), (4, 4, 77, 77))),
    Spec(Variant("window-causal-left", window=(48, 0)), True, ((4, 1, 257, 257), (4, 4, 77, 257))),
    Spec(Variant("window-wider-than-n", window=(1000, 1000)), False, ((4, 4, 257, 257), (4, 2, 1, 257))),
    Spec(Variant("window-diagonal", window=(0, 0)), False, ((4, 2, 257, 128), (4, 4, 77, 77))),
    Spec(Variant("softcap", softcap=1.5), False, ((4, 4, 257, 257), (4, 1, 77, 257))),
    Spec(Variant("softcap-window", window=(64, 16), softcap=3.0), False, ((4, 2, 257, 257), (4, 4, 128, 77))),
    Spec(Variant("sinks", sinks=True), True, ((4, 1, 257, 257), (4, 4, 77, 257))),
    Spec(Variant("sinks-softcap-window", window=(64, 16), softcap=3.0, sinks=True), False,
         ((4, 2, 257, 128), (4, 4, 77, 77))),
    Spec(Variant("alibi", alibi=True), True, ((4, 1, 257, 257), (4, 4, 77, 257))),
    Spec(Variant("alibi-softcap-sinks", window=(64, 16), softcap=3.0, sinks=True, alibi=True), False,
         ((4, 2, 257, 128), (4, 4, 128, 77))),
)
# KV caches: ragged lengths (one entry empty), page size 7 (divides none of the lengths), appended keys,
# left padding, and keys split 4 ways (decode: one query against ~1000 keys).
_KVCACHE = (
    Spec(Variant("kvcache", "kvcache", cache_seqlens=(77, 0, 200)), False, ((4, 1, 4), (4, 4, 1))),
    Spec(Variant("kvcache-new", "kvcache", cache_seqlens=(100, 5, 250), n_new=3), True, ((4, 2, 3), (4, 4, 3))),
    Spec(Variant("kvcache-paged", "kvcache", cache_seqlens=(100, 33, 250), page_size=7), False,
         ((4, 2, 4), (4, 1, 1))),
    Spec(Variant("kvcache-paged-new", "kvcache", cache_seqlens=(96, 0, 247), page_size=7, n_new=4), True,
         ((4, 1, 4), (4, 4, 4))),
    Spec(Variant("kvcache-leftpad", "kvcache", cache_seqlens=(120, 40, 257), cache_leftpad=(0, 17, 200), n_new=2),
         True, ((4, 2, 2), (4, 4, 2))),
    Spec(Variant("kvcache-splits", "kvcache", cache_seqlens=(1000, 517), num_splits=4), False, ((4, 1, 1), (4, 2, 4))),
    Spec(Variant("kvcache-paged-sinks", "kvcache", cache_seqlens=(96, 0, 247), page_size=7, n_new=4, sinks=True), True,
         ((4, 1, 4), (4, 4, 1))),
    Spec(Variant("kvcache-splits-sinks", "kvcache", cache_seqlens=(1000, 0), num_splits=4, sinks=True), False,
         ((4, 1, 1), (4, 2, 4))),
    Spec(Variant("kvcache-alibi", "kvcache", cache_seqlens=(120, 40, 257), cache_leftpad=(0, 17, 200), page_size=7,
                 n_new=2, num_splits=3, alibi=True), True, ((4, 2, 2), (4, 4, 1))),
    # fp8 caches: the decode kernel's calls (a few rows per K/V head, power-of-two pages, no left padding).
    Spec(Variant("kvcache-fp8", "kvcache", cache_seqlens=(77, 0, 200), n_new=2, fp8_cache=True), True,
         ((4, 1, 4), (4, 4, 1))),
    Spec(Variant("kvcache-fp8-paged-splits", "kvcache", cache_seqlens=(1000, 33), page_size=16, num_splits=3,
                 sinks=True, alibi=True, fp8_cache=True), False, ((4, 2, 1), (4, 1, 4))),
)
# varlen: ragged lengths, one sequence without queries, one without keys (its rows see nothing), one
# with more queries than keys (causal: its first rows see nothing), one of length 1.
_SEQLENS_Q, _SEQLENS_K = (77, 0, 128, 300, 1), (100, 33, 0, 257, 1)
_VARLEN = (
    Spec(Variant("varlen", "varlen", seqlens_q=_SEQLENS_Q, seqlens_k=_SEQLENS_K), False, ((4, 2), (4, 4))),
    Spec(Variant("varlen-causal", "varlen", seqlens_q=_SEQLENS_Q, seqlens_k=_SEQLENS_K), True, ((4, 1), (4, 2))),
    Spec(Variant("varlen-sinks", "varlen", seqlens_q=_SEQLENS_Q, seqlens_k=_SEQLENS_K, sinks=True), True,
         ((4, 2), (4, 4))),
    Spec(Variant("varlen-alibi", "varlen", seqlens_q=_SEQLENS_Q, seqlens_k=_SEQLENS_K, alibi=True), True,
         ((4, 2), (4, 1))),
)
# fp8 attention (q, k and v float8_e4m3fn, descales per (entry, K/V head), the output in the case's
# dtype): dense causal and not with GQA, a two-sided window, over an fp8 cache with appended keys, and a
# varlen batch.
_FP8 = (
    Spec(Variant("fp8", fp8=True), False, ((4, 2, 257, 257), (4, 4, 77, 128))),
    Spec(Variant("fp8-causal", fp8=True), True, ((4, 1, 257, 257), (4, 4, 128, 77))),
    Spec(Variant("fp8-window", window=(48, 16), fp8=True), False, ((4, 2, 257, 257), (4, 4, 77, 257))),
    Spec(Variant("fp8-kvcache-new", "kvcache", cache_seqlens=(77, 0, 200), n_new=2, fp8=True), True,
         ((4, 2, 2), (4, 4, 2))),
    Spec(Variant("fp8-varlen", "varlen", seqlens_q=_SEQLENS_Q, seqlens_k=_SEQLENS_K, fp8=True), True,
         ((4, 2), (4, 4))),
)
SPECS = _DENSE + _KVCACHE + _VARLEN + _FP8

# Head dims of the quick variant cases, in turn: compiled widths and padded ones, each taken by every
# backend on every dtype (small_tile runs up to 192, the tensor-core backends fp32 up to 128), so that
# the one quick case of a (dtype, variant) is advertised wherever the variant is.
QUICK_HEAD_DIMS = (64, 128, 40, 96, 32, 80, 112)
# fp8 caches run on the GPU at the decode kernel's head dims only, fp8 attention at the fp8 kernel's: their
# quick cases take those.
FP8_QUICK_HEAD_DIMS = (128, 64)
# Preferred padded head dims (padded_head_dims adds one wherever a compiled width is left without a
# padded neighbour): 8 and 40 pad to 32 / 64, 80 to 96 or 128, 112 to 128, 136 to 192 or 256, 200 to 256.
PREFERRED_PADDED = (8, 40, 80, 112, 136, 200)
MULTIPLE, MAX_HEAD_DIM = 8, 256


def families() -> dict[str, tuple[int, ...]]:
    """Compiled head dims of each kernel family (the extension's table; empty without it)."""
    from .. import _api

    return {name: tuple(dims) for name, dims in dict(getattr(_api._C, "head_dims", {}) or {}).items()}


def padded_head_dims() -> tuple[int, ...]:
    """Non-compiled multiples of 8 that give every compiled width of every family a padded neighbour: a
    head dim the family runs zero-padded to exactly that width."""
    import cutlassfa

    compiled = set(cutlassfa.HEAD_DIMS)
    chosen = [d for d in PREFERRED_PADDED if d not in compiled]
    for widths in families().values():
        for low, width in zip((0,) + tuple(sorted(widths)), sorted(widths)):
            candidates = [d for d in range(low + MULTIPLE, width, MULTIPLE) if d not in compiled]
            if candidates and not any(low < d < width for d in chosen):
                chosen.append(candidates[-1])
    return tuple(sorted(chosen))


def padded_neighbour_gaps() -> list[str]:
    """Compiled widths of a family that no padded head dim of the matrix pads to (empty: all covered)."""
    padded = padded_head_dims()
    gaps = []
    for family, widths in families().items():
        for low, width in zip((0,) + tuple(sorted(widths)), sorted(widths)):
            possible = any(d % MULTIPLE == 0 for d in range(low + 1, width))
            if possible and not any(low < d < width for d in padded):
                gaps.append(f"{family} d={width}")
    return gaps


def variant_head_dims() -> tuple[int, ...]:
    """Head dims of the full variant matrix: every compiled width and two padded ones."""
    import cutlassfa

    return tuple(sorted(set(cutlassfa.HEAD_DIMS) | {40, 136}))


def case_of(spec: Spec, dtype: str, d: int, shape: tuple[int, ...]) -> Case:
    """The Case of `spec` on (dtype, d) with one of its shapes."""
    v = spec.variant
    if v.kind == "dense":
        h, hk, nq, nk = shape
        return Case(dtype, DENSE_B, h, hk, nq, nk, d, spec.causal, variant=v)
    if v.kind == "kvcache":
        h, hk, nq = shape
        longest = max(v.cache_seqlens) + v.n_new
        capacity = -(-longest // v.page_size) * v.page_size if v.page_size else longest
        return Case(dtype, len(v.cache_seqlens), h, hk, nq, capacity, d, spec.causal, variant=v)
    h, hk = shape
    return Case(dtype, len(v.seqlens_q), h, hk, max(v.seqlens_q), max(v.seqlens_k), d, spec.causal, variant=v)


def takes(spec: Spec, dtype: str) -> bool:
    """Whether the spec's variant takes `dtype` (an fp8 cache: half-precision q; fp8 attention: a
    half-precision output)."""
    return not ((spec.variant.fp8_cache or spec.variant.fp8) and dtype == "float32")


def variant_cases(quick: bool, dtypes: Sequence[str]) -> list[Case]:
    """Every spec on every dtype it takes: once (quick) or on every head dim of variant_head_dims (full)."""
    cases = []
    for index, (dtype, spec) in enumerate(itertools.product(dtypes, SPECS)):
        if not takes(spec, dtype):
            continue
        quick_dims = FP8_QUICK_HEAD_DIMS if spec.variant.fp8_cache or spec.variant.fp8 else QUICK_HEAD_DIMS
        dims = (quick_dims[index % len(quick_dims)],) if quick else variant_head_dims()
        for j, d in enumerate(dims):
            cases.append(case_of(spec, dtype, d, spec.shapes[(index + j) % len(spec.shapes)]))
    return cases


def probes(dtype: str, spec: Spec) -> list[Case]:
    """Cases that ask whether a backend advertises (dtype, spec) at all: one per head dim the quick or
    the full matrix runs it on."""
    dims = set(QUICK_HEAD_DIMS) | set(variant_head_dims())
    return [case_of(spec, dtype, d, spec.shapes[0]) for d in sorted(dims)]
