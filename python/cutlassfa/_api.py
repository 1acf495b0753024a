"""`forward`, `backends`, `supports`, `select_backend`, `device_info`: the thin public layer over the
extension. Python checks the types of the options; the extension (`_C`, cpp/bindings/) describes the
arrays, validates them, picks the backend and launches, in one call."""

from __future__ import annotations

import functools
import math
import pathlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays

try:
    from . import _C
    _EXTENSION_ERROR = ""
except ImportError as error:  # running from a source tree, or a broken install
    _C = None
    if any(pathlib.Path(__file__).parent.glob("_C.*")):
        _EXTENSION_ERROR = f"the cutlassfa extension failed to load ({error})"
    else:
        _EXTENSION_ERROR = "the cutlassfa extension is not built (install the package: pip install .)"

# tensorcore: the fastest tensor-core kernel for the device (warpgroup MMA on sm_90 for the head dims
# it is built for, mma.sync otherwise). tensorcore_sm80: always the mma.sync kernel (comparison, tests).
GPU_BACKENDS = ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive")
BACKENDS = GPU_BACKENDS + ("cpu",)
# The extension's backend codes; `auto` takes the first of tensorcore, large_tile, small_tile, naive that runs
# the call.
_BACKEND_CODES = {name: index for index, name in enumerate(("naive", "small_tile", "large_tile", "tensorcore",
                                                             "tensorcore_sm80"))}
_BACKEND_CODES.update(auto=-1, cpu=5)
_CPU = 5

# Support reasons that are a backend's documented limit (a size its design cannot take), not a gap; the
# extension's refusals use the same prefix (`_C.LIMIT_PREFIX`).
LIMIT_PREFIX = "limit: "

# Head dims with kernels in this build (one list in CMakeLists.txt, read from the extension).
HEAD_DIMS: tuple[int, ...] = (
    tuple(sorted({d for family in ("small_tile", "large_tile", "sm80") for d in _C.head_dims[family]}))
    if _C is not None else ())


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can run on this machine, and why not when it cannot."""

    name: str
    available: bool
    reason: str = ""


@dataclass(frozen=True)
class Support:
    """Whether a backend takes a kind of case (`supports`), and why not when it does not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


# --------------------------------------------------------------------------------------------------
# Devices and backends
# --------------------------------------------------------------------------------------------------

def _require_extension() -> None:
    if _C is None:
        raise RuntimeError(_EXTENSION_ERROR)


def _unavailable_reason(name: str, device: int) -> str:
    if _C is None:
        return _EXTENSION_ERROR
    return _C.backend_unavailable_reason(getattr(_C.Backend, name), device)


def backends(device: int = 0) -> dict[str, BackendStatus]:
    """Every backend name mapped to whether it can run here (on CUDA `device` for the GPU backends) and,
    if not, why."""
    statuses = {}
    for name in GPU_BACKENDS:
        reason = _unavailable_reason(name, device)
        statuses[name] = BackendStatus(name, not reason, reason)
    statuses["cpu"] = BackendStatus("cpu", True)
    return statuses


# Mode keys of `supports`: causal, and the variants (window, softcap, KV caches, varlen, split keys).
_KNOWN_MODES = {"causal", "window", "softcap", "kv_cache", "paged", "varlen", "num_splits"}


def supports(backend: str, dtype: str, head_dim: int, *, device: int = 0, **mode: Any) -> Support:
    """Says in advance whether `forward(..., backend=backend)` takes arrays of `dtype` and `head_dim` on
    this machine (CUDA `device` for GPU backends) in the given mode, and if not, why.

    Mode keys: causal (bool), window ((left, right) or None), softcap (float), kv_cache and paged (bool:
    forward with cache_seqlens / block_table ...), varlen (bool: varlen_forward), num_splits (int or
    None); values as forward takes them (a value that asks for nothing, such as window=(-1, -1) or
    softcap=0, is the plain case). Other keys name features this version does not have. GPU backends
    take the variant modes on CUDA arrays (PyTorch, CuPy); on host arrays they run on the cpu backend."""
    if backend not in BACKENDS:
        return Support(False, f"unknown backend {backend!r}")
    if dtype not in _arrays.DTYPES:
        return Support(False, f"dtype {dtype} is not one of {', '.join(_arrays.DTYPES)}")
    for key, value in mode.items():
        if key not in _KNOWN_MODES:
            return Support(False, f"mode {key!r} is not implemented")
        if key == "causal" and not isinstance(value, (bool, np.bool_)):
            return Support(False, "causal must be a bool")
    from . import _variants

    try:
        asked = _variants.requested(mode)
    except (TypeError, ValueError) as error:
        return Support(False, str(error))
    if asked and backend == "cpu":
        return _variants.support(head_dim)
    # GPU backends take every variant mode (on CUDA arrays) for the head dims they have kernels for, so
    # they answer as for the plain call. num_splits > 1 is a schedule of the tensor-core backends; the
    # CUDA-core ones run the keys in one pass, with the same result up to rounding.
    if _C is None:
        return Support(False, _EXTENSION_ERROR)
    if backend == "cpu":
        refusal = _head_dim_refusal(head_dim)
        return Support(not refusal, refusal)
    if not isinstance(head_dim, (int, np.integer)) or isinstance(head_dim, (bool, np.bool_)):
        return Support(False, f"head dim must be an int, got {head_dim!r}")
    reason = _unavailable_reason(backend, device)
    if reason:
        return Support(False, reason)
    refusal = _C.head_dim_refusal(getattr(_C.Backend, backend), int(head_dim), dtype)
    return Support(not refusal, refusal)


@functools.lru_cache(maxsize=None)
def _head_dim_refusal(head_dim: Any) -> str:
    """Why the plain path refuses a head dim on the cpu backend ("" when it takes it): the extension's
    validator decides, asked with a one-element problem."""
    if not isinstance(head_dim, (int, np.integer)) or not 0 < head_dim <= 1024:
        return f"head dim must be a positive int, got {head_dim!r}"
    probe = np.zeros((1, 1, 1, int(head_dim)), np.float32)
    try:
        _C.validate(probe, probe, probe, None, False, None, _CPU)
    except ValueError as error:
        return str(error)
    return ""


def device_info(device: int = 0) -> dict[str, Any]:
    """The GPU this package would use: name, compute capability, multiprocessors, memory, driver and
    runtime versions, the architectures the extension was compiled for (all, and those with the Hopper
    wgmma kernels), which tensor-core kernel family `tensorcore` runs on it, and whether the extension
    loaded. Without a usable GPU the dict holds `available: False` and the `reason`."""
    wgmma = getattr(_C, "wgmma_architectures", "")
    info: dict[str, Any] = {
        "extension_loaded": _C is not None,
        "extension_error": _EXTENSION_ERROR,
        "extension_has_cuda": bool(getattr(_C, "has_cuda", False)),
        "compiled_architectures": [a for a in getattr(_C, "compiled_architectures", "").split(",") if a],
        "wgmma_architectures": wgmma.split(",") if wgmma else [],
        "head_dims": dict(_C.head_dims) if _C is not None else {},
    }
    count, error = _C.device_count() if _C is not None else (0, _EXTENSION_ERROR)
    info["device_count"] = count
    if count == 0 or not 0 <= device < count:
        info.update(available=False, reason=error or f"CUDA device {device} does not exist")
        return info
    info.update(available=True, device=device, **_C.device_properties(device))
    # Which kernel family `tensorcore` runs here (for the head dims of head_dims["sm90"] on wgmma).
    family = _C.tensorcore_family(device)
    info["tensorcore_kernel"] = {"wgmma": "wgmma (sm_90a)", "mma.sync": "mma.sync (sm_80)"}.get(family)
    return info


def empty_cache() -> None:
    """Returns the device memory the workspace pools keep reserved between calls to the driver."""
    if _C is not None and _C.has_cuda:
        _C.empty_cache()


# --------------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------------

def _backend_code(backend: Any) -> int:
    code = _BACKEND_CODES.get(backend) if isinstance(backend, str) else None
    if code is None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str, got {type(backend).__name__}")
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS + ('auto',))}")
    return code


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _scale(softmax_scale: Any) -> float | None:
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    scale = float(softmax_scale)
    if not math.isfinite(scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return scale


def select_backend(q: Any, k: Any, v: Any, *, causal: bool = False, backend: str = "auto") -> str:
    """The backend `forward(q, k, v, causal=causal, backend=backend)` runs: `auto` resolves to the first
    of tensorcore (sm_80+), large_tile (sm_80+), small_tile (sm_61+) and naive (sm_61+) that is available
    and runs the head dim, then cpu for host arrays when no GPU can be used. Raises as `forward` would for
    invalid arguments."""
    code = _backend_code(backend)
    causal = _flag(causal, "causal")
    _require_extension()
    resolved = _C.validate(q, k, v, None, causal, None, code)
    return "cpu" if resolved == _CPU else _C.Backend(resolved).name


# --------------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------------

_NO_SOFTCAP = 0.0  # forward's default, recognised by identity: one cheap test for "no variant argument"


def forward(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
            window: tuple[int, int] | None = None, softcap: float = _NO_SOFTCAP, cache_seqlens: Any = None,
            cache_leftpad: Any = None, block_table: Any = None, k_new: Any = None, v_new: Any = None,
            num_splits: int | None = None, backend: str = "auto", return_lse: bool = False, out: Any = None) -> Any:
    """Attention forward pass: softmax(scale · q kᵀ) v, computed blockwise without materializing the
    N×N score matrix (except by the `naive` backend).

    q: (B, Hq, Nq, d) or (B, Nq, d); k, v: (B, Hkv, Nk, d) or (B, Nk, d), Hq a multiple of Hkv (GQA).
    dtypes float32, float16, bfloat16; d a multiple of 8 up to 256 (`supports` says which backend runs
    which); the last dim contiguous, other strides free.
    numpy arrays and PyTorch CPU tensors compute on the GPU when one is usable (host in, host out) or
    on the CPU; CUDA arrays of PyTorch, CuPy or JAX are read in place and the result is of the same
    framework and device, computed on the framework's current stream.

    causal: bottom-right aligned as FlashAttention-2: query i sees key j iff j <= i + Nk - Nq; a row
    that sees no key gives 0 (and lse = -inf). softmax_scale defaults to 1/sqrt(d).
    Returns out, or (out, lse) when return_lse; lse is float32 (B, Hq, Nq) (or (B, Nq)), natural log.

    Variants: every GPU backend on CUDA arrays (PyTorch, CuPy), through one call into the extension;
    the `cpu` backend on host arrays (`auto` picks it for them, and d may be any multiple of 8 from 8
    to 256):
    window=(left, right): query i sees key j iff i + Nk - Nq - left <= j <= i + Nk - Nq + right (-1:
    unbounded on that side); causal=True is (-1, 0) and combines with a left bound.
    softcap=c > 0: scores become c * tanh(s / c) before the softmax (lse of the capped scores).
    KV cache: k and v are caches (B, Hkv, Ncache, d), or with block_table (B, max_pages) int32 paged
    caches (num_pages, Hkv, page_size, d) (key p of entry b: row p % page_size of page
    block_table[b, p // page_size]); q must be 4-D. cache_seqlens (B,): entry b attends keys
    [cache_leftpad[b], cache_seqlens[b] + Nnew), aligned bottom-right against that length. k_new, v_new
    (B, Hkv, Nnew, d) are written into the caches at cache_seqlens[b] first (cache_seqlens itself is
    not modified). Index arrays are int32 on q's device, or host ints (copied). Host values are checked
    in full; device values are not (that would need a synchronization): the kernels clamp lengths to
    the capacity, leftpad to the length, skip page indices outside [0, num_pages), and drop appended
    keys past the capacity.
    num_splits: None (the backend chooses from the batch, heads, keys and multiprocessors, so that one
    pass fills the GPU; a plain call of at most 64 fp16 / bf16 queries chooses the same way) or n >= 1
    parts of the keys (at most one per 128 keys and 1024 in all), merged by lse. The split is a
    schedule of the tensor-core backends; the CUDA-core backends (and varlen batches) run the keys in
    one pass. It changes nothing beyond rounding. (Host arrays sent to a GPU backend take the schedule
    num_splits=None would: they go through the plain call.)
    """
    if not (window is None and softcap is _NO_SOFTCAP and cache_seqlens is None and cache_leftpad is None
            and block_table is None and k_new is None and v_new is None and num_splits is None):
        from . import _variants

        result = _variants.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, window=window,
                                   softcap=softcap, cache_seqlens=cache_seqlens, cache_leftpad=cache_leftpad,
                                   block_table=block_table, k_new=k_new, v_new=v_new, num_splits=num_splits,
                                   backend=backend, return_lse=return_lse, out=out)
        if result is not _variants.PLAIN:
            return result
    # Options are checked here, the arrays in one call into the extension (the per-call cost of a
    # tiny problem is a few microseconds: keep this path free of anything per-call that can be cached).
    code = _BACKEND_CODES.get(backend) if type(backend) is str else None
    if code is None:
        code = _backend_code(backend)  # raises the error that says what is wrong
    if causal is not True and causal is not False:
        causal = _flag(causal, "causal")
    if return_lse is not True and return_lse is not False:
        return_lse = _flag(return_lse, "return_lse")
    if softmax_scale is not None:
        softmax_scale = _scale(softmax_scale)
    if _C is None:
        raise RuntimeError(_EXTENSION_ERROR)

    module = type(q).__module__
    if module.startswith("torch"):
        # Through torch.ops.cutlassfa.forward only while PyTorch must see the call (compiling, tracing,
        # autograd recording); eager calls go straight to the extension (the operator costs 3-13 us).
        torch_integration = _TORCH_INTEGRATION or _torch_integration()
        if torch_integration.must_use_op(q, k, v):
            return torch_integration.op_forward(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                                                return_lse=return_lse, out=out)
    if module.startswith("jax") and _jax_integration_takes(q, k, v):
        from .integrations import jax as jax_integration

        return jax_integration.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                                       return_lse=return_lse, out=out)
    if not _C.has_cuda:  # built without the CUDA toolkit: validate, then the cpu backend
        _C.validate(q, k, v, out, causal, softmax_scale, code)
        result = None
    elif module.startswith("jax"):
        result = _forward_jax(q, k, v, out, causal, softmax_scale, code, return_lse)
    elif module.startswith("cupy"):
        result = _C.forward(q, k, v, out, causal, softmax_scale, code, return_lse, _arrays.cupy_empty,
                            _arrays.cupy_stream(q), False)
    else:  # PyTorch (host or CUDA) and numpy: allocation and stream come from the extension
        result = _C.forward(q, k, v, out, causal, softmax_scale, code, return_lse, None, -1, False)
    if result is None:  # the resolved backend is `cpu`; the arguments have been validated
        result = _forward_cpu(q, k, v, out, causal, softmax_scale, return_lse)
    return result if return_lse else result[0]


_TORCH_INTEGRATION = None


def _torch_integration() -> Any:
    """cutlassfa.integrations.torch, imported (and the operator registered) on first use."""
    global _TORCH_INTEGRATION
    if _TORCH_INTEGRATION is None:
        from .integrations import torch as torch_integration

        _TORCH_INTEGRATION = torch_integration
    return _TORCH_INTEGRATION


def _jax_integration_takes(*arrays: Any) -> bool:
    """JAX tracers (inside jax.jit / vmap) go to the XLA integration; so do concrete arrays when its FFI
    handler is registered (a custom call on XLA's stream, no synchronization), and arrays on the CPU.
    Otherwise concrete GPU arrays take the direct path below, which waits for them and synchronizes."""
    import jax

    from .integrations import jax as jax_integration

    if any(isinstance(a, jax.core.Tracer) for a in arrays) or jax_integration.ffi_registered():
        return True
    # JAX arrays on the CPU: the integration runs the cpu backend through a host callback.
    return all(d.platform == "cpu" for a in arrays for d in a.devices())


def _forward_cpu(q: Any, k: Any, v: Any, out: Any, causal: bool, scale: float | None,
                 return_lse: bool) -> tuple[Any, Any]:
    """The numpy backend on host arrays (numpy, or PyTorch CPU tensors seen through numpy)."""
    from .cpu import forward_cpu

    like = q
    q, k, v = (_arrays.host_numpy(x) for x in (q, k, v))
    rank = q.ndim
    if out is None:
        out = _arrays.empty_host_like(like, q.shape, str(q.dtype) if q.dtype.name != "bfloat16" else "bfloat16")
    out_np = _arrays.host_numpy(out)
    view4 = (lambda a: a[:, None]) if rank == 3 else (lambda a: a)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    _, lse = forward_cpu(view4(q), view4(k), view4(v), causal=causal, softmax_scale=scale, return_lse=True,
                         out=view4(out_np))
    lse = lse.reshape(q.shape[:-1])
    return out, (_arrays.host_like(like, lse) if return_lse else None)


def _forward_jax(q: Any, k: Any, v: Any, out: Any, causal: bool, scale: float | None, code: int,
                 return_lse: bool) -> tuple[Any, Any]:
    """JAX computes asynchronously on streams of its own and its arrays are immutable: wait for the
    inputs, write into device buffers of ours on a per-thread stream, synchronize, hand the buffers over."""
    for x in (q, k, v):
        if hasattr(x, "block_until_ready"):
            x.block_until_ready()
    if out is not None and type(out).__module__.startswith("jax"):
        raise TypeError("out is not supported for JAX arrays (they are immutable)")
    result = _C.forward(q, k, v, out, causal, scale, code, return_lse, _arrays.device_buffer, _C.stream_per_thread, True)
    if result is None:
        raise ValueError("backend 'cpu' needs host (numpy) arrays; q, k and v are on a CUDA device")
    o, lse = result
    shape = tuple(q.shape)
    return (_arrays.finish_jax(o, shape, q.dtype.name, _C),
            _arrays.finish_jax(lse, shape[:-1], "float32", _C) if lse is not None else None)
