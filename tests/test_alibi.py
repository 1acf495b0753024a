"""ALiBi (`alibi_slopes=`, (Hq,) or (B, Hq)): the score of query i and key j gains -slope * |i + L - Nq - j|
after softcap, L the entry's keys (bottom-right, as the causal alignment; a cache's length, a varlen
sequence's). Every backend against the float64 reference, on the GPU (tile kernels, CUDA-core kernels, split
keys, caches with left padding and pages, varlen, GQA at one query: never packed) and on the CPU (cpu backend,
the torch operator, JAX); the reference itself against the formula written out. compute-sanitizer runs this
file on the GPU machine."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2, varlen_reference
from gpu_results import (SCORE_TERM_SHAPES, assert_close_on_host, assert_matches_reference, check_dense_on_gpu, host64,
                         random_cache, random_qkv, to_cuda)

GPU_BACKENDS = ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"]


def _slopes(rng, heads: int, batch: int | None = None) -> np.ndarray:
    """Bloom's geometric slopes (1/2 .. 1/256 over the heads), each entry scaled differently when per entry."""
    base = 2.0 ** -np.linspace(1, 8, heads)
    if batch is None:
        return base.astype(np.float32)
    return (base[None, :] * rng.uniform(0.5, 1.5, (batch, 1))).astype(np.float32)


def test_reference_is_the_formula(rng):
    q, k, v = random_qkv(rng, 2, 4, 2, 5, 9, 16, np.float64)
    slopes = _slopes(rng, 4, 2).astype(np.float64)
    out, lse = attention_reference(q, k, v, causal=True, softcap=3.0, alibi_slopes=slopes)
    for b in range(2):
        for h in range(4):
            for i in range(5):
                keys = range(i + 9 - 5 + 1)
                s = np.array([3.0 * math.tanh(q[b, h, i] @ k[b, h // 2, j] / 4 / 3.0) - slopes[b, h] * abs(i + 4 - j)
                              for j in keys])
                e = np.exp(s)
                np.testing.assert_allclose(out[b, h, i], e @ v[b, h // 2, list(keys)] / e.sum(), rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(lse[b, h, i], math.log(e.sum()), rtol=1e-10, atol=1e-12)


def test_reference_cache_distances_ignore_left_padding(rng):
    """Left padding hides keys without moving the alignment: the same as the dense call on the kept keys'
    positions, written out."""
    q, k, v = random_qkv(rng, 1, 2, 1, 3, 12, 8, np.float64)
    slopes = np.array([0.5, 0.25])
    out, _ = kvcache_reference(q, k, v, cache_seqlens=np.array([10]), cache_leftpad=np.array([4]), alibi_slopes=slopes)
    for h in range(2):
        for i in range(3):
            s = np.array([q[0, h, i] @ k[0, 0, j] / math.sqrt(8) - slopes[h] * abs(i + 10 - 3 - j) for j in range(4, 10)])
            e = np.exp(s - s.max())
            np.testing.assert_allclose(out[0, h, i], e @ v[0, 0, 4:10] / e.sum(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("per_entry", [False, True], ids=["per-head", "per-entry"])
@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("mode", ["full", "causal_gqa", "window_softcap_sinks", "nq_gt_nk"])
def test_cpu_dense_matches_reference(rng, per_entry, splits, mode):
    shapes = {"full": (2, 4, 4, 33, 300), "causal_gqa": (2, 8, 2, 40, 260), "window_softcap_sinks": (1, 4, 1, 64, 200),
              "nq_gt_nk": (2, 4, 2, 50, 20)}
    b, hq, hkv, nq, nk = shapes[mode]
    q, k, v = random_qkv(rng, b, hq, hkv, nq, nk, 32, np.float32)
    options = {"full": {}, "causal_gqa": dict(causal=True),
               "window_softcap_sinks": dict(window=(30, 5), softcap=8.0, sinks=np.array([1.0, -np.inf, 0.5, 2.0],
                                                                                         np.float32)),
               "nq_gt_nk": dict(causal=True)}[mode]
    slopes = _slopes(rng, hq, b if per_entry else None)
    ref, ref_lse = attention_reference(q, k, v, alibi_slopes=slopes, **options)
    out, lse = cutlassfa.forward(q, k, v, alibi_slopes=slopes, num_splits=splits, backend="cpu", return_lse=True,
                                 **options)
    assert_close_on_host("cpu", "float32", out, lse, ref, ref_lse)
    assert rel_l2(out, attention_reference(q, k, v, **options)[0]) > 1e-2  # the slopes matter here


@pytest.mark.parametrize("paged", [False, True])
def test_cpu_kv_cache_matches_reference(rng, paged):
    b, hq, hkv, nq, d, cap, page = 3, 8, 2, 3, 32, 96, 16
    q = rng.standard_normal((b, hq, nq, d)).astype(np.float16)
    lens, leftpad = np.array([20, 60, 80], np.int32), np.array([0, 11, 37], np.int32)
    k_new, v_new = (rng.standard_normal((b, hkv, 4, d)).astype(np.float16) for _ in range(2))
    k, v, table = random_cache(rng, b, hkv, cap, d, page, paged)
    slopes = _slopes(rng, hq, b)
    options = dict(cache_seqlens=lens, cache_leftpad=leftpad, block_table=table, k_new=k_new, v_new=v_new, causal=True)
    ref, ref_lse = kvcache_reference(q, k, v, alibi_slopes=slopes, **options)
    out, lse = cutlassfa.forward(q, k, v, alibi_slopes=slopes, backend="cpu", return_lse=True, **options)
    assert_close_on_host("cpu", "float16", out, lse, ref, ref_lse)


def test_cpu_varlen_matches_reference(rng):
    cu_q = np.array([0, 5, 5, 30, 31], np.int32)
    cu_k = np.array([0, 9, 12, 12, 60], np.int32)
    q = rng.standard_normal((31, 4, 32)).astype(np.float32)
    k, v = (rng.standard_normal((60, 2, 32)).astype(np.float32) for _ in range(2))
    slopes = _slopes(rng, 4, 4)  # one row per sequence
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, alibi_slopes=slopes)
    out, lse = cutlassfa.varlen_forward(q, k, v, cu_q, cu_k, causal=True, alibi_slopes=slopes, backend="cpu",
                                        return_lse=True)
    assert_close_on_host("cpu", "float32", out, lse, ref, ref_lse)


@pytest.mark.parametrize("slopes, error, words", [
    (np.zeros(3, np.float32), ValueError, "alibi_slopes must have shape (4,) or (2, 4)"),
    (np.zeros((3, 4), np.float32), ValueError, "alibi_slopes must have shape (4,) or (2, 4)"),
    (np.zeros((2, 4, 1), np.float32), ValueError, "alibi_slopes must have shape"),
    (np.zeros(4, np.int64), TypeError, "alibi_slopes must be float32, float16 or bfloat16"),
])
def test_bad_slopes_raise_naming_the_argument_and_write_nothing(rng, slopes, error, words):
    q, k, v = random_qkv(rng, 2, 4, 2, 3, 5, 16, np.float32)
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(error) as raised:
        cutlassfa.forward(q, k, v, alibi_slopes=slopes, out=out)
    assert words in str(raised.value)
    assert (out == 7.0).all()
    assert cutlassfa.supports("cpu", "float32", 64, alibi=True).ok


def test_torch_operator_and_jax_take_the_slopes(rng):
    torch = pytest.importorskip("torch", reason="optional package torch")
    q, k, v = random_qkv(rng, 2, 4, 2, 5, 9, 16, np.float32)
    slopes = _slopes(rng, 4, 2)
    ref, _ = attention_reference(q, k, v, causal=True, alibi_slopes=slopes)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    backend = cutlassfa.select_backend(q, k, v)
    with torch.enable_grad():  # through torch.ops.cutlassfa.forward
        traced = cutlassfa.forward(tq.clone().requires_grad_(), tk, tv, causal=True,
                                   alibi_slopes=torch.from_numpy(slopes))
    assert rel_l2(traced.detach().numpy(), ref) <= bound_for(backend, "float32").rel_l2
    jax = pytest.importorskip("jax", reason="optional package jax")
    jq, jk, jv = (jax.numpy.asarray(x) for x in (q, k, v))
    jax_backend = "cpu" if jq.devices().pop().platform == "cpu" else backend
    jitted = jax.jit(lambda s: cutlassfa.forward(jq, jk, jv, causal=True, alibi_slopes=s))(slopes)
    assert rel_l2(np.asarray(jitted), ref) <= bound_for(jax_backend, "float32").rel_l2
    per_head = np.stack([slopes[0], slopes[1]])  # vmap over (Hq,) rows
    mapped = jax.vmap(lambda s: cutlassfa.forward(jq, jk, jv, causal=True, alibi_slopes=s))(per_head)
    expected, _ = attention_reference(q, k, v, causal=True, alibi_slopes=slopes[1])
    assert rel_l2(np.asarray(mapped[1]), expected) <= bound_for(jax_backend, "float32").rel_l2


# --------------------------------------------------------------------------------------------------
# The GPU backends
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("shape", list(SCORE_TERM_SHAPES), ids=str)
@pytest.mark.parametrize("splits", [None, 3])
def test_gpu_dense_matches_reference(torch, rng, need_backend, backend, shape, splits):
    need_backend(backend)
    check_dense_on_gpu(torch, rng, backend, shape, splits, alibi_slopes=lambda rng, b, hq: _slopes(rng, hq, b))


# The warp-specialized kernel's ALiBi and softcap instantiations (sm90ws/score_terms.h) at the head dims of
# either (both in one call: the wgmma kernel): both halves, Nq != Nk both ways, GQA, more tiles than a 132-SM GPU
# runs at once (each CTA walks tiles of other heads and entries, each reading its own slope), ALiBi per entry;
# masks that hide the keys on one side of the diagonal (causal, windows (L, 0) and (0, R): one FFMA a score),
# or neither.
MASKS = {"full": {}, "causal": {"causal": True}, "window-left": {"window": (70, 0)},
         "window-right": {"window": (0, 50)}, "window-both": {"window": (90, 20)}}


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("mask", list(MASKS))
def test_gpu_warp_specialized_softcap_and_alibi(torch, rng, need_backend, d, dtype, mask):
    need_backend("tensorcore")
    np_dtype = cutlassfa._arrays.numpy_dtype(dtype)
    for b, hq, hkv, nq, nk in ((3, 16, 4, 400, 600), (2, 6, 6, 650, 300)):
        q, k, v = random_qkv(rng, b, hq, hkv, nq, nk, d, np_dtype)
        dq, dk, dv = (torch.from_numpy(x.astype(np.float32)).cuda().to(getattr(torch, dtype)) for x in (q, k, v))
        slopes = _slopes(rng, hq, b)
        for terms in ({"softcap": 15.0}, {"alibi_slopes": slopes}, {"softcap": 15.0, "alibi_slopes": slopes}):
            ref, ref_lse = attention_reference(q, k, v, **MASKS[mask], **terms)
            out = torch.full(dq.shape, float("nan"), dtype=dq.dtype, device="cuda")  # poisoned
            on_device = {name: to_cuda(torch, x) if isinstance(x, np.ndarray) else x for name, x in terms.items()}
            result, lse = cutlassfa.forward(dq, dk, dv, out=out, return_lse=True, backend="tensorcore",
                                            **MASKS[mask], **on_device)
            assert result is out
            assert_matches_reference("tensorcore", dtype, out, lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_slope_dtypes_host_values_and_sinks(torch, rng, need_backend, backend, dtype):
    need_backend(backend)
    np_dtype = cutlassfa._arrays.numpy_dtype(dtype)
    q, k, v = random_qkv(rng, 2, 4, 2, 70, 150, 64, np_dtype)
    exact = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)  # representable in every dtype
    sinks = np.array([1.0, -np.inf, 0.5, 2.0], np.float32)
    ref, ref_lse = attention_reference(q, k, v, causal=True, alibi_slopes=exact, sinks=sinks)
    dq, dk, dv = (to_cuda(torch, x) for x in (q, k, v)) if dtype != "bfloat16" else \
        (torch.from_numpy(x.astype(np.float32)).cuda().bfloat16() for x in (q, k, v))
    for slopes in (torch.from_numpy(exact).cuda().bfloat16(), torch.from_numpy(exact).cuda().half(), exact.tolist(),
                   exact):
        out, lse = cutlassfa.forward(dq, dk, dv, causal=True, alibi_slopes=slopes, sinks=to_cuda(torch, sinks),
                                     backend=backend, return_lse=True)
        assert_matches_reference(backend, dtype, out, lse, ref, ref_lse)
    out, lse = cutlassfa.forward(q, k, v, causal=True, alibi_slopes=exact, sinks=sinks, backend=backend,
                                 return_lse=True)
    assert_close_on_host(backend, dtype, out.astype(np.float64), lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("nq", [1, 5, 80])
def test_gpu_kv_cache_matches_reference(torch, rng, need_backend, backend, paged, nq):
    need_backend(backend)
    b, hq, hkv, d, cap, page = 4, 8, 2, 128, 512, 64
    q = rng.standard_normal((b, hq, nq, d)).astype(np.float16)
    lens, leftpad = np.array([0, 37, 500, 200], np.int32), np.array([0, 5, 0, 150], np.int32)
    k, v, table = random_cache(rng, b, hkv, cap, d, page, paged)
    slopes = _slopes(rng, hq, b)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, cache_leftpad=leftpad, block_table=table,
                                     causal=True, alibi_slopes=slopes)
    for splits in (None, 4):
        out, lse = cutlassfa.forward(*(to_cuda(torch, x) for x in (q, k, v)), cache_seqlens=to_cuda(torch, lens),
                                     cache_leftpad=to_cuda(torch, leftpad),
                                     block_table=None if table is None else to_cuda(torch, table), causal=True,
                                     alibi_slopes=to_cuda(torch, slopes), num_splits=splits, backend=backend,
                                     return_lse=True)
        assert_matches_reference(backend, "float16", out, lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_varlen_matches_reference(torch, rng, need_backend, backend):
    need_backend(backend)
    cu_q = np.array([0, 100, 100, 400, 401], np.int32)
    cu_k = np.array([0, 300, 340, 340, 900], np.int32)
    q = rng.standard_normal((401, 8, 64)).astype(np.float16)
    k, v = (rng.standard_normal((900, 2, 64)).astype(np.float16) for _ in range(2))
    slopes = _slopes(rng, 8, 4)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, alibi_slopes=slopes)
    out, lse = cutlassfa.varlen_forward(*(to_cuda(torch, x) for x in (q, k, v)), to_cuda(torch, cu_q), to_cuda(torch, cu_k),
                                        max_seqlen_q=300, max_seqlen_k=560, causal=True,
                                        alibi_slopes=to_cuda(torch, slopes), backend=backend, return_lse=True)
    assert_close_on_host(backend, "float16", host64(out), host64(lse), ref, ref_lse)
