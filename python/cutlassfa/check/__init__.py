"""`cutlassfa check`: the accuracy gate.

Runs every available backend over a shape matrix (dtype x head dim x ragged N x Nq != Nk x causal x
GQA, plus HW4 cases, padded head dims and the variants: sliding windows, softcap, KV caches, varlen)
on fresh random inputs and compares with the float64 reference. Every case a
backend advertises through `cutlassfa.supports` must be checked and pass; see `evaluate` for the
rules, `bounds` for the one table of limits and `report` for the verdict.

Modules: bounds (the limits), cases (the matrix), variants (its variant cases and padded head dims),
variant_inputs (their inputs and reference), support (what a backend advertises), backends
(callables under test, which backends a run gates), evaluate (one case, the whole run), report
(verdict, tables, JSON), hw4_rule (the HW4 max-abs rule over full-size outputs), cli.
"""

from .backends import BACKEND_ORDER, Backend, Plan, UsageError, plan, public_backend
from .bounds import (BOUNDS, FA_RULE_FACTOR, FA_RULE_FLOOR, FP8, FP8_GATE_REL_L2, GATE_REL_L2, HW4_MAX_ABS, Bound,
                     bound_for, bound_key, rel_l2_limit)
from . import variants
from .cases import HW4_FULL, HW4_QUICK, build_cases, coverage_gaps, group
from .cli import add_arguments, main, run
from .evaluate import CaseInputs, Result, evaluate, make_inputs, run_check
from .report import counts, report
from .support import Advertised, supports
from .._inputs import DTYPES, Case, Variant

__all__ = ["BACKEND_ORDER", "BOUNDS", "DTYPES", "FA_RULE_FACTOR", "FA_RULE_FLOOR", "FP8", "FP8_GATE_REL_L2",
           "GATE_REL_L2", "HW4_FULL", "HW4_MAX_ABS", "HW4_QUICK", "Advertised", "Backend", "Bound", "Case", "Variant",
           "CaseInputs", "Plan", "Result", "UsageError", "add_arguments", "bound_for", "bound_key", "build_cases",
           "counts",
           "coverage_gaps", "group",
           "evaluate", "main", "make_inputs", "plan", "public_backend", "rel_l2_limit", "report", "run",
           "run_check", "supports", "variants"]
