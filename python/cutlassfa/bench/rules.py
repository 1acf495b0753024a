"""What the bench measures and what it leaves out: the knobs of a measurement, the skip rules (decided
before any call), the L2 rotation, which dense-GEMM peak a row is compared with, and the accuracy
bound a row's output must meet."""

from __future__ import annotations

import math

from .._inputs import Case
from ..check.bounds import GATE_REL_L2, bound_key, rel_l2_limit
from .flops import case_flops, case_scores
from .runners import ANCHORS, CUDNN_FP8, FP8_ATTENTION, READ, split_term

DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 5
DEFAULT_MAX_CALL_S = 2.0  # skip a backend on a shape where one call would take longer than this
# The numpy backend is only timed on tiny problems (~0.1 s per call).
CPU_MAX_FLOPS = 2e9
# Backends that materialize the Nq x Nk score matrix (float32), and how many such matrices they hold:
# skipped when that many bytes exceed a quarter of the free GPU memory (a varlen batch: every sequence's
# matrix at once, the most such a backend could hold).
SCORE_MATRICES = {"naive": 1, "sdpa_math": 3}
# FLOP-rate model (TFLOP/s) for the time prediction before a backend was measured in this run; after
# the first measurement of a (backend, dtype) the measured rate replaces it. Deliberately low.
MODEL_TFLOPS = {"naive": 2.0, "sdpa_math": 5.0, "cpu": 0.01}
# Inputs are rotated among copies when q + k + v + out < L2_FACTOR x L2 (so no timed call finds its
# inputs in L2 from the previous call); at most MAX_COPIES copies.
L2_FACTOR = 3
MAX_COPIES = 32
# Reference sample: these (b, h) slices and the last rows of each, at most REF_MAX_ROWS and at most
# REF_MAX_SCORES scores per slice.
REF_MAX_ROWS = 2048
REF_MAX_SCORES = 1 << 24
GEMM_SIZE = 8192  # n of the n x n x n GEMM whose rate is the peak


# Which measured dense-GEMM rate a row is compared with. fp16 / bf16 rows: the GEMM of that dtype.
# fp32 rows: CUDA-core fp32 (TF32 off), except the tensor-core backends, which split fp32 inputs into fp16
# and run fp16 MMAs. PyTorch's fp32 SDPA does not use TF32 unless allowed (off by default). cpu: none;
# read: none (it does no arithmetic: its measure is GB/s).
PEAKS = {
    "fp16_gemm": ("float16", False),
    "bf16_gemm": ("bfloat16", False),
    "fp32_gemm": ("float32", False),  # TF32 disabled: the CUDA-core fp32 rate
    "tf32_gemm": ("float32", True),  # reported for reference; no row is compared with it by default
}


def peak_of(backend: str, dtype: str) -> str | None:
    """Name of the peak (a key of PEAKS) that `backend` on `dtype` is compared with."""
    backend = split_term(backend)[0]  # a score-term row: its backend's
    if backend in ("cpu", READ):
        return None
    if dtype == "float16":
        return "fp16_gemm"
    if dtype == "bfloat16":
        return "bf16_gemm"
    return "fp16_gemm" if backend.startswith("tensorcore") else "fp32_gemm"



def tflops(case: Case, ms: float) -> float:
    """TFLOP/s of one call of `case` taking `ms`, counting only the query-key pairs the mask lets through."""
    return case_flops(case) / (ms * 1e-3) / 1e12


# cudnn_e4m3's bound: its output is e4m3 (3 mantissa bits: a relative rounding error uniform within
# +-2^-4, 3.6 % rms), twice that; a wrong mask or scale is still far outside it.
FP8_OUT_REL_L2 = 0.08


def accuracy_bound(backend: str, dtype: str) -> float:
    """The rel-L2 a row's output must stay within: the gate's bound for our backends (and any other
    name), the 2 % gate for the anchors (SDPA, flex: not ours to bound tighter, but a wrong call of one,
    such as a top-left causal mask, is far outside it), FP8_OUT_REL_L2 for an anchor with fp8 output; our
    fp8-attention rows are bounded as the gate bounds fp8 attention."""
    if backend == CUDNN_FP8:
        return FP8_OUT_REL_L2
    if backend in ANCHORS:
        return GATE_REL_L2
    name, term = split_term(backend)
    return rel_l2_limit(name, bound_key(dtype, term == FP8_ATTENTION))


def skip_reason(backend: str, case: Case, *, free_bytes: int | None, max_call_s: float,
                rate_tflops: float | None = None) -> str | None:
    """Why `backend` should not be run on `case`, before any call; None to run it.

    `rate_tflops` is the rate measured earlier in this run for (backend, dtype), if any."""
    backend = split_term(backend)[0]  # a score-term row: its backend's limits
    flops = case_flops(case)
    if backend == "cpu" and flops > CPU_MAX_FLOPS:
        return f"{flops / 1e9:.3g} GFLOP > {CPU_MAX_FLOPS / 1e9:g} GFLOP limit of the numpy backend"
    if backend in SCORE_MATRICES and free_bytes is not None:
        need = SCORE_MATRICES[backend] * case_scores(case) * 4
        if need > free_bytes / 4:
            return f"score matrix {need / 2**30:.1f} GiB > free memory / 4 ({free_bytes / 4 / 2**30:.1f} GiB)"
    rate, source = (rate_tflops, "measured") if rate_tflops else (MODEL_TFLOPS.get(backend), "model")
    if rate:
        predicted = flops / (rate * 1e12)
        if predicted > max_call_s:
            return f"predicted {predicted:.3g} s/call > {max_call_s:g} s ({source} {rate:.3g} TFLOP/s)"
    return None


def rotation_copies(working_set_bytes: int, l2_bytes: int, free_bytes: int | None) -> int:
    """How many copies of the inputs to rotate among, so that the whole rotation exceeds L2_FACTOR x L2."""
    if working_set_bytes <= 0 or working_set_bytes >= L2_FACTOR * l2_bytes:
        return 1
    copies = min(MAX_COPIES, math.ceil(L2_FACTOR * l2_bytes / working_set_bytes))
    if free_bytes is not None:
        copies = min(copies, max(1, int(free_bytes / 4 // working_set_bytes)))
    return max(1, copies)


