"""Frames: where a run's arrays live. GPU inputs are PyTorch CUDA tensors when PyTorch is importable,
else CuPy arrays; without a GPU, numpy (the cpu backend only). A frame makes random inputs, copies,
host copies, empty arrays, knows the free memory and L2 size, its timer, and a dense GEMM for the peak
rates."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._inputs import Unsupported, numpy_dtype, torch_dtype
from .timing import CudaPythonEventTimer, Timer, TorchEventTimer, WallTimer

DEFAULT_L2_BYTES = 50 * 2**20  # H100 / H200: 50 MB


class Frame:
    name = "numpy"
    on_gpu = False

    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        rng = np.random.default_rng(seed)
        return rng.standard_normal(shape, dtype=np.float32).astype(numpy_dtype(dtype))

    def clone(self, x: Any) -> Any:
        return x.copy()

    def empty_like(self, x: Any, shape: tuple[int, ...]) -> Any:
        """An uninitialized array of x's dtype and device, of `shape`."""
        return np.empty(shape, x.dtype)

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

    def synchronize(self) -> None:
        """Waits for the work queued on this frame's device (nothing to wait for on the host)."""

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
        return torch_dtype(dtype)

    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        gen = self.torch.Generator(device="cuda").manual_seed(seed)
        return self.torch.randn(shape, generator=gen, device="cuda", dtype=self._dtype(dtype))

    def clone(self, x: Any) -> Any:
        return x.clone()

    def empty_like(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.torch.empty(shape, dtype=x.dtype, device=x.device)

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

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

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

    def empty_like(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.cupy.empty(shape, x.dtype)

    def to_host(self, x: Any, dtype: str) -> np.ndarray:
        return x.get()

    def free_bytes(self) -> int | None:
        return int(self.cupy.cuda.runtime.memGetInfo()[0])

    def l2_bytes(self) -> int:
        attrs = self.cupy.cuda.Device().attributes
        return int(attrs.get("L2CacheSize", 0) or DEFAULT_L2_BYTES)

    def synchronize(self) -> None:
        self.cupy.cuda.Device().synchronize()

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

