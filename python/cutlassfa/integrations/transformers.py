"""cutlassfa as a Hugging Face transformers attention implementation.

    import cutlassfa.integrations.transformers as cutlassfa_hf
    cutlassfa_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="cutlassfa")

Handles causal and non-causal layers, grouped-query attention, the layer's `scaling`, sliding-window
layers (a window of W tokens is ``window=(W - 1, 0)``), logit softcapping, attention sinks (gpt-oss's
``s_aux``), padding masks, and sequences packed in a row (``position_ids`` that restart; chunked
attention). The mask transformers builds is planned once per forward pass: none at all where
transformers would let SDPA skip it and it is the layers' own causal pattern; a causal mask over padded
entries in a few operations and one read (a decode step's from the padding alone, without building the
mask, `_mask_plan.causal_step_plan`; short prefills' `_mask_plan.padded_causal_plan`),
any other reduced to the key range each query row sees (`_mask_plan.MaskRows`), from which each layer
picks the cutlassfa call that computes exactly that mask (`_mask_plan.plan`); what cutlassfa cannot
express raises NotImplementedError, never a different answer. Under torch.compile, and in a static
cache's decode step (which `generate` compiles, building its mask before the step), nothing may be read:
the mask is planned once, on the device, as causal over left-padded entries, its plan handed to the layers
as a tensor, and a mask that is not that one stops the step with a device-side assertion; the whole step
compiles (fullgraph).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

import cutlassfa

from ._mask_plan import (MaskRows, PaddedCausal, Plan, causal_step_plan, concat_rows, pack_cache_plan, packed_forward,
                         packed_sequences_forward, padded_causal_plan, plan, rows_of_visible, unpack_cache_plan)

__all__ = ["NAME", "register", "attention_forward", "attention_mask"]

NAME = "cutlassfa"
_UNSET: Any = object()
# Mask rows evaluated per step when the mask is built (booleans: B x rows x Nk).
_MASK_CHUNK = 1 << 24
# Keyword arguments some models pass that change the attention in ways cutlassfa does not compute.
_UNSUPPORTED = {"position_bias": "a position bias (T5-style)"}


def register(name: str = NAME, *, backend: str = "auto") -> None:
    """Adds cutlassfa to transformers' attention implementations (and its mask builder), so that
    ``attn_implementation=name`` selects it. `backend`: the cutlassfa backend its calls ask for (under
    another `name` several can coexist, e.g. a CUDA-core one for float32 models)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    implementation = attention_forward if backend == "auto" else functools.partial(attention_forward, backend=backend)
    AttentionInterface.register(name, implementation)
    AttentionMaskInterface.register(name, attention_mask)


# --------------------------------------------------------------------------------------------------
# The mask: built once per forward pass, read by every layer
# --------------------------------------------------------------------------------------------------

def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                   mask_function: Any = None, attention_mask: torch.Tensor | None = None,
                   device: torch.device | str = "cpu", use_vmap: bool = False, **kwargs: Any) -> torch.Tensor:
    """transformers' mask interface: the mask `sdpa_mask` would build (evaluated a block of query rows
    at a time), reduced to `MaskRows` and packed as a 4-D int64 tensor, which transformers hands to
    every layer as it is. Query rows whose token is padding in the 2-D `attention_mask` do not matter
    (in cross-attention, where that mask is the keys', every row of a plan sees the same keys)."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

    mask_function = mask_function or causal_mask_function
    rows_per_step = max(1, _MASK_CHUNK // max(1, batch_size * kv_length))
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    traced = torch.compiler.is_compiling()
    if not traced and kwargs.get("allow_is_causal_skip") and _plain_causal(
            padding, q_length, kv_length, q_offset, kv_offset, kwargs.get("local_size")):
        return None  # the layers' own causal pattern (`plan` of no mask: no read)
    if traced or q_length <= rows_per_step:  # decode steps, short prefills
        keys, q_end = _layer_keys(padding, kv_length, kv_offset), q_offset + q_length - kv_offset
        # Nothing may be read while tracing, nor in a static cache's decode step (its offset is a tensor;
        # generate builds the mask ahead of the compiled step): the plan is made on the device, checked by
        # an assertion, and handed to the layers as a tensor. The causal mask itself need not be built for
        # one query: its keys are the entry's real ones before q_end (an eager step reads once whether
        # they are one run, and builds the mask only if not).
        no_read = traced or (isinstance(q_offset, torch.Tensor) and q_length == 1)
        if q_length == 1 and mask_function is causal_mask_function:
            step = causal_step_plan(keys, batch_size, kv_length, q_end, device, no_read)
            if no_read:
                return pack_cache_plan(step)
            if step is not None:  # the layers of this pattern take it as it is (`_plan_for`)
                marker = torch.empty(batch_size, 1, 1, 0, dtype=torch.bool, device=device)
                marker.cutlassfa_padded_causal = PaddedCausal(1, kv_length, None, step)
                return marker
        visible = sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                            kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                            allow_is_causal_skip=False, use_vmap=use_vmap, device=device)
        real_queries = _real_queries(padding, batch_size, q_length, q_offset, device)
        if no_read:
            traced_plan = padded_causal_plan(visible[:, 0], real_queries, keys, q_end, kwargs.get("local_size"), True)
            return pack_cache_plan(traced_plan.plan)
        if isinstance(q_offset, torch.Tensor):  # a static cache's prefill: the layers plan it (one read)
            return visible
        fast = padded_causal_plan(visible[:, 0], real_queries, keys, q_end, kwargs.get("local_size"))
        if fast is not None:  # the layers of this pattern take its plan as it is (`_plan_for`)
            visible.cutlassfa_padded_causal = fast
            return visible
        return rows_of_visible(visible[:, 0], real_queries).pack()
    parts = []
    for start in range(0, q_length, rows_per_step):
        rows = min(rows_per_step, q_length - start)
        visible = sdpa_mask(batch_size=batch_size, q_length=rows, kv_length=kv_length, q_offset=q_offset + start,
                            kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                            allow_is_causal_skip=False, use_vmap=use_vmap, device=device)
        parts.append(rows_of_visible(visible[:, 0], _real_queries(padding, batch_size, rows, q_offset + start, device)))
    if not parts:  # no query rows
        empty = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        return MaskRows(empty, empty, empty.bool(), empty.bool(), kv_length).pack()
    return concat_rows(parts).pack()


def _plain_causal(padding: torch.Tensor | None, q_length: int, kv_length: int, q_offset: Any, kv_offset: int,
                  local_size: int | None) -> bool:
    """Where transformers lets SDPA skip the causal mask (`allow_is_causal_skip`), the cases in which its mask
    is the plain causal one, bottom-right aligned as forward's: one query or as many queries as keys, a
    window (or chunk) of `local_size` that hides no key, no padding among the layer's keys (one read, as
    transformers' own check makes). Its static-cache case (queries from 0 against empty slots: top-left) is
    not among them: it goes through the planners."""
    if not isinstance(q_offset, int) or (q_length != 1 and q_length != kv_length):
        return False
    if local_size is not None and kv_length >= local_size:
        return False
    keys = _layer_keys(padding, kv_length, kv_offset)
    return keys is None or bool(keys.all())


def _layer_keys(padding: torch.Tensor | None, kv_length: int, kv_offset: int) -> torch.Tensor | None:
    """(B, kv_length): which of the layer's keys are real tokens. transformers' 2-D mask is indexed by absolute
    position (key j of the layer is position j + kv_offset); one that already starts at kv_offset (an older
    transformers) is taken as it is."""
    if padding is None:
        return None
    start = kv_offset if padding.shape[-1] >= kv_offset + kv_length else 0
    return padding[:, start:start + kv_length]


def _real_queries(padding: torch.Tensor | None, batch: int, rows: int, offset: Any,
                  device: torch.device | str) -> torch.Tensor:
    """(batch, rows) bool: whether the query at each absolute position is a real token (the 2-D mask
    is indexed by position; positions past its end count as real)."""
    if padding is None:
        return torch.ones(batch, rows, dtype=torch.bool, device=device)
    position = torch.arange(rows, device=padding.device) + offset
    inside = position < padding.shape[-1]
    return (padding[:, position.clamp(max=padding.shape[-1] - 1)].bool() | ~inside).to(device)


def _rows_of(mask: Any, batch: int, kv_length: int) -> MaskRows | None:
    """MaskRows of what a layer receives: ours, none, or a 4-D mask a caller built (boolean, True
    where allowed, or additive float, 0 where allowed)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        raise NotImplementedError(f"cutlassfa cannot read an attention mask of type {type(mask).__name__}")
    if MaskRows.is_packed(mask):
        return MaskRows.unpack(mask, kv_length)
    if mask.dtype != torch.bool:
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        if not bool(((mask == 0) | blocked).all()):
            raise NotImplementedError("the attention mask adds a bias to the scores; cutlassfa only masks")
        mask = ~blocked
    if mask.shape[1] != 1 and not bool((mask == mask[:, :1]).all()):
        raise NotImplementedError("the attention mask differs between heads")
    return rows_of_visible(mask[:, 0].expand(batch, -1, -1))


# Plans of the masks of the current forward pass: every layer of a kind gets the same mask object, and
# planning reads values (a device synchronisation on a GPU), so it is done once per mask and pattern.
_plans: dict[tuple, tuple[weakref.ref, Plan]] = {}


def _plan_for(mask: Any, batch: int, nq: int, nk: int, causal: bool, left: int | None, right: int | None) -> Plan:
    fast = getattr(mask, "cutlassfa_padded_causal", None)
    if fast is not None and fast.fits(nq, nk, causal, left):
        return fast.plan
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[-1] == 0 and nk > 0:
        # A decode step's plan alone (no mask to plan again from), for another layer or sliced by the model.
        planned = f"for causal layers without a window over {fast.kv_length} keys" if fast is not None else ""
        raise NotImplementedError(f"cutlassfa planned this decode step's mask {planned}; this layer has {nk} keys, "
                                  f"causal={causal}, window={left} (or the model sliced the mask)")
    made = unpack_cache_plan(mask, batch, causal, left)
    if made is not None:
        return made
    if not isinstance(mask, torch.Tensor):
        return plan(_rows_of(mask, batch, nk), nq, nk, causal, left, right)
    # An inference tensor (torch.inference_mode) has no version counter; it is not modified in place
    # between the layers of one forward pass either.
    version = -1 if mask.is_inference() else mask._version
    key = (id(mask), version, batch, nq, nk, causal, left, right)
    cached = _plans.get(key)
    if cached is not None and cached[0]() is mask:
        return cached[1]
    layout = plan(_rows_of(mask, batch, nk), nq, nk, causal, left, right)
    if len(_plans) >= 16:
        _plans.clear()
    _plans[key] = (weakref.ref(mask), layout)
    return layout


# --------------------------------------------------------------------------------------------------
# The attention
# --------------------------------------------------------------------------------------------------

def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, sliding_window: Any = _UNSET, softcap: Any = _UNSET,
                      backend: str = "auto", **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface. query (B, Hq, Nq, d), key and value (B, Hkv, Nk, d);
    returns the output as (B, Nq, Hq, d) and no attention weights."""
    if dropout and module.training:
        raise NotImplementedError("cutlassfa has no attention dropout (and no backward pass)")
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"cutlassfa does not compute {what} ({name}=)")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = getattr(module, "sliding_window", None) if sliding_window is _UNSET else sliding_window
    if softcap is _UNSET:
        softcap = getattr(getattr(module, "config", None), "attn_logit_softcapping", None)
    # transformers' sliding window W: a causal query sees its W - 1 predecessors; a bidirectional one
    # every key within distance W.
    left, right = (None, None) if window is None else ((window - 1, 0) if causal else (window, window))

    batch, nq, nk = query.shape[0], query.shape[2], key.shape[2]
    layout = _plan_for(attention_mask, batch, nq, nk, causal, left, right)
    options = {"causal": layout.causal, "softmax_scale": scaling, "backend": backend}
    if layout.window is not None:
        options["window"] = layout.window
    if softcap:
        options["softcap"] = float(softcap)
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))  # gpt-oss passes its learned sinks as s_aux
    if sinks is not None:
        options["sinks"] = sinks.detach()
    if layout.kind == "varlen":
        return _varlen(query, key, value, layout, options), None
    if layout.kind == "packed":
        return packed_sequences_forward(query, key, value, layout, options), None
    if layout.kind == "cache":  # lengths made once per plan, leftpad decided then: no device read here
        options.update(layout.cache_arguments)
    # Written straight into transformers' (B, Nq, Hq, d) layout: forward takes any strides of `out`, and torch
    # tensors as they are (through the operator where PyTorch must see the call).
    result = query.new_empty(batch, nq, query.shape[1], query.shape[3])
    cutlassfa.forward(query, key, value, out=result.transpose(1, 2), **options)
    return result, None


def _varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: Plan,
            options: dict[str, Any]) -> torch.Tensor:
    """Packs the query rows and keys of each entry, runs varlen_forward, unpacks (other rows: 0)."""
    return packed_forward(query, key, value, layout, options)
