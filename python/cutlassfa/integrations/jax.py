"""`cutlassfa.forward` for JAX arrays and tracers: eagerly, under `jax.jit` and under `jax.vmap`.

How a call runs is fixed when it is traced, by the platform it is lowered for (`jax.lax.platform_dependent`):
- CUDA, with an extension built against jaxlib's FFI headers: an XLA FFI custom call (target
  ``cutlassfa_forward``, handler in cpp/jax/ffi.cpp) inside the compiled program, on XLA's stream, with
  no host synchronisation. The backend is resolved in Python at trace time and passed as an attribute.
- CPU (and CUDA without that handler): a host callback (`jax.pure_callback`) to the numpy path of
  `cutlassfa.forward`, on the `cpu` backend for `backend="auto"` on the CPU.
`jax.vmap` folds the mapped axes into the batch axis (both paths accept any leading axes). `jax.grad`
raises NotImplementedError: there is no backward pass.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import cutlassfa
from cutlassfa._arrays import stand_in

__all__ = ["forward", "FFI_TARGET", "NO_BACKWARD"]

FFI_TARGET = "cutlassfa_forward"
NO_BACKWARD = ("cutlassfa.forward has no backward pass: gradients through cutlassfa attention are not "
               "implemented (jax.grad / jax.jvp / jax.vjp). Use jax.nn.dot_product_attention for training")
_TENSORCORE = ("tensorcore", "tensorcore_sm80")
_CUDA_CORE_FALLBACK = ("large_tile", "small_tile")  # what `auto` takes when tensorcore cannot
# forward's array arguments beside q, k, v that a traced call takes: operands of the call (host callback)
_ARRAY_MODES = ("sinks", "alibi_slopes", "cache_seqlens", "cache_leftpad", "k_descale", "v_descale")


@dataclass(frozen=True)
class _Call:
    """What is static about one call (a jit static argument, so hashable)."""

    causal: bool
    softmax_scale: float
    cpu_backend: str  # run by the host callback when lowered for the CPU
    cuda_backend: str  # run when lowered for CUDA
    ffi_backend: int | None  # cuda_backend as _C.Backend, for the FFI custom call; None: a host callback
    modes: tuple[tuple[str, Any], ...] = ()  # further keyword arguments of cutlassfa.forward
    arrays: tuple[tuple[str, int], ...] = ()  # array arguments after q, k, v: (name, ndim), in order


def forward(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
            backend: str = "auto", return_lse: bool = False, out: Any = None, **modes: Any) -> Any:
    """`cutlassfa.forward` for JAX arrays (or tracers): same arguments and results; `out` is refused
    (JAX arrays are immutable). Traceable by jax.jit and jax.vmap; jax.grad raises."""
    if out is not None:
        raise TypeError("out is not supported for JAX arrays (they are immutable)")
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    arrays = {name: jnp.asarray(modes.pop(name)) for name in _ARRAY_MODES if modes.get(name) is not None}
    operands = tuple(arrays.values())
    call = _plan(q, k, v, causal, softmax_scale, backend, modes, arrays)
    if q.ndim == 3:  # (B, N, d): one head
        result, lse = _attention(call, q[:, None], k[:, None], v[:, None], *operands)
        result, lse = result[:, 0], lse[:, 0]
    else:
        result, lse = _attention(call, q, k, v, *operands)
    return (result, lse) if return_lse else result


# --------------------------------------------------------------------------------------------------
# Trace time: validation and the backend
# --------------------------------------------------------------------------------------------------

def _plan(q: Any, k: Any, v: Any, causal: Any, softmax_scale: Any, backend: Any, modes: dict,
          arrays: dict | None = None) -> _Call:
    for key, value in modes.items():
        if key not in _forward_keywords():
            raise TypeError(f"forward() got an unexpected keyword argument {key!r}")
        if isinstance(value, (jax.Array, np.ndarray)):
            raise NotImplementedError(f"{key}: array arguments are not supported for JAX arrays yet")
    # The extension's validator judges the traced call on stand-ins of its arrays (the same checks and
    # messages as an eager call).
    array_options = {name: stand_in(a) for name, a in (arrays or {}).items()}
    name = cutlassfa.select_backend(stand_in(q), stand_in(k), stand_in(v), causal=causal, softmax_scale=softmax_scale,
                                   backend=backend, **array_options, **modes)
    operands = tuple((name, a.ndim) for name, a in (arrays or {}).items())
    scale = _scale(softmax_scale, q.shape[-1])
    frozen_modes = tuple(sorted((key, tuple(value) if isinstance(value, list) else value)
                                for key, value in modes.items()))
    if name == "cpu":
        return _Call(bool(causal), scale, "cpu", "cpu", None, frozen_modes, operands)
    cpu_backend = "cpu" if backend == "auto" else name  # auto on JAX's CPU: compute on the CPU
    cuda_backend = _device_backend(name, backend, scale)
    ffi_backend = None
    if not frozen_modes and not operands and ffi_registered():  # the FFI handler takes the core arguments only
        from cutlassfa import _C

        ffi_backend = getattr(_C.Backend, cuda_backend).value
    return _Call(bool(causal), scale, cpu_backend, cuda_backend, ffi_backend, frozen_modes, operands)


def _scale(softmax_scale: Any, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, (int, float, np.number)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(float(softmax_scale)):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return float(softmax_scale)


def _device_backend(name: str, backend: str, scale: float) -> str:
    """The GPU backend for XLA's buffers (compact and at least 16-byte aligned, so only the scale can
    keep the tensor-core kernels out, as in `cutlassfa.forward`)."""
    if name not in _TENSORCORE or scale > 0:
        return name
    if backend != "auto":
        raise ValueError(f"backend {name!r} needs softmax_scale > 0; use backend='auto'")
    statuses = cutlassfa.backends()
    return next(b for b in _CUDA_CORE_FALLBACK if statuses[b].available)


@functools.lru_cache(maxsize=None)
def _forward_keywords() -> frozenset[str]:
    return frozenset(inspect.signature(cutlassfa.forward).parameters)


@functools.lru_cache(maxsize=None)
def ffi_registered() -> bool:
    """Registers the extension's FFI handler with XLA for CUDA, once; False when the extension was built
    without it (or without CUDA) or this jaxlib has no CUDA platform."""
    try:
        from cutlassfa import _C
    except ImportError:
        return False
    handler = getattr(_C, "jax_ffi_forward", None)
    if handler is None:
        return False
    try:
        jax.ffi.register_ffi_target(FFI_TARGET, handler(), platform="CUDA")
    except Exception:  # noqa: BLE001  (a jaxlib without CUDA support refuses the platform)
        return False
    return True


# --------------------------------------------------------------------------------------------------
# The traced computation
# --------------------------------------------------------------------------------------------------

@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _attention(call: _Call, q: jax.Array, k: jax.Array, v: jax.Array,
               *arrays: jax.Array) -> tuple[jax.Array, jax.Array]:
    return _attention_jit(call, q, k, v, *arrays)


@_attention.defjvp
def _no_derivative(call: _Call, primals: tuple, tangents: tuple) -> tuple:
    raise NotImplementedError(NO_BACKWARD)


def _attention_impl(call: _Call, q: jax.Array, k: jax.Array, v: jax.Array,
                    *arrays: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(out, lse) of 4-D q, k, v (and the call's array arguments, call.arrays); any axes in front of
    (H, N, d) (vmap's) fold into the batch."""
    lse_shape = q.shape[:-1]
    if 0 in q.shape[:-1] or k.shape[-2] == 0:  # nothing to compute, or rows that see no key
        lse = jnp.full(lse_shape, -jnp.inf, jnp.float32)
        sinks = dict(zip((name for name, _ in call.arrays), arrays)).get("sinks")
        if sinks is not None:  # a row that sees no key: lse = its head's sink
            lse = jnp.broadcast_to(sinks.astype(jnp.float32)[..., None], lse_shape)
        return jnp.zeros(q.shape, q.dtype), lse
    on_cpu = functools.partial(_on_host, call, call.cpu_backend)
    on_cuda = functools.partial(_on_device, call) if call.ffi_backend is not None else \
        functools.partial(_on_host, call, call.cuda_backend)
    return jax.lax.platform_dependent(q, k, v, *arrays, cuda=on_cuda, default=on_cpu)


_attention_jit = jax.jit(_attention_impl, static_argnums=0)


def _result_types(q: jax.Array) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    return jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:-1], jnp.float32)


def _on_device(call: _Call, q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    custom_call = jax.ffi.ffi_call(FFI_TARGET, _result_types(q), vmap_method="broadcast_all")
    return custom_call(q, k, v, backend=np.int32(call.ffi_backend),
                       softmax_scale=np.float64(call.softmax_scale), causal=np.bool_(call.causal))


def _on_host(call: _Call, backend: str, q: jax.Array, k: jax.Array, v: jax.Array,
             *arrays: jax.Array) -> tuple[jax.Array, jax.Array]:
    callback = functools.partial(_host_forward, call, backend)
    return jax.pure_callback(callback, _result_types(q), q, k, v, *arrays, vmap_method="broadcast_all")


def _host_forward(call: _Call, backend: str, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The host callback: numpy in, numpy out, leading axes folded into the batch. The array arguments
    are per vmapped element (broadcast_all gives them the leading axes too): one call per element then."""
    q4, k4, v4 = (np.asarray(x).reshape((-1,) + x.shape[-3:]) for x in (q, k, v))
    arrays = tuple(np.asarray(x) for x in arrays)
    keywords = dict(causal=call.causal, softmax_scale=call.softmax_scale, backend=backend, return_lse=True,
                    **dict(call.modes))
    names = [name for name, _ in call.arrays]
    if all(a.ndim == ndim for a, (_, ndim) in zip(arrays, call.arrays)):
        out, lse = cutlassfa.forward(q4, k4, v4, **keywords, **dict(zip(names, arrays)))
        return out.reshape(q.shape), lse.reshape(q.shape[:-1])
    lead = arrays[0].shape[:arrays[0].ndim - call.arrays[0][1]]
    elements = int(np.prod(lead))
    per_element = [a.reshape((elements,) + a.shape[a.ndim - ndim:]) for a, (_, ndim) in zip(arrays, call.arrays)]
    qs, ks, vs = (x4.reshape((elements, -1) + x.shape[-3:]) for x4, x in ((q4, q), (k4, k), (v4, v)))
    results = [cutlassfa.forward(qs[e], ks[e], vs[e], **keywords, **dict(zip(names, (a[e] for a in per_element))))
               for e in range(elements)]
    return (np.stack([o for o, _ in results]).reshape(q.shape),
            np.stack([lse for _, lse in results]).reshape(q.shape[:-1]))
