"""`cutlassfa bench` on the command line. Exit status: 0; 1 when a row of ours failed (its output
outside the accuracy bound, or an error other than a refusal or out of memory); 2 for a usage error
(unknown dtype or backend, bad counts, options that do not go together, nothing can run, --plot without
matplotlib, a --json or --plot path that cannot be written)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import hw4
from .._inputs import DTYPES
from .._provenance import gpu as gpu_info
from .._provenance import provenance
from .frames import Frame, pick_frame
from .grid import parse_cases, parse_shape, parse_window, select_cases
from .measure import Row, Settings, apply_peaks, apply_twins, bench_case, measure_peaks
from .overhead import (DEFAULT_CALLS, DEFAULT_SYNC_CALLS, overhead_document, overhead_table, sync_rows,
                       tiny_call_rows)
from .plot import write_plot
from .report import Progress, json_default, peaks_text, results_table, to_document, twin_summary
from .rules import DEFAULT_MAX_CALL_S, DEFAULT_REPEATS, DEFAULT_WARMUP
from .runners import ALL_BACKENDS, OUR_BACKENDS, Runner, make_runners, select_backends
from .timing import Timer, TorchGraphTimer, WallTimer


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"want positive integers, got {text!r}")
    return values


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cutlassfa bench`."""
    parser.add_argument("--quick", action="store_true", help="a small grid (well under a minute on an H100)")
    parser.add_argument("--window", type=parse_window, metavar="LEFT,RIGHT",
                        help="a sliding window on every case: query i sees keys i + Nk - Nq - LEFT .. + RIGHT "
                             "(-1: unbounded); adds the flex (FlexAttention) anchor, as SDPA has none")
    parser.add_argument("--softcap", type=float, metavar="C",
                        help="softcap C on every case (Gemma 2's 50): scores become C tanh(s / C); with --window "
                             "too, one variant; adds the flex anchor, as SDPA has none")
    parser.add_argument("--head-dims", type=_ints, metavar="D,D,...",
                        help="the grid's fp16 / bf16 head dims (default 64,128; e.g. 64,96,128,192,256; "
                             "--decode's, --paged's or --varlen's with those); with --quick, a filter (--varlen: "
                             "the head dims)")
    grids = parser.add_mutually_exclusive_group()
    grids.add_argument("--decode", action="store_true",
                       help="the decode grid instead: 1 new query (or 4, causal) against K/V caches of 2k-128k "
                            "keys, B 1/8/64, 32 query heads on 32/8/4 K/V heads, d 128/64 (with --quick: 3 cases); "
                            "adds the read row: a plain read of K and V, the bandwidth ceiling of the same run")
    grids.add_argument("--paged", action="store_true",
                       help="the paged grid instead: the decode queries (1, or 4 causal) against paged caches of "
                            "16k and 128k keys (every entry full, pages shuffled), B 1/8/64, 32 query heads on 8/32 "
                            "K/V heads, d 128/64, bf16 (--dtypes to change; with --quick: 3 shapes); each shape "
                            "with a contiguous cache and then at each of --page-sizes, the 'vs twin' column being "
                            "paged / contiguous. SDPA gets the pages gathered into a contiguous cache (outside the "
                            "timing); adds the read row, reading the page pools. With --shape: those shapes")
    grids.add_argument("--speculative", action="store_true",
                       help="the speculative-decoding grid instead: 2, 4, 8 and 16 causal queries (up to 128 query "
                            "rows a K/V head) against full caches of 8k and 32k keys, B 8, 32 and 64 query heads on "
                            "8, d 128, bf16 (--dtypes to change), each contiguous and in pages of 16 keys "
                            "(--page-sizes); adds the flex and read rows")
    grids.add_argument("--varlen", action="store_true",
                       help="the varlen grid instead: causal prefill through varlen_forward of packed batches of "
                            "mixed lengths (16 of 64-8192, 64 of 64-1024, one of 16384 among 15 of 64-1024; fixed "
                            "seeds), 32 query heads on 8, d 128 (--head-dims), bf16 (--dtypes), each followed by "
                            "a dense call of as many sequences at the mean length, the 'vs twin' column being "
                            "varlen / dense TFLOP/s (visible pairs). SDPA: one call per sequence, timed as a "
                            "whole (with --quick: the first batch)")
    parser.add_argument("--page-sizes", type=_ints, metavar="P,P,...",
                        help="with --paged: keys a page (default 16,64,256)")
    parser.add_argument("--lengths", type=_ints, action="append", metavar="N,N,...",
                        help="with --varlen: a batch of these sequence lengths instead of the grid's; repeatable")
    parser.add_argument("--shape", action="append", type=parse_shape, metavar="B,H,N,d",
                        help="a shape to run instead of the default grid; repeatable. B,H,N,d or B,H,Nq,Nk,d; "
                             "H may be Hq:Hkv (GQA)")
    parser.add_argument("--dtypes", type=_csv, help="comma-separated dtypes: filters the grid, or the dtypes of "
                        "--shape (default for --shape: float16) and of --paged / --varlen (default: bfloat16)")
    parser.add_argument("--causal", choices=("no", "yes", "both"),
                        help="filter the grid (default: as listed) / causal for --shape (default: no) and for "
                             "--varlen (default: yes)")
    parser.add_argument("--backends", type=_csv, help="comma-separated rows to run (default: all; flex with "
                        "--window, read with --decode and --paged): " + ", ".join(ALL_BACKENDS) + "; 'sdpa' means "
                        "all four "
                        "sdpa_*; read: no attention, K and V streamed once by a torch sum (the GB/s ceiling; needs "
                        "PyTorch with CUDA)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help="timed rounds per case, every backend once per round (median)")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed calls first (>= 1)")
    parser.add_argument("--max-call-s", type=float, default=DEFAULT_MAX_CALL_S,
                        help="skip a backend on a shape when one call would take longer (seconds)")
    parser.add_argument("--seed", type=int, default=0, help="input seed")
    parser.add_argument("--no-accuracy", action="store_true", help="do not compute rel-L2 vs the fp64 reference")
    parser.add_argument("--no-peaks", action="store_true", help="do not measure the dense GEMM peaks")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON (schema in README); rewritten "
                        "after every case, with \"complete\": false until the run ends, so that a run cut short "
                        "keeps the cases it measured")
    parser.add_argument("--cases", type=parse_cases, metavar="START:STOP",
                        help="run only these cases of the grid (Python slice bounds over the list the other "
                             "options select, e.g. 0:60 then 60:): a long grid in parts; a row whose twin case "
                             "falls in another part has no 'vs twin'")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of TFLOP/s per backend per shape "
                        "(needs matplotlib)")
    parser.add_argument("--graph", action="store_true",
                        help="time every GPU contender's calls replayed from a CUDA graph (PyTorch inputs), on "
                             "any grid (--decode, --paged, --varlen too): GPU time with no host launch cost "
                             "between calls, as a serving loop's decode steps see it (default: back-to-back "
                             "calls)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--overhead", action="store_true",
                        help="instead of the grid: per-call overhead of a (1, 1, 16, 64) fp16 call (PyTorch, "
                             "SDPA flash, numpy) and the fp32 HW4 shapes synchronized after every call vs back "
                             "to back")
    parser.add_argument("--e2e", action="store_true",
                        help="instead of the grid: transformers models (random weights from configs: Llama-like "
                             "GQA, Mistral-like window, Gemma-2-like softcap + d 256) with attn_implementation "
                             "'sdpa' and 'cutlassfa': prefill, generate tokens/s, decode step, attention's share "
                             "(needs transformers and PyTorch; tiny models on the CPU without a GPU)")
    parser.add_argument("--e2e-rounds", type=int, default=10, help="interleaved rounds of --e2e (default 10)")
    parser.add_argument("--overhead-calls", type=int, default=DEFAULT_CALLS,
                        help=f"back-to-back calls per measurement of --overhead (default {DEFAULT_CALLS})")
    parser.add_argument("--sync-calls", type=int, default=DEFAULT_SYNC_CALLS,
                        help=f"calls per HW4 shape of --overhead (default {DEFAULT_SYNC_CALLS})")


def _usage(message: str) -> int:
    print(f"cutlassfa bench: error: {message}", file=sys.stderr)
    return 2


def _check_paths(args: argparse.Namespace) -> str | None:
    """Why --json / --plot cannot be written, checked before a run that may take minutes."""
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            try:
                hw4.check_writable(path)
            except OSError as error:
                return f"{option} {path}: {error.strerror}: {error.filename}"
    return None


def _conflict(args: argparse.Namespace) -> str | None:
    """Options that do not go together with the paged and varlen grids."""
    paged = getattr(args, "paged", False) or getattr(args, "speculative", False)
    varlen = getattr(args, "varlen", False)
    if args.page_sizes and not paged:
        return "--page-sizes goes with --paged or --speculative"
    if args.lengths and not varlen:
        return "--lengths goes with --varlen"
    if (paged or varlen) and args.window is not None:
        return "--window is for dense cases; not with --paged, --speculative or --varlen"
    softcap = getattr(args, "softcap", None)
    if softcap is not None and not softcap > 0:
        return f"--softcap wants a cap > 0, got {softcap}"
    if (paged or varlen) and softcap is not None:
        return "--softcap is for dense cases; not with --paged, --speculative or --varlen"
    if varlen and args.shape:
        return "--varlen takes --lengths (heads 32:8, d from --head-dims), not --shape"
    if getattr(args, "speculative", False) and (args.shape or args.head_dims):
        return "--speculative is a fixed grid (d 128); --paged --shape runs other shapes"
    return None


def run(args: argparse.Namespace, *, frame: Frame | None = None,
        timer_for: Callable[[Runner], Timer] | None = None) -> int:
    """Runs the benchmark; returns 0, 1 (a row of ours failed) or 2 (usage error). `frame` and
    `timer_for` are for tests."""
    bad = [d for d in (args.dtypes or []) if d not in DTYPES]
    speculative = getattr(args, "speculative", False)
    dense_variant = args.window is not None or getattr(args, "softcap", None) is not None
    names = select_backends(args.backends, flex=dense_variant or speculative,
                            decode=args.decode or args.paged or speculative)
    unknown = [b for b in names if b not in ALL_BACKENDS]
    if bad or unknown:
        return _usage(f"unknown dtype(s) {bad} / backend(s) {unknown}")
    if args.repeats < 1 or args.warmup < 1 or args.overhead_calls < 1 or args.sync_calls < 1:
        return _usage("--repeats, --warmup, --overhead-calls and --sync-calls must be >= 1")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        return _usage("--plot needs matplotlib (pip install matplotlib, or the 'plot' extra)")
    refusal = _conflict(args) or _check_paths(args)
    if refusal:
        return _usage(refusal)
    if frame is None:
        frame = pick_frame(gpu_info() is not None)
    if args.overhead:
        return _run_overhead(args, frame)
    if args.e2e:
        return _run_e2e(args, frame)
    cases = select_cases(args)
    if not cases:
        return _usage("no case left after the filters")
    if args.window is not None and args.window[1] > 0 and any(c.causal for c in cases):
        return _usage(f"--window {args.window[0]},{args.window[1]} on causal cases: causal is a right bound of 0")

    runners, unavailable = make_runners(names, frame)
    if not runners:
        return _usage("no backend can run here: " + "; ".join(f"{n}: {why}" for n, why in unavailable.items()))
    if args.graph and not (frame.on_gpu and frame.name == "torch"):
        return _usage("--graph needs a GPU and PyTorch with CUDA (it captures torch.cuda graphs)")
    gpu_timer = TorchGraphTimer() if args.graph else frame.timer()
    wall = WallTimer()
    timer_for = timer_for or (lambda r: gpu_timer if r.on_gpu and frame.on_gpu else wall)
    settings = Settings(args.repeats, args.warmup, args.max_call_s, args.seed, not args.no_accuracy)

    gpu = gpu_info()
    print(f"cutlassfa bench: {len(cases)} cases x {len(runners)} backends on "
          f"{gpu['name'] if gpu else 'CPU only'}; inputs: {frame.name}; timer: {gpu_timer.name}; "
          f"median of {settings.repeats} interleaved rounds after {settings.warmup} warm-up", file=sys.stderr)
    for name, why in unavailable.items():
        print(f"  not available: {name}: {why}", file=sys.stderr)

    peaks: dict[str, dict[str, Any]] = {}
    if frame.on_gpu and not args.no_peaks:
        peaks = measure_peaks(frame, {c.dtype for c in cases}, getattr(gpu_timer, "eager", gpu_timer))

    def write_json(rows: list[Row], complete: bool) -> None:
        doc = to_document(rows, peaks, settings=settings, timer=gpu_timer.name, unavailable=unavailable,
                          frame=frame.name, complete=complete)
        Path(args.json).write_text(json.dumps(doc, indent=1, default=json_default) + "\n")

    progress = Progress(len(cases) * len(runners), enabled=not args.no_progress)
    rows: list[Row] = []
    rates: dict[tuple[str, str], float] = {}
    try:
        for case in cases:
            progress.case(case.label)
            rows += bench_case(case, runners, frame, settings, rates=rates, timer_for=timer_for,
                               progress=lambda name, label=case.label: progress.step(f"{label} {name}"))
            if args.json:  # so far: a run stopped from outside keeps what it measured
                apply_peaks(rows, peaks)
                apply_twins(rows)
                write_json(rows, complete=False)
    finally:
        progress.close()
    apply_peaks(rows, peaks)
    apply_twins(rows)

    if peaks:
        print("Peaks (each row's '% peak' is against the one named in its 'peak' column):")
        print(peaks_text(peaks))
        print()
    print(results_table(rows))
    summary = twin_summary(rows)
    if summary:
        print()
        print(summary)
    if args.json:
        write_json(rows, complete=True)
        print(f"\nwrote {args.json}", file=sys.stderr)
    if args.plot:
        write_plot(rows, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return _verdict(rows)


def _verdict(rows: Sequence[Row]) -> int:
    failed = [r for r in rows if r.status == "inaccurate" or (r.status == "error" and r.backend in OUR_BACKENDS)]
    if not failed:
        return 0
    print(f"\nFAILED: {len(failed)} rows of ours with a wrong output or an error:", file=sys.stderr)
    for r in failed:
        print(f"  {r.backend} {r.case.label}: {r.note}", file=sys.stderr)
    return 1


def _run_overhead(args: argparse.Namespace, frame: Frame) -> int:
    print(f"cutlassfa bench --overhead: {args.overhead_calls} calls per measurement; inputs: {frame.name}",
          file=sys.stderr)
    tiny = tiny_call_rows(frame, args.overhead_calls)
    synced = sync_rows(frame, args.sync_calls)
    print(overhead_table(tiny, synced))
    if args.json:
        doc = overhead_document(tiny, synced, calls=args.overhead_calls, sync_calls=args.sync_calls, frame=frame.name)
        Path(args.json).write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 1 if any(r.status == "error" for r in [*tiny, *synced]) else 0


def _run_e2e(args: argparse.Namespace, frame: Frame) -> int:
    from . import e2e

    if args.e2e_rounds < 1:
        return _usage("--e2e-rounds must be >= 1")
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            return _usage(f"--e2e needs {module}")
    on_gpu = frame.on_gpu and frame.name == "torch"
    workloads = e2e.GPU_WORKLOADS if on_gpu else e2e.CPU_WORKLOADS
    print(f"cutlassfa bench --e2e: {len(workloads)} workloads (baseline, cutlassfa, no attention) on "
          f"{'the GPU' if on_gpu else 'the CPU (tiny models)'}; median of {args.e2e_rounds} interleaved rounds",
          file=sys.stderr)
    rows = []
    for work in workloads:
        rows.append(e2e.measure(work, args.e2e_rounds, "cuda" if on_gpu else "cpu"))
        print(f"  {work.label}: done", file=sys.stderr)
    print(e2e.e2e_table(rows))
    if args.json:
        import transformers

        doc = {"provenance": provenance(), "transformers": transformers.__version__, "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cutlassfa bench", description="TFLOP/s of every backend next to "
                                     "PyTorch SDPA, on the same inputs, in one run.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
