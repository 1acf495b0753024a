"""`cutlassfa tune`: measures, on this GPU, the tensor-core kernel and key-split choices the planner could
make for the bench's grids, and writes the table of those that beat its heuristics (cutlassfa/tuning.py).

For each case: the heuristics' plan (`cutlassfa.plan` with no table), then candidates around it (each tile
kernel that covers the call, at the heuristics' split count, at 1, at half and at twice it; a candidate
the planner would not run as asked, or one that runs as another does, is dropped), each made the planner's
choice by a one-entry table and timed as the bench times decode (CUDA graphs replayed interleaved, inputs
rotated past L2). Per class of calls (cutlassfa/tuning.h: the calls one entry covers) the candidate with
the best geometric-mean speed over the heuristics' across the class's cases wins if that is at least
MIN_GAIN and it is no slower than MAX_LOSS on any of them; other classes get no entry (the heuristics).
Needs PyTorch with CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .._inputs import Case
from . import grid as grids

GRIDS: dict[str, Callable[[], list[Case]]] = {
    "prefill": lambda: [c for c in grids.default_grid() if c.dtype != "float32"],
    "decode": grids.decode_grid, "paged": grids.paged_grid, "speculative": grids.speculative_grid,
    "quick": lambda: grids.decode_quick_grid() + [c for c in grids.quick_grid() if c.dtype != "float32"],
}
MIN_GAIN = 1.02  # a class's entry must be this much faster than the heuristics (geometric mean) ...
MAX_LOSS = 0.98  # ... and no case of the class slower than this


@dataclass
class Choice:
    kernel: str
    num_splits: int

    def label(self) -> str:
        return f"{self.kernel}/{self.num_splits}"


@dataclass
class Measured:
    """One case: its class, the heuristics' choice, and each distinct candidate's time (ms, median)."""

    case: Case
    tune_class: tuple[int, ...]
    heuristic: Choice
    times: dict[str, float] = field(default_factory=dict)  # by Choice.label(); the heuristic's included


def candidates(heuristic: Choice, kernels: Sequence[str]) -> list[Choice]:
    splits = {1, heuristic.num_splits, max(1, heuristic.num_splits // 2), min(1024, heuristic.num_splits * 2)}
    return [Choice(k, s) for k in kernels for s in sorted(splits)
            if (k, s) != (heuristic.kernel, heuristic.num_splits)]


def choose(results: Sequence[Measured]) -> list[tuple[tuple[int, ...], Choice, dict[str, Any]]]:
    """(class, choice, what was measured) for each class whose best candidate clears MIN_GAIN / MAX_LOSS."""
    by_class: dict[tuple[int, ...], list[Measured]] = {}
    for m in results:
        by_class.setdefault(m.tune_class, []).append(m)
    chosen = []
    for cls, members in by_class.items():
        labels = set.intersection(*(set(m.times) for m in members))
        best: tuple[float, str] | None = None
        for label in labels:
            speeds = [m.times[m.heuristic.label()] / m.times[label] for m in members]
            if min(speeds) < MAX_LOSS:
                continue
            gain = math.exp(sum(math.log(s) for s in speeds) / len(speeds))
            if gain >= MIN_GAIN and (best is None or gain > best[0]):
                best = (gain, label)
        if best is None:
            continue
        kernel, splits = best[1].split("/")
        measured = {"speedup": round(best[0], 4),
                    "cases": [{"case": m.case.label, "heuristic": m.heuristic.label(),
                               "ms": round(m.times[best[1]], 5), "heuristic_ms": round(m.times[m.heuristic.label()], 5)}
                              for m in members]}
        chosen.append((cls, Choice(kernel, int(splits)), measured))
    return chosen


def plan_options(case: Case, feed: Any) -> dict[str, Any]:
    """`cutlassfa.plan`'s arguments beside q, k, v for a case fed as the bench feeds `ours` rows: the same
    options, and the index arrays by name."""
    from .runners import call_options

    return dict(call_options(case), **dict(zip(feed.index, feed.own[3:])))


def planned_choices(case: Case, arrays: Sequence[Any], options: dict[str, Any],
                    device: tuple[int, int]) -> tuple[tuple[int, ...], Choice, list[Choice]] | None:
    """(class, the heuristics' choice, the distinct candidates the planner runs as asked) for a call of
    `case` on `arrays` (q, k, v), planned for `device` (capability, multiprocessors); None where there is no
    tensor-core kernel to choose (fill, cpu). Leaves no table installed for that device."""
    import cutlassfa
    from cutlassfa import _C, tuning

    capability, sms = device

    def plan_with(entries: list) -> dict[str, Any]:
        _C.set_tuning(capability, sms, entries)
        return cutlassfa.plan(*arrays, backend="tensorcore", device=device, **options)

    try:
        heuristic_plan = plan_with([])
        if heuristic_plan["kernel"] not in tuning.KERNELS:
            return None
        cls = heuristic_plan["tune_class"]
        heuristic = Choice(heuristic_plan["kernel"], heuristic_plan["num_splits"])
        distinct = {(heuristic.kernel, heuristic.num_splits, heuristic_plan["gqa_packed"]): heuristic}
        for choice in candidates(heuristic, tuning.KERNELS):
            p = plan_with([(cls, choice.kernel, choice.num_splits)])
            key = (p["kernel"], p["num_splits"], p["gqa_packed"])
            if p["tuned"] and (p["kernel"], p["num_splits"]) == (choice.kernel, choice.num_splits) and \
                    key not in distinct:
                distinct[key] = choice
    finally:
        _C.set_tuning(capability, sms, [])
    return tuple(cls), heuristic, list(distinct.values())


def measure_case(case: Case, frame: Any, device: tuple[int, int], rounds: int, calls_per_graph: int) -> Measured | None:
    """The heuristics and the candidates on one case (None: no tensor-core plan to tune: cpu, fill)."""
    from cutlassfa import _C

    from .feeds import clone_feed, make_feed, working_set
    from .rules import rotation_copies
    from .runners import ours
    from .timing import TorchGraphTimer, median

    capability, sms = device
    feed = make_feed(case, frame, seed=0)
    planned = planned_choices(case, feed.own[:3], plan_options(case, feed), device)
    if planned is None:
        return None
    cls, heuristic, choices = planned
    copies = rotation_copies(working_set(case, frame, feed, False), frame.l2_bytes(), frame.free_bytes())
    inputs = [feed.own] + [clone_feed(frame, feed).own for _ in range(copies - 1)]
    run = ours("tensorcore").prepare(case)

    def contender(choice: Choice) -> Callable[[int], Any]:
        entries = [] if choice is heuristic else [(cls, choice.kernel, choice.num_splits)]

        def call(i: int) -> Any:  # the table decides the plan when the call is captured
            _C.set_tuning(capability, sms, entries)
            return run(*inputs[i % len(inputs)])
        return call

    try:
        times = TorchGraphTimer(calls_per_graph).time([contender(c) for c in choices], rounds)
    finally:
        _C.set_tuning(capability, sms, [])
    return Measured(case, cls, heuristic, {c.label(): median(t) for c, t in zip(choices, times)})


def run_tune(grid_names: Sequence[str], out: str | None, rounds: int, calls_per_graph: int,
             cases: slice = slice(None)) -> int:
    import cutlassfa
    from cutlassfa import tuning

    from .frames import TorchFrame

    info = cutlassfa.device_info(0)
    if not info.get("available") or not hasattr(cutlassfa._C, "set_tuning"):
        print(f"cutlassfa tune: needs a GPU and a CUDA build ({info.get('reason', 'no tuning support')})",
              file=sys.stderr)
        return 1
    capability = info["compute_capability"][0] * 10 + info["compute_capability"][1]
    device = (capability, info["multiprocessors"])
    tuning.ensure_installed()  # then replaced per candidate, and by the new table at the end
    frame = TorchFrame()
    todo = [case for name in grid_names for case in GRIDS[name]()][cases]
    results = []
    for i, case in enumerate(todo):
        print(f"\r[{i + 1}/{len(todo)}] {case.label[:60]:<60}", end="", file=sys.stderr, flush=True)
        try:
            m = measure_case(case, frame, device, rounds, calls_per_graph)
        except Exception as error:  # noqa: BLE001 - a case that cannot run (memory) is left to the heuristics
            print(f"\n  skipped: {type(error).__name__}: {error}", file=sys.stderr)
            frame.empty_cache()
            continue
        if m is not None:
            results.append(m)
        frame.empty_cache()
    print(file=sys.stderr)
    entries = tuple(tuning.Entry(tuple(cls), c.kernel, c.num_splits, measured) for cls, c, measured in choose(results))
    table = tuning.Table(info["name"], info["multiprocessors"], capability, cutlassfa.__version__, entries)
    path = out or str(tuning.user_directory() / tuning.table_name(info["name"], info["multiprocessors"]))
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    document = table.to_json()
    document["cases"] = [{"case": m.case.label, "class": list(m.tune_class), "heuristic": m.heuristic.label(),
                          "ms": m.times} for m in results]
    pathlib.Path(path).write_text(json.dumps(document, indent=1) + "\n")
    tuning.install(cutlassfa._C, table, capability, info["multiprocessors"])
    print(f"cutlassfa tune: {len(results)} cases measured, {len(entries)} classes where a choice beats the "
          f"heuristics by >= {MIN_GAIN}x; wrote {path}")
    for e in entries:
        print(f"  class {e.tune_class}: {e.kernel}, {e.num_splits} splits ({e.measured['speedup']}x)")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument("--grid", action="append", choices=sorted(GRIDS), default=None,
                        help="the bench grid(s) to measure (repeatable; default: prefill, decode, paged, speculative)")
    parser.add_argument("--cases", type=grids.parse_cases, default=slice(None), metavar="START:STOP",
                        help="part of the case list (a long sweep over several runs)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds a candidate (default 7)")
    parser.add_argument("--calls-per-graph", type=int, default=4, help="calls captured in one CUDA graph (default 4)")
    parser.add_argument("--out", default=None,
                        help="where to write the table (default: the user's cache, where the planner looks)")


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.calls_per_graph < 1:
        print("cutlassfa tune: --rounds and --calls-per-graph must be >= 1", file=sys.stderr)
        return 2
    names = args.grid or ["prefill", "decode", "paged", "speculative"]
    return run_tune(names, args.out, args.rounds, args.calls_per_graph, args.cases)
