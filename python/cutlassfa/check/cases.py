"""The gate's matrix: plain cases over every head dim of `cutlassfa.HEAD_DIMS`, plain cases on padded
head dims, HW4 cases, and the variant cases (windows, softcap, KV caches, varlen: see `variants`).

(Nq, Nk) pairs cover N = 1, ragged N (77, 257: not a multiple of any tile), tile-exact N (128), and
Nq < Nk / Nq > Nk (the bottom-right causal offset; with Nq > Nk the first Nq - Nk rows see no key).
Heads (H, Hk): MHA and GQA. HW4 cases: (B, N, d), float32, one head, 3-D arrays, non-causal, values
uniform in [-3, 3].

The full matrix takes every (Nq, Nk) x heads for each dtype x head dim x causal, and PADDED_PER_MODE
of them for each dtype x padded head dim x causal; the quick one takes QUICK_PER_MODE of them per
compiled head dim, rotating, so that every (dtype, head dim, mode) is still checked and every (Nq, Nk)
and heads pair still appears, and each (dtype, padded head dim) once. `coverage_gaps` says which
advertised configuration (dtype x compiled head dim x causal, dtype x padded head dim, dtype x variant)
no advertised case covers: the gate fails on any.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Sequence

from .._inputs import DTYPES, Case
from .support import Advertised
from .variants import SPECS, padded_head_dims, probes, takes, variant_cases

SEQLENS_FULL = ((1, 1), (77, 77), (128, 128), (257, 257), (1, 257), (77, 257), (257, 128))
HEADS_FULL = ((4, 4), (4, 1))
SEQLENS_QUICK = ((1, 77), (77, 77), (257, 128))
HEADS_QUICK = ((4, 4), (4, 2))
QUICK_PER_MODE = 4
PADDED_PER_MODE = 3
BATCH = 2
HW4_FULL = ((4, 128, 32), (3, 77, 64), (2, 257, 64), (1, 1024, 128))
HW4_QUICK = ((4, 128, 32), (2, 257, 64))
MODES = ({"causal": False}, {"causal": True})


def head_dims() -> tuple[int, ...]:
    import cutlassfa

    return tuple(cutlassfa.HEAD_DIMS)


def _shapes(quick: bool) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    return list(itertools.product(SEQLENS_QUICK if quick else SEQLENS_FULL, HEADS_QUICK if quick else HEADS_FULL))


def build_cases(quick: bool = False, dtypes: Sequence[str] = DTYPES) -> list[Case]:
    """The check matrix (dtype x d x mode x (Nq, Nk) x heads), the HW4 cases, the padded head dims,
    then the variant cases."""
    shapes = _shapes(quick)
    cases = []
    for index, (dt, d, mode) in enumerate(itertools.product(dtypes, head_dims(), MODES)):
        chosen = [shapes[(index + i) % len(shapes)] for i in range(QUICK_PER_MODE)] if quick else shapes
        cases += [Case(dt, BATCH, h, hk, nq, nk, d, mode["causal"]) for (nq, nk), (h, hk) in chosen]
    if "float32" in dtypes:
        cases += [Case("float32", b, 1, 1, n, n, d, False, hw4=True) for b, n, d in (HW4_QUICK if quick else HW4_FULL)]
    return cases + padded_cases(quick, dtypes) + variant_cases(quick, dtypes)


def padded_cases(quick: bool, dtypes: Sequence[str]) -> list[Case]:
    """Plain cases on the padded head dims: each (dtype, d) once, causal in turn (quick), or
    PADDED_PER_MODE shapes per (dtype, d, causal) (full)."""
    shapes = _shapes(quick)
    cases = []
    for index, (dt, d) in enumerate(itertools.product(dtypes, padded_head_dims())):
        if quick:
            (nq, nk), (h, hk) = shapes[index % len(shapes)]
            cases.append(Case(dt, BATCH, h, hk, nq, nk, d, bool(index % 2)))
            continue
        for j, mode in enumerate(MODES):
            start = (index * len(MODES) + j) * PADDED_PER_MODE  # consecutive shapes, in turn
            for (nq, nk), (h, hk) in (shapes[(start + i) % len(shapes)] for i in range(PADDED_PER_MODE)):
                cases.append(Case(dt, BATCH, h, hk, nq, nk, d, mode["causal"]))
    return cases


def group(case: Case) -> str:
    """What a case checks, for the report: its variant's name, "padded head dim", "hw4" or "plain"."""
    if case.variant is not None:
        return case.variant.name
    if case.hw4:
        return "hw4"
    return "plain" if case.d in head_dims() else "padded head dim"


def coverage_key(case: Case) -> tuple[Any, ...]:
    """The configuration a case covers: (dtype, variant), (dtype, compiled d, causal) or (dtype, padded d)."""
    if case.variant is not None:
        return ("variant", case.dtype, case.variant.name)
    if case.d in head_dims():
        return ("head dim", case.dtype, case.d, case.causal)
    return ("padded", case.dtype, case.d)


def configurations(dtypes: Sequence[str]) -> list[tuple[tuple[Any, ...], str, list[Case]]]:
    """Every configuration the gate must cover where a backend advertises it: (key, description,
    probe cases: the configuration is advertised when one of them is)."""
    configs = []
    for dt, d, mode in itertools.product(dtypes, head_dims(), MODES):
        configs.append((("head dim", dt, d, mode["causal"]), f"{dt} d={d} {mode}",
                        [Case(dt, 1, 1, 1, 1, 1, d, mode["causal"])]))
    for dt, d in itertools.product(dtypes, padded_head_dims()):
        configs.append((("padded", dt, d), f"{dt} d={d} (zero-padded)",
                        [Case(dt, 1, 1, 1, 1, 1, d, causal) for causal in (False, True)]))
    for dt, spec in itertools.product(dtypes, SPECS):
        if not takes(spec, dt):
            continue
        found = probes(dt, spec)
        configs.append((("variant", dt, spec.variant.name), f"{dt} {spec.variant.name} {found[0].mode}", found))
    return configs


def coverage_gaps(name: str, advertises: Callable[[Case], Advertised], cases: Iterable[Case],
                  dtypes: Sequence[str]) -> list[str]:
    """The configurations that backend `name` advertises and no case of `cases` that it advertises covers."""
    covered = {coverage_key(c) for c in cases if advertises(c)}
    return [f"{name}: advertises {text}, which no case of the matrix covers"
            for key, text, found in configurations(dtypes)
            if key not in covered and any(advertises(probe) for probe in found)]
