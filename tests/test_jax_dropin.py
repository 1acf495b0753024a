"""`cutlassfa.jax.dot_product_attention` against `jax.nn.dot_product_attention` (XLA implementation): on the
argument combinations both take, its deviation from the XLA call in float64 stays within 2x the XLA call's
own in float32 (or the bound of the cutlassfa backend that ran it); what it cannot compute exactly is
refused. On JAX's default device (the CPU in CI)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="optional package jax")
jnp = jax.numpy

import cutlassfa  # noqa: E402
from cutlassfa.check import bound_for  # noqa: E402
from cutlassfa.jax import dot_product_attention as ours  # noqa: E402


def _inputs(seed, batch, lq, ls, heads=4, heads_k=2, dim=16):
    rng = np.random.default_rng(seed)
    shape = (lambda n, h: (batch, n, h, dim)) if batch else (lambda n, h: (n, h, dim))
    return (rng.standard_normal(shape(lq, heads)).astype(np.float32),
            rng.standard_normal(shape(ls, heads_k)).astype(np.float32),
            rng.standard_normal(shape(ls, heads_k)).astype(np.float32))


def _deviation(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def _expect_like_jax(q, k, v, **kwargs):
    jq, jk, jv = (jnp.asarray(x) for x in (q, k, v))
    got = ours(jq, jk, jv, **kwargs)
    assert got.shape == jq.shape and got.dtype == jq.dtype
    with jax.enable_x64(True):
        exact = jax.nn.dot_product_attention(*(jnp.asarray(x, jnp.float64) for x in (q, k, v)), implementation="xla",
                                             **kwargs)
    same = jax.nn.dot_product_attention(jq, jk, jv, implementation="xla", **kwargs)
    platform = jq.devices().pop().platform
    batched = [x if x.ndim == 4 else x[None] for x in (q, k, v)]  # (B, T, N, H) as the drop-in calls it
    backend = "cpu" if platform == "cpu" else cutlassfa.select_backend(*(np.swapaxes(x, 1, 2) for x in batched))
    allowed = max(2 * _deviation(same, exact), bound_for(backend, "float32").rel_l2)
    assert _deviation(got, exact) <= allowed, (_deviation(got, exact), allowed)
    return got


@pytest.mark.parametrize("lq, ls", [(12, 12), (7, 20), (20, 7)], ids=str)
@pytest.mark.parametrize("form", ["full", "causal", "window", "window_pair", "causal_window"])
def test_masks_and_lengths_of_the_sequences(lq, ls, form):
    q, k, v = _inputs(lq * 31 + ls, 2, lq, ls)
    kwargs = {"full": {}, "causal": dict(is_causal=True), "window": dict(local_window_size=3),
              "window_pair": dict(local_window_size=(4, 1)),
              "causal_window": dict(is_causal=True, local_window_size=(2, 5))}[form]
    left = {"window": 3, "window_pair": 4, "causal_window": 2}.get(form)
    if left is not None and lq - ls > left:
        # Rows past the keys + left see none while the rows below see a window: no bottom-right window
        # expresses that (forward's left bound cannot lie past a row's diagonal).
        with pytest.raises(NotImplementedError, match="starts past every key"):
            ours(*(jnp.asarray(x) for x in (q, k, v)), **kwargs)
        return
    _expect_like_jax(q, k, v, **kwargs)


def test_scale_unbatched_and_jit():
    q, k, v = _inputs(1, 0, 9, 9)
    _expect_like_jax(q, k, v, scale=0.3, is_causal=True)
    q, k, v = _inputs(2, 2, 9, 13)
    jitted = jax.jit(lambda q, k, v: ours(q, k, v, is_causal=True))(q, k, v)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(ours(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                                                   is_causal=True)), rtol=1e-6, atol=1e-6)


def test_sequence_lengths():
    q, k, v = _inputs(3, 3, 10, 14)
    kv_lengths, q_lengths = jnp.array([14, 5, 9], jnp.int32), jnp.array([10, 3, 7], jnp.int32)
    _expect_like_jax(q, k, v, key_value_seq_lengths=kv_lengths)
    _expect_like_jax(q, k, v, query_seq_lengths=q_lengths, key_value_seq_lengths=kv_lengths)
    jitted = jax.jit(lambda q, k, v, n: ours(q, k, v, key_value_seq_lengths=n))(q, k, v, kv_lengths)
    with jax.enable_x64(True):
        exact = jax.nn.dot_product_attention(*(jnp.asarray(x, jnp.float64) for x in (q, k, v)),
                                             key_value_seq_lengths=kv_lengths)
    assert _deviation(jitted, exact) <= 1e-3
    # Right-padded self-attention: the same lengths for queries and keys, causal.
    q, k, v = _inputs(4, 3, 12, 12)
    lengths = jnp.array([12, 4, 9], jnp.int32)
    _expect_like_jax(q, k, v, is_causal=True, query_seq_lengths=lengths, key_value_seq_lengths=lengths)


def test_refusals():
    q, k, v = (jnp.asarray(x) for x in _inputs(5, 2, 8, 8))
    with pytest.raises(NotImplementedError, match="bias"):
        ours(q, k, v, bias=jnp.zeros((2, 4, 8, 8)))
    with pytest.raises(NotImplementedError, match="mask must be None"):
        ours(q, k, v, mask=jnp.ones((2, 4, 8, 8), bool))
    with pytest.raises(NotImplementedError, match="key_value_seq_lengths with is_causal"):
        ours(q, k, v, is_causal=True, key_value_seq_lengths=jnp.array([8, 3]))
    with pytest.raises(ValueError, match="all be"):
        ours(q, k[0], v)
