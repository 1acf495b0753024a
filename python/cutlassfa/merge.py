"""Merging partial attention results by their log-sum-exp.

Attention of one query row over a key set K that is cut into disjoint parts K_1 ... K_n can be computed
part by part and combined exactly: with o_p the softmax-weighted mean of V over K_p and lse_p the
log-sum-exp of the row's scaled scores over K_p,

    lse = log(sum_p exp(lse_p))
    o   = sum_p exp(lse_p - lse) * o_p

This is the combine step of split-KV decoding (Flash-Decoding) and of ring (context-parallel) attention.
An attention sink (a logit with no value, one per head) is one more part, with lse = sink and o = 0: it
enters a merge once, however many parts there are.
The arithmetic runs in float32 and is shifted by the row's largest lse, so no exp overflows. A part in
which the row sees no key has lse -inf and weight exactly 0; a row that sees no key in any part gives
output 0 and lse -inf, never NaN.

Arrays stay where they are: numpy, CuPy and JAX arrays are merged with their own array module, PyTorch
tensors (CPU or CUDA) with torch, on the current stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ._arrays import framework_of

__all__ = ["merge_attention", "merge_attention_into"]


@dataclass(frozen=True)
class _Ops:
    """The few array operations the merge needs, for one framework."""

    xp: Any  # the array module: numpy, cupy, jax.numpy or torch
    to_float32: Callable[[Any], Any]
    cast: Callable[[Any, Any], Any]  # cast(array, like): array in the dtype of `like`
    add_scaled: Callable[[Any, Any, Any], None]  # add_scaled(acc, x, w): acc += x * w in place, float32


def _ops_for(array: Any) -> _Ops:
    framework = framework_of(array)
    if framework == "torch":
        import torch

        # addcmul_ reads a bfloat16/float16 x directly: one pass over acc instead of three.
        return _Ops(torch, lambda a: a.to(torch.float32), lambda a, like: a.to(like.dtype),
                    lambda acc, x, w: acc.addcmul_(x, w))
    if framework == "numpy":
        xp = np
    elif framework == "cupy":
        import cupy as xp
    elif framework == "jax":
        import jax.numpy as xp
    else:
        raise TypeError(f"expected numpy, PyTorch, CuPy or JAX arrays, got {type(array).__name__}")

    def add_scaled(acc: Any, x: Any, w: Any) -> None:
        acc += x.astype(xp.float32) * w

    return _Ops(xp, lambda a: a.astype(xp.float32), lambda a, like: a.astype(like.dtype), add_scaled)


def _weights(ops: _Ops, lses: Any, sink_lse: Any = None) -> tuple[Any, Any]:
    """The weight exp(lse_p - lse) of each part, stacked (P, ..., N, 1), and the merged lse (..., N),
    float32. lses: the parts' lses stacked (P, ..., N). sink_lse: a part with no output (attention
    sinks), broadcast against one lse, or None.

    Everything is shifted by the row's largest lse (0 where that is -inf), so no exp overflows and a row
    that no part sees gets weights 0 and lse log(0) = -inf rather than exp(-inf + inf) = NaN.
    """
    xp = ops.xp
    lses32 = ops.to_float32(lses)
    row_max = xp.amax(lses32, 0)  # NaN propagates
    sink32 = None if sink_lse is None else xp.zeros_like(row_max) + ops.to_float32(sink_lse)
    if sink32 is not None:
        row_max = xp.maximum(row_max, sink32)
    shift = xp.where(row_max == -math.inf, xp.zeros_like(row_max), row_max)
    exps = xp.exp(lses32 - shift)
    total = xp.sum(exps, 0)
    if sink32 is not None:
        total = total + xp.exp(sink32 - shift)
    # total is 0 exactly where every part has lse -inf; dividing by 1 there keeps the weights 0.
    inverse = 1.0 / xp.where(total == 0, xp.ones_like(total), total)
    with np.errstate(divide="ignore"):  # numpy: log(0) = -inf is the intended lse of an unseen row
        lse = shift + xp.log(total)
    return (exps * inverse)[..., None], lse


def merge_attention(outs: Sequence[Any], lses: Sequence[Any], *, sinks: Any = None,
                    out: Any = None) -> tuple[Any, Any]:
    """Merges attention results of the same query rows over disjoint key sets.

    Args:
        outs: partial outputs, each (..., N, d) (for example (B, H, N, d) from `forward`), all of one
            shape and one float dtype; a row that saw no key in a part may hold any finite value there.
        lses: their log-sum-exps, each (..., N): natural log, as `forward(..., return_lse=True)` gives
            (float32; other float dtypes are read as float32). -inf marks a row that saw no key in that part.
        sinks: optional (H,) attention-sink logits of the same framework, one per head, the lse's
            second-to-last dim being the heads ((B, H, N) or (H, total)): each row's merge gains
            e^sinks[h] in its denominator, once (forward(..., sinks=) of the whole key set). -inf: none.
        out: optional array of the outs' shape and framework to write the merged output into (any float
            dtype; not for JAX, whose arrays are immutable).

    Returns:
        (out, lse): out in the outs' dtype (or `out`), computed in float32 and rounded once; lse float32
        (..., N). A row that sees no key in any part gives 0 and lse -inf.

    numpy, PyTorch (CPU or CUDA: computed on the tensors' device, current stream), CuPy and JAX arrays
    are accepted; all arguments must be of one framework.
    """
    outs, lses = list(outs), list(lses)
    _check(outs, lses, same_dtype=True)
    ops = _ops_for(outs[0])
    merged, lse = merged_float32(outs, lses, None if sinks is None else _sink_column(sinks, lses[0], ops))
    if out is None:
        return ops.cast(merged, outs[0]), lse
    _check_out(out, outs[0])
    if ops.xp is np:
        np.copyto(out, merged, casting="unsafe")
    else:
        out[...] = merged  # torch and cupy cast on assignment
    return out, lse


def merged_float32(outs: Sequence[Any], lses: Sequence[Any], sink_lse: Any = None) -> tuple[Any, Any]:
    """The merge in float32, unchecked: (out, lse). sink_lse: the sinks' part (no output) broadcast
    against the lses, or None (the cpu backend passes it shifted as its lses are)."""
    ops = _ops_for(outs[0])
    weights, lse = _weights(ops, ops.xp.stack([ops.to_float32(x) for x in lses]), sink_lse)
    merged = ops.to_float32(outs[0]) * weights[0]
    for p in range(1, len(outs)):
        merged = merged + ops.to_float32(outs[p]) * weights[p]
    return merged, lse


def merged_stacked_float32(outs: Any, lses: Any, sinks: Any = None) -> tuple[Any, Any]:
    """The merge of parts stacked along a first axis, outs (P, ..., N, d) and lses (P, ..., N), in
    float32, unchecked: (out, lse). One pass of a few array operations whatever P is (the combine of a
    decode step across ranks). sinks: (H,) as in `merge_attention`, or None."""
    ops = _ops_for(outs)
    sink_lse = None if sinks is None else _sink_column(sinks, lses[0], ops)
    if ops.xp.__name__ == "torch":
        # The same merge in fewer kernels (a decode step's combine is launch-bound): logsumexp gives -inf
        # for a row no part sees, and the weights' NaN there (-inf - -inf) become 0.
        import torch

        lses32 = lses.float()
        lse = torch.logsumexp(lses32, 0)
        if sink_lse is not None:
            lse = torch.logaddexp(lse, sink_lse.float())
        weights = torch.exp(lses32 - lse).nan_to_num_(nan=0.0)
        return (outs.float() * weights[..., None]).sum(0), lse
    weights, lse = _weights(ops, lses, sink_lse)
    return ops.xp.sum(ops.to_float32(outs) * weights, 0), lse


def merge_attention_into(acc: Any, acc_lse: Any, part: Any, part_lse: Any) -> None:
    """Folds one partial result into a running one, in place: (acc, acc_lse) becomes the merge of
    itself and (part, part_lse).

    acc is float32 (..., N, d) and acc_lse float32 (..., N), both writable (views are fine: this is how
    a block of rows is updated); part (..., N, d) of any float dtype, part_lse (..., N). Start from
    acc = 0 and acc_lse = -inf (nothing seen yet). numpy, PyTorch and CuPy arrays.
    """
    _check([acc, part], [acc_lse, part_lse], same_dtype=False)
    if framework_of(acc) == "jax":
        raise TypeError("merge_attention_into updates arrays in place; JAX arrays are immutable")
    ops = _ops_for(acc)
    if acc.dtype != ops.xp.float32 or acc_lse.dtype != ops.xp.float32:
        raise TypeError(f"acc and acc_lse must be float32, got {acc.dtype} and {acc_lse.dtype}")
    weights, lse = _weights(ops, ops.xp.stack([acc_lse, ops.to_float32(part_lse)]))
    acc *= weights[0]
    ops.add_scaled(acc, part, weights[1])
    acc_lse[...] = lse


def _sink_column(sinks: Any, lse: Any, ops: _Ops) -> Any:
    """sinks (H,) as an (H, 1) float32 column against an lse (..., H, N) (a 1-D lse: (H,) itself)."""
    if framework_of(sinks) != framework_of(lse):
        raise TypeError(f"sinks must be a {framework_of(lse)} array like the lses, got {type(sinks).__name__}")
    heads = lse.shape[-2] if len(lse.shape) >= 2 else 1
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks must have shape ({heads},), one per head of the lses {tuple(lse.shape)}, "
                         f"got {tuple(sinks.shape)}")
    if framework_of(sinks) == "torch" and sinks.device != lse.device:
        raise ValueError(f"sinks must be on {lse.device} like the lses, got {sinks.device}")
    column = ops.to_float32(sinks)
    return column.reshape(heads, 1) if len(lse.shape) >= 2 else column


def _check(outs: Sequence[Any], lses: Sequence[Any], *, same_dtype: bool) -> None:
    if len(outs) == 0 or len(outs) != len(lses):
        raise ValueError(f"outs and lses must be non-empty and of the same length, got {len(outs)} and {len(lses)}")
    frameworks = {framework_of(a) for a in (*outs, *lses)}
    if len(frameworks) != 1 or None in frameworks:
        names = sorted({type(a).__name__ for a in (*outs, *lses)})
        raise TypeError(f"outs and lses must be arrays of one framework (numpy, torch, cupy, jax), got {names}")
    shape = tuple(outs[0].shape)
    if len(shape) < 2:
        raise ValueError(f"outs must have shape (..., N, d), got {shape}")
    for i, (o, lse) in enumerate(zip(outs, lses)):
        if tuple(o.shape) != shape:
            raise ValueError(f"outs[{i}] has shape {tuple(o.shape)}, outs[0] has {shape}")
        if tuple(lse.shape) != shape[:-1]:
            raise ValueError(f"lses[{i}] must have shape {shape[:-1]} (outs without the last dim), "
                             f"got {tuple(lse.shape)}")
        if same_dtype and o.dtype != outs[0].dtype:
            raise TypeError(f"outs must share one dtype, got {outs[0].dtype} and {o.dtype} (outs[{i}])")
    if frameworks == {"torch"}:
        devices = {a.device for a in (*outs, *lses)}
        if len(devices) != 1:
            raise ValueError(f"outs and lses must be on one device, got {sorted(map(str, devices))}")


def _check_out(out: Any, like: Any) -> None:
    if framework_of(out) != framework_of(like):
        raise TypeError(f"out must be a {framework_of(like)} array like the outs, got {type(out).__name__}")
    if framework_of(out) == "jax":
        raise TypeError("out is not supported for JAX arrays (they are immutable)")
    if tuple(out.shape) != tuple(like.shape):
        raise ValueError(f"out must have shape {tuple(like.shape)}, got {tuple(out.shape)}")
    if framework_of(out) == "torch" and out.device != like.device:
        raise ValueError(f"out must be on {like.device} like the outs, got {out.device}")
    if framework_of(out) == "numpy" and not out.flags.writeable:
        raise ValueError("out is read-only")
