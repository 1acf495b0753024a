"""The layout matrix, shared by the GPU tests and its CPU self-test: a forward function run on q, k, v
and `out=` in every layout of `cutlassfa._inputs.LAYOUTS` (compact BHND, a BNHD transposed view, a
padded window whose padding holds NaN), across dtype x head dim x causal x ragged N x GQA, compared
with the float64 reference under the gate's bounds. The padding around `out` must be left untouched,
and every element of `out` written."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from cutlassfa._inputs import LAYOUTS, Case, as_layout, case_values, to_numpy64
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, rel_l2

SHAPES = [(2, 4, 2, 77, 77), (1, 2, 2, 1, 1), (1, 4, 1, 130, 65), (1, 2, 2, 65, 190)]  # B, Hq, Hkv, Nq, Nk


def layout_failures(forward: Callable[..., Any], framework: str, backend: str, rng: np.random.Generator, *,
                    dtypes: Iterable[str], head_dims: Iterable[int], causals: Iterable[bool] = (False, True),
                    shapes: Iterable[tuple[int, int, int, int, int]] = SHAPES,
                    layouts: Iterable[str] = LAYOUTS) -> tuple[int, list[str]]:
    """Runs `forward(q, k, v, causal=, out=, return_lse=True)` over the matrix; returns (runs, one line
    per failed run). `backend` names the bounds that apply."""
    runs, failures = 0, []
    for dtype in dtypes:
        bound = bound_for(backend, dtype)
        for d in head_dims:
            for causal in causals:
                for b, hq, hk, nq, nk in shapes:
                    case = Case(dtype, b, hq, hk, nq, nk, d, causal)
                    q32, k32, v32 = case_values(case, rng)
                    ref, ref_lse = attention_reference(q32, k32, v32, causal=causal)
                    for layout in layouts:
                        runs += 1
                        why = _one(forward, framework, layout, case, (q32, k32, v32), ref, ref_lse, bound)
                        if why:
                            failures.append(f"{case.label} {layout}: {why}")
    return runs, failures


def _one(forward, framework, layout, case, values, ref, ref_lse, bound) -> str:
    q, k, v = (as_layout(x, case.dtype, framework, layout)[0] for x in values)
    unwritten = np.full(ref.shape, np.nan, np.float32)
    out, storage = as_layout(unwritten, case.dtype, framework, layout)
    result, lse = forward(q, k, v, causal=case.causal, out=out, return_lse=True)
    if result is not out:
        return "forward did not return the given out"
    got = to_numpy64(out)
    if np.isnan(got).any():
        return f"{int(np.isnan(got).sum())} elements of out not written (or NaN)"
    padding = int(np.isnan(to_numpy64(storage)).sum())
    if padding != int(np.prod(storage.shape)) - got.size:
        return "the padding around out was overwritten"
    err = rel_l2(got, ref)
    if not err <= bound.rel_l2:
        return f"rel-L2 {err:.3g} > {bound.rel_l2:g}"
    lse64 = to_numpy64(lse)
    seen = np.isfinite(ref_lse)
    lse_err = float(np.max(np.abs(lse64[seen] - ref_lse[seen]), initial=0.0))
    if not lse_err <= bound.lse:
        return f"lse max abs {lse_err:.3g} > {bound.lse:g}"
    if not np.all(lse64[~seen] == -np.inf) or not np.all(got[~np.isfinite(ref_lse)] == 0):
        return "rows that see no key must give out 0 and lse -inf"
    return ""
