"""`forward`, `backends`, `select_backend`, `device_info`: argument validation, backend choice and the
host/device launch paths, in one place."""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from . import _arrays
from ._arrays import ArrayInfo

try:
    from . import _C
    _EXTENSION_ERROR = ""
except ImportError as error:  # built without a CUDA toolkit
    _C = None
    if any(pathlib.Path(__file__).parent.glob("_C.*")):
        _EXTENSION_ERROR = f"the CUDA extension failed to load ({error})"
    else:
        _EXTENSION_ERROR = "cutlassfa was installed without its CUDA extension (no CUDA toolkit at build time)"

HEAD_DIMS = (32, 64, 128)
# tensorcore: the fastest tensor-core kernel for the device (warpgroup MMA on sm_90 for head dims
# 64/128, mma.sync otherwise). tensorcore_sm80: always the mma.sync kernel (comparison, tests).
GPU_BACKENDS = ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive")
_TENSORCORE_BACKENDS = ("tensorcore", "tensorcore_sm80")
BACKENDS = GPU_BACKENDS + ("cpu",)
# `auto` takes the first available backend of this list that accepts the inputs.
_AUTO_ORDER = ("tensorcore", "large_tile", "small_tile")
# Tensor-core kernels read 16-byte vectors: base pointers 16-byte aligned, strides whole vectors.
_TENSORCORE_ALIGN_BYTES = 16


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can run on this machine, and why not when it cannot."""

    name: str
    available: bool
    reason: str = ""


@dataclass(frozen=True)
class _Problem:
    """Validated arguments, as 4-D (B, H, N, d) views."""

    q: ArrayInfo
    k: ArrayInfo
    v: ArrayInfo
    out: ArrayInfo | None
    rank: int
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    device: int | None
    causal: bool
    scale: float

    def out_shape(self) -> tuple[int, ...]:
        shape = (self.batch, self.heads_q, self.seqlen_q, self.head_dim)
        return shape if self.rank == 4 else (self.batch, self.seqlen_q, self.head_dim)

    def lse_shape(self) -> tuple[int, ...]:
        return self.out_shape()[:-1]


# --------------------------------------------------------------------------------------------------
# Devices and backends
# --------------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _device_count() -> tuple[int, str]:
    if _C is None:
        return 0, _EXTENSION_ERROR
    count, error = _C.device_count()
    if error:
        return 0, f"no usable CUDA device ({error})"
    return count, ("no CUDA device" if count == 0 else "")


@lru_cache(maxsize=None)
def _properties(device: int) -> dict:
    return _C.device_properties(device)


def _compute_capability(device: int) -> int:
    major, minor = _properties(device)["compute_capability"]
    return 10 * major + minor


def _has_image(architectures: str, capability: int) -> bool:
    """Whether machine code built for `architectures` runs on a device of `capability`: sm_XY code runs
    on the same major version with minor >= Y; sm_90a only on 9.0."""
    for arch in filter(None, architectures.split(",")):
        number = int(arch.rstrip("a"))
        if arch.endswith("a"):
            if number == capability:
                return True
        elif number // 10 == capability // 10 and number <= capability:
            return True
    return False


def _gpu_backend_status(name: str, device: int) -> BackendStatus:
    count, error = _device_count()
    if count == 0:
        return BackendStatus(name, False, error)
    if not 0 <= device < count:
        return BackendStatus(name, False, f"CUDA device {device} does not exist ({count} present)")
    backend = getattr(_C.Backend, name)
    capability = _compute_capability(device)
    if capability < _C.min_compute_capability(backend):
        return BackendStatus(name, False, f"needs compute capability >= "
                             f"{_C.min_compute_capability(backend) / 10:.1f}, device {device} has {capability / 10:.1f}")
    architectures = _C.tensorcore_architectures if name in _TENSORCORE_BACKENDS else _C.compiled_architectures
    if not _C.is_compiled(backend) or not _has_image(architectures, capability):
        return BackendStatus(name, False, f"not compiled for sm_{capability} (built for: {architectures or 'none'})")
    return BackendStatus(name, True)


def backends(device: int = 0) -> dict[str, BackendStatus]:
    """Every backend name mapped to whether it can run here (on CUDA `device` for the GPU backends) and,
    if not, why."""
    statuses = {name: _gpu_backend_status(name, device) for name in GPU_BACKENDS}
    statuses["cpu"] = BackendStatus("cpu", True)
    return statuses


def device_info(device: int = 0) -> dict[str, Any]:
    """The GPU this package would use: name, compute capability, multiprocessors, memory, driver and
    runtime versions, the architectures the extension was compiled for (all, and those with the Hopper
    wgmma kernels), and which tensor-core kernel family `tensorcore` runs on it. Without a usable GPU the
    dict holds `available: False` and the `reason`."""
    count, error = _device_count()
    wgmma = getattr(_C, "wgmma_architectures", "")
    info: dict[str, Any] = {
        "compiled_architectures": _C.compiled_architectures.split(",") if _C is not None else [],
        "wgmma_architectures": wgmma.split(",") if wgmma else [],
        "device_count": count,
    }
    if count == 0 or not 0 <= device < count:
        info.update(available=False, reason=error or f"CUDA device {device} does not exist")
        return info
    info.update(available=True, device=device, **_properties(device))
    # Which kernel family `tensorcore` runs here for head dims 64 and 128 (32 always takes mma.sync).
    if _compute_capability(device) == 90 and "90a" in info["wgmma_architectures"]:
        info["tensorcore_kernel"] = "wgmma (sm_90a)"
    elif _gpu_backend_status("tensorcore", device).available:
        info["tensorcore_kernel"] = "mma.sync (sm_80)"
    else:
        info["tensorcore_kernel"] = None
    return info


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

def _describe(array: Any, name: str) -> ArrayInfo:
    return _arrays.describe(array, name, _C)


def _as4d(info: ArrayInfo) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if len(info.shape) == 3:
        b, n, d = info.shape
        sb, sn, sd = info.strides
        return (b, 1, n, d), (sb, 0, sn, sd)
    return info.shape, info.strides


def _validate(q: Any, k: Any, v: Any, out: Any, causal: Any, softmax_scale: Any) -> _Problem:
    qi, ki, vi = _describe(q, "q"), _describe(k, "k"), _describe(v, "v")
    for info, name in ((qi, "q"), (ki, "k"), (vi, "v")):
        if len(info.shape) not in (3, 4):
            raise ValueError(f"{name} must be 4-D (B, H, N, d) or 3-D (B, N, d), got shape {info.shape}")
        if info.dtype not in _arrays.DTYPES:
            raise TypeError(f"{name} has dtype {info.dtype}; expected one of {', '.join(_arrays.DTYPES)}")
    if not len(qi.shape) == len(ki.shape) == len(vi.shape):
        raise ValueError(f"q, k and v must have the same rank, got shapes {qi.shape}, {ki.shape}, {vi.shape}")
    if not qi.dtype == ki.dtype == vi.dtype:
        raise TypeError(f"q, k and v must have the same dtype, got {qi.dtype}, {ki.dtype}, {vi.dtype}")
    if not qi.device == ki.device == vi.device:
        where = lambda i: "host" if i.device is None else f"cuda:{i.device}"  # noqa: E731
        raise ValueError(f"q, k and v must be on the same device, got {where(qi)}, {where(ki)}, {where(vi)}")

    (b, hq, nq, d), _ = _as4d(qi)
    (bk, hk, nk, dk), _ = _as4d(ki)
    (bv, hv, nv, dv), _ = _as4d(vi)
    if not b == bk == bv:
        raise ValueError(f"q, k and v must have the same batch size, got {b}, {bk}, {bv}")
    if not d == dk == dv:
        raise ValueError(f"q, k and v must have the same head dim, got {d}, {dk}, {dv}")
    if hk != hv:
        raise ValueError(f"k and v must have the same number of heads, got {hk} and {hv}")
    if nk != nv:
        raise ValueError(f"k and v must have the same sequence length, got {nk} and {nv}")
    if hk == 0 and hq != 0 or hk != 0 and hq % hk != 0:
        raise ValueError(f"the heads of q ({hq}) must be a multiple of the heads of k and v ({hk})")
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim (last dim of q, k, v) must be one of {HEAD_DIMS}, got {d}")
    for info, name in ((qi, "q"), (ki, "k"), (vi, "v")):
        if 0 in info.shape:  # nothing is read from an empty array; numpy gives it zero strides
            continue
        if info.strides[-1] != 1:
            raise ValueError(f"{name} must be contiguous in its last dim (stride 1), got strides {info.strides}")
        if any(not float(s).is_integer() for s in info.strides):
            raise ValueError(f"{name} has strides that are not whole elements: {info.strides}")
    limit = 2**31 - 1
    if max(nq, nk) > limit or b * hq > limit:
        raise ValueError(f"sizes too large: N must be < 2^31 and B*H < 2^31, got B={b}, H={hq}, Nq={nq}, Nk={nk}")

    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, (int, float, np.floating, np.integer)):
            raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
        scale = float(softmax_scale)
        if not math.isfinite(scale):
            raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")

    problem = _Problem(qi, ki, vi, None, len(qi.shape), b, hq, hk, nq, nk, d, qi.dtype, qi.device,
                       bool(causal), scale)
    if out is not None:
        problem = _validate_out(problem, out)
    return problem


def _validate_out(problem: _Problem, out: Any) -> _Problem:
    oi = _describe(out, "out")
    if oi.framework != problem.q.framework:
        raise TypeError(f"out must be a {problem.q.framework} array like q, got {oi.framework}")
    if oi.framework == "jax":
        raise TypeError("out is not supported for JAX arrays (they are immutable)")
    if oi.shape != problem.out_shape():
        raise ValueError(f"out must have shape {problem.out_shape()}, got {oi.shape}")
    if oi.dtype != problem.dtype:
        raise TypeError(f"out must have dtype {problem.dtype} like q, got {oi.dtype}")
    if oi.device != problem.device:
        raise ValueError(f"out must be on the same device as q")
    if oi.strides[-1] != 1 and 0 not in oi.shape:
        raise ValueError(f"out must be contiguous in its last dim (stride 1), got strides {oi.strides}")
    if oi.framework == "numpy" and not oi.array.flags.writeable:
        raise ValueError("out is read-only")
    return _Problem(**{**problem.__dict__, "out": oi})


# --------------------------------------------------------------------------------------------------
# Backend choice
# --------------------------------------------------------------------------------------------------

def _tensorcore_accepts(problem: _Problem) -> bool:
    """The tensor-core kernel takes the row max of unscaled scores, so it needs softmax_scale > 0; and
    device arrays must be 16-byte aligned with 16-byte multiple strides for its vector loads (host
    arrays are copied into compact device buffers, which always are)."""
    if not problem.scale > 0:
        return False
    if problem.device is None:
        return True
    itemsize = _arrays.ITEMSIZE[problem.dtype]
    arrays = [problem.q, problem.k, problem.v] + ([problem.out] if problem.out is not None else [])
    for info in arrays:
        if info.ptr % _TENSORCORE_ALIGN_BYTES:
            return False
        if any((s * itemsize) % _TENSORCORE_ALIGN_BYTES for s, n in zip(info.strides[:-1], info.shape[:-1]) if n > 1):
            return False
    return True


def _resolve(problem: _Problem, backend: str) -> str:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend not in BACKENDS + ("auto",):
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS + ('auto',))}")
    device = 0 if problem.device is None else problem.device
    if backend == "cpu":
        if problem.device is not None:
            raise ValueError("backend 'cpu' needs host (numpy) arrays; q, k and v are on a CUDA device")
        return "cpu"
    if backend == "auto":
        statuses = backends(device)
        for name in _AUTO_ORDER:
            if statuses[name].available and (name != "tensorcore" or _tensorcore_accepts(problem)):
                return name
        if problem.device is None:
            return "cpu"
        raise RuntimeError(f"no GPU backend can run on cuda:{device}: {statuses['small_tile'].reason}")
    status = backends(device)[backend]
    if not status.available:
        raise RuntimeError(f"backend {backend!r} is not available: {status.reason}")
    if backend in _TENSORCORE_BACKENDS and not _tensorcore_accepts(problem):
        raise ValueError(f"backend {backend!r} needs softmax_scale > 0 and 16-byte aligned q, k, v and out "
                         "with strides that are multiples of 16 bytes; pass contiguous arrays or use "
                         "backend='auto'")
    return backend


def select_backend(q: Any, k: Any, v: Any, *, causal: bool = False, backend: str = "auto") -> str:
    """The backend `forward(q, k, v, causal=causal, backend=backend)` runs: `auto` resolves to the first
    available of tensorcore (sm_80+), large_tile (sm_80+), small_tile (sm_61+), then cpu for host
    arrays when no GPU can be used. Raises as `forward` would for invalid arguments."""
    return _resolve(_validate(q, k, v, None, causal, None), backend)


# --------------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------------

def forward(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
            backend: str = "auto", return_lse: bool = False, out: Any = None) -> Any:
    """Attention forward pass: softmax(scale · q kᵀ) v, computed blockwise without materializing the
    N×N score matrix (except by the `naive` backend).

    q: (B, Hq, Nq, d) or (B, Nq, d); k, v: (B, Hkv, Nk, d) or (B, Nk, d), Hq a multiple of Hkv (GQA).
    dtypes float32, float16, bfloat16; d in 32, 64, 128; the last dim contiguous, other strides free.
    numpy arrays compute on the GPU when one is usable (host in, host out) or on the CPU; CUDA arrays
    of PyTorch, CuPy or JAX are read in place and the result is of the same framework and device,
    computed on the framework's current stream.

    causal: bottom-right aligned as FlashAttention-2: query i sees key j iff j <= i + Nk - Nq; a row
    that sees no key gives 0 (and lse = -inf). softmax_scale defaults to 1/sqrt(d).
    Returns out, or (out, lse) when return_lse; lse is float32 (B, Hq, Nq) (or (B, Nq)), natural log.
    """
    problem = _validate(q, k, v, out, causal, softmax_scale)
    name = _resolve(problem, backend)
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if name == "cpu":
        result, lse = _forward_cpu(problem, bool(return_lse))
    elif problem.device is None:
        result, lse = _forward_host_on_gpu(problem, name, bool(return_lse))
    else:
        result, lse = _forward_device(problem, name, bool(return_lse))
    return (result, lse) if return_lse else result


def _view4d(array: np.ndarray, rank: int) -> np.ndarray:
    return array[:, None] if rank == 3 else array


def _forward_cpu(problem: _Problem, return_lse: bool) -> tuple[Any, Any]:
    from .cpu import forward_cpu

    result = problem.out.array if problem.out is not None else np.empty(
        problem.out_shape(), dtype=_arrays.numpy_dtype(problem.dtype))
    q, k, v = (_view4d(i.array, problem.rank) for i in (problem.q, problem.k, problem.v))
    _, lse = forward_cpu(q, k, v, causal=problem.causal, softmax_scale=problem.scale, return_lse=True,
                         out=_view4d(result, problem.rank))
    return result, (lse.reshape(problem.lse_shape()) if return_lse else None)


def _fill_params(problem: _Problem, q: tuple[int, tuple], k: tuple[int, tuple], v: tuple[int, tuple],
                 o: tuple[int, tuple], lse_ptr: int) -> Any:
    """A _C.FwdParams from (pointer, 4-D strides in elements) of each tensor."""
    params = _C.FwdParams()
    for name, (ptr, strides) in (("q", q), ("k", k), ("v", v), ("o", o)):
        setattr(params, name, ptr)
        setattr(params, f"{name}_batch_stride", int(strides[0]))
        setattr(params, f"{name}_head_stride", int(strides[1]))
        setattr(params, f"{name}_row_stride", int(strides[2]))
    params.lse = lse_ptr
    params.batch, params.heads_q, params.heads_kv = problem.batch, problem.heads_q, problem.heads_kv
    params.heads_ratio = problem.heads_q // problem.heads_kv
    params.seqlen_q, params.seqlen_k, params.head_dim = problem.seqlen_q, problem.seqlen_k, problem.head_dim
    params.softmax_scale = problem.scale
    params.softmax_scale_log2 = problem.scale * math.log2(math.e)
    params.causal = problem.causal
    params.dtype = _arrays.DTYPES.index(problem.dtype)
    return params


def _compact_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _is_empty(problem: _Problem) -> bool:
    return problem.batch * problem.heads_q * problem.seqlen_q == 0


def _forward_host_on_gpu(problem: _Problem, name: str, return_lse: bool) -> tuple[Any, Any]:
    """numpy in, numpy out: compact device copies of q, k, v, one launch, results copied back."""
    dtype = _arrays.numpy_dtype(problem.dtype)
    result = problem.out.array if problem.out is not None else np.empty(problem.out_shape(), dtype=dtype)
    lse = np.empty(problem.lse_shape(), dtype=np.float32) if return_lse else None
    if _is_empty(problem) or problem.seqlen_k == 0:
        result[...] = 0
        if lse is not None:
            lse.fill(-np.inf)
        return result, lse

    # Host arrays run on CUDA device 0, on the calling thread's default stream.
    device, stream, itemsize = 0, _C.stream_per_thread, _arrays.ITEMSIZE[problem.dtype]
    views = {}
    buffers = []  # keeps the device copies alive until the launch has been synchronized
    for key, info in (("q", problem.q), ("k", problem.k), ("v", problem.v)):
        shape, strides = _as4d(info)
        buffer = _C.DeviceBuffer(int(np.prod(shape)) * itemsize, device)
        buffers.append(buffer)
        compact = _compact_strides(shape)
        _arrays.strided_copy(_C, buffer.ptr, compact, info.ptr, tuple(int(s) for s in strides), shape,
                             itemsize, device, stream)
        views[key] = (buffer.ptr, compact)
    out_shape4 = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
    out_buffer = _C.DeviceBuffer(int(np.prod(out_shape4)) * itemsize, device)
    lse_buffer = _C.DeviceBuffer(int(np.prod(out_shape4[:-1])) * 4, device) if return_lse else None
    params = _fill_params(problem, views["q"], views["k"], views["v"],
                          (out_buffer.ptr, _compact_strides(out_shape4)), lse_buffer.ptr if lse_buffer else 0)
    _C.forward(getattr(_C.Backend, name), params, device, stream)

    result4 = _view4d(result, problem.rank)
    host_strides = tuple(s // itemsize for s in result4.strides)
    _arrays.strided_copy(_C, result4.__array_interface__["data"][0], host_strides, out_buffer.ptr,
                         _compact_strides(out_shape4), out_shape4, itemsize, device, stream)
    if lse is not None:
        _arrays.strided_copy(_C, lse.__array_interface__["data"][0], (1,), lse_buffer.ptr, (1,),
                             (lse.size,), 4, device, stream)
    _C.synchronize(device, stream)
    return result, lse


def _forward_device(problem: _Problem, name: str, return_lse: bool) -> tuple[Any, Any]:
    """CUDA arrays of a framework: read in place, written into a new array of that framework (or out)."""
    like, device = problem.q, problem.device
    if problem.out is not None:
        result = target = problem.out.array
    else:
        result, target = _arrays.empty_like_framework(like, problem.out_shape(), problem.dtype, _C)
    lse_result = lse_target = None
    if return_lse:
        lse_result, lse_target = _arrays.empty_like_framework(like, problem.lse_shape(), "float32", _C)

    for info in (problem.q, problem.k, problem.v):
        _arrays.wait_until_ready(info)
    stream = _arrays.current_stream(like, _C)
    if _is_empty(problem) or problem.seqlen_k == 0:
        _fill_device(like, target, lse_target, problem, stream)
    else:
        out_shape4 = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
        lse_ptr = _pointer_and_strides(lse_target, "lse", out_shape4[:-1])[0] if lse_target is not None else 0
        params = _fill_params(problem, (problem.q.ptr, _as4d(problem.q)[1]), (problem.k.ptr, _as4d(problem.k)[1]),
                              (problem.v.ptr, _as4d(problem.v)[1]), _pointer_and_strides(target, "out", out_shape4),
                              lse_ptr)
        _C.forward(getattr(_C.Backend, name), params, device, stream)

    if like.framework == "jax":
        _C.synchronize(device, stream)
        result = _arrays.finish_jax(target, problem.out_shape(), problem.dtype, _C)
        if lse_target is not None:
            lse_result = _arrays.finish_jax(lse_target, problem.lse_shape(), "float32", _C)
    return result, lse_result


def _pointer_and_strides(target: Any, name: str, shape4: tuple[int, ...]) -> tuple[int, tuple]:
    """(device pointer, strides in elements, as 4-D for O) of an output: one of our compact
    DeviceBuffers (JAX) or a framework array."""
    if isinstance(target, _C.DeviceBuffer):
        return target.ptr, _compact_strides(shape4)
    info = _describe(target, name)
    return info.ptr, (_as4d(info)[1] if len(shape4) == 4 else info.strides)


def _fill_device(like: ArrayInfo, target: Any, lse_target: Any, problem: _Problem, stream: int) -> None:
    """Empty problems, and Nk == 0 where no row sees a key: O = 0, lse = -inf."""
    if isinstance(target, _C.DeviceBuffer):  # JAX: fill through a host staging copy
        for buffer, dtype, value in ((target, problem.dtype, 0.0), (lse_target, "float32", -np.inf)):
            if buffer is None or buffer.bytes == 0:
                continue
            host = np.full(buffer.bytes // _arrays.ITEMSIZE[dtype], value, dtype=_arrays.numpy_dtype(dtype))
            _C.memcpy_2d(buffer.ptr, buffer.bytes, host.__array_interface__["data"][0], buffer.bytes,
                         buffer.bytes, 1, buffer.device, stream)
        _C.synchronize(problem.device, stream)
        return
    if like.framework == "torch":
        target.zero_()
        if lse_target is not None:
            lse_target.fill_(-math.inf)
    else:
        target.fill(0)
        if lse_target is not None:
            lse_target.fill(-math.inf)
