"""`cutlassfa check` on the command line: options, the run, the exit status (0 passed, 1 failed,
2 usage error: unknown backend or dtype, a requested backend not available, nothing to gate, a
--json path that cannot be written)."""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from typing import Sequence

from .. import hw4
from .._inputs import DTYPES
from .backends import UsageError, plan
from .cases import build_cases, coverage_gaps
from .evaluate import run_check
from .report import progress_printer, report


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cutlassfa check`."""
    parser.add_argument("--backends", type=_csv,
                        help="comma-separated backends to gate (default: every available one)")
    parser.add_argument("--dtypes", type=_csv, default=list(DTYPES),
                        help="comma-separated dtypes (default: float32,float16,bfloat16)")
    parser.add_argument("--quick", action="store_true", help="a small matrix (seconds; what CI runs)")
    parser.add_argument("--seed", type=int, default=None, help="input seed (default: fresh, printed)")
    parser.add_argument("--inputs", choices=("auto", "numpy", "torch", "cupy"), default="auto",
                        help="array type fed to GPU backends (auto: torch CUDA tensors if torch is "
                             "importable, else numpy host arrays); cpu always gets numpy")
    parser.add_argument("--json", metavar="PATH", help="write every case's result as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _usage(message: str) -> int:
    print(f"cutlassfa check: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Runs the gate; returns 0 (pass), 1 (a failure) or 2 (usage error)."""
    bad = [d for d in args.dtypes if d not in DTYPES]
    if bad:
        return _usage(f"unknown dtype(s) {', '.join(bad)}; choose from {', '.join(DTYPES)}")
    if args.json:
        try:
            hw4.check_writable(args.json)
        except OSError as error:
            return _usage(f"--json {args.json}: {error.strerror}: {error.filename}")
    try:
        gated = plan(args.backends, args.inputs)
    except UsageError as error:
        return _usage(str(error))
    if not gated.backends and not gated.required:
        return _usage("no backend available: " + "; ".join(f"{n}: {why}" for n, why in gated.unavailable.items()))
    seed = args.seed if args.seed is not None else secrets.randbits(31)
    cases = build_cases(args.quick, args.dtypes)
    variant = sum(c.variant is not None for c in cases)
    print(f"cutlassfa check: seed {seed} (replay with --seed {seed}); {len(cases)} cases ({variant} of them "
          f"variants: windows, softcap, KV caches, varlen) x "
          f"{len(gated.backends)} backends: " + ", ".join(f"{b.name} ({b.framework} inputs)" for b in gated.backends))
    for name, why in gated.unavailable.items():
        print(f"  not available: {name}: {why}")
    for name, why in gated.required.items():
        print(f"  REQUIRED BUT NOT AVAILABLE (CUTLASSFA_REQUIRE_GPU=1): {name}: {why}")
    gaps = [gap for b in gated.backends for gap in coverage_gaps(b.name, b.advertises, cases, args.dtypes)]
    start = time.perf_counter()
    results = run_check(gated.backends, cases, seed, None if args.no_progress else progress_printer(sys.stderr))
    return report(results, seed=seed, elapsed=time.perf_counter() - start, json_path=args.json,
                  backends=[b.name for b in gated.backends], unavailable=gated.unavailable,
                  required=gated.required, gaps=gaps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cutlassfa check", description="The accuracy gate: every available "
                                     "backend against the float64 reference.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
