"""varlen batches (packed sequences of different lengths) on the cpu backend and in the reference,
against each sequence computed on its own (attention_oracle)."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from attention_oracle import assert_matches, dense_attention, visible
from cutlassfa.cpu import forward_cpu, varlen_forward_cpu
from cutlassfa.reference import varlen_reference

D = 32


def packed(rng, lens_q, lens_k, hq=4, hkv=2, d=D, dtype=np.float32):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]), hq, d)).astype(dtype)
    k, v = (rng.standard_normal((int(cu_k[-1]), hkv, d)).astype(dtype) for _ in range(2))
    return q, k, v, cu_q, cu_k


def oracle(q, k, v, cu_q, cu_k, causal=False, window=(-1, -1), softcap=0.0):
    """Each sequence on its own: (n, H, d) rows seen as (H, n, d), the formula's mask."""
    left, right = window
    if causal:
        right = 0
    hq = q.shape[1]
    out = np.zeros(q.shape)
    lse = np.full((hq, q.shape[0]), -np.inf)
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        o, l_ = dense_attention(q[q0:q1].transpose(1, 0, 2), k[k0:k1].transpose(1, 0, 2),
                                v[k0:k1].transpose(1, 0, 2), visible(q1 - q0, k1 - k0, left, right), softcap=softcap)
        out[q0:q1] = o.transpose(1, 0, 2)
        lse[:, q0:q1] = l_
    return out, lse


def run_and_check(q, k, v, cu_q, cu_k, **mode):
    want_out, want_lse = oracle(q, k, v, cu_q, cu_k, **mode)
    ref_out, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, **mode)
    np.testing.assert_allclose(ref_out, want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ref_lse, want_lse, rtol=1e-10, atol=1e-12)
    out, lse = varlen_forward_cpu(q, k, v, cu_q, cu_k, return_lse=True, block_m=16, block_n=16, **mode)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (q.shape[1], q.shape[0])
    assert lse.dtype == np.float32
    assert_matches(out, lse, want_out, want_lse, q.dtype.name)
    return out, lse


# (query lengths, key lengths): empty sequences first, last and in the middle, Nq != Nk, ragged.
LENGTHS = [
    ([5, 0, 17, 40], [5, 3, 17, 40]),
    ([0, 33, 1], [12, 70, 0]),
    ([1, 1, 1, 1], [100, 1, 37, 64]),
    ([50, 7], [20, 7]),
    ([0, 0], [0, 0]),
]


@pytest.mark.parametrize("lens", LENGTHS, ids=lambda x: str(x[0]))
@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 1)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_matrix(rng, lens, hq, hkv, causal):
    run_and_check(*packed(rng, *lens, hq=hq, hkv=hkv), causal=causal)


@pytest.mark.parametrize("window,causal,softcap", [
    ((8, 0), True, 0.0), ((3, 2), False, 0.0), ((-1, 4), False, 0.0), ((0, 0), False, 1.0), ((-1, -1), True, 10.0),
], ids=str)
def test_window_and_softcap(rng, window, causal, softcap):
    run_and_check(*packed(rng, *LENGTHS[0]), causal=causal, window=window, softcap=softcap)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision(rng, resolve_dtype, dtype):
    run_and_check(*packed(rng, [9, 0, 60], [30, 4, 60], dtype=resolve_dtype(dtype)), causal=True)


def test_one_sequence_is_the_dense_call(rng):
    q, k, v, cu_q, cu_k = packed(rng, [45], [70])
    out, lse = varlen_forward_cpu(q, k, v, cu_q, cu_k, causal=True, return_lse=True)
    dense, dense_lse = forward_cpu(q.transpose(1, 0, 2)[None], k.transpose(1, 0, 2)[None],
                                   v.transpose(1, 0, 2)[None], causal=True, softmax_scale=None, return_lse=True)
    np.testing.assert_array_equal(out, dense[0].transpose(1, 0, 2))
    np.testing.assert_array_equal(lse, dense_lse[0])


def test_strided_inputs_and_out(rng):
    # Every other head of a wider buffer: strides differ from the packed layout; out is written in place.
    q, k, v, cu_q, cu_k = packed(rng, [3, 20], [8, 25], hq=8, hkv=4)
    want = varlen_forward_cpu(q[:, ::2], k[:, ::2], v[:, ::2], cu_q, cu_k, causal=True)
    buf = np.full((q.shape[0], 4, 2 * D), 9, np.float32)
    got = varlen_forward_cpu(np.ascontiguousarray(q[:, ::2]), k[:, ::2], v[:, ::2], cu_q, cu_k, causal=True,
                             out=buf[:, :, :D])
    np.testing.assert_array_equal(got, want)
    assert (buf[:, :, D:] == 9).all()
    run_and_check(q[:, ::2], k[:, ::2], v[:, ::2], cu_q, cu_k, causal=True)


needs_extension = pytest.mark.skipif(cutlassfa._api._C is None,
                                     reason="optional package: the cutlassfa extension is not built")


@pytest.mark.parametrize("cu_q,name", [
    ([0, 3, 2, 23], "cu_seqlens_q"), ([1, 3, 23], "cu_seqlens_q"), ([0, 3, 22], "cu_seqlens_q"),
    ([0, 23], "cu_seqlens"),
])
@needs_extension
def test_bad_cu_seqlens_write_nothing(rng, cu_q, name):
    """Refused by the extension's validator before the cpu backend runs."""
    q, k, v, _, cu_k = packed(rng, [3, 20], [8, 25])
    out = np.full(q.shape, 5, np.float32)
    with pytest.raises(ValueError, match=name):
        cutlassfa.varlen_forward(q, k, v, cu_q, cu_k, out=out, backend="cpu")
    assert (out == 5).all()


@needs_extension
def test_max_seqlen_is_checked(rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 20], [8, 25])
    cutlassfa.varlen_forward(q, k, v, cu_q, cu_k, max_seqlen_q=20, max_seqlen_k=25, backend="cpu")
    with pytest.raises(ValueError, match="max_seqlen_k"):
        cutlassfa.varlen_forward(q, k, v, cu_q, cu_k, max_seqlen_k=24, backend="cpu")
