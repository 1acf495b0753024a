"""A drop-in for `torch.nn.functional.scaled_dot_product_attention`:

    from cutlassfa.torch import scaled_dot_product_attention
    out = scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                       scale=None, enable_gqa=False)

SDPA's signature and semantics, computed by `cutlassfa.forward` (CUDA tensors in place, CPU tensors on the
GPU when one is usable, else on the `cpu` backend; under torch.compile through the torch operator):

- query (..., L, E), key (..., S, E), value (..., S, E): 3 or more dims, the leading ones (batch, heads)
  alike; value's last dim must equal E (cutlassfa computes Ev = E only). enable_gqa: key and value may
  have fewer heads (dim -3), a divisor of the query's.
- is_causal: SDPA's top-left alignment (query i sees keys j <= i, also when L != S).
- attn_mask: None; a `torch.nn.attention.bias.CausalBias` (`causal_upper_left` = is_causal,
  `causal_lower_right` = cutlassfa's own bottom-right causal); or a boolean mask (True: take part)
  broadcastable to (..., L, S), the same for every head, that gives each query one contiguous range of
  keys: read once, eagerly (one device synchronization; refused under torch.compile), and computed
  exactly as a causal or full pattern, a per-sequence key range (padding) or packed sequences.
  A row that sees no key gives 0, as SDPA does.
- scale: SDPA's (default 1/sqrt(E)).

What it cannot compute exactly raises NotImplementedError (float masks, dropout_p > 0, Ev != E, masks
that differ between heads or leave holes); wrong shapes raise as SDPA does (ValueError / RuntimeError).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

import cutlassfa

from .integrations._mask_plan import MaskRows, Plan, packed_forward, packed_sequences_forward, plan, rows_of_visible

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """`torch.nn.functional.scaled_dot_product_attention`, computed by cutlassfa (see the module)."""
    if dropout_p:
        raise NotImplementedError("cutlassfa computes no attention dropout (dropout_p must be 0)")
    _check_shapes(query, key, value, enable_gqa)
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: pass either attn_mask or is_causal, not both")
    lead, length_q, length_k = query.shape[:-2], query.shape[-2], key.shape[-2]
    q, k, v = (_as_4d(x) for x in (query, key, value))
    options: dict[str, Any] = {"softmax_scale": scale}
    if attn_mask is None:
        if is_causal:
            _top_left_causal(options, length_q, length_k)
        out = _forward(q, k, v, options)
    elif _causal_variant(attn_mask) is not None:
        if _causal_variant(attn_mask) == "upper_left":
            _top_left_causal(options, length_q, length_k)
        else:
            options["causal"] = True
        out = _forward(q, k, v, options)
    elif isinstance(attn_mask, torch.Tensor):
        out = _masked(q, k, v, attn_mask, tuple(lead), length_q, length_k, options)
    else:
        raise TypeError(f"attn_mask must be None, a boolean tensor or a CausalBias, got {type(attn_mask).__name__}")
    return out.reshape(*lead, length_q, out.shape[-1])


def _check_shapes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor, got {type(x).__name__}")
        if x.dim() < 3:
            raise ValueError(f"{name} must have at least 3 dims (..., N, E), got shape {tuple(x.shape)}")
    if not query.dim() == key.dim() == value.dim():
        raise ValueError(f"query, key and value must have the same number of dims, got {query.dim()}, "
                         f"{key.dim()}, {value.dim()}")
    if value.shape[-1] != query.shape[-1] or key.shape[-1] != query.shape[-1]:
        raise NotImplementedError(f"cutlassfa computes one head dim for q, k and v; got E = {query.shape[-1]}, "
                                  f"key {key.shape[-1]}, value Ev = {value.shape[-1]}")
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(f"key and value must agree but in the last dim, got {tuple(key.shape)} and "
                         f"{tuple(value.shape)}")
    q_lead, k_lead = query.shape[:-2], key.shape[:-2]
    heads_q, heads_k = (q_lead[-1], k_lead[-1]) if query.dim() >= 4 else (1, 1)
    same_batch = q_lead[:-1] == k_lead[:-1] if query.dim() >= 4 else q_lead == k_lead
    if not same_batch or (heads_q != heads_k and not (enable_gqa and heads_k and heads_q % heads_k == 0)):
        need = "a divisor of the query's heads with enable_gqa=True" if heads_q != heads_k else "the query's"
        raise ValueError(f"key and value must have the query's leading dims ({tuple(q_lead)}), heads {need}; "
                         f"got key {tuple(key.shape)}")


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """(..., H, N, E) as (B, H, N, E): 3-D arrays get one head, more leading dims fold into the batch."""
    if x.dim() == 3:
        return x[:, None]
    return x if x.dim() == 4 else x.reshape(-1, *x.shape[-3:])


def _top_left_causal(options: dict[str, Any], length_q: int, length_k: int) -> None:
    """SDPA's is_causal (query i sees keys j <= i) in forward's bottom-right terms: causal when L = S; a
    right bound of L - S keys past the diagonal when L > S; and when S > L, keys from L on are seen by no
    row: causal over the first L keys (forward's cache length)."""
    if length_q >= length_k:
        options["window"] = (-1, length_q - length_k)
    else:
        options["causal"] = True
        options["key_length"] = length_q


def _causal_variant(mask: Any) -> str | None:
    """"upper_left" / "lower_right" for a torch.nn.attention.bias.CausalBias, else None."""
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:  # a PyTorch without causal bias objects
        return None
    if not isinstance(mask, CausalBias):
        return None
    return "upper_left" if mask.variant == CausalVariant.UPPER_LEFT else "lower_right"


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
    length = options.pop("key_length", None)
    if length is not None:  # keys no row sees, left out by a view
        k, v = k[:, :, :length], v[:, :, :length]
    return cutlassfa.forward(q, k, v, **options)


def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, lead: tuple[int, ...],
            length_q: int, length_k: int, options: dict[str, Any]) -> torch.Tensor:
    """A boolean mask, reduced to one key range per (entry, query) and computed by the form that matches.
    lead: the query's leading dims (batch..., heads); q, k, v are their 4-D views (_as_4d)."""
    if mask.dtype != torch.bool:
        raise NotImplementedError(f"cutlassfa takes boolean attention masks only (a {mask.dtype} mask adds a bias "
                                  "it does not compute); pass a boolean mask (True: take part) or a CausalBias")
    if torch.compiler.is_compiling():
        raise NotImplementedError("a boolean attn_mask is read on the host, which torch.compile cannot trace; "
                                  "pass is_causal or a CausalBias instead")
    try:
        full = torch.broadcast_to(mask, (*lead, length_q, length_k))  # a view: nothing is copied
    except RuntimeError as error:
        raise ValueError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to "
                         f"{(*lead, length_q, length_k)}") from error
    if len(lead) >= 2:  # (batch..., heads): one mask per entry, the same for every head
        if mask.dim() >= 3 and mask.shape[-3] > 1 and not bool((mask == mask[..., :1, :, :]).all()):
            raise NotImplementedError("the attention mask differs between heads; cutlassfa takes one mask per "
                                      "batch entry")
        full = full[..., 0, :, :]
    layout = _layout(rows_of_visible(full.reshape(q.shape[0], length_q, length_k).to(q.device)), length_q, length_k)
    options["causal"] = layout.causal
    if layout.window is not None:
        options["window"] = layout.window
    if layout.kind == "dense":
        return cutlassfa.forward(q, k, v, **options)
    if layout.kind == "cache":
        return cutlassfa.forward(q, k, v, **layout.cache_arguments, **options)
    if layout.kind == "packed":  # causal sequences one after another: one varlen call over them
        return packed_sequences_forward(q, k, v, layout, options).transpose(1, 2)
    return _varlen(q, k, v, layout, options)


def _layout(rows: MaskRows, length_q: int, length_k: int) -> Plan:
    """The call that computes the mask `rows` describes (every row's output is returned, so every row
    matters), trying causal (bottom-right), full, and SDPA's top-left causal with more queries than keys
    (a right bound of L - S past forward's diagonal). Rows that see no key may also be left out of a
    packed (varlen) call, which gives them 0; raises the planner's NotImplementedError otherwise."""
    patterns = [(True, None, None), (False, None, None)]
    if length_q > length_k:
        patterns.append((False, None, length_q - length_k))
    empty = rows.first > rows.last
    refusal: NotImplementedError | None = None
    for causal, left, right in patterns:
        for candidate in (rows, dataclasses.replace(rows, matters=~empty)):
            try:
                layout = plan(candidate, length_q, length_k, causal, left, right)
            except NotImplementedError as error:
                refusal = error
                continue
            if candidate is rows:
                return layout
            if layout.kind == "varlen":  # the empty rows it was not asked about must lie outside the runs
                row = torch.arange(length_q, device=empty.device)[None]
                inside = (row >= layout.query_start[:, None]) & (row < layout.query_end[:, None])
                if not bool((empty & inside).any()):
                    return layout
    raise refusal


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Plan, options: dict[str, Any]) -> torch.Tensor:
    """Each entry's run of query rows against its run of keys, packed; the other rows give 0."""
    return packed_forward(q, k, v, layout, options).transpose(1, 2)
