"""`forward` with its variant arguments, and `varlen_forward`: sliding windows, softcap, KV caches
(contiguous, paged, appended keys), split keys and batches of sequences of different lengths.

`forward` hands a call over here only when one of those arguments is given, so that its plain path
stays one call into the extension. The options are checked first, on every backend and before anything
is written (cutlassfa._options); a call that asks for nothing beyond the plain path (window=(-1, -1),
softcap=0, num_splits=1) goes back to it. CUDA arrays (PyTorch, CuPy) then go to the extension in one
call (`_C.forward_variant`: it validates the arrays, appends k_new / v_new, splits the keys and
launches on every GPU backend). Host arrays (numpy, PyTorch CPU tensors) run on the `cpu` backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _arrays
from ._api import Support, _backend_code, _flag, _scale, _torch_integration
from ._options import check_head_dim, check_kvcache, check_num_splits, check_softcap, check_varlen, check_window
from .cpu import forward_cpu, kvcache_forward_cpu, varlen_forward_cpu
from .masks import resolve_window

__all__ = ["PLAIN", "forward", "varlen_forward", "requested", "support"]

PLAIN = object()  # what `forward` returns for a call the plain path computes
_KV_ARGUMENTS = ("cache_seqlens", "cache_leftpad", "block_table", "k_new", "v_new")
# Mode keys of `supports` that ask for more than the plain path; each with the argument that asks.
VARIANT_MODES = {"window": "window", "softcap": "softcap", "kv_cache": "cache_seqlens", "paged": "block_table",
                 "varlen": "varlen_forward", "num_splits": "num_splits"}
_HOST = "host arrays (numpy, PyTorch CPU tensors)"
_DEVICE = "CUDA arrays (PyTorch, CuPy)"


# --------------------------------------------------------------------------------------------------
# What a call or a supports() query asks for
# --------------------------------------------------------------------------------------------------

def requested(mode: dict[str, Any]) -> list[str]:
    """The variant keys of a `supports` mode that ask for more than the plain path, after checking their
    values (TypeError / ValueError as `forward` would raise)."""
    causal = bool(mode.get("causal", False))
    asked = []
    for key, value in mode.items():
        if key == "window":
            wanted = check_window(value, causal) != resolve_window(causal)
        elif key == "softcap":
            wanted = check_softcap(value) > 0
        elif key == "num_splits":
            wanted = (check_num_splits(value) or 1) > 1
        elif key in VARIANT_MODES:
            wanted = _flag(value, key)
        else:
            continue
        if wanted:
            asked.append(key)
    return asked


def support(head_dim: Any) -> Support:
    """`supports` of the cpu backend for a query that asks for variant modes: every head dim the
    validator takes. (GPU backends take every variant mode for the head dims they have kernels for.)"""
    try:
        check_head_dim(head_dim)
    except ValueError as error:
        return Support(False, str(error))
    return Support(True)


def _host_refusal(argument: str, backend: str) -> str:
    """Why a GPU backend asked for by name does not take a variant call on host arrays."""
    what = argument if argument == "varlen_forward" else f"{argument}="
    return (f"{what} runs on backend {backend!r} for {_DEVICE}; on {_HOST} it runs on the cpu backend "
            f"(backend='auto' or 'cpu')")


# --------------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------------

def forward(q: Any, k: Any, v: Any, *, causal: Any, softmax_scale: Any, window: Any, softcap: Any,
            cache_seqlens: Any, cache_leftpad: Any, block_table: Any, k_new: Any, v_new: Any, num_splits: Any,
            backend: Any, return_lse: Any, out: Any) -> Any:
    """`cutlassfa.forward` with a variant argument given (see its docstring); PLAIN when the arguments
    ask for nothing the plain path does not compute."""
    _backend_code(backend)
    causal, return_lse = _flag(causal, "causal"), _flag(return_lse, "return_lse")
    scale = _scale(softmax_scale)
    win, cap, asked_splits = check_window(window, causal), check_softcap(softcap), check_num_splits(num_splits)
    splits = asked_splits or 1
    kv = {name: value for name, value in zip(_KV_ARGUMENTS, (cache_seqlens, cache_leftpad, block_table, k_new, v_new))
          if value is not None}
    # The arguments that ask for more than the plain path.
    given = dict(kv)
    if win != resolve_window(causal):
        given["window"] = (win.left, win.right)
    if cap > 0:
        given["softcap"] = cap
    framework = _arrays.framework_of(q)
    if splits > 1 or asked_splits == 1 and (not _on_jax_host(q) if framework == "jax" else not _is_host(q)):
        # An explicit 1 on device arrays (and JAX tracers) too: the plain path splits a call of few
        # queries by itself (dispatch.cpp, dense_num_splits), so one pass must be asked for here.
        given["num_splits"] = splits
    if not given:
        return PLAIN
    argument = next(iter(given))

    if framework == "jax":
        if k_new is not None or v_new is not None:
            raise TypeError("k_new / v_new are appended into k and v in place; JAX arrays are immutable")
        if _on_jax_device(q):
            return _on_jax_gpu(q, k, v, out, causal, scale, backend, return_lse, window_left=win.left,
                               window_right=win.right, softcap=cap, num_splits=asked_splits or 0, **kv)
        if backend not in ("auto", "cpu"):
            raise NotImplementedError(_host_refusal(argument, backend))
        from .integrations import jax as jax_integration

        return jax_integration.forward(q, k, v, causal=causal, softmax_scale=scale, backend=backend,
                                       return_lse=return_lse, out=out, **given)
    if framework == "torch":
        routed = _torch_integration().maybe_route(q, k, v, causal=causal, softmax_scale=scale, backend=backend,
                                                  return_lse=return_lse, out=out, **given)
        if routed is not None:
            return routed
    if not _is_host(q):
        return _on_device(q, k, v, out, causal, scale, backend, return_lse, window_left=win.left,
                          window_right=win.right, softcap=cap, num_splits=asked_splits or 0, **kv)

    like = q
    q, k, v = _host_arrays(("q", q), ("k", k), ("v", v))
    d = q.shape[-1]
    if kv:
        k_new, v_new = _host_arrays(("k_new", k_new), ("v_new", v_new), like=like, optional=True)
        index = {name: _host_index(kv.get(name), name) for name in ("cache_seqlens", "cache_leftpad", "block_table")}
        check_kvcache(q, k, v, k_new=k_new, v_new=v_new, **index)
    else:
        _check_dense(q, k, v)
    check_head_dim(d)
    out_host, out_np = _output(out, like, q)
    if backend not in ("auto", "cpu"):
        raise NotImplementedError(_host_refusal(argument, backend))

    options = dict(causal=causal, softmax_scale=scale, window=win, softcap=cap, num_splits=splits, return_lse=True)
    if kv:
        _, lse = kvcache_forward_cpu(q, k, v, k_new=k_new, v_new=v_new, out=out_np, **index, **options)
    else:
        view4 = (lambda a: a[:, None]) if q.ndim == 3 else (lambda a: a)
        _, lse = forward_cpu(view4(q), view4(k), view4(v), out=view4(out_np), **options)
        lse = lse.reshape(q.shape[:-1])
    return (out_host, _arrays.host_like(like, lse)) if return_lse else out_host


def _check_dense(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """The checks of the plain path's validator, for the shapes of a dense call."""
    if q.ndim not in (3, 4) or not q.ndim == k.ndim == v.ndim:
        raise ValueError(f"q, k and v must all be 4-D (B, H, N, d) or all 3-D (B, N, d), got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    if not q.shape[0] == k.shape[0]:
        raise ValueError(f"q, k and v must have the same batch size, got {q.shape[0]} and {k.shape[0]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k and v must have the same head dim, got {q.shape[-1]} and {k.shape[-1]}")
    hq, hkv = (q.shape[1], k.shape[1]) if q.ndim == 4 else (1, 1)
    if hkv == 0 and hq != 0 or hkv != 0 and hq % hkv:
        raise ValueError(f"the heads of q ({hq}) must be a multiple of the heads of k and v ({hkv})")


# --------------------------------------------------------------------------------------------------
# varlen_forward
# --------------------------------------------------------------------------------------------------

def varlen_forward(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *, max_seqlen_q: int | None = None,
                   max_seqlen_k: int | None = None, causal: bool = False, softmax_scale: float | None = None,
                   window: tuple[int, int] | None = None, softcap: float = 0.0, backend: str = "auto",
                   return_lse: bool = False, out: Any = None) -> Any:
    """Attention over a batch of sequences of different lengths, packed without padding (FlashAttention's
    varlen layout). GPU backends compute it on CUDA arrays (PyTorch, CuPy); host arrays (numpy, PyTorch
    CPU tensors) run on the `cpu` backend. JAX arrays are not taken yet (NotImplementedError).

    q (total_q, Hq, d); k, v (total_k, Hkv, d), Hq a multiple of Hkv; dtypes as `forward`, d a multiple
    of 8 from 8 to 256, any strides. cu_seqlens_q / cu_seqlens_k: (B+1,) int prefix sums, 0 first,
    non-decreasing, ending at total_q / total_k: sequence b is rows [cu[b], cu[b+1]); empty sequences
    are allowed (int32 arrays on q's device, or host ints, copied). max_seqlen_q / max_seqlen_k: None
    or at least each sequence's length; they size the GPU grid: with cu_seqlens on the device and
    None, the grid covers the totals (correct, slower). Device values are not checked (that would
    need a synchronization): the kernels clamp each sequence to [0, total) and to max_seqlen.
    causal, window, softcap, softmax_scale: as `forward`, aligned bottom-right within each sequence.
    Returns out (total_q, Hq, d), or (out, lse) when return_lse, lse float32 (Hq, total_q).
    """
    _backend_code(backend)
    causal, return_lse = _flag(causal, "causal"), _flag(return_lse, "return_lse")
    scale = _scale(softmax_scale)
    win, cap = check_window(window, causal), check_softcap(softcap)
    framework = _arrays.framework_of(q)
    if framework == "jax":
        raise NotImplementedError("varlen_forward does not take JAX arrays yet")
    if framework == "torch":
        if _torch_integration().must_use_op(q, k, v):
            raise NotImplementedError("cutlassfa.varlen_forward has no torch operator yet (torch.compile, "
                                      "autograd, tensor subclasses)")
    if not _is_host(q):
        if framework is None:
            raise TypeError(f"q must be a numpy, PyTorch, CuPy or JAX array, got {type(q).__name__}")
        return _on_device(q, k, v, out, causal, scale, backend, return_lse, window_left=win.left,
                          window_right=win.right, softcap=cap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                          max_seqlen_q=-1 if max_seqlen_q is None else _max_seqlen(max_seqlen_q, "max_seqlen_q"),
                          max_seqlen_k=-1 if max_seqlen_k is None else _max_seqlen(max_seqlen_k, "max_seqlen_k"))

    like = q
    q, k, v = _host_arrays(("q", q), ("k", k), ("v", v))
    cu_q, cu_k = _host_index(cu_seqlens_q, "cu_seqlens_q"), _host_index(cu_seqlens_k, "cu_seqlens_k")
    check_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    check_head_dim(q.shape[-1])
    out_host, out_np = _output(out, like, q)
    if backend not in ("auto", "cpu"):
        raise NotImplementedError(_host_refusal("varlen_forward", backend))
    _, lse = varlen_forward_cpu(q, k, v, cu_q, cu_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                causal=causal, softmax_scale=scale, window=win, softcap=cap, return_lse=True,
                                out=out_np)
    return (out_host, _arrays.host_like(like, lse)) if return_lse else out_host


# --------------------------------------------------------------------------------------------------
# Host arrays
# --------------------------------------------------------------------------------------------------

def _is_host(array: Any) -> bool:
    framework = _arrays.framework_of(array)
    return framework == "numpy" or framework == "torch" and array.device.type == "cpu"


def _on_jax_host(q: Any) -> bool:
    """A concrete JAX array on the CPU only."""
    import jax

    return not isinstance(q, jax.core.Tracer) and all(d.platform == "cpu" for d in q.devices())


def _on_jax_device(q: Any) -> bool:
    """A concrete JAX array on a GPU (a tracer's device is not known until it runs)."""
    import jax

    return not isinstance(q, jax.core.Tracer) and any(d.platform != "cpu" for d in q.devices())


def _on_device(q: Any, k: Any, v: Any, out: Any, causal: bool, scale: float | None, backend: str, return_lse: bool,
               **variant: Any) -> Any:
    """A variant call on CUDA arrays: one call into the extension, which validates the arrays (naming
    the argument), appends new keys, splits the keys and launches on the framework's stream."""
    from . import _api

    if _arrays.framework_of(q) is None:
        raise TypeError(f"q must be a numpy, PyTorch, CuPy or JAX array, got {type(q).__name__}")
    if backend == "cpu":
        raise ValueError("backend 'cpu' needs host arrays (numpy, PyTorch CPU tensors); q is on a CUDA device")
    extension = _api._C
    if extension is None or not extension.has_cuda:
        raise RuntimeError(_api._EXTENSION_ERROR or "cutlassfa was installed without its CUDA extension")
    alloc, stream = None, -1  # PyTorch: allocation and stream through its DLPack exchange API
    if _arrays.framework_of(q) == "cupy":
        alloc, stream = _arrays.cupy_empty, _arrays.cupy_stream(q)
    result = extension.forward_variant(q, k, v, out, causal, scale, _backend_code(backend), return_lse, alloc, stream,
                                       False, **variant)
    return result if return_lse else result[0]


def _on_jax_gpu(q: Any, k: Any, v: Any, out: Any, causal: bool, scale: float | None, backend: str,
                return_lse: bool, **variant: Any) -> Any:
    """A variant call on concrete JAX arrays on a GPU. JAX computes on streams of its own and its arrays
    are immutable (as on the plain path): wait for the inputs, compute into device buffers of ours on a
    per-thread stream, synchronize, and hand the buffers to JAX."""
    from . import _api

    if out is not None:
        raise TypeError("out is not supported for JAX arrays (they are immutable)")
    if backend == "cpu":
        raise ValueError("backend 'cpu' needs host arrays; q is a JAX array on a GPU")
    extension = _api._C
    if extension is None or not extension.has_cuda:
        raise RuntimeError(_api._EXTENSION_ERROR or "cutlassfa was installed without its CUDA extension")
    for x in (q, k, v, *variant.values()):
        if hasattr(x, "block_until_ready"):
            x.block_until_ready()
    o, lse = extension.forward_variant(q, k, v, None, causal, scale, _backend_code(backend), return_lse,
                                       _arrays.device_buffer, extension.stream_per_thread, True, **variant)
    shape = tuple(q.shape)
    o = _arrays.finish_jax(o, shape, q.dtype.name, extension)
    if not return_lse:
        return o
    return o, _arrays.finish_jax(lse, shape[:-1], "float32", extension)


def _max_seqlen(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if not 0 <= value < 2**31:
        raise ValueError(f"{name} = {value} must be >= the longest sequence and < 2^31")
    return int(value)


def _host_arrays(*named: tuple[str, Any], like: Any = None, optional: bool = False) -> list[Any]:
    """numpy views of host arrays of one framework (the first one's, or `like`'s) and one float dtype."""
    like = named[0][1] if like is None else like
    framework = _arrays.framework_of(like)
    arrays = []
    for name, array in named:
        if array is None and optional:
            arrays.append(None)
            continue
        if _arrays.framework_of(array) != framework or not _is_host(array):
            raise TypeError(f"{name} must be a host array of the framework of q ({framework}), got "
                            f"{type(array).__name__}" + ("" if _arrays.framework_of(array) is None else
                                                         f" on {getattr(array, 'device', 'the host')}"))
        array = _arrays.host_numpy(array)
        if array.dtype.name not in _arrays.DTYPES:
            raise TypeError(f"{name} has dtype {array.dtype}; expected one of {', '.join(_arrays.DTYPES)}")
        arrays.append(array)
    present = [(name, a) for (name, _), a in zip(named, arrays) if a is not None]
    if len({a.dtype for _, a in present}) > 1:
        raise TypeError(f"{', '.join(n for n, _ in present)} must have the same dtype, got "
                        f"{', '.join(str(a.dtype) for _, a in present)}")
    return arrays


def _host_index(value: Any, name: str) -> Any:
    """An index argument for the cpu backend: numpy, a sequence of ints, or a PyTorch CPU tensor."""
    if value is None or isinstance(value, (np.ndarray, list, tuple)):
        return value
    if _arrays.framework_of(value) == "torch" and value.device.type == "cpu":
        return value.numpy()
    raise TypeError(f"{name} must be a host array of ints (numpy, a sequence, a PyTorch CPU tensor) like q, "
                    f"got {type(value).__name__}")


def _output(out: Any, like: Any, q: np.ndarray) -> tuple[Any, np.ndarray]:
    """(the array to return, its numpy view): `out` after checking it, or a new array like q."""
    if out is None:
        out = _arrays.empty_host_like(like, q.shape, q.dtype.name)
        return out, _arrays.host_numpy(out)
    if _arrays.framework_of(out) != _arrays.framework_of(like) or not _is_host(out):
        raise TypeError(f"out must be a host array of the framework of q, got {type(out).__name__}")
    out_np = _arrays.host_numpy(out)
    if out_np.shape != q.shape:
        raise ValueError(f"out must have shape {q.shape}, got {out_np.shape}")
    if out_np.dtype != q.dtype:
        raise TypeError(f"out must have dtype {q.dtype} like q, got {out_np.dtype}")
    if not out_np.flags.writeable:
        raise ValueError("out is read-only")
    return out, out_np
