"""The measurement of one case: inputs made once and shared (feeds.py: our arrays, and the anchors'
dense equivalent), each contender's first call alone (does it accept the case, is its output right, is
it worth timing), then every contender timed interleaved (see timing.py) on the same rotated input
copies; the dense-GEMM peaks; and each row's rate against its twin's (grid.twin_of)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .._inputs import Case, classify_error
from .._text import first_line
from .feeds import Feed, clone_feed, fed_as, host_feed, kind_of, make_feed, with_dense, working_set
from .flops import case_bytes, case_flops
from .frames import Frame
from .grid import twin_of
from .rules import (DEFAULT_MAX_CALL_S, DEFAULT_REPEATS, DEFAULT_WARMUP, GEMM_SIZE, PEAKS, accuracy_bound, peak_of,
                    rotation_copies, skip_reason, tflops)
from .runners import ANCHORS, DENSE, FP8_ATTENTION, FP8_CACHE, READ, Runner, fp8_roundtrip, term_values
from .samples import output_sample, reference_sample
from .timing import ContenderFailed, Timer, median

# Row statuses: "ok"; "inaccurate" (timed, but its output is outside the accuracy bound: the run
# fails); "skipped", "unsupported", "error" (not timed; the note says why).
STATUSES = ("ok", "inaccurate", "skipped", "unsupported", "error")

# The fp8 rows' references: the inputs they quantize, as the quantized values dequantize.
_QUANTIZED = {FP8_CACHE: {"kv_values": fp8_roundtrip},
              FP8_ATTENTION: {"kv_values": fp8_roundtrip, "q_values": fp8_roundtrip}}


@dataclass
class Row:
    backend: str
    case: Case
    status: str = "ok"
    ms: float | None = None
    ms_min: float | None = None
    repeats: int = 0
    tflops: float | None = None
    # attention_bytes per second: the rate that bounds decode. The read row reads K + V alone; on the
    # decode grid q and o are at most 1.6 % more (8:1 GQA, 4 queries, 2048 keys), so its count stands.
    gbps: float | None = None
    peak: str | None = None
    pct_peak: float | None = None
    rel_err: float | None = None
    rel_bound: float | None = None
    copies: int = 1  # input copies rotated among (L2)
    note: str = ""
    fed: str = ""  # what the row's calls took (feeds.fed_as)
    twin: str | None = None  # the label of the case this row's rate is held against (grid.twin_of)
    vs_twin: float | None = None  # this row's rate / the same backend's rate on the twin (TFLOP/s, else GB/s)

    def to_json(self) -> dict[str, Any]:
        c, var = self.case, self.case.variant
        kind = kind_of(c)
        return {"backend": self.backend, "dtype": c.dtype, "B": c.B, "H": c.H, "Hk": c.Hk, "Nq": c.Nq,
                "Nk": c.Nk, "d": c.d, "causal": c.causal,
                "window": list(c.window) if c.window is not None else None, "softcap": c.softcap or None,
                "mode": kind, "variant": var.name if var is not None else None,
                "page_size": var.page_size if kind == "paged" else None,
                "seqlens_q": list(var.seqlens_q) if kind == "varlen" else None,
                "seqlens_k": list(var.seqlens_k) if kind == "varlen" else
                list(var.cache_seqlens) if kind in ("paged", "kvcache") else None,
                "fed": self.fed,
                "flops": case_flops(c), "bytes": case_bytes(c),
                "status": self.status, "ms": self.ms, "ms_min": self.ms_min, "repeats": self.repeats,
                "tflops": self.tflops, "gbps": self.gbps,
                "peak": self.peak, "pct_peak": self.pct_peak, "rel_err": _finite(self.rel_err),
                "rel_bound": self.rel_bound, "copies": self.copies, "twin": self.twin, "vs_twin": self.vs_twin,
                "note": self.note}


def _finite(x: float | None) -> float | None:
    """JSON has no inf / NaN: those become null (the note says why)."""
    return x if x is None or math.isfinite(x) else None


@dataclass
class Settings:
    repeats: int = DEFAULT_REPEATS
    warmup: int = DEFAULT_WARMUP
    max_call_s: float = DEFAULT_MAX_CALL_S
    seed: int = 0
    accuracy: bool = True


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or "out of memory" in str(error).lower() or \
        type(error).__name__ == "OutOfMemoryError"


ProgressFn = Callable[[str], None]


def bench_case(case: Case, runners: Sequence[Runner], frame: Frame, settings: Settings, *,
               rates: dict[tuple[str, str], float], timer_for: Callable[[Runner], Timer],
               progress: ProgressFn = lambda _: None) -> list[Row]:
    """All runners on one case; inputs (and their rotated copies) are made once and shared."""
    free = frame.free_bytes()
    rows = {r.name: Row(r.name, case, peak=peak_of(r.name, case.dtype), fed=fed_as(case, r.feed)) for r in runners}
    todo = []
    for r in runners:
        why = skip_reason(r.name, case, free_bytes=free, max_call_s=settings.max_call_s,
                          rate_tflops=rates.get((r.name, case.dtype)))
        if why:
            rows[r.name].status, rows[r.name].note = "skipped", why
            progress(r.name)
        else:
            todo.append(r)
    if not todo:
        return list(rows.values())

    dense_wanted = any(r.feed == DENSE for r in todo)
    gpu_feeds: list[Feed] = []
    host: Feed | None = None
    ref: np.ndarray | None = None
    term_refs: dict[str, np.ndarray] = {}  # the score-term rows' references, by term
    try:
        base = make_feed(case, frame, settings.seed)
        if frame.on_gpu and any(r.on_gpu for r in todo):
            copies = rotation_copies(working_set(case, frame, base, dense_wanted), frame.l2_bytes(), free)
            gpu_feeds = [base] + [clone_feed(frame, base) for _ in range(copies - 1)]
        if any(not r.on_gpu for r in todo) or not frame.on_gpu:
            host = base if not frame.on_gpu else host_feed(case, frame, base)
        if settings.accuracy and any(r.attention for r in todo):
            sample = host or base
            ref = reference_sample(case, *sample.own[:3], sample.index)
            for term in {r.term for r in todo if r.term is not None}:
                values = _QUANTIZED.get(term) or {term: term_values(case, term)}
                term_refs[term] = reference_sample(case, *sample.own[:3], sample.index, **values)
    except Exception as error:  # noqa: BLE001 - inputs that do not fit are reported per row
        status, note = ("skipped", "out of memory for the inputs") if _is_oom(error) else \
            ("unsupported", first_line(error))
        for r in todo:
            rows[r.name].status, rows[r.name].note = status, note
            progress(r.name)
        frame.empty_cache()
        return list(rows.values())

    feeds_of = {r.name: gpu_feeds if (r.on_gpu and frame.on_gpu) else [host] for r in todo}
    if dense_wanted:
        todo = _add_dense(case, frame, todo, feeds_of, rows, progress)
    inputs_of = {r.name: [f.dense if r.feed == DENSE else f.own for f in feeds_of[r.name]] for r in todo}
    live = []
    for r in todo:
        progress(r.name)
        call = _first_call(rows[r.name], r, inputs_of[r.name], timer_for(r), settings,
                           term_refs.get(r.term) if r.term is not None else ref, base.index)
        if call is not None:
            live.append((r, call))
    groups: dict[int, list[tuple[Runner, Callable]]] = {}
    timers: dict[int, Timer] = {}
    for r, call in live:
        timer = timer_for(r)
        groups.setdefault(id(timer), []).append((r, call))
        timers[id(timer)] = timer
    for key, members in groups.items():
        _time_interleaved(members, [rows[r.name] for r, _ in members], [inputs_of[r.name] for r, _ in members],
                          timers[key], settings, rates)
    del base, gpu_feeds, host, feeds_of, inputs_of
    frame.empty_cache()
    return list(rows.values())


def _add_dense(case: Case, frame: Frame, todo: list[Runner], feeds_of: dict[str, list[Feed]],
               rows: dict[str, Row], progress: ProgressFn) -> list[Runner]:
    """Builds the dense equivalent on every feed an anchor takes. When it cannot be built (a gathered
    cache that does not fit beside the pages), only the rows fed it are settled; ours still run."""
    feeds = {id(f): f for r in todo if r.feed == DENSE for f in feeds_of[r.name]}
    try:
        for feed in feeds.values():
            with_dense(case, frame, feed)
        return todo
    except Exception as error:  # noqa: BLE001 - reported on the anchors' rows
        for feed in feeds.values():
            feed.dense = None
        frame.empty_cache()
        status, note = ("skipped", "out of memory for the dense equivalent") if _is_oom(error) else \
            ("unsupported", f"dense equivalent: {first_line(error)}")
        for r in todo:
            if r.feed == DENSE:
                rows[r.name].status, rows[r.name].note = status, note
                progress(r.name)
        return [r for r in todo if r.feed != DENSE]


def _fail_row(row: Row, error: BaseException) -> None:
    if _is_oom(error):
        row.status, row.note = "skipped", "out of memory"
    else:
        # read is not ours either: a refusal worded as PyTorch words it is `unsupported`, as for an anchor.
        row.status = classify_error(error, anchor=row.backend in ANCHORS or row.backend == READ)
        row.note = f"{row.status}: {first_line(error)}"


def _first_call(row: Row, runner: Runner, inputs: Sequence[tuple[Any, ...]], timer: Timer, settings: Settings,
                ref: np.ndarray | None, index: dict[str, np.ndarray]) -> Callable[..., Any] | None:
    """One call alone: checks the backend accepts the case, gives the output for the error sample, and
    the time that decides whether the rest is worth running (a second call's when the first is over).
    Returns the prepared call, or None when the row is settled (skipped, unsupported, error)."""
    case = row.case
    first: list[Any] = []
    timer = getattr(timer, "eager", timer)  # a graph timer's captured calls would not give this output
    try:
        with runner.context():
            call = runner.prepare(case)
            first_ms = timer.time([lambda i: first.append(call(*inputs[0]))], 1)[0][0]
            if first_ms > settings.max_call_s * 1e3:
                # A first call may carry one-time setup: cuDNN builds a plan per shape, one per length for
                # the per-sequence calls of a varlen batch (2.1 s for 16 lengths on an H200). The second
                # call decides.
                first_ms = timer.time([lambda i: call(*inputs[0])], 1)[0][0]
    except Exception as error:  # noqa: BLE001 - a refusing or failing backend is one row, not the run
        _fail_row(row, error)
        return None
    if first_ms > settings.max_call_s * 1e3:
        row.status, row.note = "skipped", f"first call took {first_ms / 1e3:.3g} s > {settings.max_call_s:g} s"
        return None
    if ref is not None and runner.attention:  # read's sums are no attention output: nothing to compare
        from cutlassfa.reference import rel_l2

        row.rel_err = rel_l2(output_sample(case, first[0], index), ref)
        row.rel_bound = accuracy_bound(row.backend, case.dtype)
        if not row.rel_err <= row.rel_bound:  # `not <=` also catches NaN
            row.status = "inaccurate"
            row.note = (f"INACCURATE: rel-L2 {row.rel_err:.3g} > bound {row.rel_bound:.3g}"
                        + ("" if math.isfinite(row.rel_err) else " (output has NaN or inf)"))
    return call


def _time_interleaved(members: list[tuple[Runner, Callable]], rows: list[Row],
                      inputs: list[Sequence[tuple[Any, ...]]], timer: Timer, settings: Settings,
                      rates: dict[tuple[str, str], float]) -> None:
    """Warm-up rounds, then `repeats` timed rounds of every member, interleaved. Every call takes the
    next input copy (one counter for all members, so no call reads the copy the previous call read)."""
    counter = itertools.count(1)

    def timed(index: int, runner: Runner, call: Callable,
              copies: Sequence[tuple[Any, ...]]) -> Callable[[int], Any]:
        def one(_: int) -> Any:
            try:
                with runner.context():
                    return call(*copies[next(counter) % len(copies)])
            except Exception as error:  # noqa: BLE001 - which contender failed is what the caller needs
                raise ContenderFailed(index, error) from error
        return one

    while members:
        calls = [timed(i, r, call, copies) for i, ((r, call), copies) in enumerate(zip(members, inputs))]
        try:
            if settings.warmup > 1:
                timer.time(calls, settings.warmup - 1)
            times = timer.time(calls, settings.repeats)
            break
        except ContenderFailed as failed:  # that member's row says why; time the others again
            _fail_row(rows[failed.index], failed.error)
            del members[failed.index], rows[failed.index], inputs[failed.index]
    else:
        return
    for (runner, _), row, copies, ts in zip(members, rows, inputs, times):
        row.ms, row.ms_min, row.repeats = median(ts), min(ts), len(ts)
        row.gbps = case_bytes(row.case) / (row.ms * 1e-3) / 1e9
        if runner.attention:  # read computes nothing: GB/s is its measure
            row.tflops = tflops(row.case, row.ms)
            rates[(row.backend, row.case.dtype)] = row.tflops
        row.copies = len(copies)


def measure_peaks(frame: Frame, dtypes: Iterable[str], timer: Timer, n: int = GEMM_SIZE,
                  repeats: int = 10, warmup: int = 3) -> dict[str, dict[str, Any]]:
    """Dense GEMM rates (n^3, median of `repeats`) for the peaks the rows of `dtypes` need."""
    peaks: dict[str, dict[str, Any]] = {}
    wanted = set(dtypes)
    for name, (dtype, tf32) in PEAKS.items():
        if dtype not in wanted:
            continue
        tf32_note = " TF32" if tf32 else (" TF32 off" if dtype == "float32" else "")
        how = f"{frame.name} matmul {n}x{n}x{n} {dtype}{tf32_note}"
        try:
            call = frame.gemm(n, dtype, tf32)
            timer.time([call], warmup)
            ms = median(timer.time([call], repeats)[0])
            peaks[name] = {"tflops": 2.0 * n**3 / (ms * 1e-3) / 1e12, "how": f"{how}, median of {repeats}"}
        except Exception as error:  # noqa: BLE001
            peaks[name] = {"tflops": None, "how": f"{how}: not measured ({first_line(error)})"}
        frame.empty_cache()
    return peaks


def apply_peaks(rows: Iterable[Row], peaks: dict[str, dict[str, Any]]) -> None:
    for row in rows:
        rate = peaks.get(row.peak or "", {}).get("tflops")
        if row.tflops is not None and rate:
            row.pct_peak = 100.0 * row.tflops / rate


def apply_twins(rows: Sequence[Row]) -> None:
    """Sets each row's vs_twin: its rate over the same backend's on the twin case of the same run
    (paged / contiguous cache, varlen / dense at the mean length), TFLOP/s where both have one (the
    twins count their own visible pairs), else GB/s (read)."""
    by_key = {(r.backend, r.case): r for r in rows}
    for row in rows:
        twin_case = twin_of(row.case)
        other = by_key.get((row.backend, twin_case)) if twin_case is not None else None
        if other is None:
            continue
        row.twin = twin_case.label
        mine, theirs = (row.tflops, other.tflops) if row.tflops and other.tflops else (row.gbps, other.gbps)
        if mine and theirs:
            row.vs_twin = mine / theirs
