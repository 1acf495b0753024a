"""The gate's shape matrix, over every head dim of `cutlassfa.HEAD_DIMS`. (Nq, Nk) pairs cover N = 1,
ragged N (77, 257: not a multiple of any tile), tile-exact N (128), and Nq < Nk / Nq > Nk (the
bottom-right causal offset; with Nq > Nk the first Nq - Nk rows see no key). Heads (H, Hk): MHA and
GQA. HW4 cases: (B, N, d), float32, one head, 3-D arrays, non-causal, values uniform in [-3, 3].

The full matrix takes every (Nq, Nk) x heads for each dtype x head dim x causal; the quick one takes
QUICK_PER_MODE of them, rotating, so that every (dtype, head dim, mode) is still checked and every
(Nq, Nk) and heads pair still appears. `coverage_gaps` says which advertised (dtype, head dim, mode)
no case covers: the gate fails on any.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Sequence

from .._inputs import DTYPES, Case
from .support import Advertised

SEQLENS_FULL = ((1, 1), (77, 77), (128, 128), (257, 257), (1, 257), (77, 257), (257, 128))
HEADS_FULL = ((4, 4), (4, 1))
SEQLENS_QUICK = ((1, 77), (77, 77), (257, 128))
HEADS_QUICK = ((4, 4), (4, 2))
QUICK_PER_MODE = 4
BATCH = 2
HW4_FULL = ((4, 128, 32), (3, 77, 64), (2, 257, 64), (1, 1024, 128))
HW4_QUICK = ((4, 128, 32), (2, 257, 64))
MODES = ({"causal": False}, {"causal": True})


def head_dims() -> tuple[int, ...]:
    import cutlassfa

    return tuple(cutlassfa.HEAD_DIMS)


def build_cases(quick: bool = False, dtypes: Sequence[str] = DTYPES) -> list[Case]:
    """The check matrix (dtype x d x mode x (Nq, Nk) x heads), then the HW4 cases."""
    shapes = list(itertools.product(SEQLENS_QUICK if quick else SEQLENS_FULL, HEADS_QUICK if quick else HEADS_FULL))
    cases = []
    for index, (dt, d, mode) in enumerate(itertools.product(dtypes, head_dims(), MODES)):
        chosen = [shapes[(index + i) % len(shapes)] for i in range(QUICK_PER_MODE)] if quick else shapes
        cases += [Case(dt, BATCH, h, hk, nq, nk, d, mode["causal"]) for (nq, nk), (h, hk) in chosen]
    if "float32" in dtypes:
        cases += [Case("float32", b, 1, 1, n, n, d, False, hw4=True) for b, n, d in (HW4_QUICK if quick else HW4_FULL)]
    return cases


def coverage_gaps(name: str, advertises, cases: Iterable[Case], dtypes: Sequence[str]) -> list[str]:
    """The (dtype, head dim, mode) that backend `name` advertises and no case of `cases` covers."""
    covered = {(c.dtype, c.d, tuple(sorted(c.mode.items()))) for c in cases}
    gaps = []
    for dt, d, mode in itertools.product(dtypes, head_dims(), MODES):
        probe = Case(dt, 1, 1, 1, 1, 1, d, mode["causal"])
        claim: Advertised = advertises(probe)
        if claim and (dt, d, tuple(sorted(mode.items()))) not in covered:
            gaps.append(f"{name}: advertises {dt} d={d} {mode}, which no case of the matrix covers")
    return gaps
