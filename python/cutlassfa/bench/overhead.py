"""`cutlassfa bench --overhead`: what one call costs beyond its kernel.

* A tiny problem, (B, H, N, d) = (1, 1, 16, 64) fp16, whose kernel takes a few microseconds: the wall
  time of `calls` (>= 3,000) back-to-back calls with one synchronize at the end, divided by the count,
  through PyTorch tensors (ours, plain and with causal + lse, and SDPA's FLASH backend in the same
  run), and through numpy arrays (the host path: copies in, launch, copies out). Contenders alternate
  in rounds (median of the rounds), as in the bench.
* The fp32 HW4 shapes with a synchronize after every call (as a training or serving loop has) against
  back to back: a per-call allocation or setup shows as the difference.
"""

from __future__ import annotations

import contextlib

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import hw4
from .._inputs import Case
from .._provenance import sm_clock_mhz
from .._text import first_line, format_table
from ..check.variant_inputs import index_to_framework
from .frames import Frame
from .timing import median

TINY = Case("float16", 1, 1, 1, 16, 16, 64, False)
DEFAULT_CALLS = 3000
DEFAULT_SYNC_CALLS = 30
ROUNDS = 3


@dataclass
class OverheadRow:
    what: str  # e.g. "torch tensorcore causal+lse"
    path: str  # "torch", "cupy" or "numpy"
    backend: str
    shape: tuple[int, ...]
    dtype: str
    status: str = "ok"  # "ok", "unavailable", "error"
    calls: int = 0
    us_per_call: float | None = None
    note: str = ""


@dataclass
class SyncRow:
    shape: tuple[int, int, int]  # (B, N, d), fp32
    backend: str
    status: str = "ok"
    calls: int = 0
    ms_back_to_back: float | None = None
    ms_synchronized: float | None = None
    ratio: float | None = None  # synchronized / back to back
    sm_clock_mhz: float | None = None  # nvidia-smi's SM clock right after the row's timings (None without it)
    note: str = ""


def wall_per_call(call: Callable[[], Any], calls: int, synchronize: Callable[[], None], *,
                  sync_each: bool = False) -> float:
    """Seconds per call: `calls` calls then one synchronize (or one after each call), wall clock."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
        if sync_each:
            synchronize()
    synchronize()
    return (time.perf_counter() - start) / calls


def _alternating(contenders: Sequence[Callable[[], float]], rounds: int = ROUNDS) -> list[float]:
    """Median over `rounds` rounds of each contender's measurement, contenders alternating."""
    results: list[list[float]] = [[] for _ in contenders]
    for r in range(rounds):
        for j in range(len(contenders)):
            c = (r + j) % len(contenders)
            results[c].append(contenders[c]())
    return [median(v) for v in results]


def tiny_call_rows(frame: Frame, calls: int) -> list[OverheadRow]:
    """Per-call wall time of the tiny problem on every path that can run here."""
    import cutlassfa

    b, h, n, d = TINY.B, TINY.H, TINY.Nq, TINY.d
    rows: list[OverheadRow] = []
    runs: list[tuple[OverheadRow, Callable[[], Any]]] = []
    host = tuple(np.random.default_rng(0).standard_normal((b, h, n, d)).astype(np.float16) for _ in range(3))
    host_backend = cutlassfa.select_backend(*host)
    row = OverheadRow("numpy (host path)", "numpy", host_backend, (b, h, n, d), TINY.dtype)
    runs.append((row, lambda: cutlassfa.forward(*host)))
    if frame.on_gpu:
        dev = tuple(frame.randn((b, h, n, d), TINY.dtype, seed) for seed in range(3))
        backend = cutlassfa.select_backend(*dev)
        runs.append((OverheadRow(f"{frame.name} {backend}", frame.name, backend, (b, h, n, d), TINY.dtype),
                     lambda: cutlassfa.forward(*dev)))
        runs.append((OverheadRow(f"{frame.name} {backend} causal+lse", frame.name, backend, (b, h, n, d),
                                 TINY.dtype), lambda: cutlassfa.forward(*dev, causal=True, return_lse=True)))
        # The options of a serving call: a window, softcap and the cache lengths on the device.
        lengths = index_to_framework(np.array([n], np.int32), frame.name)
        runs.append((OverheadRow(f"{frame.name} {backend} window+softcap+cache_seqlens", frame.name, backend,
                                 (b, h, n, d), TINY.dtype),
                     lambda: cutlassfa.forward(*dev, causal=True, window=(8, 0), softcap=30.0, cache_seqlens=lengths)))
        sdpa = _sdpa_flash(frame, dev)
        if isinstance(sdpa, str):
            rows.append(OverheadRow("torch sdpa_flash", "torch", "sdpa_flash", (b, h, n, d), TINY.dtype,
                                    "unavailable", note=sdpa))
        else:
            runs.append((OverheadRow("torch sdpa_flash", "torch", "sdpa_flash", (b, h, n, d), TINY.dtype), sdpa))
    else:
        rows.append(OverheadRow("torch / cupy device arrays", "torch", "-", (b, h, n, d), TINY.dtype, "unavailable",
                                note="no GPU frame (needs a GPU and PyTorch or CuPy)"))
    with contextlib.ExitStack() as stack:
        for _, call in runs:
            if hasattr(call, "context"):
                stack.enter_context(call.context())
        rows.extend(_time_runs(runs, calls, frame))
    return rows


def _time_runs(runs: list[tuple[OverheadRow, Callable[[], Any]]], calls: int, frame: Frame) -> list[OverheadRow]:
    """Warm each path up, then time the ones that ran, interleaved."""
    rows: list[OverheadRow] = []
    good = []
    for row, call in runs:
        try:
            for _ in range(min(100, calls)):  # warm-up: module loads, allocator pools, caches
                call()
            frame.synchronize()
            good.append((row, call))
        except Exception as error:  # noqa: BLE001 - one path failing is one row
            row.status, row.note = "error", first_line(error)
            rows.append(row)
    seconds = _alternating([lambda c=call: wall_per_call(c, calls, frame.synchronize) for _, call in good])
    for (row, _), s in zip(good, seconds):
        row.calls, row.us_per_call = calls, s * 1e6
        rows.append(row)
    return rows


def _sdpa_flash(frame: Frame, dev: tuple[Any, Any, Any]) -> Callable[[], Any] | str:
    """SDPA restricted to its FLASH backend on the same tensors, or why it cannot run."""
    if frame.name != "torch":
        return "needs PyTorch with CUDA"
    try:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as error:
        return first_line(error)

    # The backend restriction is entered once (tiny_call_rows holds it over the timing): entering
    # sdpa_kernel() costs tens of microseconds, which a user would not pay per call.
    def call() -> Any:
        return F.scaled_dot_product_attention(*dev)

    call.context = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)  # type: ignore[attr-defined]
    return call


def sync_rows(frame: Frame, calls: int, shapes: Sequence[tuple[int, int, int]] = hw4.FULL_SHAPES) -> list[SyncRow]:
    """Each fp32 HW4 shape: ms per call back to back and with a synchronize after every call."""
    import cutlassfa

    rows = []
    for shape in shapes:
        if not frame.on_gpu:
            rows.append(SyncRow(shape, "-", "unavailable", note="needs a GPU and PyTorch or CuPy"))
            continue
        try:
            q, k, v = (frame.randn(shape, "float32", seed) for seed in range(3))
            backend = cutlassfa.select_backend(q, k, v)
            row = SyncRow(shape, backend, calls=calls)

            def call() -> Any:
                return cutlassfa.forward(q, k, v)

            for _ in range(3):
                call()
            b2b, synced = _alternating([lambda: wall_per_call(call, calls, frame.synchronize),
                                        lambda: wall_per_call(call, calls, frame.synchronize, sync_each=True)])
            row.ms_back_to_back, row.ms_synchronized = b2b * 1e3, synced * 1e3
            row.ratio = synced / b2b
            row.sm_clock_mhz = sm_clock_mhz()  # device 0, as the document's provenance
        except Exception as error:  # noqa: BLE001
            row = SyncRow(shape, "-", "error", note=first_line(error))
        rows.append(row)
        frame.empty_cache()
    return rows


def overhead_table(tiny: Sequence[OverheadRow], synced: Sequence[SyncRow]) -> str:
    f = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    first = format_table(["path", "backend", "shape", "calls", "µs per call", "note"],
                         [[r.what, r.backend, "x".join(map(str, r.shape)) + f" {r.dtype}", r.calls,
                           f(r.us_per_call, ".1f"), r.note or r.status] for r in tiny])
    second = format_table(["fp32 (B, N, d)", "backend", "calls", "ms back to back", "ms synchronized", "ratio",
                           "SM MHz after", "note"],
                          [[str(r.shape), r.backend, r.calls, f(r.ms_back_to_back, ".3f"), f(r.ms_synchronized, ".3f"),
                            f(r.ratio, ".3f"), f(r.sm_clock_mhz, ".0f"), r.note or r.status] for r in synced])
    return first + "\n\n" + second


def overhead_document(tiny: Sequence[OverheadRow], synced: Sequence[SyncRow], *, calls: int, sync_calls: int,
                      frame: str) -> dict[str, Any]:
    from .._provenance import provenance

    return {"schema": "cutlassfa-bench-overhead/1", **provenance(),
            "settings": {"calls": calls, "sync_calls": sync_calls, "rounds": ROUNDS, "inputs": frame,
                         "timer": "time.perf_counter (wall)"},
            "tiny": [asdict(r) for r in tiny], "synchronized": [asdict(r) for r in synced]}
