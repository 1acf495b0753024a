"""cutlassfa as PyTorch operators: ``torch.ops.cutlassfa.forward`` (``forward_append`` for a call that appends
k_new / v_new to its caches) and ``torch.ops.cutlassfa.varlen_forward``, registered through ``torch.library``
when this module is imported, so that torch.compile, torch.export and FakeTensor shape propagation see the
call, and autograd raises a clear error (there is no backward pass) instead of dropping the gradient.

Eager calls do not go through the operator. Dispatching a Python-implemented operator costs time on
every call (an empty kernel on CPU tensors, a shared 2-core machine, ``bench/torch_op_overhead.py``,
several runs): 3.4–4.4 µs for a ``torch.library.Library`` define/impl operator, 8–13 µs once an
autograd kernel is registered, 11–18 µs for ``torch.library.custom_op``, against a per-call budget of
10 µs. So `cutlassfa.forward` and `varlen_forward` call the kernels directly and ask `must_use_op` first
(~0.5 µs), which sends the call through its operator only when something has to see it: while
torch.compile / torch.export trace, for fake or wrapped tensors (tensor subclasses, dispatch modes,
functorch transforms, jit tracing), and when autograd would record the call.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import torch

import cutlassfa
from cutlassfa._arrays import host_numpy, stand_in, torch_from_numpy, varlen_stand_in

__all__ = ["forward", "maybe_route", "must_use_op", "op_forward", "op_varlen_forward", "eager_forward", "eager_call",
           "NO_BACKWARD"]

NO_BACKWARD = ("cutlassfa.forward has no backward pass: gradients through cutlassfa attention are not "
               "implemented. Call it under torch.no_grad() / torch.inference_mode(), or on inputs that "
               "do not require grad, or use torch.nn.functional.scaled_dot_product_attention for training")

# Keyword arguments of cutlassfa.forward that the operator carries beside q, k, v, with their defaults
# (a default is not passed on, so that forward need not know a mode it is not asked for). A call that
# appends k_new / v_new to its caches runs as forward_append, whose schema declares the caches written.
_MODE_DEFAULTS: dict[str, Any] = {"window": None, "softcap": 0.0, "cache_seqlens": None, "cache_leftpad": None,
                                   "block_table": None, "num_splits": None, "sinks": None, "alibi_slopes": None,
                                   "k_descale": None, "v_descale": None, "q_descale": None, "out_dtype": None}
# Their types in the schemas.
_MODE_TYPES = {"window": "int[]?", "softcap": "float", "cache_seqlens": "Tensor?", "cache_leftpad": "Tensor?",
               "block_table": "Tensor?", "num_splits": "int?", "sinks": "Tensor?", "alibi_slopes": "Tensor?",
               "k_descale": "Tensor?", "v_descale": "Tensor?", "q_descale": "Tensor?", "out_dtype": "ScalarType?"}
# varlen_forward's: the same modes but those of a KV cache, beside the packed sequences' bounds.
_VARLEN_MODE_DEFAULTS: dict[str, Any] = {name: value for name, value in _MODE_DEFAULTS.items()
                                         if name not in ("cache_seqlens", "cache_leftpad", "block_table", "num_splits")}


def _schema(head: str, modes: dict[str, Any]) -> str:
    """An operator's schema: `head` (its name and leading arguments), the call's flags, `modes` with their
    defaults, and the results."""
    listed = ", ".join(f"{_MODE_TYPES[name]} {name}={default}" for name, default in modes.items())
    return f"{head}, bool causal=False, float? softmax_scale=None, str backend='auto', {listed}) " \
           "-> (Tensor out, Tensor lse)"


_FORWARD_SCHEMA = _schema("forward(Tensor q, Tensor k, Tensor v", _MODE_DEFAULTS)
_APPEND_SCHEMA = _schema("forward_append(Tensor q, Tensor(a!) k, Tensor(b!) v, Tensor k_new, Tensor v_new",
                         _MODE_DEFAULTS)
_VARLEN_SCHEMA = _schema("varlen_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
                         "int? max_seqlen_q=None, int? max_seqlen_k=None", _VARLEN_MODE_DEFAULTS)
# The backward of both: an operator that raises when it runs, so that tracing a training graph
# (torch.compile traces the backward ahead of time) still works and only running the backward fails.
# It reads grad_out so that no partitioner can move it into the forward graph.
_NO_BACKWARD_SCHEMA = "forward_backward(Tensor grad_out, SymInt[] kv_shape) -> (Tensor, Tensor, Tensor)"


class _State(threading.local):
    inside_op = False  # set while the operator itself calls cutlassfa.forward (a class default reads fast)


_state = _State()


# --------------------------------------------------------------------------------------------------
# Routing
# --------------------------------------------------------------------------------------------------

# Bound once: each is asked on every eager call (attribute lookups through torch._C cost ~30 ns each).
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_functorch_transforms_active = torch._C._are_functorch_transforms_active
_is_tracing = torch._C._is_tracing


def must_use_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a call on q, k, v must go through the operator for PyTorch to see it (see the module
    docstring); `cutlassfa.forward` asks this on every call with torch tensors (~0.5 µs)."""
    if _is_compiling():  # first: dynamo folds it to True and traces nothing below
        return True
    if _state.inside_op:
        return False
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        # FakeTensor, FunctionalTensor, nn.Parameter and other subclasses; not a tensor at all: the
        # caller's validation says what is wrong.
        return all(isinstance(t, torch.Tensor) for t in (q, k, v))
    if _is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return True  # autograd must record the call, to raise on backward rather than drop the gradient
    return _dispatch_stack_len() > 0 or _functorch_transforms_active() or _is_tracing()


def maybe_route(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> Any | None:
    """The result of ``cutlassfa.forward(q, k, v, **kwargs)`` computed through the operator when the call
    must be visible to PyTorch (see the module docstring); None when the caller should run the direct
    path. Costs about a microsecond when it returns None."""
    if not must_use_op(q, k, v):
        return None
    return op_forward(q, k, v, **kwargs)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> Any:
    """`cutlassfa.forward` for torch tensors (CPU or CUDA), through the operator when the call must be
    visible to PyTorch, else directly. Same arguments and results as `cutlassfa.forward`."""
    routed = maybe_route(q, k, v, **kwargs)
    return routed if routed is not None else eager_forward(q, k, v, **kwargs)


def op_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
               softmax_scale: float | None = None, backend: str = "auto", return_lse: bool = False,
               out: torch.Tensor | None = None, **modes: Any) -> Any:
    """``cutlassfa.forward`` through ``torch.ops.cutlassfa.forward`` (always the operator), or
    ``torch.ops.cutlassfa.forward_append`` for a call that appends k_new / v_new to its caches."""
    appended = [modes.pop(name) for name in ("k_new", "v_new") if modes.get(name) is not None]
    modes = _schema_modes("forward", _MODE_DEFAULTS, q, modes)
    if appended:
        if len(appended) != 2:
            raise ValueError("k_new and v_new must be given together")
        if _is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *appended)):
            raise NotImplementedError(NO_BACKWARD)  # an operator that writes its inputs has no autograd formula
        result, lse = torch.ops.cutlassfa.forward_append.default(q, k, v, *appended, causal, softmax_scale, backend,
                                                                 **modes)
    else:
        result, lse = torch.ops.cutlassfa.forward.default(q, k, v, causal, softmax_scale, backend, **modes)
    if out is not None:
        result = _copy_into(out, result)
    return (result, lse) if return_lse else result


def op_varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Any, cu_seqlens_k: Any, *,
                      max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, causal: bool = False,
                      softmax_scale: float | None = None, backend: str = "auto", return_lse: bool = False,
                      out: torch.Tensor | None = None, **modes: Any) -> Any:
    """``cutlassfa.varlen_forward`` through ``torch.ops.cutlassfa.varlen_forward`` (always the operator); host
    cu_seqlens (ints) become int32 tensors on q's device."""
    modes = _schema_modes("varlen_forward", _VARLEN_MODE_DEFAULTS, q, modes)
    bounds = [b if isinstance(b, torch.Tensor) else torch.tensor(np.asarray(b), dtype=torch.int32, device=q.device)
              for b in (cu_seqlens_q, cu_seqlens_k)]
    result, lse = torch.ops.cutlassfa.varlen_forward.default(q, k, v, *bounds, max_seqlen_q, max_seqlen_k, causal,
                                                             softmax_scale, backend, **modes)
    if out is not None:
        result = _copy_into(out, result)
    return (result, lse) if return_lse else result


def _schema_modes(name: str, defaults: dict[str, Any], q: torch.Tensor, modes: dict[str, Any]) -> dict[str, Any]:
    """The operator `name`'s mode arguments, every one (defaults filled in) in the schema's form."""
    unknown = sorted(modes.keys() - defaults.keys())
    if unknown:
        raise NotImplementedError(f"cutlassfa.{name}: {unknown[0]!r} is not supported through "
                                  f"torch.ops.cutlassfa.{name} (torch.compile, autograd) yet")
    for key in ("k_descale", "v_descale", "q_descale"):  # one float per tensor: a 0-d tensor in the schema
        if isinstance(modes.get(key), (int, float)):
            modes[key] = torch.tensor(float(modes[key]), dtype=torch.float32, device=q.device)
    if isinstance(modes.get("out_dtype"), str):  # the schema's ScalarType
        modes["out_dtype"] = getattr(torch, modes["out_dtype"])
    return {**defaults, **modes}


def _copy_into(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    # copy_ would broadcast or cast silently: demand what forward demands of `out`.
    if out.shape != result.shape:
        raise ValueError(f"out must have shape {tuple(result.shape)}, got {tuple(out.shape)}")
    if out.dtype != result.dtype:
        raise TypeError(f"out must have dtype {result.dtype} (the result's), got {out.dtype}")
    if out.device != result.device:
        raise ValueError("out must be on the same device as q")
    return out.copy_(result)


# --------------------------------------------------------------------------------------------------
# The direct path
# --------------------------------------------------------------------------------------------------

def eager_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> Any:
    """`cutlassfa.forward` on real torch tensors, never through the operator."""
    return eager_call(cutlassfa.forward, q, k, v, **kwargs)


def eager_call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`function` (`cutlassfa.forward` or a sibling taking arrays) on real torch tensors. CPU tensors
    go through zero-copy numpy views (host in, host out, as numpy arrays do)."""
    if args[0].device.type != "cpu":
        return function(*args, **kwargs)
    as_numpy = [_to_numpy(a) if isinstance(a, torch.Tensor) else a for a in args]
    options = {name: _to_numpy(value) if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}
    result = function(*as_numpy, **options)
    out = kwargs.get("out")

    def back(array: np.ndarray) -> torch.Tensor:  # the numpy view of `out` is handed back as `out`
        return out if out is not None and array is options["out"] else torch_from_numpy(array)

    return tuple(back(r) for r in result) if isinstance(result, tuple) else back(result)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.device.type != "cpu":
        raise ValueError(f"every tensor argument must be on the device of q (cpu), got one on {tensor.device}")
    return host_numpy(tensor)


# --------------------------------------------------------------------------------------------------
# The operator
# --------------------------------------------------------------------------------------------------

# The operators' kernels take the schema's arguments positionally, the modes in _MODE_DEFAULTS' order (or
# _VARLEN_MODE_DEFAULTS', the schemas'): one list of names for the real call and the fake one.
def _given_modes(modes: tuple[Any, ...], defaults: dict[str, Any] = _MODE_DEFAULTS) -> dict[str, Any]:
    """The modes the call asks for (defaults dropped), by name."""
    given = dict(zip(defaults, modes))
    return {name: value for name, value in given.items() if not _is_default(name, value)}


def _is_default(name: str, value: Any) -> bool:
    default = _MODE_DEFAULTS[name]
    return value is None if default is None else value == default


def _inside_op(function: Callable[..., Any], *args: Any, modes: tuple[Any, ...],
               defaults: dict[str, Any] = _MODE_DEFAULTS, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """An operator's real kernel: `function` (a cutlassfa entry point) on real tensors with the modes the call
    asks for, (out, lse), with the routing told that it runs inside the operator."""
    given = _given_modes(modes, defaults)
    if "window" in given:
        given["window"] = tuple(given["window"])
    _state.inside_op = True
    try:
        return eager_call(function, *args, return_lse=True, **kwargs, **given)
    finally:
        _state.inside_op = False


def _forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  softmax_scale: float | None = None, backend: str = "auto",
                  *modes: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return _inside_op(cutlassfa.forward, q.detach(), k.detach(), v.detach(), modes=modes, causal=causal,
                      softmax_scale=softmax_scale, backend=backend)


def _forward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  softmax_scale: float | None = None, backend: str = "auto",
                  *modes: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes and dtypes of the results (out like q, compact, of the output's dtype; lse float32
    q.shape[:-1]). The extension's validator judges the call on stand-ins of the fake tensors' shapes and
    dtypes (index values read as zeros), so that a traced call fails where it is written, with the eager
    call's messages."""
    dtype = _judged(stand_in(k), stand_in(v), q, causal, softmax_scale, backend, modes, _MODE_DEFAULTS)
    return q.new_empty(q.shape, dtype=dtype), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _judged(k: Any, v: Any, q: torch.Tensor, causal: bool, softmax_scale: float | None, backend: str,
            modes: tuple[Any, ...], defaults: dict[str, Any], **arrays: Any) -> torch.dtype:
    """The extension's validator on q's stand-in, k and v (stand-ins already), `arrays` (stand-ins) and the
    modes the call asks for; returns the output's dtype: q's, or fp8 attention's out_dtype (bfloat16 by
    default)."""
    given = _given_modes(modes, defaults)
    out_dtype = given.pop("out_dtype", None)
    options = {name: stand_in(value) for name, value in given.items()}
    cutlassfa.select_backend(stand_in(q), k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                             out_dtype=out_dtype, **arrays, **options)
    return q.dtype if q.dtype != torch.float8_e4m3fn else (out_dtype or torch.bfloat16)


def _append_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                 causal: bool = False, softmax_scale: float | None = None, backend: str = "auto",
                 *modes: Any) -> tuple[torch.Tensor, torch.Tensor]:
    # k and v themselves (not detached copies' storage): the call writes the new keys into them
    return _inside_op(cutlassfa.forward, q, k, v, modes=modes, causal=causal, softmax_scale=softmax_scale,
                      backend=backend, k_new=k_new, v_new=v_new)


def _append_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                 causal: bool = False, softmax_scale: float | None = None, backend: str = "auto",
                 *modes: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """As _forward_fake, the caches judged writable and k_new / v_new beside them."""
    dtype = _judged(stand_in(k, writable=True), stand_in(v, writable=True), q, causal, softmax_scale, backend, modes,
                    _MODE_DEFAULTS, k_new=stand_in(k_new), v_new=stand_in(v_new))
    return q.new_empty(q.shape, dtype=dtype), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _varlen_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                 causal: bool = False, softmax_scale: float | None = None, backend: str = "auto",
                 *modes: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return _inside_op(cutlassfa.varlen_forward, q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k,
                      modes=modes, defaults=_VARLEN_MODE_DEFAULTS, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, causal=causal, softmax_scale=softmax_scale, backend=backend)


def _varlen_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                 causal: bool = False, softmax_scale: float | None = None, backend: str = "auto",
                 *modes: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """out (total_q, Hq, d) compact of the output's dtype, lse float32 (Hq, total_q); the call judged by the
    extension's validator on stand-ins (cu_seqlens: prefix sums of their length that it accepts)."""
    bounds = {name: varlen_stand_in(cu, int(total), int(total if longest is None else min(longest, total)))
              for name, cu, total, longest in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
                                               ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k))}
    dtype = _judged(stand_in(k), stand_in(v), q, causal, softmax_scale, backend, modes, _VARLEN_MODE_DEFAULTS,
                    max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **bounds)
    return q.new_empty(q.shape, dtype=dtype), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _no_backward_impl(grad_out: torch.Tensor, kv_shape: list[int]) -> tuple[torch.Tensor, ...]:
    raise NotImplementedError(NO_BACKWARD)


def _no_backward_fake(grad_out: torch.Tensor, kv_shape: list[int]) -> tuple[torch.Tensor, ...]:
    return grad_out.new_empty(grad_out.shape), grad_out.new_empty(kv_shape), grad_out.new_empty(kv_shape)


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    ctx.kv_shape = inputs[1].shape  # no tensor is kept: the backward only has to fail
    ctx.inputs = len(inputs)


def _backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor) -> tuple:
    """forward's and varlen_forward's: gradients for q, k, v (the operator that raises), none for the rest."""
    grads = torch.ops.cutlassfa.forward_backward.default(grad_out, list(ctx.kv_shape))
    return tuple(grads) + (None,) * (ctx.inputs - 3)


def _register() -> torch.library.Library:
    library = torch.library.Library("cutlassfa", "DEF")
    library.define(_FORWARD_SCHEMA)
    library.define(_APPEND_SCHEMA)
    library.define(_VARLEN_SCHEMA)
    library.define(_NO_BACKWARD_SCHEMA)
    for device in ("CPU", "CUDA"):
        library.impl("forward", _forward_impl, device)
        library.impl("forward_append", _append_impl, device)
        library.impl("varlen_forward", _varlen_impl, device)
        library.impl("forward_backward", _no_backward_impl, device)
    torch.library.register_fake("cutlassfa::forward", _forward_fake, lib=library)
    torch.library.register_fake("cutlassfa::forward_append", _append_fake, lib=library)
    torch.library.register_fake("cutlassfa::varlen_forward", _varlen_fake, lib=library)
    torch.library.register_fake("cutlassfa::forward_backward", _no_backward_fake, lib=library)
    torch.library.register_autograd("cutlassfa::forward", _backward, setup_context=_setup_context, lib=library)
    torch.library.register_autograd("cutlassfa::varlen_forward", _backward, setup_context=_setup_context,
                                    lib=library)
    return library


_LIBRARY = _register()  # kept alive: the registrations last as long as this object
