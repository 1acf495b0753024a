"""What the Python layer needs to know about the frameworks beyond the extension's own description of
their arrays: dtype names, allocations the extension cannot make itself (CuPy, JAX), streams, and
numpy views of host arrays for the `cpu` backend. One place knows about the frameworks."""

from __future__ import annotations

from typing import Any

import numpy as np

DTYPES = ("float32", "float16", "bfloat16")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# dtype name -> DLPack (type code, bits).
_DLPACK_CODES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16)}


def framework_of(array: Any) -> str | None:
    """"numpy", "torch", "cupy" or "jax" for an array of that framework, else None."""
    if isinstance(array, np.ndarray):
        return "numpy"
    module = type(array).__module__.split(".")[0]
    if module in ("torch", "cupy"):
        return module
    if module in ("jax", "jaxlib"):
        return "jax"
    return None


def numpy_dtype(dtype: str) -> np.dtype:
    if dtype in ("bfloat16", "float8_e4m3fn"):  # numpy's through ml_dtypes
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(f"{dtype} numpy arrays need the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(dtype)


def stand_in(array: Any, writable: bool = False) -> Any:
    """A host array of `array`'s shape and dtype that occupies no memory (zero strides), for arrays with
    no data to read (PyTorch fake tensors, JAX tracers), so that the extension's validator judges a traced
    call with its own messages; `writable` for caches that keys are appended into. Index values read as
    zeros. None stays None; host values pass through."""
    if array is None or isinstance(array, (np.ndarray, list, tuple, int, float)):
        return array
    name = str(array.dtype).removeprefix("torch.")
    dtype = numpy_dtype(name) if name in DTYPES or name.startswith(("int", "uint", "float")) else np.dtype(np.uint8)
    shape = tuple(int(n) for n in array.shape)
    if not shape:
        return np.zeros((), dtype)
    row = np.zeros(shape[-1:], dtype)  # the last dim contiguous, as the validator asks
    return np.lib.stride_tricks.as_strided(row, shape, (0,) * (len(shape) - 1) + row.strides, writeable=writable)


def varlen_stand_in(cu_seqlens: Any, total: int, longest: int) -> np.ndarray:
    """Host prefix sums of cu_seqlens' length that the validator accepts for `total` rows in sequences of at
    most `longest`, for cu_seqlens whose values are not known where the call is judged (tracers, fake
    tensors)."""
    entries = int(cu_seqlens.shape[0]) if getattr(cu_seqlens, "ndim", 1) == 1 else 0
    values = np.minimum(np.arange(entries, dtype=np.int64) * max(longest, 0), total)
    if entries:
        values[-1] = total
    return values.astype(np.int32)


def cupy_empty(shape: tuple[int, ...], dtype: str, device: int) -> tuple[Any, Any]:
    """A new CuPy array on `device` (the extension's allocation callback): (result, writable target)."""
    import cupy

    with cupy.cuda.Device(device):
        array = cupy.empty(shape, dtype=numpy_dtype(dtype))
    return array, array


def cupy_stream(array: Any) -> int:
    """The stream CuPy launches on now for the array's device."""
    import cupy

    with cupy.cuda.Device(array.device.id):
        return cupy.cuda.get_current_stream().ptr


def device_buffer(shape: tuple[int, ...], dtype: str, device: int) -> tuple[Any, Any]:
    """A device buffer of ours (JAX outputs: its arrays are immutable, we write then hand it over)."""
    from . import _C

    buffer = _C.DeviceBuffer(int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[dtype], device)
    return buffer, buffer


def finish_jax(buffer: Any, shape: tuple[int, ...], dtype: str, extension: Any) -> Any:
    """Hands a filled device buffer to JAX (zero copy through DLPack; the array keeps the buffer alive)."""
    code, bits = _DLPACK_CODES[dtype]
    return extension.wrap_jax(buffer, list(shape), code, bits)


def _is_torch(array: Any) -> bool:
    return type(array).__module__.startswith("torch")


def host_numpy(array: Any) -> np.ndarray:
    """A numpy view (no copy) of a host array: numpy itself, or a PyTorch CPU tensor (bfloat16 and
    float8_e4m3fn through ml_dtypes, which numpy lacks)."""
    if not _is_torch(array):
        return array
    import torch

    array = array.detach()  # the cpu backend has no autograd: PyTorch routes calls that need it elsewhere
    if array.dtype == torch.bfloat16:
        return array.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    if array.dtype == torch.float8_e4m3fn:
        return array.view(torch.uint8).numpy().view(numpy_dtype("float8_e4m3fn"))
    return array.numpy()


def empty_host_like(like: Any, shape: tuple[int, ...], dtype: str) -> Any:
    """A new host array of `like`'s framework."""
    if _is_torch(like):
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype))
    return np.empty(shape, dtype=numpy_dtype(dtype))


def torch_from_numpy(array: np.ndarray) -> Any:
    """A PyTorch CPU tensor sharing `array`'s memory (bfloat16 through its int16 bits), the inverse of
    host_numpy."""
    import torch

    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if array.dtype.name == "float8_e4m3fn":
        return torch.from_numpy(array.view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(array)


def host_like(like: Any, array: np.ndarray) -> Any:
    """`array` (a numpy result) in `like`'s framework."""
    if _is_torch(like):
        return torch_from_numpy(np.ascontiguousarray(array))
    return array
