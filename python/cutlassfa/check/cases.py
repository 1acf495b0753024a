"""The gate's shape matrix. (Nq, Nk) pairs cover N = 1, ragged N (77, 257: not a multiple of any tile),
tile-exact N (128), and Nq < Nk / Nq > Nk (the bottom-right causal offset; with Nq > Nk the first
Nq - Nk rows see no key). Heads (H, Hk): MHA and GQA. HW4 cases: (B, N, d), float32, one head, 3-D
arrays, non-causal, values uniform in [-3, 3]."""

from __future__ import annotations

from typing import Sequence

from .._inputs import DTYPES, Case

MATRIX_FULL = dict(
    head_dims=(32, 64, 128),
    seqlens=((1, 1), (77, 77), (128, 128), (257, 257), (1, 257), (77, 257), (257, 128)),
    heads=((4, 4), (4, 1)),
    batch=2,
)
MATRIX_QUICK = dict(
    head_dims=(32, 128),
    seqlens=((1, 77), (77, 77), (257, 128)),
    heads=((4, 4), (4, 2)),
    batch=2,
)
HW4_FULL = ((4, 128, 32), (3, 77, 64), (2, 257, 64), (1, 1024, 128))
HW4_QUICK = ((4, 128, 32), (2, 257, 64))


def build_cases(quick: bool = False, dtypes: Sequence[str] = DTYPES) -> list[Case]:
    """The check matrix (dtype x d x (Nq, Nk) x causal x heads), then the HW4 cases."""
    m = MATRIX_QUICK if quick else MATRIX_FULL
    cases = [
        Case(dt, m["batch"], h, hk, nq, nk, d, causal)
        for dt in dtypes
        for d in m["head_dims"]
        for nq, nk in m["seqlens"]
        for causal in (False, True)
        for h, hk in m["heads"]
    ]
    if "float32" in dtypes:
        cases += [Case("float32", b, 1, 1, n, n, d, False, hw4=True) for b, n, d in (HW4_QUICK if quick else HW4_FULL)]
    return cases
