"""What a bench run prints and writes: the results table, the peaks, the ratios to the twins, the JSON
document (schema in the README), and a progress bar on stderr."""

from __future__ import annotations

import math
import sys
from typing import Any, Sequence

import numpy as np

from .._text import format_table
from .feeds import kind_of
from .measure import Row, Settings
from .runners import READ

SCHEMA = "cutlassfa-bench/3"  # 3: rows name their mode, variant, lengths, feed and twin


def _f(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def results_table(rows: Sequence[Row]) -> str:
    """One line per row. A `variant` column when a case has one (window, paged, varlen ...), a `vs twin`
    column when a row has a twin in the run (see measure.apply_twins)."""
    variants = any(r.case.variant is not None for r in rows)
    twins = any(r.vs_twin is not None for r in rows)
    body = []
    for r in rows:
        c = r.case
        heads = str(c.H) if c.H == c.Hk else f"{c.H}/{c.Hk}"
        line = [r.backend, c.dtype, c.B, heads, c.Nq, c.Nk, c.d, "yes" if c.causal else "no"]
        line += [c.variant.name if c.variant else ""] if variants else []
        line += [_f(r.ms, ".3f"), _f(r.tflops, ".1f" if (r.tflops or 0) >= 10 else ".3g"), _f(r.gbps, ".0f")]
        line += [_f(r.vs_twin, ".3f")] if twins else []
        line += [_f(r.pct_peak, ".0f"), r.peak or "", _f(r.rel_err, ".1e"),
                 r.note if r.status != "skipped" else f"skipped: {r.note}"]
        body.append(line)
    header = ["backend", "dtype", "B", "H", "Nq", "Nk", "d", "causal"] + (["variant"] if variants else []) + \
        ["ms", "TFLOP/s", "GB/s"] + (["vs twin"] if twins else []) + ["% peak", "peak", "rel-L2", "note"]
    return format_table(header, body)


# How a row's twin ratio reads, by the row's mode.
TWIN_RATIOS = {"paged": "paged / contiguous cache", "varlen": "varlen / dense at the mean length"}


def twin_summary(rows: Sequence[Row]) -> str:
    """Per mode and backend, the spread of the attention rows' vs-twin ratios: min, geomean, max, and how
    many are below 0.9 (the bar both the paged and the varlen targets set); '' when no row has one."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.vs_twin is not None and r.backend != READ:
            groups.setdefault((kind_of(r.case), r.backend), []).append(r.vs_twin)
    lines = []
    for (kind, backend), ratios in groups.items():
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        below = sum(x < 0.9 for x in ratios)
        lines.append(f"  {TWIN_RATIOS.get(kind, kind)}, {backend}: min {min(ratios):.3f}, geomean {geomean:.3f}, "
                     f"max {max(ratios):.3f} over {len(ratios)} cases ({below} below 0.9)")
    return ("Rate against the twin case of the same run (TFLOP/s over visible pairs):\n" + "\n".join(lines)
            if lines else "")


def peaks_text(peaks: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, p in peaks.items():
        rate = p.get("tflops")
        lines.append(f"  {name:<10} {'' if rate is None else f'{rate:8.1f} TFLOP/s'}  ({p['how']})")
    return "\n".join(lines)


def to_document(rows: Sequence[Row], peaks: dict[str, dict[str, Any]], *, settings: Settings, timer: str,
                unavailable: dict[str, str], frame: str, complete: bool = True) -> dict[str, Any]:
    """The JSON document: provenance (commit, dirty, GPU, clocks, driver, versions), settings, peaks, rows;
    `complete` false while the run is still going (the rows so far)."""
    from .._provenance import provenance

    return {
        "schema": SCHEMA,
        **provenance(),
        "settings": {"repeats": settings.repeats, "warmup": settings.warmup, "max_call_s": settings.max_call_s,
                     "seed": settings.seed, "timer": timer, "inputs": frame, "interleaved": True,
                     "flops": "4 * H * d * visible query-key pairs summed over the batch (bottom-right causal "
                              "counted exactly; each entry's own lengths for KV caches and varlen batches)",
                     "vs_twin": "a row's TFLOP/s (read: GB/s) over the same backend's on its twin case: paged "
                                "cache / contiguous cache of the same shape, varlen batch / dense batch at the "
                                "mean length"},
        "complete": complete,
        "passed": not any(r.status == "inaccurate" for r in rows),
        "peaks": peaks,
        "unavailable": unavailable,
        "rows": [r.to_json() for r in rows],
    }


def json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


class Progress:
    """tqdm when importable, else a one-line bar on stderr (only on a terminal: logs get one line per case)."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.tty = sys.stderr.isatty()
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, file=sys.stderr, unit="row", leave=False)
            except ImportError:
                pass

    def case(self, label: str) -> None:
        if self.enabled and self.bar is None and not self.tty:
            print(f"[{self.done}/{self.total}] {label}", file=sys.stderr, flush=True)

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description(label[:40])
            self.bar.update(1)
        elif self.tty:
            width = 30
            filled = width * self.done // max(self.total, 1)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label[:50]:<50}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.tty:
            sys.stderr.write("\n")

