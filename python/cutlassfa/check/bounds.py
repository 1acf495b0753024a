"""BOUNDS: the one table of accuracy limits per (backend, dtype), and the rules beside it.

Every limit is about 3-4x the worst error measured on an H200 over the full matrix (check --json,
commit b320db9; worst rel-L2 / worst lse error):
  * fp32 on CUDA cores (naive, small_tile, large_tile) accumulates in fp32: 1.2e-6 / 6.9e-6.
  * tensorcore computes S from fp32 inputs in split fp16 (hi + lo), P and V in fp16: 3.0e-4 / 9.0e-6
    (commit 80cc65a). The lse bound (5e-5) is what catches a return to a single fp16 rounding of q and
    k, whose rel-L2 (4-7e-4) hides under the 1e-3 rel-L2 bound but whose lse error is ~1e-3.
  * fp16 / bf16 round P (tensorcore) and O to the input dtype: fp16 2.9e-4, bf16 2.4e-3 rel-L2
    (tensorcore; the CUDA-core kernels 2.3e-4 and 1.8e-3); lse ~1e-6 (computed in fp32).
  * the cpu backend (numpy, fp32 accumulation): 1.1e-6 / 3.4e-6 on fp32.
  * fp8 attention (q, k and v float8_e4m3fn; the rows keyed FP8 below, out in the case's dtype): every fp8
    kernel (FlashAttention-3's, cuDNN's, ours) feeds P V with P in e4m3 (2^-4 relative). That algorithm in
    otherwise exact arithmetic is 1.6-2.7 % rel-L2 on the gate's fp8 inputs (its yardstick, the check's
    naive_same_precision with p_dtype e4m3): the 2 % gate cannot hold for it, so its rows have their own,
    FP8_GATE_REL_L2, beside FlashAttention's rule against that yardstick. Hopper's fp8 MMA accumulates S
    with ~14 bits, so lse (from S) is bounded looser than from half-precision scores.
lse is float32 in every backend; its bound is an absolute error in natural-log units.
Any backend not named here (e.g. one injected by a test) gets the "*" row.
tests/test_check.py pins every value of this table: changing a bound is a visible diff there too.
"""

from __future__ import annotations

from typing import NamedTuple

from .. import hw4

GATE_REL_L2 = 0.02  # the project's gate: no backend may exceed 2 % rel-L2, whatever the table says
FP8 = "float8_e4m3fn"  # the bound key of fp8-attention rows (bound_key)
FP8_GATE_REL_L2 = 0.04  # fp8 attention's gate (module docstring: the exact fp8 algorithm is up to 2.7 %)


class Bound(NamedTuple):
    rel_l2: float  # rel-L2 of out vs the float64 reference
    lse: float  # max |lse - lse_ref| over rows that see at least one key


_HALF = {"float16": Bound(1e-3, 1e-4), "bfloat16": Bound(8e-3, 1e-4)}
_CUDA_CORE = {"float32": Bound(1e-5, 5e-5), **_HALF}
BOUNDS: dict[str, dict[str, Bound]] = {
    "tensorcore": {"float32": Bound(1e-3, 5e-5), **_HALF, FP8: Bound(4e-2, 1e-2)},
    "tensorcore_sm80": {"float32": Bound(1e-3, 5e-5), **_HALF},
    "large_tile": _CUDA_CORE,
    "small_tile": _CUDA_CORE,
    "naive": _CUDA_CORE,
    "cpu": {**_CUDA_CORE, FP8: _HALF["bfloat16"]},  # fp8: float32 on the dequantized inputs, rounded once
    "*": {"float32": Bound(1e-4, 1e-4), "float16": Bound(3e-3, 1e-2), "bfloat16": Bound(1.5e-2, 5e-2),
          FP8: Bound(4e-2, 5e-2)},
}
# FlashAttention's rule for half precision: err <= FA_RULE_FACTOR * err(naive_same_precision) + floor.
# The floor is one unit roundoff of the dtype (2^-11 fp16, 2^-8 bf16): the output itself has to be
# rounded to the dtype once, so a case where the same-precision naive computation happens to be exact
# (N = 1: out = v) must still leave room for that one rounding.
FA_RULE_FACTOR = 2.0
FA_RULE_FLOOR = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
# HW4's criterion (see cutlassfa.hw4): float32 inputs uniform in [-3, 3], max abs error of out <= 5e-3.
HW4_MAX_ABS = hw4.MAX_ABS_ERROR


def bound_key(dtype: str, fp8_attention: bool) -> str:
    """The key of a case's bound: FP8 for fp8 attention (whatever its output dtype), else its dtype."""
    return FP8 if fp8_attention else dtype


def bound_for(backend: str, dtype: str) -> Bound:
    """The (rel-L2, lse) bound of `backend` on `dtype` (a bound key), the "*" row's where it has none."""
    return BOUNDS.get(backend, {}).get(dtype) or BOUNDS["*"][dtype]


def rel_l2_limit(backend: str, dtype: str) -> float:
    """The rel-L2 a case of `backend` on `dtype` (a bound key) must stay within: its bound, never above the
    gate (2 %; FP8_GATE_REL_L2 for fp8 attention)."""
    return min(FP8_GATE_REL_L2 if dtype == FP8 else GATE_REL_L2, bound_for(backend, dtype).rel_l2)
