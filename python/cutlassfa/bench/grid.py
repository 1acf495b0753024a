"""The bench grids and --shape parsing. HW4: the fp32 one-head test shapes (t11, t22, t29, t30 of the
HW4 test set), (B, N, d). LLM: fp16 and bf16, d 64 / 128, (B, H, N) with B*N = 32K tokens, causal and
not. Quick: seconds on an H100. Decode: one new query (or four, causal) against a K/V cache, the
inference grid. Paged: decode against paged caches, each shape also with a contiguous cache (its twin).
Speculative: 2-16 causal queries of grouped heads against long caches, contiguous and paged (twins).
Varlen: causal prefill of packed batches of mixed lengths, each beside a dense call of as many sequences
at the mean length (its twin)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Sequence

import numpy as np

from .. import hw4
from .._inputs import DTYPES, Case, Variant

HW4_SHAPES = hw4.FULL_SHAPES
LLM_SHAPES = ((32, 16, 1024), (8, 16, 4096), (2, 16, 16384))
LLM_HEAD_DIMS = (64, 128)
# Decode: 32 query heads on 32, 8 or 4 K/V heads (MHA, GQA 4:1 and 8:1), B sequences of Nk cached keys,
# one new query, or four with the causal mask; cases whose K + V exceed 32 GiB are left out.
DECODE_HEADS = 32
DECODE_KV_HEADS = (32, 8, 4)
DECODE_BATCHES = (1, 8, 64)
DECODE_KEYS = (2048, 16384, 131072)
DECODE_QUERIES = ((1, False), (4, True))
DECODE_HEAD_DIMS = (128, 64)
DECODE_MAX_KV_BYTES = 32 << 30
# Paged: the decode queries against caches of Nk keys in pages of PAGE_SIZES keys (16, vLLM's default
# block size, to 256), pages shuffled over the pool (a serving cache's pages are wherever the allocator
# found room), every entry at full length. K + V capped as for decode.
PAGE_SIZES = (16, 64, 256)
PAGED_DTYPES = ("bfloat16",)
PAGED_KV_HEADS = (8, 32)
PAGED_BATCHES = (1, 8, 64)
PAGED_KEYS = (16384, 131072)
PAGED_HEAD_DIMS = (128, 64)
# Speculative: a few query tokens (2-16, causal) of many grouped heads against long caches, as speculative
# decoding and multi-token prediction verify drafts (up to 128 query rows a K/V head), B 8, d 128, bf16,
# each shape contiguous and in pages of 16 keys.
SPECULATIVE_HEADS = ((32, 8), (64, 8))
SPECULATIVE_QUERIES = (2, 4, 8, 16)
SPECULATIVE_KEYS = (8192, 32768)
SPECULATIVE_PAGE_SIZES = (16,)
# Varlen: causal prefill, 32 query heads on 8 K/V heads, of batches whose lengths are drawn once with a
# fixed seed: 16 of 64-8192 (the mix; seed 0 gives the lengths bench/NOTES-variants.md quotes,
# mean 4164), 64 short prompts, and one long prompt among 15 short ones.
VARLEN_HEADS, VARLEN_KV_HEADS = 32, 8
VARLEN_HEAD_DIMS = (128,)
VARLEN_DTYPES = ("bfloat16",)


def _draw_lengths(seed: int, count: int, low: int, high: int) -> tuple[int, ...]:
    return tuple(int(n) for n in np.random.default_rng(seed).integers(low, high + 1, count))


VARLEN_MIXES = (_draw_lengths(0, 16, 64, 8192), _draw_lengths(1, 64, 64, 1024),
                (16384,) + _draw_lengths(2, 15, 64, 1024))


def default_grid(head_dims: tuple[int, ...] = LLM_HEAD_DIMS) -> list[Case]:
    cases = [Case("float32", b, 1, 1, n, n, d, False) for b, n, d in HW4_SHAPES]
    cases += [Case(dt, b, h, h, n, n, d, causal)
              for dt in ("float16", "bfloat16") for d in head_dims for b, h, n in LLM_SHAPES
              for causal in (False, True)]
    return cases


def quick_grid() -> list[Case]:
    return [
        Case("float32", 136, 1, 1, 128, 128, 32, False),  # HW4 t11 with B / 100: small enough for cpu too
        Case("float32", 50, 1, 1, 2048, 2048, 64, False),
        Case("float16", 8, 16, 16, 1024, 1024, 64, False),
        Case("float16", 8, 16, 16, 1024, 1024, 64, True),
        Case("bfloat16", 8, 16, 16, 1024, 1024, 128, False),
    ]


def decode_grid(head_dims: tuple[int, ...] = DECODE_HEAD_DIMS) -> list[Case]:
    return [Case(dt, b, DECODE_HEADS, hk, nq, nk, d, causal)
            for dt in ("bfloat16", "float16") for d in head_dims for hk in DECODE_KV_HEADS for b in DECODE_BATCHES
            for nk in DECODE_KEYS if 2 * b * hk * nk * d * 2 <= DECODE_MAX_KV_BYTES
            for nq, causal in DECODE_QUERIES]


def decode_quick_grid() -> list[Case]:
    """bf16, d = 128, GQA 4:1: a long cache, a batch of short ones, and four causal queries."""
    return [Case("bfloat16", b, DECODE_HEADS, 8, nq, nk, 128, causal)
            for b, nk, nq, causal in ((1, 131072, 1, False), (8, 2048, 1, False), (1, 16384, 4, True))]


def kvcache_case(dtype: str, b: int, h: int, hk: int, nq: int, nk: int, d: int, causal: bool,
                 page_size: int = 0) -> Case:
    """Queries against a cache of nk keys an entry, every entry full (cache_seqlens = nk): contiguous
    (B, Hkv, Nk, d) for page_size 0, else pages of page_size keys (ceil(nk / page_size) an entry)."""
    name = f"paged {page_size}" if page_size else "contiguous cache"
    return Case(dtype, b, h, hk, nq, nk, d, causal,
                variant=Variant(name, kind="kvcache", cache_seqlens=(nk,) * b, page_size=page_size))


def paged_cases(shape: tuple[int, int, int, int, int, int], dtype: str, causal: bool,
                page_sizes: Sequence[int] = PAGE_SIZES) -> list[Case]:
    """One (B, H, Hk, Nq, Nk, d) shape with a contiguous cache, then paged at each page size."""
    return [kvcache_case(dtype, *shape, causal, p) for p in (0, *page_sizes)]


def paged_grid(head_dims: tuple[int, ...] = PAGED_HEAD_DIMS, page_sizes: Sequence[int] = PAGE_SIZES,
               dtypes: Sequence[str] = PAGED_DTYPES) -> list[Case]:
    return [case for dt in dtypes for d in head_dims for hk in PAGED_KV_HEADS for b in PAGED_BATCHES
            for nk in PAGED_KEYS if 2 * b * hk * nk * d * 2 <= DECODE_MAX_KV_BYTES
            for nq, causal in DECODE_QUERIES
            for case in paged_cases((b, DECODE_HEADS, hk, nq, nk, d), dt, causal, page_sizes)]


def paged_quick_grid(page_sizes: Sequence[int] = PAGE_SIZES, dtypes: Sequence[str] = PAGED_DTYPES) -> list[Case]:
    """d = 128, GQA 4:1: a batch of 16k caches, one 128k cache, and four causal queries."""
    return [case for dt in dtypes
            for b, nk, nq, causal in ((8, 16384, 1, False), (1, 131072, 1, False), (8, 16384, 4, True))
            for case in paged_cases((b, DECODE_HEADS, 8, nq, nk, 128), dt, causal, page_sizes)]


def speculative_grid(page_sizes: Sequence[int] = SPECULATIVE_PAGE_SIZES,
                     dtypes: Sequence[str] = PAGED_DTYPES) -> list[Case]:
    return [case for dt in dtypes for nk in SPECULATIVE_KEYS for h, hk in SPECULATIVE_HEADS
            for nq in SPECULATIVE_QUERIES for case in paged_cases((8, h, hk, nq, nk, 128), dt, True, page_sizes)]


def varlen_case(dtype: str, h: int, hk: int, d: int, causal: bool, lengths: Sequence[int]) -> Case:
    """A packed batch of sequences of these lengths (queries and keys alike); B is their count, Nq = Nk
    the longest."""
    lengths = tuple(int(n) for n in lengths)
    name = f"varlen {len(lengths)} of {min(lengths)}-{max(lengths)}"
    return Case(dtype, len(lengths), h, hk, max(lengths), max(lengths), d, causal,
                variant=Variant(name, kind="varlen", seqlens_q=lengths, seqlens_k=lengths))


def dense_at_mean(case: Case) -> Case:
    """A varlen case's twin: a dense batch of as many sequences, each at the mean length."""
    var = case.variant
    nq, nk = (round(sum(n) / len(n)) for n in (var.seqlens_q, var.seqlens_k))
    return Case(case.dtype, case.B, case.H, case.Hk, nq, nk, case.d, case.causal,
                variant=Variant(f"dense at the mean of {var.name.removeprefix('varlen ')}"))


def varlen_grid(mixes: Sequence[Sequence[int]] = VARLEN_MIXES, head_dims: tuple[int, ...] = VARLEN_HEAD_DIMS,
                dtypes: Sequence[str] = VARLEN_DTYPES, causals: Sequence[bool] = (True,)) -> list[Case]:
    """Each mix as a varlen case, followed by its dense twin."""
    return [c for dt in dtypes for d in head_dims for causal in causals for lengths in mixes
            for varlen in [varlen_case(dt, VARLEN_HEADS, VARLEN_KV_HEADS, d, causal, lengths)]
            for c in (varlen, dense_at_mean(varlen))]


def twin_of(case: Case) -> Case | None:
    """The case a row's rate is held against in the same run: a paged cache's contiguous cache of the
    same shape, a varlen batch's dense call at the mean length; None for the others."""
    var = case.variant
    if var is not None and var.kind == "kvcache" and var.page_size:
        return dataclasses.replace(case, variant=dataclasses.replace(var, name="contiguous cache", page_size=0))
    if var is not None and var.kind == "varlen":
        return dense_at_mean(case)
    return None


def parse_shape(text: str) -> tuple[int, int, int, int, int, int]:
    """"B,H,N,d" or "B,H,Nq,Nk,d"; H may be "Hq:Hkv" for GQA. Returns (B, H, Hk, Nq, Nk, d)."""
    parts = text.split(",")
    try:
        heads = parts[1].split(":")
        h, hk = int(heads[0]), int(heads[-1])
        if len(parts) == 4:
            b, n, d = int(parts[0]), int(parts[2]), int(parts[3])
            nq = nk = n
        elif len(parts) == 5:
            b, nq, nk, d = int(parts[0]), int(parts[2]), int(parts[3]), int(parts[4])
        else:
            raise ValueError
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"--shape wants B,H,N,d or B,H,Nq,Nk,d (H may be Hq:Hkv), got {text!r}")
    if min(b, h, hk, nq, nk, d) < 1 or h % hk:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: sizes must be >= 1 and Hq a multiple of Hkv")
    return b, h, hk, nq, nk, d


def parse_window(text: str) -> tuple[int, int]:
    """"LEFT,RIGHT" (-1: unbounded on that side)."""
    try:
        left, right = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window wants LEFT,RIGHT (-1: unbounded), got {text!r}") from None
    if left < -1 or right < -1:
        raise argparse.ArgumentTypeError(f"--window {text!r}: each side is >= 0, or -1 for unbounded")
    return left, right


def parse_cases(text: str) -> slice:
    """"START:STOP" (Python slice bounds over the run's case list, either may be empty): part of a grid, so
    that a long one runs over several calls."""
    try:
        start, stop = (int(x) if x.strip() else None for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cases wants START:STOP (e.g. 0:40, 40:), got {text!r}") from None
    return slice(start, stop)


def select_cases(args: argparse.Namespace) -> list[Case]:
    """The cases of a run: --shape x --dtypes x --causal, or the (quick / decode / paged / varlen) grid
    with --head-dims, filtered by --dtypes and --causal; --window and --softcap on every one. The paged and
    varlen grids take --dtypes as the dtypes to run (default bfloat16), and --page-sizes / --lengths. --cases
    takes a part of the list."""
    part = getattr(args, "cases", None) or slice(None)
    if getattr(args, "paged", False) or getattr(args, "speculative", False):
        return _paged_cases(args)[part]
    if getattr(args, "varlen", False):
        return _varlen_cases(args)[part]
    window, softcap = getattr(args, "window", None), getattr(args, "softcap", None)
    if window is not None or softcap is not None:
        names = ([f"window {window[0]},{window[1]}"] if window is not None else []) + \
                ([f"softcap {softcap:g}"] if softcap is not None else [])
        variant = Variant(" ".join(names), window=window, softcap=softcap or 0.0)
        return [dataclasses.replace(c, variant=variant) for c in _plain_cases(args)][part]
    return _plain_cases(args)[part]


def _plain_cases(args: argparse.Namespace) -> list[Case]:
    if args.shape:
        dtypes = args.dtypes or ["float16"]
        causals = {"no": [False], "yes": [True], "both": [False, True], None: [False]}[args.causal]
        return [Case(dt, b, h, hk, nq, nk, d, c) for (b, h, hk, nq, nk, d) in args.shape for dt in dtypes
                for c in causals]
    head_dims = tuple(getattr(args, "head_dims", None) or ())
    if getattr(args, "decode", False):
        cases = decode_quick_grid() if args.quick else decode_grid(head_dims or DECODE_HEAD_DIMS)
    else:
        cases = quick_grid() if args.quick else default_grid(head_dims or LLM_HEAD_DIMS)
    if head_dims:  # the quick grids: a filter
        cases = [c for c in cases if c.dtype == "float32" or c.d in head_dims]
    if args.dtypes:
        cases = [c for c in cases if c.dtype in args.dtypes]
    if args.causal in ("no", "yes"):
        cases = [c for c in cases if c.causal == (args.causal == "yes")]
    return cases


_CAUSALS = {"no": [False], "yes": [True], "both": [False, True]}


def _paged_cases(args: argparse.Namespace) -> list[Case]:
    dtypes = args.dtypes or list(PAGED_DTYPES)
    if getattr(args, "speculative", False):
        return speculative_grid(tuple(args.page_sizes or SPECULATIVE_PAGE_SIZES), dtypes)
    page_sizes = tuple(args.page_sizes or PAGE_SIZES)
    head_dims = tuple(args.head_dims or ())
    if args.shape:
        return [c for shape in args.shape for dt in dtypes for causal in _CAUSALS.get(args.causal, [False])
                for c in paged_cases(shape, dt, causal, page_sizes)]
    if args.quick:
        cases = paged_quick_grid(page_sizes, dtypes)
        cases = [c for c in cases if not head_dims or c.d in head_dims]
    else:
        cases = paged_grid(head_dims or PAGED_HEAD_DIMS, page_sizes, dtypes)
    if args.causal in ("no", "yes"):
        cases = [c for c in cases if c.causal == (args.causal == "yes")]
    return cases


def _varlen_cases(args: argparse.Namespace) -> list[Case]:
    mixes = args.lengths or (VARLEN_MIXES[:1] if args.quick else VARLEN_MIXES)
    return varlen_grid(mixes, tuple(args.head_dims or VARLEN_HEAD_DIMS), args.dtypes or list(VARLEN_DTYPES),
                       _CAUSALS.get(args.causal, [True]))


__all__ = ["DECODE_MAX_KV_BYTES", "DTYPES", "HW4_SHAPES", "LLM_HEAD_DIMS", "LLM_SHAPES", "PAGE_SIZES", "VARLEN_MIXES",
           "decode_grid", "decode_quick_grid", "default_grid", "dense_at_mean", "kvcache_case", "paged_cases",
           "paged_grid", "paged_quick_grid", "parse_shape", "parse_window", "quick_grid", "select_cases",
           "speculative_grid", "twin_of", "varlen_case", "varlen_grid"]
