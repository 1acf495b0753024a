"""`cutlassfa bench`: TFLOP/s of every backend next to PyTorch SDPA, on the same inputs, in one run.

For each case (dtype, B, H, Nq, Nk, d, causal) every available cutlassfa backend and, when PyTorch is
importable, `scaled_dot_product_attention` restricted to one of its backends at a time (sdpa_flash,
sdpa_efficient, sdpa_cudnn, sdpa_math; with --window, FlexAttention with a block mask: flex; with
--decode and --paged, a plain read of K and V: read; FlashAttention-4 when installed: fa4; asked for, the
same calls with attention sinks or ALiBi: tensorcore_sinks, fa4_sinks, tensorcore_alibi, ...) is timed
with CUDA events: each contender's first call alone, warm-up rounds, then `--repeats` (default 20) rounds
in which every contender makes one call in turn; a row's time is the median of its rounds. Inputs are
rotated among copies when they would sit in L2.

    TFLOP/s = 4 * B * H * d * (query-key pairs the mask lets through) / t
    GB/s = (q, k, v read and o written once, in bytes) / t      (the rate that bounds decode: --decode)

--paged runs the decode queries against paged caches (block_table + cache_seqlens), each shape also with
a contiguous cache; --varlen runs packed batches of mixed lengths through varlen_forward, each beside a
dense batch at the mean length. A row's `vs twin` is its rate over the same backend's on that twin case.
The anchors get the dense equivalent (feeds.py): the pages gathered into a contiguous cache, one SDPA call
per sequence.

Each row is also given as a percentage of a dense-GEMM rate measured once per run (rules.PEAKS), and
with its rel-L2 error against the float64 reference on a sample of the output; a row of ours whose
error exceeds the gate's bound is marked INACCURATE and the command exits 1. A backend that would be
absurdly slow on a shape is skipped, and the table says why. `--overhead` measures the per-call cost.

Modules: grid (cases and their twins), flops (visible-pair and byte counts), timing (interleaved timers),
frames (where arrays live), feeds (what each row is fed), runners (ours, SDPA, FlexAttention, read), rules
(knobs, skips, peaks, accuracy bound), samples (the accuracy sample), measure (one case), report (table,
JSON), plot, overhead, cli.
"""

from .cli import add_arguments, main, run
from .feeds import Feed, gather_pages, make_feed, split_sequences, with_dense
from .flops import attention_bytes, attention_flops, case_bytes, case_flops, varlen_flops, visible_pairs
from .frames import CupyFrame, Frame, TorchFrame, pick_frame
from .grid import (DECODE_MAX_KV_BYTES, HW4_SHAPES, LLM_HEAD_DIMS, LLM_SHAPES, PAGE_SIZES, VARLEN_MIXES, decode_grid,
                   decode_quick_grid, default_grid, dense_at_mean, kvcache_case, paged_cases, paged_grid,
                   paged_quick_grid, parse_cases, parse_shape, parse_window, quick_grid, select_cases, speculative_grid,
                   twin_of, varlen_case, varlen_grid)
from .measure import Row, Settings, apply_peaks, apply_twins, bench_case, measure_peaks
from .samples import output_sample, reference_sample
from .rules import (CPU_MAX_FLOPS, L2_FACTOR, MAX_COPIES, PEAKS, accuracy_bound, peak_of, rotation_copies,
                    skip_reason, tflops)
from .runners import (ALIBI, ALL_BACKENDS, ANCHORS, DENSE, FA4, FLEX, OUR_BACKENDS, OWN, READ, SDPA_BACKENDS, SINKS,
                      TERMS, Runner, fa4, flex, make_runners, ours, read, sdpa, select_backends, sink_values,
                      split_term, term_values)
from .timing import CudaPythonEventTimer, TorchEventTimer, TorchGraphTimer, WallTimer, median, round_robin
from .._inputs import DTYPES

__all__ = ["ALIBI", "ALL_BACKENDS", "ANCHORS", "CPU_MAX_FLOPS", "CudaPythonEventTimer", "CupyFrame", "DECODE_MAX_KV_BYTES",
           "DENSE", "DTYPES", "FA4", "FLEX", "Feed", "Frame", "HW4_SHAPES", "L2_FACTOR", "LLM_HEAD_DIMS", "LLM_SHAPES",
           "MAX_COPIES", "OUR_BACKENDS", "OWN", "PAGE_SIZES", "PEAKS", "READ", "Row", "Runner", "SDPA_BACKENDS",
           "SINKS", "Settings", "TERMS", "TorchEventTimer", "TorchFrame", "TorchGraphTimer", "VARLEN_MIXES",
           "WallTimer",
           "accuracy_bound", "add_arguments", "apply_peaks", "apply_twins", "attention_bytes", "attention_flops",
           "bench_case", "case_bytes", "case_flops", "decode_grid", "decode_quick_grid", "default_grid",
           "dense_at_mean", "fa4", "flex", "gather_pages", "kvcache_case", "main", "make_feed", "make_runners",
           "measure_peaks", "median", "ours", "output_sample", "paged_cases", "paged_grid", "paged_quick_grid",
           "parse_cases", "parse_shape", "parse_window", "peak_of", "pick_frame", "quick_grid", "read", "reference_sample",
           "rotation_copies", "round_robin", "run", "sdpa", "select_backends", "select_cases", "sink_values",
           "skip_reason", "speculative_grid", "split_term", "term_values",
           "split_sequences", "tflops", "twin_of", "varlen_case", "varlen_flops", "varlen_grid", "visible_pairs",
           "with_dense"]
