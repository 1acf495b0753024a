"""Decode calls the planner may send to the decode kernel or to the tile kernels, timed both ways in one run:
each case's heuristic plan against the tile kernels at several split counts (`cutlassfa tune`'s candidates,
forced through the planner's table), and a read of the keys the call must read (an int64 sum over the
visible part of K and V), all as CUDA graphs replayed interleaved, inputs rotated past L2. One JSON line a
case. Default cases: Gemma-2-like decode (16 query heads on 8, d 256, bf16, B 8, one query or four causal),
plain, softcap 50, and softcap with a window of 4096, at 8k and 32k keys; --head-dim 128 for the Llama-like
control. --fp8-cache: instead, one query against fp8 caches of 256-512 MB as bf16 (issue 34's smallest cases,
d 128, 32:8 and 8:1 heads, contiguous and in pages of 16 and 64 keys), the split counts around the heuristic's.

    python scripts/decode_modes_probe.py [--head-dim 256] [--rounds 7] [--fp8-cache] > probe.jsonl
"""

from __future__ import annotations

import argparse
import json

import torch

import cutlassfa
from cutlassfa._inputs import Case, Variant
from cutlassfa.bench.feeds import make_feed
from cutlassfa.bench.frames import TorchFrame
from cutlassfa.bench.timing import TorchGraphTimer, median
from cutlassfa.bench.tune import measure_case


def read_ms(k: torch.Tensor, v: torch.Tensor, first_key: int, rounds: int) -> float:
    """An int64 sum over keys [first_key, Nk) of K and V (B, Hkv, Nk, d; a paged pool whole): the bytes the
    call must read, as the bench's read row reads them (an int32 sum ran at 0.74 TB/s on an H200: a reduction
    bound by its accumulation, not a ceiling)."""
    k_words, v_words = (x[:, :, first_key:].view(torch.int64) for x in (k, v))
    (times,) = TorchGraphTimer(4).time([lambda i: (k_words.sum(), v_words.sum())], rounds)
    return median(times)


def gemma_cases(d: int):
    """(mode name, case, first key read) of the default grid."""
    for nk in (8192, 32768):
        for nq in (1, 4):
            for name, window, softcap in (("plain", None, 0.0), ("softcap", None, 50.0),
                                          ("window+softcap", (4096, 0), 50.0)):
                variant = Variant(name, kind="kvcache", cache_seqlens=(nk,) * 8, window=window, softcap=softcap)
                first = 0 if window is None else max(0, nk - nq - window[0])
                yield name, Case("bfloat16", 8, 16, 8, nq, nk, d, True, variant=variant), first


def fp8_cache_cases():
    """One bf16 query against fp8 caches whose bf16 K + V would be 256-512 MB (B, Hq, Hkv, keys), each
    contiguous and paged."""
    for b, hq, hkv, nk in ((8, 32, 8, 8192), (8, 32, 8, 16384), (32, 32, 8, 2048), (1, 32, 8, 131072),
                           (32, 8, 1, 16384)):
        for page in (0, 16, 64):
            name = "fp8 contiguous" if page == 0 else f"fp8 page {page}"
            variant = Variant(name, kind="kvcache", cache_seqlens=(nk,) * b, page_size=page, fp8_cache=True)
            yield name, Case("bfloat16", b, hq, hkv, 1, nk, 128, True, variant=variant), 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fp8-cache", action="store_true", help="the fp8-cache split probe instead")
    args = parser.parse_args()
    frame = TorchFrame()
    info = cutlassfa.device_info(0)
    device = (info["compute_capability"][0] * 10 + info["compute_capability"][1], info["multiprocessors"])
    cases = fp8_cache_cases() if args.fp8_cache else gemma_cases(args.head_dim)
    for name, case, first in cases:
        measured = measure_case(case, frame, device, args.rounds, 4)
        if measured is None:  # no tensor-core plan to compare
            continue
        feed = make_feed(case, frame, seed=0)
        row = dict(case=case.label, d=case.d, nq=case.Nq, nk=case.Nk, mode=name, heuristic=measured.heuristic.label(),
                   ms=measured.times, read_ms=read_ms(feed.own[1], feed.own[2], first, args.rounds))
        best_tile = min((t for label, t in measured.times.items() if not label.startswith("sm90decode")),
                        default=None)
        ours = measured.times[measured.heuristic.label()]
        row.update(of_read=row["read_ms"] / ours, vs_best_tile=best_tile / ours if best_tile else None,
                   best=min(measured.times, key=measured.times.get))
        print(json.dumps(row), flush=True)
        del feed
        frame.empty_cache()


if __name__ == "__main__":
    main()
