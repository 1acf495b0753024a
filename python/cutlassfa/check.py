"""`cutlassfa check`: the accuracy gate.

Runs every available backend over a shape matrix (dtype x head dim x ragged N x Nq != Nk x causal x
GQA) on fresh random inputs and compares with the float64 reference
(:func:`cutlassfa.reference.attention_reference`, computed on the same *rounded* inputs the backend
saw, so input rounding is not counted as error). A case passes when

* rel-L2(out) <= min(2 %, BOUNDS[backend][dtype].rel_l2)            (2 % is the project's gate);
* max |lse - lse_ref| over rows that see a key <= BOUNDS[...].lse;
* float16 / bfloat16: rel-L2(out) <= 2 x rel-L2(naive_same_precision) + FA_RULE_FLOOR[dtype]
  (FlashAttention's own test rule: no worse than twice a computation done in the input dtype);
* HW4 cases (float32 inputs uniform in [-3, 3], (B, N, d) arrays): max |out - ref| <= 5e-3.

Exit code 0 when everything passes, 1 with a table of offenders otherwise, 2 on a usage error.
Backends are plain callables (:class:`Backend`), so tests can inject a broken one.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

# =====================================================================================================
# BOUNDS: the one table of per-(backend, dtype) limits, about 3-4x the worst error measured on an
# H200 over the full matrix (check --json, commit b320db9; worst rel-L2 / worst lse error):
#   * fp32 on CUDA cores (naive, small_tile, large_tile) accumulates in fp32: 1.2e-6 / 6.9e-6.
#   * tensorcore computes S from fp32 inputs in split fp16 (hi + lo), P and V in fp16: 3.0e-4 / 9.0e-6
#     (commit 80cc65a).
#   * fp16 / bf16 round P (tensorcore) and O to the input dtype: fp16 2.9e-4, bf16 2.4e-3 rel-L2
#     (tensorcore; the CUDA-core kernels 2.3e-4 and 1.8e-3); lse ~1e-6 (computed in fp32).
#   * the cpu backend (numpy, fp32 accumulation): 1.1e-6 / 3.4e-6 on fp32.
# lse is float32 in every backend; its bound is an absolute error in natural-log units.
# Any backend not named here (e.g. one injected by a test) gets the "*" row.
# =====================================================================================================
GATE_REL_L2 = 0.02  # the project's gate: no backend may exceed 2 % rel-L2, whatever the table says


class Bound(NamedTuple):
    rel_l2: float  # rel-L2 of out vs the float64 reference
    lse: float  # max |lse - lse_ref| over rows that see at least one key


_HALF = {"float16": Bound(1e-3, 1e-4), "bfloat16": Bound(8e-3, 1e-4)}
_CUDA_CORE = {"float32": Bound(1e-5, 5e-5), **_HALF}
BOUNDS: dict[str, dict[str, Bound]] = {
    "tensorcore": {"float32": Bound(1e-3, 5e-5), **_HALF},
    "tensorcore_sm80": {"float32": Bound(1e-3, 5e-5), **_HALF},
    "large_tile": _CUDA_CORE,
    "small_tile": _CUDA_CORE,
    "naive": _CUDA_CORE,
    "cpu": _CUDA_CORE,
    "*": {"float32": Bound(1e-4, 1e-4), "float16": Bound(3e-3, 1e-2), "bfloat16": Bound(1.5e-2, 5e-2)},
}
# FlashAttention's rule for half precision: err <= FA_RULE_FACTOR * err(naive_same_precision) + floor.
# The floor is one unit roundoff of the dtype (2^-11 fp16, 2^-8 bf16): the output itself has to be
# rounded to the dtype once, so a case where the same-precision naive computation happens to be exact
# (N = 1: out = v) must still leave room for that one rounding.
FA_RULE_FACTOR = 2.0
FA_RULE_FLOOR = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
# HW4's criterion: float32 inputs uniform in [-3, 3], max abs error of out <= 5e-3.
HW4_MAX_ABS = 5e-3
HW4_RANGE = 3.0

DTYPES = ("float32", "float16", "bfloat16")
BACKEND_ORDER = ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive", "cpu")

# ---------------------------------------------------------------------------------------------------
# The shape matrix. (Nq, Nk) pairs cover N = 1, ragged N (77, 257: not a multiple of any tile),
# tile-exact N (128), and Nq < Nk / Nq > Nk (the bottom-right causal offset; with Nq > Nk the first
# Nq - Nk rows see no key). Heads (H, Hk): MHA and GQA.
# ---------------------------------------------------------------------------------------------------
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
# HW4 cases: (B, N, d), float32, one head, 3-D arrays, non-causal.
HW4_FULL = ((4, 128, 32), (3, 77, 64), (2, 257, 64), (1, 1024, 128))
HW4_QUICK = ((4, 128, 32), (2, 257, 64))


@dataclass(frozen=True)
class Case:
    """One input configuration. `hw4` cases use (B, N, d) arrays with values uniform in [-3, 3]."""

    dtype: str
    B: int
    H: int
    Hk: int
    Nq: int
    Nk: int
    d: int
    causal: bool
    hw4: bool = False

    @property
    def label(self) -> str:
        heads = f"H{self.H}" if self.H == self.Hk else f"H{self.H}/{self.Hk}"
        tag = " hw4" if self.hw4 else ""
        return f"{self.dtype} B{self.B} {heads} {self.Nq}x{self.Nk} d{self.d}{' causal' if self.causal else ''}{tag}"


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


# ---------------------------------------------------------------------------------------------------
# Arrays: numpy on the host, torch / cupy on the GPU. Shared with bench.py.
# ---------------------------------------------------------------------------------------------------
class Unsupported(Exception):
    """A backend (or the array framework) cannot run this configuration: reported, not a failure."""


def numpy_dtype(dtype: str) -> np.dtype:
    """numpy dtype for a dtype name; bfloat16 needs ml_dtypes (raises Unsupported without it)."""
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise Unsupported("bfloat16 numpy arrays need the ml_dtypes package") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded (nearest even) to `dtype`, returned as float32. bf16 by bit arithmetic, so the
    reference values never depend on ml_dtypes being installed."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def torch_dtype(dtype: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def to_framework(x32: np.ndarray, dtype: str, framework: str) -> Any:
    """Host float32 values (already rounded to `dtype`) as a `framework` array of `dtype`."""
    if framework == "numpy":
        return x32.astype(numpy_dtype(dtype))
    if framework == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(x32)).to(device="cuda", dtype=torch_dtype(dtype))
    if framework == "cupy":
        if dtype == "bfloat16":
            raise Unsupported("CuPy has no bfloat16 arrays")
        import cupy

        return cupy.asarray(x32.astype(dtype))
    raise ValueError(f"unknown array framework {framework!r}")


def to_numpy64(x: Any) -> np.ndarray:
    """Any supported array (numpy, torch, cupy, jax; any of the three dtypes) as float64 numpy."""
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        import torch

        return x.detach().to(torch.float32).cpu().numpy().astype(np.float64)
    if module == "cupy":
        return x.get().astype(np.float64)
    return np.asarray(x).astype(np.float64)


def gpu_framework() -> str:
    """Framework for GPU inputs: torch (CUDA) when importable, else numpy host arrays."""
    try:
        import torch

        if torch.cuda.is_available():
            return "torch"
    except ImportError:
        pass
    return "numpy"


def classify_error(error: BaseException, *, anchor: bool = False) -> str:
    """'unsupported' for a backend refusing a configuration, else 'error'. cutlassfa's own backends
    support every configuration of the matrix, so for them only a missing optional package
    (`Unsupported`) counts; an anchor (PyTorch SDPA) may also refuse with an error saying so."""
    if isinstance(error, (Unsupported, NotImplementedError)):
        return "unsupported"
    message = str(error).lower()
    if anchor and isinstance(error, (ValueError, TypeError, RuntimeError)) and (
        "not supported" in message or "no available kernel" in message
    ):
        return "unsupported"
    return "error"


def first_line(error: BaseException, limit: int = 120) -> str:
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------------
# Backends as callables.
# ---------------------------------------------------------------------------------------------------
ForwardFn = Callable[..., Any]  # fn(q, k, v, *, causal, softmax_scale) -> (out, lse) or out


@dataclass
class Backend:
    """A backend under test. `fn(q, k, v, *, causal, softmax_scale)` returns (out, lse) or out;
    `framework` is the array type it is fed ("numpy", "torch", "cupy")."""

    name: str
    fn: ForwardFn
    framework: str = "numpy"


def public_backend(name: str, framework: str) -> Backend:
    """A backend that goes through the public :func:`cutlassfa.forward`."""

    def fn(q: Any, k: Any, v: Any, *, causal: bool, softmax_scale: float | None) -> Any:
        import cutlassfa

        return cutlassfa.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=name,
                                 return_lse=True)

    return Backend(name, fn, framework)


def available_backends() -> tuple[list[str], dict[str, str]]:
    """(available names in BACKEND_ORDER, {unavailable name: reason}) from cutlassfa.backends()."""
    import cutlassfa

    table = cutlassfa.backends()
    order = [n for n in BACKEND_ORDER if n in table] + [n for n in table if n not in BACKEND_ORDER]
    available = [n for n in order if table[n].available]
    return available, {n: table[n].reason for n in order if not table[n].available}


def resolve_backends(names: Sequence[str] | None, inputs: str = "auto") -> tuple[list[Backend], dict[str, str]]:
    """Backends to gate: the named ones (all must be available) or every available one."""
    available, unavailable = available_backends()
    if names:
        missing = [n for n in names if n not in available]
        if missing:
            why = "; ".join(f"{n}: {unavailable.get(n, 'unknown backend')}" for n in missing)
            raise SystemExit(f"cutlassfa check: backend not available ({why})")
        available = list(names)
    gpu = gpu_framework() if inputs == "auto" else inputs
    return [public_backend(n, "numpy" if n == "cpu" else gpu) for n in available], unavailable


# ---------------------------------------------------------------------------------------------------
# The gate.
# ---------------------------------------------------------------------------------------------------
@dataclass
class Result:
    backend: str
    case: Case
    status: str  # "pass", "fail", "unsupported", "error"
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
        row.update(asdict(self.case))
        return row


@dataclass
class _Inputs:
    """One case's inputs: float32 host values rounded to the dtype, and the float64 reference."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    ref_out: np.ndarray
    ref_lse: np.ndarray
    naive_err: float | None


def make_inputs(case: Case, seed: int, index: int) -> _Inputs:
    """Reproducible per (seed, case index): `--seed S` replays a run exactly."""
    from cutlassfa import reference

    rng = np.random.default_rng([seed, index])
    if case.hw4:
        shapes = [(case.B, case.Nq, case.d), (case.B, case.Nk, case.d), (case.B, case.Nk, case.d)]
        q, k, v = (round_to(rng.uniform(-HW4_RANGE, HW4_RANGE, s), case.dtype) for s in shapes)
    else:
        shapes = [(case.B, case.H, case.Nq, case.d)] + [(case.B, case.Hk, case.Nk, case.d)] * 2
        q, k, v = (round_to(rng.standard_normal(s), case.dtype) for s in shapes)
    ref_out, ref_lse = reference.attention_reference(q, k, v, causal=case.causal)
    naive_err = None
    if case.dtype in FA_RULE_FLOOR:
        naive = reference.naive_same_precision(q, k, v, numpy_dtype(case.dtype), causal=case.causal)
        naive_err = reference.rel_l2(naive, ref_out)
    return _Inputs(q, k, v, ref_out, ref_lse, naive_err)


def bound_for(backend: str, dtype: str) -> Bound:
    return BOUNDS.get(backend, BOUNDS["*"])[dtype]


def evaluate(backend: Backend, case: Case, inputs: _Inputs) -> Result:
    """Runs one backend on one case and applies every rule."""
    from cutlassfa import reference

    try:
        q, k, v = (to_framework(x, case.dtype, backend.framework) for x in (inputs.q, inputs.k, inputs.v))
        result = backend.fn(q, k, v, causal=case.causal, softmax_scale=None)
    except Exception as error:  # a backend refusing or crashing is reported, never fatal
        return Result(backend.name, case, classify_error(error), reasons=[first_line(error)])
    out, lse = result if isinstance(result, tuple) else (result, None)

    bound = bound_for(backend.name, case.dtype)
    r = Result(backend.name, case, "pass", rel_bound=min(GATE_REL_L2, bound.rel_l2))
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
        diff = np.abs(out64 - inputs.ref_out)
    r.max_abs = float(np.max(diff)) if diff.size and not np.isnan(diff).any() else (0.0 if not diff.size else math.inf)
    if case.hw4 and not r.max_abs <= HW4_MAX_ABS:
        r.reasons.append(f"HW4 max abs {r.max_abs:.3g} > {HW4_MAX_ABS:g}")
    if inputs.naive_err is not None:
        r.naive_err = inputs.naive_err
        r.fa_limit = FA_RULE_FACTOR * inputs.naive_err + FA_RULE_FLOOR[case.dtype]
        if not r.rel_err <= r.fa_limit:
            r.reasons.append(f"rel-L2 {r.rel_err:.3g} > 2x naive same-precision + floor = {r.fa_limit:.3g}")
    if lse is not None:
        lse64 = to_numpy64(lse)
        if lse64.size != inputs.ref_lse.size:
            r.reasons.append(f"lse shape {lse64.shape} != {inputs.ref_lse.shape}")
        else:
            lse64 = lse64.reshape(inputs.ref_lse.shape)
            seen = np.isfinite(inputs.ref_lse)
            with np.errstate(invalid="ignore"):
                errs = np.abs(lse64[seen] - inputs.ref_lse[seen])
            r.lse_err = float(errs.max()) if errs.size and not np.isnan(errs).any() else (0.0 if not errs.size else math.inf)
            if not r.lse_err <= bound.lse:
                r.reasons.append(f"lse max abs {r.lse_err:.3g} > {bound.lse:g}")
            if not np.all(lse64[~seen] == -np.inf):
                r.reasons.append("lse of rows that see no key is not -inf")
    if r.reasons:
        r.status = "fail"
    return r


def run_check(backends: Sequence[Backend], cases: Sequence[Case], seed: int,
              progress: Callable[[int, int, str], None] | None = None) -> list[Result]:
    """Every backend on every case; inputs and the reference are made once per case."""
    results = []
    for index, case in enumerate(cases):
        if progress:
            progress(index, len(cases), case.label)
        try:
            inputs = make_inputs(case, seed, index)
        except Unsupported as error:  # e.g. bfloat16 without ml_dtypes
            results += [Result(b.name, case, "unsupported", reasons=[str(error)]) for b in backends]
            continue
        results += [evaluate(b, case, inputs) for b in backends]
    if progress:
        progress(len(cases), len(cases), "done")
    return results


# ---------------------------------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------------------------------
def _fmt(x: float | None, spec: str = ".2e") -> str:
    return "-" if x is None else format(x, spec)


def format_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-markdown table with padded columns."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def summary_table(results: Sequence[Result]) -> str:
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.backend, r.case.dtype), []).append(r)
    rows = []
    for (backend, dtype), rs in groups.items():
        errs = [r.rel_err for r in rs if r.rel_err is not None]
        lses = [r.lse_err for r in rs if r.lse_err is not None]
        ratios = [r.rel_err / r.naive_err for r in rs if r.rel_err is not None and r.naive_err]
        hw4 = [r.max_abs for r in rs if r.case.hw4 and r.max_abs is not None]
        count = lambda s: sum(r.status == s for r in rs)  # noqa: E731
        bound = bound_for(backend, dtype)
        rows.append([backend, dtype, len(rs), count("pass"), count("fail") + count("error"), count("unsupported"),
                     _fmt(max(errs, default=None)), _fmt(min(GATE_REL_L2, bound.rel_l2)),
                     _fmt(max(lses, default=None)), _fmt(max(ratios, default=None), ".2f"),
                     _fmt(max(hw4, default=None))])
    return format_table(["backend", "dtype", "cases", "pass", "fail", "unsupported", "worst rel-L2", "bound",
                         "worst lse err", "worst err/naive", "HW4 max abs"], rows)


def offenders_table(results: Sequence[Result]) -> str:
    rows = [[r.backend, r.case.label, r.status, _fmt(r.rel_err), _fmt(r.rel_bound), "; ".join(r.reasons)]
            for r in results if r.status in ("fail", "error")]
    return format_table(["backend", "case", "status", "rel-L2", "bound", "why"], rows)


def _progress_printer(stream: Any) -> Callable[[int, int, str], None]:
    tty = hasattr(stream, "isatty") and stream.isatty()

    def show(done: int, total: int, label: str) -> None:
        if not tty:
            return
        width = 30
        filled = width * done // max(total, 1)
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label[:50]:<50}")
        if done == total:
            stream.write("\n")
        stream.flush()

    return show


# ---------------------------------------------------------------------------------------------------
# CLI.
# ---------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cutlassfa check`."""
    parser.add_argument("--backends", type=lambda s: [x for x in s.split(",") if x],
                        help="comma-separated backends to gate (default: every available one)")
    parser.add_argument("--dtypes", type=lambda s: [x for x in s.split(",") if x], default=list(DTYPES),
                        help="comma-separated dtypes (default: float32,float16,bfloat16)")
    parser.add_argument("--quick", action="store_true", help="a small matrix (seconds; what CI runs)")
    parser.add_argument("--seed", type=int, default=None, help="input seed (default: fresh, printed)")
    parser.add_argument("--inputs", choices=("auto", "numpy", "torch", "cupy"), default="auto",
                        help="array type fed to GPU backends (auto: torch CUDA tensors if torch is "
                             "importable, else numpy host arrays); cpu always gets numpy")
    parser.add_argument("--json", metavar="PATH", help="write every case's result as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    """Runs the gate; returns 0 (pass), 1 (an offender) or 2 (usage error)."""
    bad = [d for d in args.dtypes if d not in DTYPES]
    if bad:
        print(f"cutlassfa check: unknown dtype(s) {bad}; choose from {list(DTYPES)}", file=sys.stderr)
        return 2
    try:
        backends, unavailable = resolve_backends(args.backends, args.inputs)
    except SystemExit as error:
        print(error, file=sys.stderr)
        return 2
    if not backends:
        print("cutlassfa check: no backend available: "
              + "; ".join(f"{n}: {why}" for n, why in unavailable.items()), file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else secrets.randbits(31)
    cases = build_cases(args.quick, args.dtypes)
    print(f"cutlassfa check: seed {seed} (replay with --seed {seed}); {len(cases)} cases x "
          f"{len(backends)} backends: " + ", ".join(f"{b.name} ({b.framework} inputs)" for b in backends))
    for name, why in unavailable.items():
        print(f"  not available: {name}: {why}")
    start = time.perf_counter()
    results = run_check(backends, cases, seed, None if args.no_progress else _progress_printer(sys.stderr))
    return report(results, seed=seed, elapsed=time.perf_counter() - start, json_path=args.json,
                  unavailable=unavailable)


def report(results: Sequence[Result], *, seed: int, elapsed: float = 0.0, json_path: str | None = None,
           unavailable: Mapping[str, str] | None = None) -> int:
    """Prints the summary (and offenders); writes JSON; returns the exit code."""
    offenders = [r for r in results if r.status in ("fail", "error")]
    print()
    print(summary_table(results))
    unsupported = [r for r in results if r.status == "unsupported"]
    if unsupported:
        reasons = sorted({f"{r.backend} {r.case.dtype}: {r.reasons[0] if r.reasons else ''}" for r in unsupported})
        print("\nunsupported (not counted as failures):\n  " + "\n  ".join(reasons[:20]))
    if json_path:
        doc = {"seed": seed, "passed": not offenders, "gate_rel_l2": GATE_REL_L2,
               "bounds": {b: {dt: bd._asdict() for dt, bd in row.items()} for b, row in BOUNDS.items()},
               "hw4_max_abs": HW4_MAX_ABS, "fa_rule": {"factor": FA_RULE_FACTOR, "floor": FA_RULE_FLOOR},
               "unavailable": dict(unavailable or {}), "results": [r.to_json() for r in results]}
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1, default=float)
    if offenders:
        print(f"\nFAILED: {len(offenders)} of {len(results)} cases (seed {seed}):")
        print(offenders_table(offenders))
        return 1
    print(f"\nPASSED: {len(results)} cases in {elapsed:.1f} s (seed {seed})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cutlassfa check", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
