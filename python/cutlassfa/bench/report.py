"""What a bench run prints and writes: the results table, the peaks, the JSON document (schema in the
README), and a progress bar on stderr."""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from .._text import format_table
from .measure import Row, Settings

SCHEMA = "cutlassfa-bench/2"


def _f(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def results_table(rows: Sequence[Row]) -> str:
    body = []
    for r in rows:
        c = r.case
        heads = str(c.H) if c.H == c.Hk else f"{c.H}/{c.Hk}"
        body.append([r.backend, c.dtype, c.B, heads, c.Nq, c.Nk, c.d, "yes" if c.causal else "no",
                     _f(r.ms, ".3f"), _f(r.tflops, ".1f" if (r.tflops or 0) >= 10 else ".3g"), _f(r.gbps, ".0f"),
                     _f(r.pct_peak, ".0f"), r.peak or "", _f(r.rel_err, ".1e"),
                     r.note if r.status != "skipped" else f"skipped: {r.note}"])
    return format_table(["backend", "dtype", "B", "H", "Nq", "Nk", "d", "causal", "ms", "TFLOP/s", "GB/s",
                         "% peak", "peak", "rel-L2", "note"], body)


def peaks_text(peaks: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, p in peaks.items():
        rate = p.get("tflops")
        lines.append(f"  {name:<10} {'' if rate is None else f'{rate:8.1f} TFLOP/s'}  ({p['how']})")
    return "\n".join(lines)


def to_document(rows: Sequence[Row], peaks: dict[str, dict[str, Any]], *, settings: Settings, timer: str,
                unavailable: dict[str, str], frame: str) -> dict[str, Any]:
    """The JSON document: provenance (commit, dirty, GPU, clocks, driver, versions), settings, peaks, rows."""
    from .._provenance import provenance

    return {
        "schema": SCHEMA,
        **provenance(),
        "settings": {"repeats": settings.repeats, "warmup": settings.warmup, "max_call_s": settings.max_call_s,
                     "seed": settings.seed, "timer": timer, "inputs": frame, "interleaved": True,
                     "flops": "4 * B * H * d * visible query-key pairs (bottom-right causal counted exactly)"},
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

