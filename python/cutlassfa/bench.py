"""`cutlassfa bench`: TFLOP/s of every backend next to PyTorch SDPA, on the same inputs, in one run.

For each case (dtype, B, H, Nq, Nk, d, causal) every available cutlassfa backend and, when PyTorch is
importable, `scaled_dot_product_attention` restricted to one of its backends at a time (sdpa_flash,
sdpa_efficient, sdpa_cudnn, sdpa_math) is timed with CUDA events: warm-up calls first, then the
median of `--repeats` (default 20) calls, the inputs rotated among copies when they would sit in L2.

    TFLOP/s = 4 * B * H * Nq * Nk * d / t      (x 0.5 when causal)

Each row is also given as a percentage of a dense-GEMM rate measured once per run (see PEAK_OF), and
with its rel-L2 error against the float64 reference on a sample of the output (a few (b, h) slices,
the last <= 2048 query rows: taking the *last* rows keeps the bottom-right causal alignment).
A backend that would be absurdly slow on a shape is skipped, and the table says why.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Protocol, Sequence

import numpy as np

from .check import Case, Unsupported, classify_error, first_line, format_table, numpy_dtype, to_numpy64

DTYPES = ("float32", "float16", "bfloat16")
OUR_BACKENDS = ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive", "cpu")
# Row name -> torch.nn.attention.SDPBackend member.
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_math": "MATH",
}
ALL_BACKENDS = OUR_BACKENDS + tuple(SDPA_BACKENDS)

# ---------------------------------------------------------------------------------------------------
# Grids. HW4: the fp32 one-head test shapes (t11, t22, t29, t30 of the HW4 test set), (B, N, d). LLM: fp16 and
# bf16, d 64 / 128, (B, H, N) with B*N = 32K tokens, causal and not. Quick: seconds on an H100.
# ---------------------------------------------------------------------------------------------------
HW4_SHAPES = ((13600, 128, 32), (500, 2048, 64), (4, 32768, 32), (2, 32768, 64))
LLM_SHAPES = ((32, 16, 1024), (8, 16, 4096), (2, 16, 16384))
LLM_HEAD_DIMS = (64, 128)


def default_grid() -> list[Case]:
    cases = [Case("float32", b, 1, 1, n, n, d, False) for b, n, d in HW4_SHAPES]
    cases += [Case(dt, b, h, h, n, n, d, causal)
              for dt in ("float16", "bfloat16") for d in LLM_HEAD_DIMS for b, h, n in LLM_SHAPES
              for causal in (False, True)]
    return cases


def quick_grid() -> list[Case]:
    return [
        Case("float32", 136, 1, 1, 128, 128, 32, False),  # HW4 t11 with B / 100: small enough for cpu too
        Case("float32", 50, 1, 1, 2048, 2048, 64, False),
        Case("float16", 8, 16, 16, 1024, 1024, 64, False),
        Case("float16", 8, 16, 16, 1024, 1024, 64, True),
        Case("bfloat16", 8, 16, 16, 1024, 1024, 128, False),
    ]


# ---------------------------------------------------------------------------------------------------
# Knobs of the measurement.
# ---------------------------------------------------------------------------------------------------
DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 5
DEFAULT_MAX_CALL_S = 2.0  # skip a backend on a shape where one call would take longer than this
# The numpy backend is only timed on tiny problems (~0.1 s per call).
CPU_MAX_FLOPS = 2e9
# Backends that materialize the Nq x Nk score matrix (float32), and how many such matrices they hold:
# skipped when that many bytes exceed a quarter of the free GPU memory.
SCORE_MATRICES = {"naive": 1, "sdpa_math": 3}
# FLOP-rate model (TFLOP/s) for the time prediction before a backend was measured in this run; after
# the first measurement of a (backend, dtype) the measured rate replaces it. Deliberately low.
MODEL_TFLOPS = {"naive": 2.0, "sdpa_math": 5.0, "cpu": 0.01}
# Inputs are rotated among copies when q + k + v + out < L2_FACTOR x L2 (so no timed call finds its
# inputs in L2 from the previous call); at most MAX_COPIES copies.
L2_FACTOR = 3
MAX_COPIES = 32
DEFAULT_L2_BYTES = 50 * 2**20  # H100 / H200: 50 MB
# Reference sample: these (b, h) slices and the last rows of each, at most REF_MAX_ROWS and at most
# REF_MAX_SCORES scores per slice.
REF_MAX_ROWS = 2048
REF_MAX_SCORES = 1 << 24
GEMM_SIZE = 8192

# Which measured dense-GEMM rate a row is compared with. fp16 / bf16 rows: the GEMM of that dtype.
# fp32 rows: CUDA-core fp32 (TF32 off), except the tensor-core backends, which split fp32 inputs into fp16
# and run fp16 MMAs. PyTorch's fp32 SDPA does not use TF32 unless allowed (off by default). cpu: none.
PEAKS = {
    "fp16_gemm": ("float16", False),
    "bf16_gemm": ("bfloat16", False),
    "fp32_gemm": ("float32", False),  # TF32 disabled: the CUDA-core fp32 rate
    "tf32_gemm": ("float32", True),  # reported for reference; no row is compared with it by default
}


def peak_of(backend: str, dtype: str) -> str | None:
    """Name of the peak (a key of PEAKS) that `backend` on `dtype` is compared with."""
    if backend == "cpu":
        return None
    if dtype == "float16":
        return "fp16_gemm"
    if dtype == "bfloat16":
        return "bf16_gemm"
    return "fp16_gemm" if backend.startswith("tensorcore") else "fp32_gemm"


def attention_flops(B: int, H: int, Nq: int, Nk: int, d: int, causal: bool) -> float:
    """4 * B * H * Nq * Nk * d (two GEMMs of 2 FLOP per multiply-add), halved when causal."""
    flops = 4.0 * B * H * Nq * Nk * d
    return flops * 0.5 if causal else flops


def tflops(case: Case, ms: float) -> float:
    return attention_flops(case.B, case.H, case.Nq, case.Nk, case.d, case.causal) / (ms * 1e-3) / 1e12


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def skip_reason(backend: str, case: Case, *, free_bytes: int | None, max_call_s: float,
                rate_tflops: float | None = None) -> str | None:
    """Why `backend` should not be run on `case`, before any call; None to run it.

    `rate_tflops` is the rate measured earlier in this run for (backend, dtype), if any."""
    flops = attention_flops(case.B, case.H, case.Nq, case.Nk, case.d, case.causal)
    if backend == "cpu" and flops > CPU_MAX_FLOPS:
        return f"{flops / 1e9:.3g} GFLOP > {CPU_MAX_FLOPS / 1e9:g} GFLOP limit of the numpy backend"
    if backend in SCORE_MATRICES and free_bytes is not None:
        need = SCORE_MATRICES[backend] * case.B * case.H * case.Nq * case.Nk * 4
        if need > free_bytes / 4:
            return f"score matrix {need / 2**30:.1f} GiB > free memory / 4 ({free_bytes / 4 / 2**30:.1f} GiB)"
    rate, source = (rate_tflops, "measured") if rate_tflops else (MODEL_TFLOPS.get(backend), "model")
    if rate:
        predicted = flops / (rate * 1e12)
        if predicted > max_call_s:
            return f"predicted {predicted:.3g} s/call > {max_call_s:g} s ({source} {rate:.3g} TFLOP/s)"
    return None


def rotation_copies(working_set_bytes: int, l2_bytes: int, free_bytes: int | None) -> int:
    """How many copies of the inputs to rotate among, so that the whole rotation exceeds L2_FACTOR x L2."""
    if working_set_bytes <= 0 or working_set_bytes >= L2_FACTOR * l2_bytes:
        return 1
    copies = min(MAX_COPIES, math.ceil(L2_FACTOR * l2_bytes / working_set_bytes))
    if free_bytes is not None:
        copies = min(copies, max(1, int(free_bytes / 4 // working_set_bytes)))
    return max(1, copies)


# ---------------------------------------------------------------------------------------------------
# Timers: fn(i) performs call i; time(fn, n) returns n durations in ms.
# ---------------------------------------------------------------------------------------------------
class Timer(Protocol):
    name: str

    def time(self, fn: Callable[[int], Any], calls: int) -> list[float]: ...


class TorchEventTimer:
    """torch.cuda.Event pairs on the current stream (the one cutlassfa.forward and SDPA launch on).
    No synchronization between calls: the host runs ahead, so launch overhead is hidden once the
    kernels are longer than it."""

    name = "torch.cuda.Event"

    def time(self, fn: Callable[[int], Any], calls: int) -> list[float]:
        import torch

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        for i in range(calls):
            starts[i].record()
            fn(i)
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]


class CudaPythonEventTimer:
    """CUDA runtime events through cuda-python (`cuda.bindings.runtime`), recorded on `stream()`
    (CuPy's current stream: the one cutlassfa.forward launches on for CuPy arrays)."""

    name = "cuda.bindings.runtime events"

    def __init__(self, stream: Callable[[], int] = lambda: 0) -> None:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart  # cuda-python < 12.6
        self._rt = cudart
        self._stream = stream

    def _ok(self, result: tuple) -> Any:
        if result[0] != self._rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"CUDA runtime error {result[0]}")
        return result[1] if len(result) == 2 else result[1:]

    def time(self, fn: Callable[[int], Any], calls: int) -> list[float]:
        rt, stream = self._rt, self._stream()
        events = [(self._ok(rt.cudaEventCreate()), self._ok(rt.cudaEventCreate())) for _ in range(calls)]
        try:
            for i, (start, end) in enumerate(events):
                self._ok(rt.cudaEventRecord(start, stream))
                fn(i)
                self._ok(rt.cudaEventRecord(end, stream))
            self._ok(rt.cudaEventSynchronize(events[-1][1]))
            return [float(self._ok(rt.cudaEventElapsedTime(s, e))) for s, e in events]
        finally:
            for pair in events:
                for event in pair:
                    rt.cudaEventDestroy(event)


class WallTimer:
    """time.perf_counter around each call (the cpu backend is synchronous)."""

    name = "time.perf_counter"

    def time(self, fn: Callable[[int], Any], calls: int) -> list[float]:
        out = []
        for i in range(calls):
            t0 = time.perf_counter()
            fn(i)
            out.append((time.perf_counter() - t0) * 1e3)
        return out


# ---------------------------------------------------------------------------------------------------
# Frames: where GPU inputs live (torch when importable, else CuPy); numpy when there is no GPU.
# ---------------------------------------------------------------------------------------------------
class Frame:
    name = "numpy"
    on_gpu = False

    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        rng = np.random.default_rng(seed)
        return rng.standard_normal(shape, dtype=np.float32).astype(numpy_dtype(dtype))

    def clone(self, x: Any) -> Any:
        return x.copy()

    def to_host(self, x: Any, dtype: str) -> np.ndarray:
        return np.asarray(x)

    def nbytes(self, x: Any) -> int:
        return int(x.nbytes)

    def free_bytes(self) -> int | None:
        return None

    def l2_bytes(self) -> int:
        return DEFAULT_L2_BYTES

    def empty_cache(self) -> None:
        pass

    def timer(self) -> Timer:
        return WallTimer()

    def gemm(self, n: int, dtype: str, tf32: bool) -> Callable[[int], Any]:
        raise Unsupported("no GPU")


class TorchFrame(Frame):
    name = "torch"
    on_gpu = True

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def _dtype(self, dtype: str) -> Any:
        t = self.torch
        return {"float32": t.float32, "float16": t.float16, "bfloat16": t.bfloat16}[dtype]

    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        gen = self.torch.Generator(device="cuda").manual_seed(seed)
        return self.torch.randn(shape, generator=gen, device="cuda", dtype=self._dtype(dtype))

    def clone(self, x: Any) -> Any:
        return x.clone()

    def to_host(self, x: Any, dtype: str) -> np.ndarray:
        return x.detach().float().cpu().numpy().astype(numpy_dtype(dtype))

    def nbytes(self, x: Any) -> int:
        return x.numel() * x.element_size()

    def free_bytes(self) -> int | None:
        return int(self.torch.cuda.mem_get_info()[0])

    def l2_bytes(self) -> int:
        props = self.torch.cuda.get_device_properties(self.torch.cuda.current_device())
        return int(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)

    def empty_cache(self) -> None:
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def timer(self) -> Timer:
        return TorchEventTimer()

    def gemm(self, n: int, dtype: str, tf32: bool) -> Callable[[int], Any]:
        t = self.torch
        a = t.randn(n, n, device="cuda", dtype=self._dtype(dtype))
        b = t.randn(n, n, device="cuda", dtype=self._dtype(dtype))
        c = t.empty(n, n, device="cuda", dtype=self._dtype(dtype))

        def call(_: int) -> Any:
            # allow_tf32 is read at each matmul; set it for this call only.
            previous = t.backends.cuda.matmul.allow_tf32
            t.backends.cuda.matmul.allow_tf32 = tf32
            try:
                return t.matmul(a, b, out=c)
            finally:
                t.backends.cuda.matmul.allow_tf32 = previous

        return call


class CupyFrame(Frame):
    name = "cupy"
    on_gpu = True

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy

    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        if dtype == "bfloat16":
            raise Unsupported("CuPy has no bfloat16 arrays (install PyTorch)")
        return self.cupy.random.default_rng(seed).standard_normal(shape, dtype=np.float32).astype(dtype)

    def clone(self, x: Any) -> Any:
        return x.copy()

    def to_host(self, x: Any, dtype: str) -> np.ndarray:
        return x.get()

    def free_bytes(self) -> int | None:
        return int(self.cupy.cuda.runtime.memGetInfo()[0])

    def l2_bytes(self) -> int:
        attrs = self.cupy.cuda.Device().attributes
        return int(attrs.get("L2CacheSize", 0) or DEFAULT_L2_BYTES)

    def empty_cache(self) -> None:
        self.cupy.cuda.Device().synchronize()
        self.cupy.get_default_memory_pool().free_all_blocks()

    def timer(self) -> Timer:
        return CudaPythonEventTimer(lambda: self.cupy.cuda.get_current_stream().ptr)

    def gemm(self, n: int, dtype: str, tf32: bool) -> Callable[[int], Any]:
        if dtype == "bfloat16":
            raise Unsupported("CuPy has no bfloat16 arrays")
        if tf32:
            raise Unsupported("TF32 rate measured through PyTorch only")
        a = self.cupy.random.standard_normal((n, n), dtype=np.float32).astype(dtype)
        b = self.cupy.random.standard_normal((n, n), dtype=np.float32).astype(dtype)
        c = self.cupy.empty((n, n), dtype=dtype)
        return lambda _: self.cupy.matmul(a, b, out=c)


def pick_frame(gpu: bool) -> Frame:
    """torch when importable with CUDA, else CuPy, else numpy (no GPU: cpu backend only)."""
    if gpu:
        try:
            import torch

            if torch.cuda.is_available():
                return TorchFrame()
        except ImportError:
            pass
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                return CupyFrame()
        except Exception:  # noqa: BLE001 - no CuPy, or no usable device
            pass
    return Frame()


# ---------------------------------------------------------------------------------------------------
# Runners: one per row name.
# ---------------------------------------------------------------------------------------------------
@dataclass
class Runner:
    """`prepare(case)` returns call(q, k, v) -> out; calls run inside `context()`. `on_gpu`: fed the
    frame's GPU arrays (else host numpy arrays)."""

    name: str
    prepare: Callable[[Case], Callable[[Any, Any, Any], Any]]
    on_gpu: bool = True
    context: Callable[[], ContextManager] = contextlib.nullcontext


def ours(name: str) -> Runner:
    def prepare(case: Case) -> Callable[[Any, Any, Any], Any]:
        import cutlassfa

        return lambda q, k, v: cutlassfa.forward(q, k, v, causal=case.causal, backend=name)

    return Runner(name, prepare, on_gpu=name != "cpu")


def sdpa(name: str) -> Runner:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    member = getattr(SDPBackend, SDPA_BACKENDS[name], None)
    if member is None:
        raise Unsupported(f"this PyTorch ({torch.__version__}) has no SDPBackend.{SDPA_BACKENDS[name]}")

    def prepare(case: Case) -> Callable[[Any, Any, Any], Any]:
        kwargs: dict[str, Any] = {}
        if case.causal and case.Nq != case.Nk:
            # PyTorch's is_causal is top-left aligned; ours is bottom-right as FlashAttention-2.
            from torch.nn.attention.bias import causal_lower_right

            kwargs["attn_mask"] = causal_lower_right(case.Nq, case.Nk)
        elif case.causal:
            kwargs["is_causal"] = True
        if case.H != case.Hk:
            kwargs["enable_gqa"] = True
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs)

    @contextlib.contextmanager
    def context() -> Any:
        with sdpa_kernel(member), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Flash attention kernel not used because ..."
            yield

    return Runner(name, prepare, on_gpu=True, context=context)


def make_runners(names: Sequence[str], frame: Frame) -> tuple[list[Runner], dict[str, str]]:
    """Runners for the requested names that can run here, and {name: why not} for the others."""
    import cutlassfa

    statuses = cutlassfa.backends()
    runners, unavailable = [], {}
    for name in names:
        if name in SDPA_BACKENDS:
            if frame.name != "torch":
                unavailable[name] = "needs PyTorch with CUDA"
                continue
            try:
                runners.append(sdpa(name))
            except (ImportError, Unsupported) as error:
                unavailable[name] = str(error)
        elif name in statuses:
            if not statuses[name].available:
                unavailable[name] = statuses[name].reason
            elif name != "cpu" and not frame.on_gpu:
                unavailable[name] = "needs PyTorch or CuPy for device arrays"
            else:
                runners.append(ours(name))
        else:
            unavailable[name] = "unknown backend"
    return runners, unavailable


# ---------------------------------------------------------------------------------------------------
# The measurement.
# ---------------------------------------------------------------------------------------------------
@dataclass
class Row:
    backend: str
    case: Case
    status: str = "ok"  # "ok", "skipped", "unsupported", "error"
    ms: float | None = None
    ms_min: float | None = None
    repeats: int = 0
    tflops: float | None = None
    peak: str | None = None
    pct_peak: float | None = None
    rel_err: float | None = None
    copies: int = 1  # input copies rotated among (L2)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        c = self.case
        return {"backend": self.backend, "dtype": c.dtype, "B": c.B, "H": c.H, "Hk": c.Hk, "Nq": c.Nq,
                "Nk": c.Nk, "d": c.d, "causal": c.causal, "status": self.status, "ms": self.ms,
                "ms_min": self.ms_min, "repeats": self.repeats, "tflops": self.tflops, "peak": self.peak,
                "pct_peak": self.pct_peak, "rel_err": _finite(self.rel_err), "copies": self.copies,
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


def _slices(case: Case) -> list[tuple[int, int]]:
    return sorted({(0, 0), (case.B - 1, case.H - 1)})


def _ref_rows(case: Case) -> int:
    return max(1, min(case.Nq, REF_MAX_ROWS, REF_MAX_SCORES // max(case.Nk, 1)))


def reference_sample(case: Case, q: Any, k: Any, v: Any) -> np.ndarray:
    """float64 reference of out[b, h, -R:, :] for the sampled (b, h), concatenated."""
    from cutlassfa import reference

    rows, group = _ref_rows(case), case.H // case.Hk
    parts = []
    for b, h in _slices(case):
        qs = to_numpy64(q[b, h, case.Nq - rows:])[None, None]
        ks = to_numpy64(k[b, h // group])[None, None]
        vs = to_numpy64(v[b, h // group])[None, None]
        parts.append(reference.attention_reference(qs, ks, vs, causal=case.causal)[0].ravel())
    return np.concatenate(parts)


def output_sample(case: Case, out: Any) -> np.ndarray:
    rows = _ref_rows(case)
    return np.concatenate([to_numpy64(out[b, h, case.Nq - rows:]).ravel() for b, h in _slices(case)])


ProgressFn = Callable[[str], None]


def bench_case(case: Case, runners: Sequence[Runner], frame: Frame, settings: Settings, *,
               rates: dict[tuple[str, str], float], timer_for: Callable[[Runner], Timer],
               progress: ProgressFn = lambda _: None) -> list[Row]:
    """All runners on one case; inputs (and their rotated copies) are made once and shared."""
    free = frame.free_bytes()
    rows = {r.name: Row(r.name, case, peak=peak_of(r.name, case.dtype)) for r in runners}
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

    shapes = [(case.B, case.H, case.Nq, case.d)] + [(case.B, case.Hk, case.Nk, case.d)] * 2
    gpu_inputs: list[tuple[Any, Any, Any]] = []
    host_inputs: tuple[Any, ...] | None = None
    ref: np.ndarray | None = None
    try:
        base = tuple(frame.randn(s, case.dtype, settings.seed * 1000 + i) for i, s in enumerate(shapes))
        if frame.on_gpu and any(r.on_gpu for r in todo):
            ws = sum(frame.nbytes(x) for x in base) + frame.nbytes(base[0])  # + out
            copies = rotation_copies(ws, frame.l2_bytes(), free)
            gpu_inputs = [base] + [tuple(frame.clone(x) for x in base) for _ in range(copies - 1)]
        if any(not r.on_gpu for r in todo) or not frame.on_gpu:
            host_inputs = base if not frame.on_gpu else tuple(frame.to_host(x, case.dtype) for x in base)
        if settings.accuracy:
            ref = reference_sample(case, *(host_inputs or base))
    except Exception as error:  # noqa: BLE001 - inputs that do not fit are reported per row
        status, note = ("skipped", "out of memory for the inputs") if _is_oom(error) else \
            ("unsupported", first_line(error))
        for r in todo:
            rows[r.name].status, rows[r.name].note = status, note
            progress(r.name)
        frame.empty_cache()
        return list(rows.values())

    for r in todo:
        progress(r.name)
        inputs = gpu_inputs if (r.on_gpu and frame.on_gpu) else [host_inputs]
        _measure(rows[r.name], r, inputs, timer_for(r), settings, ref, rates)
    del gpu_inputs, host_inputs
    frame.empty_cache()
    return list(rows.values())


def _measure(row: Row, runner: Runner, inputs: Sequence[tuple[Any, Any, Any]], timer: Timer,
             settings: Settings, ref: np.ndarray | None, rates: dict[tuple[str, str], float]) -> None:
    case = row.case
    first: list[Any] = []
    try:
        with runner.context():
            call = runner.prepare(case)
            # First call alone: checks the backend accepts the case, gives the output for the error
            # sample, and the time that decides whether the rest is worth running.
            first_ms = timer.time(lambda i: first.append(call(*inputs[0])), 1)[0]
            if first_ms > settings.max_call_s * 1e3:
                row.status, row.note = "skipped", f"first call took {first_ms / 1e3:.3g} s > {settings.max_call_s:g} s"
                return
            if ref is not None:
                from cutlassfa.reference import rel_l2

                row.rel_err = rel_l2(output_sample(case, first[0]), ref)
                if not math.isfinite(row.rel_err):
                    row.note = "output has NaN or inf"
            first.clear()
            n = len(inputs)
            if settings.warmup > 1:
                timer.time(lambda i: call(*inputs[i % n]), settings.warmup - 1)
            times = timer.time(lambda i: call(*inputs[(i + 1) % n]), settings.repeats)
    except Exception as error:  # noqa: BLE001 - a refusing or failing backend is one row, not the run
        if _is_oom(error):
            row.status, row.note = "skipped", "out of memory"
        else:
            row.status = classify_error(error, anchor=row.backend.startswith("sdpa_"))
            row.note = f"{row.status}: {first_line(error)}"
        return
    row.ms, row.ms_min, row.repeats = median(times), min(times), len(times)
    row.tflops = tflops(case, row.ms)
    rates[(row.backend, case.dtype)] = row.tflops
    row.copies = len(inputs)


def measure_peaks(frame: Frame, dtypes: Iterable[str], timer: Timer, n: int = GEMM_SIZE,
                  repeats: int = 10, warmup: int = 3) -> dict[str, dict[str, Any]]:
    """Dense GEMM rates (n^3, median of `repeats`) for the peaks the rows of `dtypes` need."""
    peaks: dict[str, dict[str, Any]] = {}
    wanted = set(dtypes)
    for name, (dtype, tf32) in PEAKS.items():
        if dtype not in wanted:
            continue
        how = f"{frame.name} matmul {n}x{n}x{n} {dtype}{' TF32' if tf32 else (' TF32 off' if dtype == 'float32' else '')}"
        try:
            call = frame.gemm(n, dtype, tf32)
            timer.time(call, warmup)
            ms = median(timer.time(call, repeats))
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


# ---------------------------------------------------------------------------------------------------
# Provenance.
# ---------------------------------------------------------------------------------------------------
def package_version() -> str:
    try:
        import cutlassfa

        return str(getattr(cutlassfa, "__version__", "unknown"))
    except ImportError:
        return "unknown"


def git_commit() -> tuple[str, bool | None]:
    """(`git rev-parse HEAD` of the tree the package was imported from, dirty?), or
    ("<version>+unknown", None) when it is not a git checkout. CUTLASSFA_COMMIT overrides it for a
    build made from a copy of a checkout (the copy has no .git)."""
    if os.environ.get("CUTLASSFA_COMMIT"):
        return os.environ["CUTLASSFA_COMMIT"], None
    where = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            return head.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return f"{package_version()}+unknown", None


def gpu_info() -> dict[str, Any] | None:
    """name, compute capability ("9.0"), SM count, L2 bytes of device 0; None without a GPU."""
    try:
        import cutlassfa

        info = cutlassfa.device_info()
    except Exception:  # noqa: BLE001
        info = {}
    if isinstance(info, dict) and info.get("available", "name" in info):
        cc = info.get("compute_capability")
        cc = f"{cc[0]}.{cc[1]}" if isinstance(cc, (tuple, list)) else cc
        return {"name": info.get("name"), "compute_capability": cc, "multiprocessors": info.get("multiprocessors"),
                "l2_cache_bytes": info.get("l2_cache_bytes")}
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return {"name": p.name, "compute_capability": f"{p.major}.{p.minor}",
                    "multiprocessors": p.multi_processor_count, "l2_cache_bytes": getattr(p, "L2_cache_size", None)}
    except ImportError:
        pass
    return None


def software() -> dict[str, Any]:
    sw: dict[str, Any] = {"python": sys.version.split()[0], "numpy": np.__version__, "cutlassfa": package_version()}
    for module in ("torch", "cupy"):
        try:
            sw[module] = __import__(module).__version__
        except ImportError:
            pass
    return sw


# ---------------------------------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------------------------------
def _f(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def results_table(rows: Sequence[Row]) -> str:
    body = []
    for r in rows:
        c = r.case
        heads = str(c.H) if c.H == c.Hk else f"{c.H}/{c.Hk}"
        body.append([r.backend, c.dtype, c.B, heads, c.Nq, c.Nk, c.d, "yes" if c.causal else "no",
                     _f(r.ms, ".3f"), _f(r.tflops, ".1f" if (r.tflops or 0) >= 10 else ".3g"), _f(r.pct_peak, ".0f"), r.peak or "",
                     _f(r.rel_err, ".1e"), r.note if r.status != "skipped" else f"skipped: {r.note}"])
    return format_table(["backend", "dtype", "B", "H", "Nq", "Nk", "d", "causal", "ms", "TFLOP/s", "% peak",
                         "peak", "rel-L2", "note"], body)


def peaks_text(peaks: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, p in peaks.items():
        rate = p.get("tflops")
        lines.append(f"  {name:<10} {'' if rate is None else f'{rate:8.1f} TFLOP/s'}  ({p['how']})")
    return "\n".join(lines)


def to_document(rows: Sequence[Row], peaks: dict[str, dict[str, Any]], *, settings: Settings, timer: str,
                unavailable: dict[str, str], frame: str) -> dict[str, Any]:
    commit, dirty = git_commit()
    return {
        "schema": "cutlassfa-bench/1",
        "gpu": gpu_info(),
        "commit": commit,
        "dirty": dirty,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "software": software(),
        "settings": {"repeats": settings.repeats, "warmup": settings.warmup, "max_call_s": settings.max_call_s,
                     "seed": settings.seed, "timer": timer, "inputs": frame},
        "peaks": peaks,
        "unavailable": unavailable,
        "rows": [r.to_json() for r in rows],
    }


def write_plot(rows: Sequence[Row], path: str) -> None:
    """Grouped bars: one group per case, one bar per backend, TFLOP/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def label(c: Case) -> str:
        short = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[c.dtype]
        n = f"{c.Nq}" if c.Nq == c.Nk else f"{c.Nq}x{c.Nk}"
        return f"{short} {c.B}x{c.H}x{n} d{c.d}" + (" causal" if c.causal else "")

    labels = list(dict.fromkeys(label(r.case) for r in rows))
    backends = list(dict.fromkeys(r.backend for r in rows if r.tflops is not None))
    values = {b: [0.0] * len(labels) for b in backends}
    for r in rows:
        if r.tflops is not None:
            values[r.backend][labels.index(label(r.case))] = r.tflops
    # Horizontal groups, one per case, on a log axis: the CUDA-core backends run at a tenth of the
    # tensor-core rate and would vanish on a linear one.
    height = 0.8 / max(len(backends), 1)
    fig, ax = plt.subplots(figsize=(11, max(4.0, 0.45 * len(labels) + 1.5)))
    ys = np.arange(len(labels))[::-1]
    for i, b in enumerate(backends):
        bars = [v if v > 0 else np.nan for v in values[b]]
        ax.barh(ys + ((len(backends) - 1) / 2 - i) * height, bars, height, label=b)
    ax.set_xscale("log")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel("TFLOP/s (4·B·H·Nq·Nk·d / t, ×0.5 causal; log scale)")
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class _Progress:
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


# ---------------------------------------------------------------------------------------------------
# CLI.
# ---------------------------------------------------------------------------------------------------
def parse_shape(text: str) -> tuple[int, int, int, int, int, int]:
    """"B,H,N,d" or "B,H,Nq,Nk,d"; H may be "Hq:Hkv" for GQA. Returns (B, H, Hk, Nq, Nk, d)."""
    parts = text.split(",")
    try:
        heads = parts[1].split(":")
        h, hk = int(heads[0]), int(heads[-1])
        if len(parts) == 4:
            b, n, d = int(parts[0]), int(parts[2]), int(parts[3])
            nq = nk = n
        elif len(parts) == 5:
            b, nq, nk, d = int(parts[0]), int(parts[2]), int(parts[3]), int(parts[4])
        else:
            raise ValueError
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"--shape wants B,H,N,d or B,H,Nq,Nk,d (H may be Hq:Hkv), got {text!r}")
    if min(b, h, hk, nq, nk, d) < 1 or h % hk:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: sizes must be >= 1 and Hq a multiple of Hkv")
    return b, h, hk, nq, nk, d


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cutlassfa bench`."""
    parser.add_argument("--quick", action="store_true", help="a small grid (well under a minute on an H100)")
    parser.add_argument("--shape", action="append", type=parse_shape, metavar="B,H,N,d",
                        help="a shape to run instead of the default grid; repeatable. B,H,N,d or B,H,Nq,Nk,d; "
                             "H may be Hq:Hkv (GQA)")
    parser.add_argument("--dtypes", type=_csv, help="comma-separated dtypes: filters the grid, or the dtypes of "
                        "--shape (default for --shape: float16)")
    parser.add_argument("--causal", choices=("no", "yes", "both"),
                        help="filter the grid (default: as listed) / causal for --shape (default: no)")
    parser.add_argument("--backends", type=_csv, help="comma-separated rows to run (default: all): "
                        + ", ".join(ALL_BACKENDS) + "; 'sdpa' means all four sdpa_*")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timed calls per row (median)")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed calls first (>= 1)")
    parser.add_argument("--max-call-s", type=float, default=DEFAULT_MAX_CALL_S,
                        help="skip a backend on a shape when one call would take longer (seconds)")
    parser.add_argument("--seed", type=int, default=0, help="input seed")
    parser.add_argument("--no-accuracy", action="store_true", help="do not compute rel-L2 vs the fp64 reference")
    parser.add_argument("--no-peaks", action="store_true", help="do not measure the dense GEMM peaks")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON (schema in README)")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of TFLOP/s per backend per shape "
                        "(needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def select_cases(args: argparse.Namespace) -> list[Case]:
    if args.shape:
        dtypes = args.dtypes or ["float16"]
        causals = {"no": [False], "yes": [True], "both": [False, True], None: [False]}[args.causal]
        return [Case(dt, b, h, hk, nq, nk, d, c) for (b, h, hk, nq, nk, d) in args.shape for dt in dtypes
                for c in causals]
    cases = quick_grid() if args.quick else default_grid()
    if args.dtypes:
        cases = [c for c in cases if c.dtype in args.dtypes]
    if args.causal in ("no", "yes"):
        cases = [c for c in cases if c.causal == (args.causal == "yes")]
    return cases


def select_backends(requested: Sequence[str] | None) -> list[str]:
    if not requested:
        return list(ALL_BACKENDS)
    names: list[str] = []
    for name in requested:
        names += list(SDPA_BACKENDS) if name == "sdpa" else [name]
    return list(dict.fromkeys(names))


def run(args: argparse.Namespace, *, frame: Frame | None = None,
        timer_for: Callable[[Runner], Timer] | None = None) -> int:
    """Runs the benchmark; returns 0, or 2 on a usage error. `frame` and `timer_for` are for tests."""
    bad = [d for d in (args.dtypes or []) if d not in DTYPES]
    unknown = [b for b in select_backends(args.backends) if b not in ALL_BACKENDS]
    if bad or unknown:
        print(f"cutlassfa bench: unknown dtype(s) {bad} / backend(s) {unknown}", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.warmup < 1:
        print("cutlassfa bench: --repeats and --warmup must be >= 1", file=sys.stderr)
        return 2
    if args.plot:
        if importlib.util.find_spec("matplotlib") is None:
            print("cutlassfa bench: --plot needs matplotlib (pip install matplotlib, or the 'plot' extra)",
                  file=sys.stderr)
            return 2
    cases = select_cases(args)
    if not cases:
        print("cutlassfa bench: no case left after the filters", file=sys.stderr)
        return 2

    if frame is None:
        gpu = gpu_info() is not None
        frame = pick_frame(gpu)
    runners, unavailable = make_runners(select_backends(args.backends), frame)
    if not runners:
        print("cutlassfa bench: no backend can run here: "
              + "; ".join(f"{n}: {why}" for n, why in unavailable.items()), file=sys.stderr)
        return 2
    gpu_timer = frame.timer()
    timer_for = timer_for or (lambda r: gpu_timer if r.on_gpu and frame.on_gpu else WallTimer())
    settings = Settings(args.repeats, args.warmup, args.max_call_s, args.seed, not args.no_accuracy)

    gpu = gpu_info()
    print(f"cutlassfa bench: {len(cases)} cases x {len(runners)} backends on "
          f"{gpu['name'] if gpu else 'CPU only'}; inputs: {frame.name}; timer: {gpu_timer.name}; "
          f"median of {settings.repeats} after {settings.warmup} warm-up", file=sys.stderr)
    for name, why in unavailable.items():
        print(f"  not available: {name}: {why}", file=sys.stderr)

    peaks: dict[str, dict[str, Any]] = {}
    if frame.on_gpu and not args.no_peaks:
        peaks = measure_peaks(frame, {c.dtype for c in cases}, gpu_timer)

    progress = _Progress(len(cases) * len(runners), enabled=not args.no_progress)
    rows: list[Row] = []
    rates: dict[tuple[str, str], float] = {}
    try:
        for case in cases:
            progress.case(case.label)
            rows += bench_case(case, runners, frame, settings, rates=rates, timer_for=timer_for,
                               progress=lambda name, label=case.label: progress.step(f"{label} {name}"))
    finally:
        progress.close()
    apply_peaks(rows, peaks)

    if peaks:
        print("Peaks (each row's '% peak' is against the one named in its 'peak' column):")
        print(peaks_text(peaks))
        print()
    print(results_table(rows))
    if args.json:
        doc = to_document(rows, peaks, settings=settings, timer=gpu_timer.name, unavailable=unavailable,
                          frame=frame.name)
        Path(args.json).write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
        print(f"\nwrote {args.json}", file=sys.stderr)
    if args.plot:
        write_plot(rows, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cutlassfa bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
