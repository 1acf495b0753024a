"""The bench grids and --shape parsing. HW4: the fp32 one-head test shapes (t11, t22, t29, t30 of the
HW4 test set), (B, N, d). LLM: fp16 and bf16, d 64 / 128, (B, H, N) with B*N = 32K tokens, causal and
not. Quick: seconds on an H100. Decode: one new query (or four, causal) against a K/V cache, the
inference grid."""

from __future__ import annotations

import argparse
import dataclasses

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


def select_cases(args: argparse.Namespace) -> list[Case]:
    """The cases of a run: --shape x --dtypes x --causal, or the (quick / decode) grid with --head-dims,
    filtered by --dtypes and --causal; --window on every one."""
    window = getattr(args, "window", None)
    if window is not None:
        variant = Variant(f"window {window[0]},{window[1]}", window=window)
        return [dataclasses.replace(c, variant=variant) for c in _plain_cases(args)]
    return _plain_cases(args)


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


__all__ = ["DECODE_MAX_KV_BYTES", "DTYPES", "HW4_SHAPES", "LLM_HEAD_DIMS", "LLM_SHAPES", "decode_grid",
           "decode_quick_grid", "default_grid", "parse_shape", "parse_window", "quick_grid", "select_cases"]
