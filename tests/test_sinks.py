"""Attention sinks (`sinks=`, one logit per query head): each row's softmax gains e^sink in its denominator
and nothing in its numerator; a row that sees no key gives O = 0 and lse = sink; -inf is no sink. Every
backend against the float64 reference, on the GPU (tile kernels, decode kernel, split combine, CUDA-core
kernels, host arrays through the GPU) and on the CPU (cpu backend, merge_attention, JAX, the torch
operator); the reference itself against the formula written out. compute-sanitizer runs this file on the
GPU machine."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.merge import merge_attention
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2, varlen_reference
from gpu_results import (SCORE_TERM_SHAPES, assert_close_on_host, assert_matches_reference, check_dense_on_gpu, host64,
                         random_cache, random_qkv, to_cuda)

GPU_BACKENDS = ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"]


def _sinks(rng, heads: int) -> np.ndarray:
    """One head without a sink (-inf), one far above the scores (its rows mostly sink), the rest near them."""
    values = rng.normal(0.5, 1.5, heads)
    values[0] = -np.inf
    if heads > 2:
        values[1] = 6.0
    return values.astype(np.float32)


# --------------------------------------------------------------------------------------------------
# The reference: the formula written out
# --------------------------------------------------------------------------------------------------

def test_reference_is_the_formula(rng):
    q, k, v = random_qkv(rng, 2, 4, 2, 5, 7, 16, np.float64)
    sinks = _sinks(rng, 4).astype(np.float64)
    out, lse = attention_reference(q, k, v, causal=True, sinks=sinks, softcap=3.0)
    for b in range(2):
        for h in range(4):
            for i in range(5):
                keys = range(i + 7 - 5 + 1)  # causal, bottom-right
                s = np.array([3.0 * math.tanh(q[b, h, i] @ k[b, h // 2, j] / 4 / 3.0) for j in keys])
                e = np.exp(s)
                denominator = e.sum() + math.exp(sinks[h])
                np.testing.assert_allclose(out[b, h, i], e @ v[b, h // 2, list(keys)] / denominator, rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(lse[b, h, i], math.log(denominator), rtol=1e-10, atol=1e-12)


def test_reference_rows_without_keys_give_the_sink(rng):
    q, k, v = random_qkv(rng, 1, 3, 3, 4, 6, 8, np.float64)
    sinks = np.array([-np.inf, 0.25, -2.0])
    out, lse = kvcache_reference(q, k, v, cache_seqlens=np.array([0]), sinks=sinks)
    assert (out == 0).all()
    np.testing.assert_array_equal(lse, np.broadcast_to(sinks[None, :, None], lse.shape))


def test_minus_inf_sinks_are_no_sinks(rng):
    q, k, v = random_qkv(rng, 2, 4, 2, 9, 13, 16)
    none = np.full(4, -np.inf, np.float32)
    for run in (attention_reference, lambda *a, **kw: cutlassfa.forward(*a, backend="cpu", return_lse=True, **kw)):
        out, lse = run(q, k, v, causal=True, sinks=none)
        plain, plain_lse = run(q, k, v, causal=True)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))
        np.testing.assert_array_equal(np.asarray(lse), np.asarray(plain_lse))


# --------------------------------------------------------------------------------------------------
# The cpu backend: every form of call
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("mode", ["full", "causal_gqa", "window_softcap", "nq_gt_nk"])
def test_cpu_dense_matches_reference(rng, dtype, splits, mode):
    np_dtype = cutlassfa._arrays.numpy_dtype(dtype)
    shapes = {"full": (2, 4, 4, 33, 300), "causal_gqa": (2, 8, 2, 40, 260), "window_softcap": (1, 4, 1, 64, 200),
              "nq_gt_nk": (2, 4, 2, 50, 20)}
    b, hq, hkv, nq, nk = shapes[mode]
    q, k, v = random_qkv(rng, b, hq, hkv, nq, nk, 32, np_dtype)
    options = {"full": {}, "causal_gqa": dict(causal=True), "window_softcap": dict(window=(30, 5), softcap=8.0),
               "nq_gt_nk": dict(causal=True)}[mode]
    sinks = _sinks(rng, hq)
    ref, ref_lse = attention_reference(q, k, v, sinks=sinks, **options)
    out, lse = cutlassfa.forward(q, k, v, sinks=sinks, num_splits=splits, backend="cpu", return_lse=True, **options)
    assert_close_on_host("cpu", dtype, out, lse, ref, ref_lse)


@pytest.mark.parametrize("paged", [False, True])
def test_cpu_kv_cache_matches_reference(rng, paged):
    b, hq, hkv, nq, d, cap = 4, 8, 2, 3, 64, 96
    q = rng.standard_normal((b, hq, nq, d)).astype(np.float16)
    lens = np.array([0, 17, 96 - 8, 40], np.int32)  # entry 0 sees no key: lse = sink
    k_new, v_new = (rng.standard_normal((b, hkv, 8, d)).astype(np.float16) for _ in range(2)) if paged else (None, None)
    k, v, table = random_cache(rng, b, hkv, cap, d, 16, paged)
    if paged:
        lens[0] = 1  # with the 8 appended keys, causal=False: entry 0 sees them
    sinks = _sinks(rng, hq)
    options = dict(cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new, causal=not paged)
    ref, ref_lse = kvcache_reference(q, k, v, sinks=sinks, **options)
    out, lse = cutlassfa.forward(q, k, v, sinks=sinks, backend="cpu", return_lse=True, **options)
    assert_close_on_host("cpu", "float16", out, lse, ref, ref_lse)
    if not paged:
        assert (out[0] == 0).all()
        np.testing.assert_array_equal(lse[0], np.broadcast_to(sinks[:, None], (hq, nq)))


def test_cpu_varlen_matches_reference(rng):
    cu_q = np.array([0, 5, 5, 30, 31], np.int32)
    cu_k = np.array([0, 9, 12, 12, 60], np.int32)  # entry 2 has no keys
    q = rng.standard_normal((31, 4, 32)).astype(np.float32)
    k, v = (rng.standard_normal((60, 2, 32)).astype(np.float32) for _ in range(2))
    sinks = _sinks(rng, 4)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, sinks=sinks)
    out, lse = cutlassfa.varlen_forward(q, k, v, cu_q, cu_k, causal=True, sinks=sinks, backend="cpu", return_lse=True)
    assert_close_on_host("cpu", "float32", out, lse, ref, ref_lse)
    np.testing.assert_array_equal(lse[:, 5:30], np.broadcast_to(sinks[:, None], (4, 25)))


def test_host_sink_dtypes_and_sequences_read_as_float32(rng):
    import ml_dtypes

    q, k, v = random_qkv(rng, 1, 3, 3, 4, 9, 16, np.float32)
    exact = np.array([0.5, -1.25, 2.0], np.float32)  # representable in every dtype
    expected = cutlassfa.forward(q, k, v, sinks=exact, backend="cpu")
    for sinks in (exact.astype(np.float16), exact.astype(ml_dtypes.bfloat16), exact.tolist(), tuple(exact.tolist())):
        np.testing.assert_array_equal(cutlassfa.forward(q, k, v, sinks=sinks, backend="cpu"), expected)


def test_three_dim_arrays_take_one_sink(rng):
    q, k, v = (rng.standard_normal((2, n, 16)).astype(np.float32) for n in (5, 8, 8))
    out, lse = cutlassfa.forward(q, k, v, sinks=[1.5], backend="cpu", return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, sinks=[1.5])
    assert_close_on_host("cpu", "float32", out, lse, ref, ref_lse)


@pytest.mark.parametrize("sinks, error, words", [
    (np.zeros(3, np.float32), ValueError, "sinks must have shape (4,)"),
    (np.zeros((1, 4), np.float32), ValueError, "sinks must have shape (4,)"),
    (np.zeros(4, np.int32), TypeError, "sinks must be float32, float16 or bfloat16"),
    (np.zeros(4, np.float64), TypeError, "sinks must be float32, float16 or bfloat16"),
    ("sinks", TypeError, "sinks"),
])
def test_bad_sinks_raise_naming_the_argument_and_write_nothing(rng, sinks, error, words):
    q, k, v = random_qkv(rng, 1, 4, 2, 3, 5, 16, np.float32)
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(error, match=None) as raised:
        cutlassfa.forward(q, k, v, sinks=sinks, out=out)
    assert words in str(raised.value)
    assert (out == 7.0).all()
    assert not cutlassfa.supports("cpu", "float32", 64, sinks="yes").ok
    assert cutlassfa.supports("cpu", "float32", 64, sinks=True).ok


# --------------------------------------------------------------------------------------------------
# merge_attention(sinks=): the sink counts once however the keys are cut
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("parts", [1, 2, 5])
def test_merge_counts_the_sink_once(rng, parts):
    q, k, v = random_qkv(rng, 2, 4, 2, 6, 50, 16, np.float32)
    sinks = _sinks(rng, 4)
    cuts = np.linspace(0, 50, parts + 1).astype(int)
    pieces = [cutlassfa.forward(q, k[:, :, a:b], v[:, :, a:b], backend="cpu", return_lse=True)
              for a, b in zip(cuts, cuts[1:])]
    out, lse = merge_attention([o for o, _ in pieces], [l_ for _, l_ in pieces], sinks=sinks)
    ref, ref_lse = attention_reference(q, k, v, sinks=sinks)
    assert_close_on_host("cpu", "float32", out, lse, ref, ref_lse)
    with pytest.raises(ValueError, match="sinks must have shape"):
        merge_attention([pieces[0][0]], [pieces[0][1]], sinks=sinks[:2])


# --------------------------------------------------------------------------------------------------
# Frameworks on the CPU: PyTorch (eager, operator, fake tensors), JAX (eager, jit, vmap)
# --------------------------------------------------------------------------------------------------

def test_torch_cpu_eager_operator_and_fake(rng):
    torch = pytest.importorskip("torch", reason="optional package torch")
    q, k, v = (torch.from_numpy(x) for x in random_qkv(rng, 1, 4, 2, 5, 9, 16, np.float32))
    sinks = torch.from_numpy(_sinks(rng, 4)).bfloat16()
    ref, ref_lse = attention_reference(q.numpy(), k.numpy(), v.numpy(), causal=True, sinks=sinks.float().numpy())
    eager = cutlassfa.forward(q, k, v, causal=True, sinks=sinks, return_lse=True)
    with torch.enable_grad():  # through torch.ops.cutlassfa.forward (autograd must record it)
        traced = cutlassfa.forward(q.clone().requires_grad_(), k, v, causal=True, sinks=sinks, return_lse=True)
    backend = cutlassfa.select_backend(q, k, v)  # host tensors run on the GPU where one is usable
    for out, lse in (eager, traced):
        assert_close_on_host(backend, "float32", out.detach().numpy(), lse.detach().numpy(), ref, ref_lse)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fq, fk, fv = torch.empty(1, 4, 5, 16), torch.empty(1, 2, 9, 16), torch.empty(1, 2, 9, 16)
        out, lse = torch.ops.cutlassfa.forward.default(fq, fk, fv, sinks=torch.empty(4))
        assert tuple(out.shape) == (1, 4, 5, 16) and tuple(lse.shape) == (1, 4, 5)
        with pytest.raises(ValueError, match="sinks must have shape"):
            torch.ops.cutlassfa.forward.default(fq, fk, fv, sinks=torch.empty(3))


def test_torch_compile_with_sinks(rng):
    torch = pytest.importorskip("torch", reason="optional package torch")
    q, k, v = (torch.from_numpy(x) for x in random_qkv(rng, 1, 4, 4, 6, 6, 16, np.float32))
    sinks = torch.from_numpy(_sinks(rng, 4))
    compiled = torch.compile(lambda q, k, v, s: cutlassfa.forward(q, k, v, causal=True, sinks=s), fullgraph=True)
    ref, _ = attention_reference(q.numpy(), k.numpy(), v.numpy(), causal=True, sinks=sinks.numpy())
    assert rel_l2(compiled(q, k, v, sinks).numpy(), ref) <= bound_for(cutlassfa.select_backend(q, k, v), "float32").rel_l2


def test_jax_eager_jit_and_vmap(rng):
    jax = pytest.importorskip("jax", reason="optional package jax")
    jnp = jax.numpy
    q, k, v = random_qkv(rng, 2, 4, 2, 5, 7, 16, np.float32)
    sinks = np.stack([_sinks(rng, 4), _sinks(rng, 4)])
    jq, jk, jv = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    # JAX's default device: the CPU (the cpu backend), or a GPU (where the numpy arrays would run too)
    backend = "cpu" if jq.devices().pop().platform == "cpu" else cutlassfa.select_backend(q, k, v)
    ref, ref_lse = attention_reference(q, k, v, causal=True, sinks=sinks[0])
    eager = cutlassfa.forward(jq, jk, jv, causal=True, sinks=jnp.asarray(sinks[0]), return_lse=True)
    jitted = jax.jit(lambda s: cutlassfa.forward(jq, jk, jv, causal=True, sinks=s, return_lse=True))(sinks[0])
    for out, lse in (eager, jitted):
        assert_close_on_host(backend, "float32", np.asarray(out), np.asarray(lse), ref, ref_lse)
    mapped = jax.vmap(lambda s: cutlassfa.forward(jq, jk, jv, causal=True, sinks=s))(jnp.asarray(sinks))
    for i in range(2):
        expected, _ = attention_reference(q, k, v, causal=True, sinks=sinks[i])
        assert rel_l2(np.asarray(mapped[i]), expected) <= bound_for(backend, "float32").rel_l2
    _, lse = cutlassfa.forward(jq, jk[:, :, :0], jv[:, :, :0], sinks=jnp.asarray(sinks[0]), return_lse=True)
    np.testing.assert_array_equal(np.asarray(lse), np.broadcast_to(sinks[0][None, :, None], lse.shape))


# --------------------------------------------------------------------------------------------------
# The GPU backends
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("shape", list(SCORE_TERM_SHAPES), ids=str)
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_gpu_dense_matches_reference(torch, rng, need_backend, backend, shape, splits):
    need_backend(backend)
    check_dense_on_gpu(torch, rng, backend, shape, splits, sinks=lambda rng, b, hq: _sinks(rng, hq))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_sink_dtypes_and_host_values(torch, rng, need_backend, backend, dtype):
    """bf16 / fp16 device sinks are converted on the device; host values are uploaded; fp32 inputs."""
    need_backend(backend)
    np_dtype = cutlassfa._arrays.numpy_dtype(dtype)
    q, k, v = random_qkv(rng, 2, 4, 2, 70, 150, 64, np_dtype)
    exact = np.array([-np.inf, 0.5, 3.0, -1.25], np.float32)
    ref, ref_lse = attention_reference(q, k, v, causal=True, sinks=exact)
    dq, dk, dv = (to_cuda(torch, x) for x in (q, k, v)) if dtype != "bfloat16" else \
        (torch.from_numpy(x.astype(np.float32)).cuda().bfloat16() for x in (q, k, v))
    for sinks in (torch.from_numpy(exact).cuda().bfloat16(), torch.from_numpy(exact).cuda().half(), exact.tolist(),
                  exact):
        out, lse = cutlassfa.forward(dq, dk, dv, causal=True, sinks=sinks, backend=backend, return_lse=True)
        assert_matches_reference(backend, dtype, out, lse, ref, ref_lse)
    # Host arrays through the GPU (numpy in, numpy out), sinks as host values of every dtype.
    import ml_dtypes

    for sinks in (exact, exact.astype(np.float16), exact.astype(ml_dtypes.bfloat16)):
        out, lse = cutlassfa.forward(q, k, v, causal=True, sinks=sinks, backend=backend, return_lse=True)
        assert_close_on_host(backend, dtype, out.astype(np.float64), lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("nq", [1, 5, 80])
def test_gpu_kv_cache_matches_reference(torch, rng, need_backend, backend, paged, nq):
    need_backend(backend)
    b, hq, hkv, d, cap, page = 4, 8, 2, 128, 512, 64
    q = rng.standard_normal((b, hq, nq, d)).astype(np.float16)
    lens = np.array([0, 37, 500, 200], np.int32)  # entry 0 sees no key (causal, no appended keys)
    k, v, table = random_cache(rng, b, hkv, cap, d, page, paged)
    sinks = _sinks(rng, hq)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, block_table=table, causal=True, sinks=sinks)
    for splits in (None, 1, 4):
        out, lse = cutlassfa.forward(*(to_cuda(torch, x) for x in (q, k, v)), cache_seqlens=to_cuda(torch, lens),
                                     block_table=None if table is None else to_cuda(torch, table), causal=True,
                                     sinks=to_cuda(torch, sinks), num_splits=splits, backend=backend, return_lse=True)
        assert_matches_reference(backend, "float16", out, lse, ref, ref_lse)
        np.testing.assert_array_equal(host64(lse)[0], np.broadcast_to(sinks[:, None], (hq, nq)))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_varlen_matches_reference(torch, rng, need_backend, backend):
    need_backend(backend)
    cu_q = np.array([0, 100, 100, 400, 401], np.int32)
    cu_k = np.array([0, 300, 340, 340, 900], np.int32)  # entry 2: no keys
    q = rng.standard_normal((401, 8, 64)).astype(np.float16)
    k, v = (rng.standard_normal((900, 2, 64)).astype(np.float16) for _ in range(2))
    sinks = _sinks(rng, 8)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, sinks=sinks)
    out, lse = cutlassfa.varlen_forward(*(to_cuda(torch, x) for x in (q, k, v)), to_cuda(torch, cu_q), to_cuda(torch, cu_k),
                                        max_seqlen_q=300, max_seqlen_k=560, causal=True, sinks=to_cuda(torch, sinks),
                                        backend=backend, return_lse=True)
    assert_close_on_host(backend, "float16", host64(out), host64(lse), ref, ref_lse)  # (total, H, d) and (H, total)
    np.testing.assert_array_equal(host64(lse)[:, 100:400], np.broadcast_to(sinks[:, None], (8, 300)))


@pytest.mark.gpu
def test_gpu_no_keys_fill_gives_the_sinks(torch, rng):
    q, k, v = random_qkv(rng, 2, 4, 2, 6, 0, 64)
    sinks = _sinks(rng, 4)
    out, lse = cutlassfa.forward(*(to_cuda(torch, x) for x in (q, k, v)), sinks=to_cuda(torch, sinks), return_lse=True)
    assert (host64(out) == 0).all()
    np.testing.assert_array_equal(host64(lse), np.broadcast_to(sinks[None, :, None], (2, 4, 6)))


@pytest.mark.gpu
def test_gpu_sinks_on_the_device_with_host_arrays_are_refused(torch, rng):
    q, k, v = random_qkv(rng, 1, 4, 2, 6, 9, 64)
    out = np.full(q.shape, 7, np.float16)
    with pytest.raises(ValueError, match=r"sinks must be on q's device \(host\), got cuda:0"):
        cutlassfa.forward(q, k, v, sinks=torch.zeros(4, device="cuda"), out=out)
    assert (out == 7).all()
