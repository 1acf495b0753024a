"""Uniform description of the arrays `forward` accepts: numpy on the host, or CUDA arrays of PyTorch,
CuPy and JAX (read through DLPack by the extension). One place knows about the frameworks."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

DTYPES = ("float32", "float16", "bfloat16")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# DLPack (type code, bits) -> dtype name.
_DLPACK_DTYPES = {(2, 32): "float32", (2, 16): "float16", (4, 16): "bfloat16"}
_DLPACK_CODES = {name: code for code, name in _DLPACK_DTYPES.items()}
_DLPACK_CPU, _DLPACK_CUDA = 1, 2


@dataclass(frozen=True)
class ArrayInfo:
    """What validation and the launch need to know about one array."""

    array: Any
    framework: str  # "numpy", "torch", "cupy" or "jax"
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: str  # one of DTYPES, or the framework's name for an unsupported one
    device: int | None  # CUDA device ordinal, None on the host
    ptr: int


def framework_of(array: Any) -> str | None:
    if isinstance(array, np.ndarray):
        return "numpy"
    module = type(array).__module__.split(".")[0]
    if module in ("torch", "cupy"):
        return module
    if module in ("jax", "jaxlib"):
        return "jax"
    return None


def describe(array: Any, name: str, extension: Any) -> ArrayInfo:
    """Describes `array`; raises TypeError naming `name` for anything that is not a supported array."""
    framework = framework_of(array)
    if framework is None:
        raise TypeError(
            f"{name} must be a numpy array or a CUDA array of PyTorch, CuPy or JAX, got {type(array).__name__}"
        )
    if framework == "numpy":
        dtype = array.dtype.name
        itemsize = array.dtype.itemsize
        strides = tuple(s // itemsize if s % itemsize == 0 else s / itemsize for s in array.strides)
        return ArrayInfo(array, framework, tuple(array.shape), strides, dtype, None,
                         array.__array_interface__["data"][0])
    if framework == "jax" and not hasattr(array, "__dlpack__"):
        raise TypeError(f"{name}: this JAX object is not a concrete array (tracers are not supported)")
    if extension is None:
        raise RuntimeError(
            f"{name} is a {framework} array, but cutlassfa was built without its CUDA extension")
    try:
        ptr, shape, strides, (code, bits), (device_type, device_id) = extension.describe(array)
    except TypeError as error:
        raise TypeError(f"{name}: cannot read this {framework} array through DLPack ({error})") from None
    dtype = _DLPACK_DTYPES.get((code, bits), f"dlpack(code={code}, bits={bits})")
    if device_type == _DLPACK_CPU:
        raise TypeError(f"{name} is a host {framework} array; pass numpy arrays for host computation")
    if device_type != _DLPACK_CUDA:
        raise TypeError(f"{name} lives on DLPack device type {device_type}; only CUDA devices are supported")
    return ArrayInfo(array, framework, tuple(shape), tuple(strides), dtype, device_id, ptr)


def current_stream(info: ArrayInfo, extension: Any) -> int:
    """The stream the array's framework would launch on now (JAX exposes none: a per-thread stream that
    `forward` synchronizes before returning)."""
    if info.framework == "torch":
        import torch

        return torch.cuda.current_stream(info.array.device).cuda_stream
    if info.framework == "cupy":
        import cupy

        with cupy.cuda.Device(info.device):
            return cupy.cuda.get_current_stream().ptr
    return extension.stream_per_thread


def wait_until_ready(info: ArrayInfo) -> None:
    """JAX computes asynchronously on streams of its own: its inputs must be finished before we read them."""
    if info.framework == "jax":
        info.array.block_until_ready()


def empty_like_framework(like: ArrayInfo, shape: tuple[int, ...], dtype: str, extension: Any) -> tuple[Any, Any]:
    """A new array of `like`'s framework and device. Returns (array to hand back, writable target):
    the two differ for JAX, whose arrays are immutable: we write into a device buffer and wrap it after."""
    if like.framework == "numpy":
        array = np.empty(shape, dtype=numpy_dtype(dtype))
        return array, array
    if like.framework == "torch":
        import torch

        torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
        array = torch.empty(shape, dtype=torch_dtype, device=like.array.device)
        return array, array
    if like.framework == "cupy":
        import cupy

        with cupy.cuda.Device(like.device):
            array = cupy.empty(shape, dtype=numpy_dtype(dtype))
        return array, array
    buffer = extension.DeviceBuffer(int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[dtype], like.device)
    return buffer, buffer


def finish_jax(buffer: Any, shape: tuple[int, ...], dtype: str, extension: Any) -> Any:
    """Hands a filled device buffer to JAX (zero copy through DLPack; the array keeps the buffer alive)."""
    code, bits = _DLPACK_CODES[dtype]
    return extension.wrap_jax(buffer, list(shape), code, bits)


def numpy_dtype(dtype: str) -> np.dtype:
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("bfloat16 numpy arrays need the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def strided_copy(extension: Any, dst: int, dst_strides: tuple[int, ...], src: int,
                 src_strides: tuple[int, ...], shape: tuple[int, ...], itemsize: int, device: int,
                 stream: int) -> None:
    """Copies a strided block between host and device (either direction) with as few 2-D copies as the
    strides allow: dimensions contiguous in both arrays are merged first. Strides are in elements and
    the last dimension is contiguous in both."""
    dims = [(n, d, s) for n, d, s in zip(shape, dst_strides, src_strides) if n != 1]
    merged: list[list[int]] = []
    for n, d, s in reversed(dims):
        if merged and d == merged[-1][0] * merged[-1][1] and s == merged[-1][0] * merged[-1][2]:
            merged[-1][0] *= n
        else:
            merged.append([n, d, s])
    merged.reverse()  # outermost first; the last entry is contiguous (stride 1) in both arrays
    if not merged:
        merged = [[1, 1, 1]]
    width = merged[-1][0] * itemsize
    if len(merged) >= 2:
        height, dst_pitch, src_pitch = merged[-2][0], merged[-2][1] * itemsize, merged[-2][2] * itemsize
        outer = merged[:-2]
    else:
        height, dst_pitch, src_pitch, outer = 1, width, width, []
    for index in itertools.product(*(range(n) for n, _, _ in outer)):
        dst_offset = sum(i * d for i, (_, d, _) in zip(index, outer)) * itemsize
        src_offset = sum(i * s for i, (_, _, s) in zip(index, outer)) * itemsize
        extension.memcpy_2d(dst + dst_offset, dst_pitch, src + src_offset, src_pitch, width, height,
                            device, stream)
