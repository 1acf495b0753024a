"""cutlassfa for JAX: `forward` and `varlen_forward` (every option of `cutlassfa.forward`, in JAX's
(B, N, H, d) layout with ``layout="BNHD"`` or in (B, H, N, d); with k_new / v_new the updated caches are
returned: ``out, k, v = forward(q, k, v, cache_seqlens=..., k_new=..., v_new=...)``), and a drop-in for
`jax.nn.dot_product_attention`:

    from cutlassfa.jax import dot_product_attention
    out = dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                                query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None)

JAX's names, layout and semantics, computed by `cutlassfa.forward` (eagerly, under `jax.jit` and `jax.vmap`):

- query (B, T, N, H) or (T, N, H); key and value (B, S, K, H) or (S, K, H), K a divisor of N (GQA).
- is_causal and local_window_size ((left, right), or w for (w, w)) are JAX's top-left: query i sees keys
  [i - left, i + right], and with is_causal none past i, also when T != S.
- query_seq_lengths (B,): rows from a sequence's length on give 0 (as JAX's XLA implementation does).
  key_value_seq_lengths (B,): keys from a sequence's length on are not seen; with is_causal or a window
  only when it is the same array as query_seq_lengths (self-attention over right-padded sequences, whose
  valid rows never reach the padding), since cutlassfa aligns a window to each sequence's end.
- scale: JAX's (default 1/sqrt(H)).

`bias` and `mask` must be None (padding goes through the lengths); what cutlassfa cannot compute exactly
raises NotImplementedError. The public module is `cutlassfa.jax`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from cutlassfa.integrations.jax import forward, varlen_forward

__all__ = ["dot_product_attention", "forward", "varlen_forward"]


def dot_product_attention(query: Any, key: Any, value: Any, bias: Any = None, mask: Any = None, *,
                          scale: float | None = None, is_causal: bool = False, query_seq_lengths: Any = None,
                          key_value_seq_lengths: Any = None, local_window_size: Any = None) -> Any:
    """`jax.nn.dot_product_attention`, computed by cutlassfa (see the module)."""
    if bias is not None:
        raise NotImplementedError("cutlassfa adds no attention bias (bias must be None)")
    if mask is not None:
        raise NotImplementedError("mask must be None: give padding as query_seq_lengths / key_value_seq_lengths")
    q, k, v = (jnp.asarray(x) for x in (query, key, value))
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise ValueError(f"query, key and value must all be (B, T, N, H) or all (T, N, H), got shapes {q.shape}, "
                         f"{k.shape}, {v.shape}")
    unbatched = q.ndim == 3
    if unbatched:
        q, k, v = q[None], k[None], v[None]
    length_q, length_k = q.shape[1], k.shape[1]
    left, right = _window(local_window_size)
    if is_causal:
        right = 0 if right is None else min(right, 0)
    options: dict[str, Any] = {"softmax_scale": scale}
    if key_value_seq_lengths is not None:
        if left is None and right is None:
            options["cache_seqlens"] = jnp.asarray(key_value_seq_lengths, jnp.int32)
        elif key_value_seq_lengths is not query_seq_lengths or length_q != length_k:
            raise NotImplementedError("key_value_seq_lengths with is_causal or a window: cutlassfa aligns a window to "
                                      "each sequence's end; pass the same array as query_seq_lengths (right-padded "
                                      "self-attention) or no window")
    # JAX's top-left rows in forward's bottom-right terms: keys no row sees are left out (a view), and the
    # window moves by the difference of the two diagonals.
    kept = length_k if right is None else max(0, min(length_k, length_q + right))
    shift = kept - length_q
    window = (-1 if left is None else left + shift, -1 if right is None else right - shift)
    if left is not None and window[0] < 0:
        raise NotImplementedError(f"local_window_size {local_window_size} with {length_q} queries and {kept} keys "
                                  "leaves rows whose window starts past every key")
    if window != (-1, -1):
        options["window"] = window
    if kept < length_k:
        k, v = k[:, :kept], v[:, :kept]
    out = forward(q, k, v, layout="BNHD", **options)  # JAX's layout: no transpose
    if query_seq_lengths is not None:  # rows past a sequence's length give 0
        valid = jnp.arange(length_q)[None, :] < jnp.asarray(query_seq_lengths)[:, None]
        out = jnp.where(valid[:, :, None, None], out, jnp.zeros((), out.dtype))
    return out[0] if unbatched else out


def _window(local_window_size: Any) -> tuple[int | None, int | None]:
    """(left, right) keys around a query's own position, None for unbounded."""
    if local_window_size is None:
        return None, None
    if isinstance(local_window_size, int):
        return local_window_size, local_window_size
    left, right = local_window_size
    return int(left), int(right)
