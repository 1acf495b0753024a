"""Inputs for the accuracy gate, the bench and the tests: one attention case, its random values, the
dtypes (rounding without ml_dtypes), the array frameworks they are fed as, and the memory layouts
(compact, transposed, padded views) that exercise the kernels' strides.

Nothing here imports torch, CuPy or JAX until an array of that framework is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays

DTYPES = ("float32", "float16", "bfloat16")
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# Memory layouts of a (B, H, N, d) array, each with a contiguous last dim (what forward requires):
#   bhnd:   compact;
#   bnhd:   a (B, N, H, d) array viewed as (B, H, N, d), the layout most models keep;
#   padded: a window into a larger array: an extra head, 3 extra rows and 8 extra columns around it,
#           so heads, rows and the base pointer all sit at an offset (kept at multiples of 8 elements,
#           the 16-byte alignment the tensor-core kernels need). The padding holds NaN: a kernel
#           that reads it returns NaN.
LAYOUTS = ("bhnd", "bnhd", "padded")
_PAD_HEADS, _PAD_ROWS, _PAD_COLS = 1, 3, 8


class Unsupported(Exception):
    """The harness cannot build this configuration here (a missing optional package, a framework
    without the dtype). Distinct from a backend refusing a case."""


@dataclass(frozen=True)
class Variant:
    """What a case asks for beyond the plain call (`cutlassfa.check.variants` builds and runs them).

    kind "dense": forward with window / softcap / num_splits on (B, H, N, d) arrays. kind "kvcache":
    forward against a KV cache of B = len(cache_seqlens) entries, contiguous (page_size 0, Ncache = the
    case's Nk) or paged (pages of page_size keys, capacity >= the case's Nk), with n_new keys appended
    through k_new / v_new and cache_leftpad when given. kind "varlen": varlen_forward over sequences of
    seqlens_q / seqlens_k (B of them). sinks: one attention-sink logit per query head; alibi: ALiBi slopes
    per (entry, query head) (any kind). fp8_cache (kvcache): k, v, k_new and v_new float8_e4m3fn with
    descales per (entry, K/V head). fp8 (any kind): fp8 attention, q as well (q_descale per (entry, K/V
    head) too), the result in the case's dtype (out_dtype)."""

    name: str
    kind: str = "dense"
    window: tuple[int, int] | None = None
    softcap: float = 0.0
    num_splits: int | None = None
    cache_seqlens: tuple[int, ...] = ()
    cache_leftpad: tuple[int, ...] = ()
    page_size: int = 0
    n_new: int = 0
    seqlens_q: tuple[int, ...] = ()
    seqlens_k: tuple[int, ...] = ()
    sinks: bool = False
    alibi: bool = False
    fp8_cache: bool = False
    fp8: bool = False

    @property
    def mode(self) -> dict[str, Any]:
        """The mode keys of `cutlassfa.supports` that ask for this variant."""
        mode: dict[str, Any] = {}
        if self.window is not None:
            mode["window"] = self.window
        if self.softcap:
            mode["softcap"] = self.softcap
        if self.kind == "kvcache":
            mode["kv_cache"] = True
            if self.page_size:
                mode["paged"] = True
        if self.kind == "varlen":
            mode["varlen"] = True
        if self.num_splits is not None:
            mode["num_splits"] = self.num_splits
        if self.sinks:
            mode["sinks"] = True
        if self.alibi:
            mode["alibi"] = True
        if self.fp8_cache:
            mode["fp8_cache"] = True
        return mode


@dataclass(frozen=True)
class Case:
    """One attention configuration: q is (B, H, Nq, d), k and v (B, Hk, Nk, d). `hw4` cases use 3-D
    (B, N, d) arrays with float32 values uniform in [-3, 3], as the HW4 test files do. `variant`: what
    the case asks for beyond the plain call (None: nothing); its shapes are then the variant's own."""

    dtype: str
    B: int
    H: int
    Hk: int
    Nq: int
    Nk: int
    d: int
    causal: bool
    hw4: bool = False
    variant: Variant | None = None

    @property
    def mode(self) -> dict[str, Any]:
        """The keyword arguments of `cutlassfa.supports` that describe this case's masking."""
        return {"causal": self.causal, **(self.variant.mode if self.variant else {})}

    @property
    def q_dtype(self) -> str:
        """q's dtype: the case's, or float8_e4m3fn for fp8 attention (the case's dtype is then the output's)."""
        return "float8_e4m3fn" if self.variant is not None and self.variant.fp8 else self.dtype

    @property
    def variant_name(self) -> str:
        return self.variant.name if self.variant else "plain"

    @property
    def window(self) -> tuple[int, int] | None:
        """The variant's (left, right) window (-1: unbounded on that side), or None."""
        return self.variant.window if self.variant is not None else None

    @property
    def softcap(self) -> float:
        """The variant's softcap (0: none)."""
        return self.variant.softcap if self.variant is not None else 0.0

    @property
    def label(self) -> str:
        heads = f"H{self.H}" if self.H == self.Hk else f"H{self.H}/{self.Hk}"
        tag = " hw4" if self.hw4 else ""
        tag += f" {self.variant.name}" if self.variant else ""
        return f"{self.dtype} B{self.B} {heads} {self.Nq}x{self.Nk} d{self.d}{' causal' if self.causal else ''}{tag}"

    def shapes(self) -> list[tuple[int, ...]]:
        """Shapes of q, k, v (plain and dense-variant cases)."""
        if self.hw4:
            return [(self.B, self.Nq, self.d), (self.B, self.Nk, self.d), (self.B, self.Nk, self.d)]
        return [(self.B, self.H, self.Nq, self.d)] + [(self.B, self.Hk, self.Nk, self.d)] * 2


# ---------------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------------
def numpy_dtype(dtype: str) -> np.dtype:
    """numpy dtype for a dtype name; bfloat16 needs ml_dtypes (raises Unsupported without it: a case the
    gate cannot build, rather than the API's TypeError)."""
    if dtype not in ("bfloat16", "float8_e4m3fn"):
        return np.dtype(dtype)
    try:
        return _arrays.numpy_dtype(dtype)
    except TypeError as error:
        raise Unsupported(str(error)) from None


def torch_dtype(dtype: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "float8_e4m3fn": torch.float8_e4m3fn}[dtype]


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded (nearest even) to `dtype`, returned as float32. bf16 by bit arithmetic, so the
    reference values never depend on ml_dtypes being installed."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def case_values(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 q, k, v for `case`, already rounded to its dtype: standard normal, or uniform in
    [-3, 3] for HW4 cases."""
    from .hw4 import INPUT_RANGE

    if case.hw4:
        return tuple(round_to(rng.uniform(-INPUT_RANGE, INPUT_RANGE, s), case.dtype) for s in case.shapes())
    return tuple(round_to(rng.standard_normal(s), case.dtype) for s in case.shapes())


# ---------------------------------------------------------------------------------------------------
# Frameworks
# ---------------------------------------------------------------------------------------------------
def gpu_framework() -> str:
    """Framework for GPU inputs: torch (CUDA) when importable, else numpy host arrays."""
    try:
        import torch

        if torch.cuda.is_available():
            return "torch"
    except ImportError:
        pass
    return "numpy"


def to_framework(x32: np.ndarray, dtype: str, framework: str) -> Any:
    """Host float32 values (already rounded to `dtype`) as a compact `framework` array of `dtype`."""
    if framework == "numpy":
        return x32.astype(numpy_dtype(dtype))
    if framework == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(x32)).to(device="cuda", dtype=torch_dtype(dtype))
    if framework == "cupy":
        if dtype in ("bfloat16", "float8_e4m3fn"):
            raise Unsupported(f"CuPy has no {dtype} arrays")
        import cupy

        return cupy.asarray(x32.astype(dtype))
    raise ValueError(f"unknown array framework {framework!r}")


def to_numpy64(x: Any) -> np.ndarray:
    """Any supported array (numpy, torch, cupy, jax; any of the three dtypes) as float64 numpy."""
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        import torch

        return x.detach().to(torch.float32).cpu().numpy().astype(np.float64)
    if module == "cupy":
        return x.get().astype(np.float64)
    return np.asarray(x).astype(np.float64)


def _full(like: Any, shape: tuple[int, ...], value: float) -> Any:
    """An array of `like`'s framework, dtype and device, filled with `value`."""
    module = type(like).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch.full(shape, value, dtype=like.dtype, device=like.device)
    if module == "cupy":
        import cupy

        return cupy.full(shape, value, dtype=like.dtype)
    return np.full(shape, value, dtype=like.dtype)


def strided(x: Any, layout: str, fill: float = float("nan")) -> tuple[Any, Any]:
    """A view with the values of the 4-D array `x` in `layout` (see LAYOUTS), of the same framework,
    dtype and device. Returns (view, storage): the storage holds the view and, for `padded`, the
    `fill` values around it."""
    b, h, n, d = x.shape
    if layout == "bhnd":
        storage = _full(x, (b, h, n, d), fill)
        view = storage
    elif layout == "bnhd":
        storage = _full(x, (b, n, h, d), fill)
        view = storage.swapaxes(1, 2)
    elif layout == "padded":
        storage = _full(x, (b, h + _PAD_HEADS, n + _PAD_ROWS, d + _PAD_COLS), fill)
        view = storage[:, _PAD_HEADS:, 2:2 + n, _PAD_COLS:]
    else:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    view[...] = x
    return view, storage


def classify_error(error: BaseException, *, anchor: bool = False) -> str:
    """'unsupported' for a refusal of a configuration, else 'error'. A refusal is `Unsupported` or
    `NotImplementedError`; an anchor (PyTorch SDPA) may also refuse with an error saying so."""
    if isinstance(error, (Unsupported, NotImplementedError)):
        return "unsupported"
    message = str(error).lower()
    if anchor and isinstance(error, (ValueError, TypeError, RuntimeError)) and (
        "not supported" in message or "no available kernel" in message
    ):
        return "unsupported"
    return "error"


def as_layout(x32: np.ndarray, dtype: str, framework: str, layout: str) -> tuple[Any, Any]:
    """Host float32 values (rounded to `dtype`) as a `framework` array in `layout`: (view, storage)."""
    return strided(to_framework(x32, dtype, framework), layout)
