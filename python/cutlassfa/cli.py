"""The ``cutlassfa`` command line: run / gen / info / check / bench / tune.

    cutlassfa run INPUT OUTPUT [--backend auto]   HW4 input file -> HW4 output file
    cutlassfa gen PREFIX --B 2 --N 128 --d 32     random case: PREFIX.in and its reference PREFIX.out
    cutlassfa info                                GPU, compiled architectures, available backends
    cutlassfa check ... / cutlassfa bench ...     (cutlassfa.check / cutlassfa.bench)
    cutlassfa tune [--grid decode] [--out PATH]   measure the planner's choices here, write its table

HW4 is the FlashAttention assignment (Homework 4) of the CS542200 Parallel Programming course; its
binary files and its correctness rule (every output within 5e-3) are described in `cutlassfa.hw4`.

Exit status: 0 on success; 2 when the command cannot run as asked (bad arguments, a missing or malformed
file, an unsupported head dim, an output path that cannot be written, a backend that is not available
on this machine), checked before any computation; 1 when the computation itself fails, or `run
--expect` finds an error above the HW4 limit. Errors are one line on stderr, never a traceback, and
never leave an output file behind.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import __version__, hw4

__all__ = ["main", "build_parser"]

BACKEND_CHOICES = ("auto", "naive", "small_tile", "large_tile", "tensorcore", "tensorcore_sm80", "cpu")
# Batches per forward call in `run`: bounded so that the staging copies a backend makes stay small
# next to the mapped input and the output (~2 copies of the data in all). 2**24 elements = 64 MiB
# per tensor, still thousands of (N=128, d=32) problems per call: plenty to fill a GPU.
_RUN_CHUNK_ELEMS = 1 << 24
# Subcommands implemented in their own modules (module name, help line).
_EXTERNAL = {
    "check": ("cutlassfa.check", "check every available backend against the reference"),
    "bench": ("cutlassfa.bench", "benchmark the backends (TFLOP/s)"),
    "tune": ("cutlassfa.bench.tune", "measure the planner's kernel choices on this GPU and write its dispatch table"),
}

HW4_MAX_ABS_ERROR = hw4.MAX_ABS_ERROR  # the HW4 correctness rule: every output within 5e-3


class CliError(Exception):
    """An error reported to the user as one line on stderr, with an exit status."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------


def _writable(path: str) -> None:
    """Fails (status 2, naming `path`) unless `path` can be written; before any computation."""
    try:
        hw4.check_writable(path)
    except OSError as error:
        raise CliError(f"cannot write {path}: {error.strerror}: {error.filename}") from None


def _cmd_run(args: argparse.Namespace) -> int:
    import cutlassfa  # lazily: `gen` and `--help` must work without the extension

    _writable(args.output)  # fail before a long computation, not after
    t0 = time.perf_counter()
    q, k, v = hw4.read_hw4(args.input)  # memory-mapped; pages are read during compute
    b, n, d = q.shape
    if args.expect is not None:  # a reference that cannot be read must not cost the computation
        expected_bytes = b * n * d * 4
        size = os.path.getsize(args.expect)
        if size != expected_bytes:
            raise CliError(f"{args.expect}: an HW4 output for B={b}, N={n}, d={d} has {expected_bytes} bytes, "
                           f"this file has {size}")
    o = np.empty((b, n, d), dtype=np.float32)
    t1 = time.perf_counter()

    try:
        used = cutlassfa.select_backend(q, k, v, backend=args.backend)
    except RuntimeError as error:  # the backend cannot run on this machine: not a compute failure
        raise CliError(str(error), 2) from None
    step = max(1, _RUN_CHUNK_ELEMS // (n * d))
    for b0 in range(0, b, step):
        b1 = min(b, b0 + step)
        cutlassfa.forward(q[b0:b1], k[b0:b1], v[b0:b1], backend=args.backend, out=o[b0:b1])
    t2 = time.perf_counter()

    hw4.write_hw4_output(args.output, o)
    t3 = time.perf_counter()
    print(f"B={b} N={n} d={d} backend={used}")
    print(f"input {t1 - t0:.3f} s  compute {t2 - t1:.3f} s  output {t3 - t2:.3f} s")
    if args.expect is not None:
        expected = hw4.read_hw4_output(args.expect, o.shape)
        error = float(np.max(np.abs(o.astype(np.float64) - expected))) if o.size else 0.0
        verdict = "ok" if error <= HW4_MAX_ABS_ERROR else "FAILED"
        print(f"max abs error vs {args.expect}: {error:.3g} (HW4 limit {HW4_MAX_ABS_ERROR}) {verdict}")
        return 0 if error <= HW4_MAX_ABS_ERROR else 1
    return 0


# ---------------------------------------------------------------------------------------------
# gen
# ---------------------------------------------------------------------------------------------


def _cmd_gen(args: argparse.Namespace) -> int:
    from .reference import attention_reference

    if min(args.B, args.N) < 1:
        raise CliError(f"--B and --N must be >= 1, got B={args.B}, N={args.N}")
    if args.d not in hw4.SUPPORTED_HEAD_DIMS:
        raise CliError(f"--d must be one of {hw4.SUPPORTED_HEAD_DIMS}, got {args.d}")
    if not args.range > 0:
        raise CliError(f"--range must be > 0, got {args.range}")
    for path in (f"{args.prefix}.in", f"{args.prefix}.out"):
        _writable(path)
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))
    rng = np.random.default_rng(seed)
    shape = (args.B, args.N, args.d)
    q, k, v = (rng.uniform(-args.range, args.range, size=shape).astype(np.float32) for _ in range(3))
    out, _ = attention_reference(q, k, v)
    hw4.write_hw4_input(f"{args.prefix}.in", q, k, v)
    try:
        hw4.write_hw4_output(f"{args.prefix}.out", out.astype(np.float32))
    except BaseException:
        os.unlink(f"{args.prefix}.in")  # never leave an input without its reference output
        raise
    print(f"wrote {args.prefix}.in and {args.prefix}.out (B={args.B} N={args.N} d={args.d} seed={seed})")
    return 0


# ---------------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------------


def _cmd_info(args: argparse.Namespace) -> int:
    import cutlassfa
    from cutlassfa import tuning

    from ._diagnostics import build_problem

    problem = build_problem()
    if problem:  # loud, first and on stderr too: a broken build must not read as "no GPU"
        print(f"ERROR: {problem}", file=sys.stderr)
        print(f"BUILD ERROR: {problem}")
    info: dict[str, Any] = dict(cutlassfa.device_info())
    print("device:")
    for key in ("name", "compute_capability", "multiprocessors", "compiled_architectures"):
        if key in info:
            print(f"  {key}: {_fmt(info.pop(key))}")
    for key, value in info.items():  # whatever else it reports, e.g. `reason` when there's no GPU
        print(f"  {key}: {_fmt(value)}")
    print("backends:")
    for name, backend in cutlassfa.backends().items():
        state = "available" if backend.available else f"unavailable: {backend.reason}"
        print(f"  {name:<15} {state}")
    status = tuning.ensure_installed()
    where = f"{status.path} ({status.origin}, {status.entries} entries)" if status.path else "none"
    print(f"tuning table: {where}" + (f"; {status.note}" if status.note else ""))
    return 1 if problem else 0


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(x) for x in value) or "-"
    return str(value)


# ---------------------------------------------------------------------------------------------
# parser and entry point
# ---------------------------------------------------------------------------------------------


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The argument parser. `check`/`bench` get their own arguments only when `argv` names them,
    so other subcommands never import those modules."""
    parser = argparse.ArgumentParser(
        prog="cutlassfa",
        description="FlashAttention forward: HW4 files (the input/output format of the CS542200 FlashAttention "
        "assignment), test cases, device info, the accuracy gate and the bench.",
    )
    parser.add_argument("--version", action="version", version=f"cutlassfa {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("run", help="attention of an HW4 input file, written as an HW4 output file")
    p.add_argument("input", help="HW4 input: int32 B, N, d then per batch Q, K, V (N x d float32)")
    p.add_argument("output", help="HW4 output: B*N*d float32 (written atomically)")
    p.add_argument("--backend", default="auto", choices=BACKEND_CHOICES, help="default: auto")
    p.add_argument("--expect", metavar="REFERENCE", default=None,
                   help="an HW4 output file to compare with (e.g. from `cutlassfa gen`): prints the max abs "
                        f"error and exits 1 above {HW4_MAX_ABS_ERROR}")
    p.set_defaults(handler=_cmd_run)

    p = sub.add_parser(
        "gen",
        help="random HW4 case: PREFIX.in and its reference output PREFIX.out",
        description="Write a random HW4 input PREFIX.in (Q, K, V uniform in [-range, range]) and its "
        "float64 reference output, rounded to float32, as PREFIX.out.",
    )
    p.add_argument("prefix", metavar="OUTPUT_PREFIX", help="writes OUTPUT_PREFIX.in and OUTPUT_PREFIX.out")
    p.add_argument("--B", type=int, required=True, help="batch size")
    p.add_argument("--N", type=int, required=True, help="sequence length")
    p.add_argument("--d", type=int, required=True, help=f"head dim, one of {hw4.SUPPORTED_HEAD_DIMS}")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh; printed)")
    p.add_argument("--range", type=float, default=3.0, help="values uniform in [-range, range] (3.0)")
    p.set_defaults(handler=_cmd_gen)

    p = sub.add_parser("info", help="GPU, compiled architectures and available backends")
    p.set_defaults(handler=_cmd_info)

    wanted = _subcommand_of(argv)
    for name, (module, help_line) in _EXTERNAL.items():
        p = sub.add_parser(name, help=help_line)
        if name == wanted:
            try:
                importlib.import_module(module).add_arguments(p)
            except ImportError as exc:
                # Its arguments are unknown: accept any, so the user sees why it cannot run.
                p.set_defaults(handler=_unavailable(name, exc), accepts_unknown=True)
                continue
        p.set_defaults(handler=_external(module))
    return parser


def _subcommand_of(argv: Sequence[str]) -> str | None:
    """The first non-option word of argv: the subcommand (the top-level parser has no options
    that take values, so this cannot be an option's argument)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _external(module: str):
    def handler(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module).run(args))

    return handler


def _unavailable(name: str, exc: ImportError):
    def handler(args: argparse.Namespace) -> int:
        raise CliError(f"'{name}' is not available in this installation ({exc})")

    return handler


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cutlassfa`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown and not getattr(args, "accepts_unknown", False):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as exc:  # --help (0) or a usage error (2): return it rather than exit
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.handler(args)
    except CliError as exc:
        return _fail(args.command, str(exc), exc.status)
    except (OSError, ValueError) as exc:  # missing/malformed files, unsupported shapes or backends
        return _fail(args.command, _describe(exc), 2)
    except RuntimeError as exc:  # the computation itself failed (e.g. a CUDA error)
        return _fail(args.command, _describe(exc), 1)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror or exc}: {exc.filename}"
    return str(exc) or type(exc).__name__


def _fail(command: str, message: str, status: int) -> int:
    print(f"cutlassfa {command}: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
