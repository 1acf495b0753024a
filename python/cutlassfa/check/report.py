"""The gate's verdict and what it prints and writes.

The gate passes only when every case it ran passed, every advertised case was run, every backend it
gates checked at least one case, and no backend that must run (CUTLASSFA_REQUIRE_GPU=1) was missing.
The report says how many cases each backend checked (per dtype, and per variant: plain, padded head
dim, hw4, each window / softcap / KV-cache / varlen mode), and why any advertised case was not.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, Sequence

from .._text import format_table
from .bounds import (BOUNDS, FA_RULE_FACTOR, FA_RULE_FLOOR, FP8_GATE_REL_L2, GATE_REL_L2, HW4_MAX_ABS, bound_key,
                     rel_l2_limit)
from .cases import group
from .evaluate import CHECKED, NOT_ADVERTISED, Result

# /3: each result also holds its variant (the Variant's fields, or null), variant_name, label and the
# mode `cutlassfa.supports` was asked with; the document holds checked_per_variant.
SCHEMA = "cutlassfa-check/3"


def _fmt(x: float | None, spec: str = ".2e") -> str:
    return "-" if x is None else format(x, spec)


def counts(results: Iterable[Result]) -> dict[str, dict[str, int]]:
    """backend -> {checked, pass, fail, error, unchecked, not advertised}."""
    table: dict[str, Counter] = {}
    for r in results:
        table.setdefault(r.backend, Counter())[r.status] += 1
    out = {}
    for backend, c in table.items():
        out[backend] = {"checked": sum(c[s] for s in CHECKED),
                        **{s: c[s] for s in (*CHECKED, "unchecked", NOT_ADVERTISED)}}
    return out


def problems(results: Sequence[Result], backends: Sequence[str], required: Mapping[str, str],
             gaps: Sequence[str] = ()) -> list[str]:
    """Why the gate fails, one line each, beyond the offending cases (which offenders_table lists)."""
    lines = [f"{name}: cannot run, and CUTLASSFA_REQUIRE_GPU=1 requires it: {why}" for name, why in required.items()]
    lines += list(gaps)
    unchecked = Counter((r.backend, r.reasons[0] if r.reasons else "") for r in results if r.status == "unchecked")
    for (backend, why), n in unchecked.items():
        hint = "" if "--inputs" in why else " (--dtypes leaves a dtype out)"
        lines.append(f"{backend}: {n} advertised cases not checked: {why}{hint}")
    per_backend = counts(results)
    for name in backends:
        if per_backend.get(name, {}).get("checked", 0) == 0:
            lines.append(f"{name}: 0 cases checked")
    offenders = sum(r.status in ("fail", "error") for r in results)
    if offenders:
        lines.append(f"{offenders} cases out of bounds or failing (table above)")
    return lines


def summary_table(results: Sequence[Result]) -> str:
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:  # fp8 attention's rows apart (their own bound)
        fp8 = r.case.variant is not None and r.case.variant.fp8
        groups.setdefault((r.backend, bound_key(r.case.dtype, fp8)), []).append(r)
    rows = []
    for (backend, dtype), rs in groups.items():
        errs = [r.rel_err for r in rs if r.rel_err is not None]
        lses = [r.lse_err for r in rs if r.lse_err is not None]
        ratios = [r.rel_err / r.naive_err for r in rs if r.rel_err is not None and r.naive_err]
        hw4 = [r.max_abs for r in rs if r.case.hw4 and r.max_abs is not None]
        n = Counter(r.status for r in rs)
        rows.append([backend, dtype, sum(n[s] for s in CHECKED), n["pass"], n["fail"] + n["error"], n["unchecked"],
                     n[NOT_ADVERTISED], _fmt(max(errs, default=None)), _fmt(rel_l2_limit(backend, dtype)),
                     _fmt(max(lses, default=None)), _fmt(max(ratios, default=None), ".2f"),
                     _fmt(max(hw4, default=None))])
    return format_table(["backend", "dtype", "checked", "pass", "fail", "unchecked", "not advertised",
                         "worst rel-L2", "bound", "worst lse err", "worst err/naive", "HW4 max abs"], rows)


def checked_per_variant(results: Iterable[Result]) -> dict[str, dict[str, int]]:
    """backend -> {group (see cases.group) -> cases checked}."""
    table: dict[str, Counter] = {}
    for r in results:
        table.setdefault(r.backend, Counter())[group(r.case)] += r.status in CHECKED
    return {backend: dict(c) for backend, c in table.items()}


def variant_table(results: Sequence[Result]) -> str:
    """Per backend and variant: cases checked, passed, failed, unchecked, not advertised, and the worst
    rel-L2 as a fraction of its bound."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.backend, group(r.case)), []).append(r)
    rows = []
    for (backend, name), rs in groups.items():
        n = Counter(r.status for r in rs)
        used = [r.rel_err / r.rel_bound for r in rs if r.rel_err is not None and r.rel_bound]
        rows.append([backend, name, sum(n[s] for s in CHECKED), n["pass"], n["fail"] + n["error"], n["unchecked"],
                     n[NOT_ADVERTISED], _fmt(max(used, default=None), ".2f")])
    return format_table(["backend", "variant", "checked", "pass", "fail", "unchecked", "not advertised",
                         "worst rel-L2 / bound"], rows)


def offenders_table(results: Sequence[Result]) -> str:
    rows = [[r.backend, r.case.label, r.status, _fmt(r.rel_err), _fmt(r.rel_bound), "; ".join(r.reasons)]
            for r in results if r.status in ("fail", "error")]
    return format_table(["backend", "case", "status", "rel-L2", "bound", "why"], rows)


def document(results: Sequence[Result], *, seed: int, passed: bool, problem_lines: Sequence[str],
             unavailable: Mapping[str, str], required: Mapping[str, str]) -> dict[str, Any]:
    """The JSON document of a run: provenance, rules, verdict, per-backend counts, every case."""
    from .._provenance import provenance

    return {"schema": SCHEMA, **provenance(), "seed": seed, "passed": passed, "problems": list(problem_lines),
            "checked": {b: c["checked"] for b, c in counts(results).items()}, "counts": counts(results),
            "checked_per_variant": checked_per_variant(results),
            "gate_rel_l2": GATE_REL_L2, "fp8_gate_rel_l2": FP8_GATE_REL_L2,
            "bounds": {b: {dt: bd._asdict() for dt, bd in row.items()} for b, row in BOUNDS.items()},
            "hw4_max_abs": HW4_MAX_ABS, "fa_rule": {"factor": FA_RULE_FACTOR, "floor": FA_RULE_FLOOR},
            "unavailable": dict(unavailable), "required_but_unavailable": dict(required),
            "results": [r.to_json() for r in results]}


def report(results: Sequence[Result], *, seed: int, elapsed: float = 0.0, json_path: str | None = None,
           backends: Sequence[str] | None = None, unavailable: Mapping[str, str] | None = None,
           required: Mapping[str, str] | None = None, gaps: Sequence[str] = ()) -> int:
    """Prints the summary, the per-backend counts and, on failure, every problem; writes the JSON;
    returns the exit status (0 passed, 1 failed). `backends` are the names that were gated (default:
    every backend in `results`): each must have checked at least one case. `gaps`: advertised
    configurations the matrix does not cover (cases.coverage_gaps)."""
    unavailable, required = dict(unavailable or {}), dict(required or {})
    names = list(backends) if backends is not None else list(dict.fromkeys(r.backend for r in results))
    problem_lines = problems(results, names, required, gaps)
    passed = not problem_lines
    print()
    print(summary_table(results))
    print()
    print(variant_table(results))
    per_backend = counts(results)
    print("\nchecked per backend: " + (", ".join(f"{b} {per_backend.get(b, {}).get('checked', 0)}" for b in names)
                                       or "none"))
    skipped = Counter((r.backend, r.reasons[0] if r.reasons else "") for r in results if r.status == NOT_ADVERTISED)
    for (backend, why), n in skipped.items():
        print(f"  not advertised by {backend} (not run): {n} cases: {why}")
    if json_path:
        doc = document(results, seed=seed, passed=passed, problem_lines=problem_lines, unavailable=unavailable,
                       required=required)
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1, default=float)
    checked = sum(c["checked"] for c in per_backend.values())
    if not passed:
        print(f"\nFAILED (seed {seed}):")
        for line in problem_lines:
            print(f"  - {line}")
        if any(r.status in ("fail", "error") for r in results):
            print(offenders_table(results))
        return 1
    print(f"\nPASSED: {checked} cases checked ("
          + ", ".join(f"{b} {per_backend[b]['checked']}" for b in names) + f") in {elapsed:.1f} s (seed {seed})")
    return 0


def progress_printer(stream: Any = None) -> Callable[[int, int, str], None]:
    """A one-line progress bar on a terminal; nothing on a log file."""
    stream = sys.stderr if stream is None else stream
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
