"""One backend on one case, judged by every rule; and the run over the whole matrix.

A case passes when
* rel-L2(out) <= min(2 %, BOUNDS[backend][dtype].rel_l2);
* max |lse - lse_ref| over rows that see a key <= BOUNDS[...].lse, and rows that see no key are -inf;
* float16 / bfloat16: rel-L2(out) <= 2 x rel-L2(naive_same_precision) + FA_RULE_FLOOR[dtype]
  (FlashAttention's own test rule: no worse than twice a computation done in the input dtype; for fp8
  attention the yardstick rounds P to e4m3, and the bound and gate are its own: bounds.py, FP8);
* HW4 cases: max |out - ref| <= 5e-3.
The reference is :func:`cutlassfa.reference.attention_reference` (kvcache_reference, varlen_reference
for those variants) in float64 on the same *rounded* inputs the backend saw, so input rounding is not
counted as error.

Statuses: `pass`; `fail` (a rule broken, or the backend refused a case it advertises); `error` (it
raised); `unchecked` (it advertises the case but the harness cannot build its inputs here, e.g.
bfloat16 numpy arrays without ml_dtypes, or CuPy inputs, which have no bfloat16); `not advertised` (not run: the backend does not claim the
case).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .._inputs import Case, Unsupported, case_values, classify_error, numpy_dtype, to_framework, to_numpy64
from .._text import first_line
from .backends import Backend
from .bounds import FA_RULE_FACTOR, FA_RULE_FLOOR, HW4_MAX_ABS, bound_for, bound_key, rel_l2_limit
from .variant_inputs import index_to_framework, variant_inputs

CHECKED = ("pass", "fail", "error")  # statuses of a case that was run
NOT_ADVERTISED = "not advertised"


@dataclass
class Result:
    backend: str
    case: Case
    status: str  # "pass", "fail", "error", "unchecked", "not advertised"
    rel_err: float | None = None
    rel_bound: float | None = None
    max_abs: float | None = None
    lse_err: float | None = None
    naive_err: float | None = None
    fa_limit: float | None = None
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        # JSON has no inf / NaN: those become null (the reasons say what was wrong).
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
               for k, v in asdict(self).items() if k != "case"}
        row.update(asdict(self.case))  # variant: its fields, or None for a plain case
        row.update(variant_name=self.case.variant_name, label=self.case.label,
                   mode={k: list(v) if isinstance(v, tuple) else v for k, v in self.case.mode.items()})
        return row


@dataclass
class CaseInputs:
    """One case's inputs: float32 host values rounded to the dtype, and the float64 reference. Variant
    cases add float arrays (k_new, v_new), int32 index arrays and scalar options, passed to the backend
    as keyword arguments of `forward` / `varlen_forward`."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    ref_out: np.ndarray
    ref_lse: np.ndarray
    naive_err: float | None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    index: dict[str, np.ndarray] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    kv_dtype: str | None = None  # of k, v, k_new and v_new when not the case's (an fp8 cache)


def make_inputs(case: Case, seed: int, index: int) -> CaseInputs:
    """Reproducible per (seed, case index): `--seed S` replays a run exactly. Raises Unsupported when
    the half-precision yardstick cannot be computed here (bfloat16 without ml_dtypes)."""
    from cutlassfa import reference

    rng = np.random.default_rng([seed, index])
    if case.variant is not None:
        made = variant_inputs(case, rng)
        naive_err = None if made.naive is None else reference.rel_l2(made.naive, made.ref_out)
        return CaseInputs(made.q, made.k, made.v, made.ref_out, made.ref_lse, naive_err, made.arrays, made.index,
                          made.options, made.kv_dtype)
    q, k, v = case_values(case, rng)
    ref_out, ref_lse = reference.attention_reference(q, k, v, causal=case.causal)
    naive_err = None
    if case.dtype in FA_RULE_FLOOR:
        naive = reference.naive_same_precision(q, k, v, numpy_dtype(case.dtype), causal=case.causal)
        naive_err = reference.rel_l2(naive, ref_out)
    return CaseInputs(q, k, v, ref_out, ref_lse, naive_err)


def _max_abs(diff: np.ndarray) -> float:
    if not diff.size:
        return 0.0
    return math.inf if np.isnan(diff).any() else float(np.max(diff))


def evaluate(backend: Backend, case: Case, inputs: CaseInputs) -> Result:
    """Runs one backend on one case it advertises and applies every rule."""
    from cutlassfa import reference

    fw = backend.framework
    try:
        kv_dtype = inputs.kv_dtype or case.dtype
        q = to_framework(inputs.q, case.q_dtype, fw)
        k, v = (to_framework(x, kv_dtype, fw) for x in (inputs.k, inputs.v))
        # Descales in float32, as users pass them; k_new / v_new in the cache's dtype; the rest in the case's.
        extra = {name: to_framework(x, "float32" if name.endswith("descale") else
                                    kv_dtype if name in ("k_new", "v_new") else case.dtype, fw)
                 for name, x in inputs.arrays.items()}
    except Unsupported as error:  # the harness cannot feed this backend this dtype here
        return Result(backend.name, case, "unchecked", reasons=[str(error)])
    extra.update({name: index_to_framework(x, fw) for name, x in inputs.index.items()}, **inputs.options)
    try:
        result = backend.fn(q, k, v, causal=case.causal, softmax_scale=None, **extra)
    except Exception as error:  # a backend refusing or crashing is reported, never fatal
        if classify_error(error) == "unsupported":
            return Result(backend.name, case, "fail", reasons=[f"refused a case it advertises: {first_line(error)}"])
        return Result(backend.name, case, "error", reasons=[first_line(error)])
    out, lse = result if isinstance(result, tuple) else (result, None)

    key = bound_key(case.dtype, case.variant is not None and case.variant.fp8)
    bound = bound_for(backend.name, key)
    r = Result(backend.name, case, "pass", rel_bound=rel_l2_limit(backend.name, key))
    out64 = to_numpy64(out)
    if out64.shape != inputs.ref_out.shape:
        r.status, r.reasons = "fail", [f"out shape {out64.shape} != {inputs.ref_out.shape}"]
        return r
    out_dtype = getattr(out, "dtype", None)
    if out_dtype is not None and not str(out_dtype).endswith(case.dtype):
        r.reasons.append(f"out dtype {out_dtype} != {case.dtype}")

    r.rel_err = reference.rel_l2(out64, inputs.ref_out)
    if not r.rel_err <= r.rel_bound:  # `not <=` also catches NaN
        r.reasons.append(f"rel-L2 {r.rel_err:.3g} > {r.rel_bound:.3g}")
    with np.errstate(invalid="ignore"):
        r.max_abs = _max_abs(np.abs(out64 - inputs.ref_out))
    if case.hw4 and not r.max_abs <= HW4_MAX_ABS:
        r.reasons.append(f"HW4 max abs {r.max_abs:.3g} > {HW4_MAX_ABS:g}")
    if inputs.naive_err is not None:
        r.naive_err = inputs.naive_err
        r.fa_limit = FA_RULE_FACTOR * inputs.naive_err + FA_RULE_FLOOR[case.dtype]
        if not r.rel_err <= r.fa_limit:
            r.reasons.append(f"rel-L2 {r.rel_err:.3g} > 2x naive same-precision + floor = {r.fa_limit:.3g}")
    if lse is None:
        r.reasons.append("no lse returned")
    else:
        _check_lse(r, to_numpy64(lse), inputs.ref_lse, bound.lse)
    if r.reasons:
        r.status = "fail"
    return r


def _check_lse(r: Result, lse64: np.ndarray, ref_lse: np.ndarray, limit: float) -> None:
    if lse64.size != ref_lse.size:
        r.reasons.append(f"lse shape {lse64.shape} != {ref_lse.shape}")
        return
    lse64 = lse64.reshape(ref_lse.shape)
    seen = np.isfinite(ref_lse)
    with np.errstate(invalid="ignore"):
        r.lse_err = _max_abs(np.abs(lse64[seen] - ref_lse[seen]))
    if not r.lse_err <= limit:
        r.reasons.append(f"lse max abs {r.lse_err:.3g} > {limit:g}")
    if not np.all(lse64[~seen] == -np.inf):
        r.reasons.append("lse of rows that see no key is not -inf")


def run_check(backends: Sequence[Backend], cases: Sequence[Case], seed: int,
              progress: Callable[[int, int, str], None] | None = None) -> list[Result]:
    """Every backend on every case it advertises; inputs and the reference are made once per case."""
    results = []
    for index, case in enumerate(cases):
        if progress:
            progress(index, len(cases), case.label)
        claims = {b.name: b.advertises(case) for b in backends}
        takers = [b for b in backends if claims[b.name]]
        results += [Result(b.name, case, NOT_ADVERTISED, reasons=[claims[b.name].reason])
                    for b in backends if not claims[b.name]]
        if not takers:
            continue
        try:
            inputs = make_inputs(case, seed, index)
        except Unsupported as error:  # e.g. bfloat16 without ml_dtypes
            results += [Result(b.name, case, "unchecked", reasons=[str(error)]) for b in takers]
            continue
        results += [evaluate(b, case, inputs) for b in takers]
    if progress:
        progress(len(cases), len(cases), "done")
    return results
