"""`cutlassfa.forward` and `varlen_forward` for JAX arrays and tracers: eagerly, under `jax.jit` and
under `jax.vmap`, every option included.

How a call runs is fixed when it is traced, by the platform it is lowered for (`jax.lax.platform_dependent`):
- CUDA, with an extension built against jaxlib's FFI headers: one XLA FFI custom call (target
  ``cutlassfa_forward``, handler in cpp/jax/ffi.cpp) inside the compiled program, on XLA's stream, with
  no host synchronisation. The call is validated at trace time by the extension's validator (on stand-ins
  of the arrays) and its backend resolved then; options are attributes, arrays beyond q, k, v operands.
- CPU (and CUDA without that handler): a host callback (`jax.pure_callback`) to the numpy path of
  `cutlassfa.forward`, on the `cpu` backend for `backend="auto"` on the CPU.

Layouts: ``layout="BHND"`` takes (B, H, N, d) arrays as `cutlassfa.forward` does; ``"BNHD"`` takes JAX's
own (B, N, H, d) (KV caches (B, N, Hkv, d), paged (pages, page_size, Hkv, d)) with no transpose: the
kernels read either through strides. lse is (B, H, N) in both. JAX arrays are immutable: with k_new /
v_new the caches after the append are returned as well (``out, k, v``, or ``out, lse, k, v``); XLA
appends in place when the caches' buffers can be donated.

`jax.vmap` folds the mapped axes into the batch axis for q, k, v alone; a call with more arrays runs
once per mapped element (XLA's loop). `jax.grad` raises NotImplementedError: there is no backward pass.
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
from cutlassfa._api import _dtype_name, _flag, _scale
from cutlassfa._arrays import stand_in, varlen_stand_in

__all__ = ["forward", "varlen_forward", "FFI_TARGET", "NO_BACKWARD", "LAYOUTS"]

FFI_TARGET = "cutlassfa_forward"
NO_BACKWARD = ("cutlassfa.forward has no backward pass: gradients through cutlassfa attention are not "
               "implemented (jax.grad / jax.jvp / jax.vjp). Use jax.nn.dot_product_attention for training")
LAYOUTS = ("BHND", "BNHD")  # the FFI handler's attribute `layout`: their index
_TENSORCORE = ("tensorcore", "tensorcore_sm80")
_CUDA_CORE_FALLBACK = ("large_tile", "small_tile")  # what `auto` takes when tensorcore cannot
# forward's array arguments beside q, k, v: operands of the call, in this order (the FFI handler reads
# them by the names the call lists); integer ones are int32, float ones float32.
_INDEX_ARRAYS = ("cache_seqlens", "cache_leftpad", "block_table", "cu_seqlens_q", "cu_seqlens_k")
_FLOAT_ARRAYS = ("sinks", "alibi_slopes", "k_descale", "v_descale", "q_descale")
_ARRAYS = ("cache_seqlens", "cache_leftpad", "block_table", "k_new", "v_new", "cu_seqlens_q", "cu_seqlens_k",
           *_FLOAT_ARRAYS)
_SCALARS = ("window", "softcap", "num_splits", "out_dtype")  # static: attributes of the call
_VARLEN_OPTIONS = ("window", "softcap", "sinks", "alibi_slopes", "q_descale", "k_descale", "v_descale", "out_dtype")


@dataclass(frozen=True)
class _Call:
    """What is static about one call (a jit static argument, so hashable)."""

    causal: bool
    softmax_scale: float | None  # None: the default 1/sqrt(d), resolved by the extension
    cpu_backend: str  # run by the host callback when lowered for the CPU
    cuda_backend: str  # run when lowered for CUDA
    ffi_backend: int | None  # cuda_backend as _C.Backend, for the FFI custom call; None: a host callback
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    num_splits: int | None = None
    layout: str = "BHND"
    arrays: tuple[tuple[str, int], ...] = ()  # array operands after q, k, v: (name, ndim), in order
    max_seqlen: tuple[int, int] | None = None  # varlen calls: (max_seqlen_q, max_seqlen_k)
    lse: bool = True  # False: lse is not computed (an empty result stands in for it)
    out_dtype: str | None = None  # fp8 attention's (None: the default)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.arrays)

    @property
    def appends(self) -> bool:
        return "k_new" in self.names

    @property
    def dense(self) -> bool:
        """Neither a KV-cache nor a varlen call."""
        return self.max_seqlen is None and not {"cache_seqlens", "cache_leftpad", "block_table"} & set(self.names)


def forward(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
            backend: str = "auto", return_lse: bool = False, out: Any = None, layout: str = "BHND",
            **options: Any) -> Any:
    """`cutlassfa.forward` for JAX arrays (or tracers): the same arguments, in `layout` ("BHND" or JAX's
    "BNHD"); `out` is refused (JAX arrays are immutable). With k_new / v_new the updated caches follow
    the result: ``out, k, v`` (or ``out, lse, k, v``). Traceable by jax.jit and jax.vmap; jax.grad raises."""
    if out is not None:
        raise TypeError("out is not supported for JAX arrays (they are immutable)")
    return_lse = _flag(return_lse, "return_lse")
    _check_layout(layout)
    for key in options:
        if key not in _forward_keywords() or key in ("cu_seqlens_q", "cu_seqlens_k"):
            raise TypeError(f"forward() got an unexpected keyword argument {key!r}")
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    one_head = q.ndim == 3  # (B, N, d): one head, in either layout
    if one_head:
        head_axis = 1 if layout == "BHND" else 2
        q, k, v = (jnp.expand_dims(x, head_axis) for x in (q, k, v))
    call, operands = _plan(q, k, v, causal, softmax_scale, backend, layout, options, lse=return_lse)
    result, lse, *caches = _attention(call, q, k, v, *operands)
    if one_head:
        result, lse = jnp.squeeze(result, head_axis), lse[:, 0] if return_lse else lse
    return (result, lse, *caches) if return_lse else (result, *caches) if caches else result


def varlen_forward(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *, max_seqlen_q: int | None = None,
                   max_seqlen_k: int | None = None, causal: bool = False, softmax_scale: float | None = None,
                   backend: str = "auto", return_lse: bool = False, out: Any = None, **options: Any) -> Any:
    """`cutlassfa.varlen_forward` for JAX arrays (or tracers): q (total_q, Hq, d), k, v (total_k, Hkv, d);
    max_seqlen_q / max_seqlen_k must be Python ints (they size the grid) or None (the totals)."""
    if out is not None:
        raise TypeError("out is not supported for JAX arrays (they are immutable)")
    return_lse = _flag(return_lse, "return_lse")
    for key in options:
        if key not in _VARLEN_OPTIONS:
            raise TypeError(f"varlen_forward() got an unexpected keyword argument {key!r}")
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    longest = []
    for name, value, total in (("max_seqlen_q", max_seqlen_q, q.shape[0]), ("max_seqlen_k", max_seqlen_k, k.shape[0])):
        if value is not None and (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))):
            raise TypeError(f"{name} must be a Python int or None for JAX arrays (it sizes the grid), "
                            f"got {type(value).__name__}")
        longest.append(total if value is None else min(int(value), total))
    call, operands = _plan(q, k, v, causal, softmax_scale, backend, "BHND",
                           dict(options, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k),
                           max_seqlen=(longest[0], longest[1]), asked=(max_seqlen_q, max_seqlen_k), lse=return_lse)
    result, lse = _attention(call, q, k, v, *operands)
    return (result, lse) if return_lse else result


# --------------------------------------------------------------------------------------------------
# Trace time: validation and the backend
# --------------------------------------------------------------------------------------------------

def _check_layout(layout: Any) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _bhnd(x: Any, layout: str) -> Any:
    """A (B, N, H, d) array (or stand-in) seen as (B, H, N, d)."""
    return x if layout == "BHND" else x.swapaxes(-2, -3)


def _plan(q: Any, k: Any, v: Any, causal: Any, softmax_scale: Any, backend: Any, layout: str, options: dict,
          max_seqlen: tuple[int, int] | None = None, asked: tuple = (None, None),
          lse: bool = True) -> tuple[_Call, tuple]:
    """Validates the call (the extension's validator, on stand-ins of its arrays) and fixes what is static
    about it; returns the call and its array operands in the order call.arrays names them."""
    scalars, arrays = {}, {}
    for key, value in options.items():
        if value is None:
            continue
        if key in _SCALARS:
            if isinstance(value, (jax.Array, np.ndarray)):
                raise NotImplementedError(f"{key} must be a Python value for JAX arrays (it is static)")
            scalars[key] = _dtype_name(value) if key == "out_dtype" else value
        else:
            arrays[key] = jnp.asarray(value)
    varlen = max_seqlen is not None
    stand_ins = {name: stand_in(a) for name, a in arrays.items()}
    for name in ("k_new", "v_new"):
        if name in stand_ins:
            stand_ins[name] = _bhnd(stand_ins[name], layout)
    if varlen:
        for name, total, longest in (("cu_seqlens_q", q.shape[0], max_seqlen[0]),
                                     ("cu_seqlens_k", k.shape[0], max_seqlen[1])):
            stand_ins[name] = varlen_stand_in(arrays[name], int(total), longest)
        name = cutlassfa.select_backend(stand_in(q), stand_in(k), stand_in(v), causal=causal,
                                       softmax_scale=softmax_scale, backend=backend, max_seqlen_q=asked[0],
                                       max_seqlen_k=asked[1], **stand_ins, **scalars)
    else:
        appends = "k_new" in arrays  # the caches must look writable to the validator
        name = cutlassfa.select_backend(*(_bhnd(stand_in(x, writable=appends), layout) for x in (q, k, v)),
                                       causal=causal, softmax_scale=softmax_scale, backend=backend, **stand_ins,
                                       **scalars)
    scale = _scale(softmax_scale)
    operand_names = tuple(n for n in _ARRAYS if n in arrays)
    operands = tuple(_operand(n, arrays[n]) for n in operand_names)
    statics = dict(window=_window(scalars.get("window")), softcap=float(scalars.get("softcap") or 0.0),
                   num_splits=scalars.get("num_splits"), layout=layout,
                   arrays=tuple((n, arrays[n].ndim) for n in operand_names), max_seqlen=max_seqlen, lse=lse,
                   out_dtype=scalars.get("out_dtype"))
    if name == "cpu":
        return _Call(bool(causal), scale, "cpu", "cpu", None, **statics), operands
    cpu_backend = "cpu" if backend == "auto" else name  # auto on JAX's CPU: compute on the CPU
    cuda_backend = _device_backend(name, backend, scale)
    ffi_backend = None
    if ffi_registered() and q.dtype != jnp.float8_e4m3fn:  # fp8 attention: the handler takes none yet
        from cutlassfa import _C, tuning

        ffi_backend = getattr(_C.Backend, cuda_backend).value
        tuning.ensure_installed()  # the custom call plans in the extension, with the measured table
    return _Call(bool(causal), scale, cpu_backend, cuda_backend, ffi_backend, **statics), operands


def _operand(name: str, array: jax.Array) -> jax.Array:
    """An array argument as the custom call takes it: index arrays int32, per-head floats float32."""
    if name in _INDEX_ARRAYS:
        return array.astype(jnp.int32)
    if name in _FLOAT_ARRAYS:
        return array.astype(jnp.float32)
    return array


def _window(window: Any) -> tuple[int, int]:
    """The window's sides as given (a pair or a masks.Window, validated already; -1 unbounded); causal is
    folded in by the handler."""
    if window is None:
        return (-1, -1)
    left, right = (window.left, window.right) if hasattr(window, "left") else window
    return (int(left), int(right))


def _device_backend(name: str, backend: str, scale: float | None) -> str:
    """The GPU backend for XLA's buffers (compact and at least 16-byte aligned, so only the scale can
    keep the tensor-core kernels out, as in `cutlassfa.forward`; the default scale is > 0)."""
    if name not in _TENSORCORE or scale is None or scale > 0:
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
def _attention(call: _Call, q: jax.Array, k: jax.Array, v: jax.Array, *arrays: jax.Array) -> tuple:
    return _attention_jit(call, q, k, v, *arrays)


@_attention.defjvp
def _no_derivative(call: _Call, primals: tuple, tangents: tuple) -> tuple:
    raise NotImplementedError(NO_BACKWARD)


def _attention_impl(call: _Call, q: jax.Array, k: jax.Array, v: jax.Array, *arrays: jax.Array) -> tuple:
    """(out, lse) of the call (and with k_new the caches k, v after the append)."""
    if call.dense and (0 in q.shape[:-1] or 0 in k.shape[:-1]):  # no row, or rows that see no key
        lse = jnp.full(_lse_shape(call, q), -jnp.inf, jnp.float32)
        sinks = dict(zip(call.names, arrays)).get("sinks")
        if sinks is not None and call.lse:  # a row that sees no key: lse = its head's sink
            lse = jnp.broadcast_to(sinks.astype(jnp.float32)[..., None], lse.shape)
        return jnp.zeros(q.shape, _out_dtype(call, q)), lse
    on_cpu = functools.partial(_on_host, call, call.cpu_backend)
    on_cuda = functools.partial(_on_device, call) if call.ffi_backend is not None else \
        functools.partial(_on_host, call, call.cuda_backend)
    return tuple(jax.lax.platform_dependent(q, k, v, *arrays, cuda=on_cuda, default=on_cpu))


_attention_jit = jax.jit(_attention_impl, static_argnums=0)


def _lse_shape(call: _Call, q: Any) -> tuple[int, ...]:
    if not call.lse:  # not asked for: nothing written (vmap's leading axes kept in front)
        return q.shape[:max(q.ndim - 4, 0)] + (0,)
    if call.max_seqlen is not None:  # varlen: (Hq, total_q)
        return (q.shape[1], q.shape[0])
    if call.layout == "BNHD":
        return q.shape[:-3] + (q.shape[-2], q.shape[-3])
    return q.shape[:-1]


def _out_dtype(call: _Call, q: jax.Array) -> Any:
    """q's dtype, or fp8 attention's out_dtype (bfloat16 by default)."""
    return q.dtype if q.dtype != jnp.float8_e4m3fn else jnp.dtype(call.out_dtype or "bfloat16")


def _result_types(call: _Call, q: jax.Array, k: jax.Array) -> tuple:
    types = (jax.ShapeDtypeStruct(q.shape, _out_dtype(call, q)),
             jax.ShapeDtypeStruct(_lse_shape(call, q), jnp.float32))
    return types + (jax.ShapeDtypeStruct(k.shape, k.dtype),) * 2 if call.appends else types


def _vmap_method(call: _Call) -> str:
    # q, k, v alone fold mapped axes into the batch; other operands (per-entry lengths, page tables,
    # per-head values) do not fold that way: one call per mapped element.
    return "broadcast_all" if not call.arrays else "sequential"


def _on_device(call: _Call, q: jax.Array, k: jax.Array, v: jax.Array, *arrays: jax.Array) -> tuple:
    aliases = {1: 2, 2: 3} if call.appends else {}  # the caches k, v become results 2 and 3
    custom_call = jax.ffi.ffi_call(FFI_TARGET, _result_types(call, q, k), vmap_method=_vmap_method(call),
                                   input_output_aliases=aliases)
    max_q, max_k = call.max_seqlen or (0, 0)
    return custom_call(q, k, v, *arrays, backend=np.int32(call.ffi_backend),
                       softmax_scale=np.float64(np.nan if call.softmax_scale is None else call.softmax_scale),
                       causal=np.bool_(call.causal),
                       window_left=np.int64(call.window[0]), window_right=np.int64(call.window[1]),
                       softcap=np.float64(call.softcap), num_splits=np.int32(call.num_splits or 0),
                       layout=np.int32(LAYOUTS.index(call.layout)), max_seqlen_q=np.int64(max_q),
                       max_seqlen_k=np.int64(max_k), operands=",".join(call.names))


def _on_host(call: _Call, backend: str, q: jax.Array, k: jax.Array, v: jax.Array, *arrays: jax.Array) -> tuple:
    callback = functools.partial(_host_forward, call, backend)
    return jax.pure_callback(callback, _result_types(call, q, k), q, k, v, *arrays, vmap_method=_vmap_method(call))


def _host_forward(call: _Call, backend: str, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  *arrays: np.ndarray) -> tuple:
    """The host callback: numpy in, numpy out. q, k, v alone may carry vmap's leading axes (folded into
    the batch); a call with other operands sees one mapped element at a time."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    keywords = dict(causal=call.causal, softmax_scale=call.softmax_scale, backend=backend, return_lse=True)
    if call.window != (-1, -1):
        keywords["window"] = call.window
    if call.softcap:
        keywords["softcap"] = call.softcap
    if call.num_splits is not None:
        keywords["num_splits"] = call.num_splits
    if call.out_dtype is not None:
        keywords["out_dtype"] = call.out_dtype
    named = dict(zip(call.names, (np.asarray(a) for a in arrays)))
    if call.max_seqlen is not None:
        cu_q, cu_k = named.pop("cu_seqlens_q"), named.pop("cu_seqlens_k")
        keywords.pop("num_splits", None)
        out, lse = cutlassfa.varlen_forward(q, k, v, cu_q, cu_k, max_seqlen_q=call.max_seqlen[0],
                                            max_seqlen_k=call.max_seqlen[1], **keywords, **named)
        return out, lse if call.lse else np.zeros((0,), np.float32)
    caches = ()
    if call.appends:  # appended into copies: the operands are the caller's immutable arrays
        k, v = np.array(k), np.array(v)
        caches = (k, v)
        named["k_new"], named["v_new"] = _bhnd(named["k_new"], call.layout), _bhnd(named["v_new"], call.layout)
    # vmap's leading axes folded into the batch (math.prod, not -1: a dimension may be 0)
    q4, k4, v4 = (_bhnd(x.reshape((math.prod(x.shape[:-3]),) + x.shape[-3:]), call.layout) for x in (q, k, v))
    out, lse = cutlassfa.forward(q4, k4, v4, **keywords, **named)
    out = np.ascontiguousarray(_bhnd(out, call.layout)).reshape(q.shape)
    lse = lse.reshape(_lse_shape(call, q)) if call.lse else np.zeros(_lse_shape(call, q), np.float32)
    return (out, lse) + caches
