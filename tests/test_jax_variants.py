"""Every option of cutlassfa.forward / varlen_forward through JAX, under jax.jit and jax.vmap, in both
layouts (BHND and JAX's BNHD), against the float64 reference: windows, softcap, sinks, ALiBi, contiguous and
paged KV caches with appended keys (the updated caches returned, the inputs untouched), fp8 caches, varlen.
On JAX's CPU (the host callback, in CI) and, under the `gpu` marker, on its GPU (the FFI custom call).
Also the CUDA lowering of these calls, checked by exporting for CUDA on any machine: one custom call, no
transpose, the caches aliased."""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import cutlassfa  # noqa: E402
import cutlassfa.jax as cfa_jax  # noqa: E402
from cutlassfa.check import bound_for  # noqa: E402
from cutlassfa.integrations import jax as cutlassfa_jax  # noqa: E402
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2, varlen_reference  # noqa: E402

from attention_oracle import cache_after_append  # noqa: E402
from gpu_results import assert_close_on_host  # noqa: E402

_JNP = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}
_PLATFORMS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _device(platform: str):
    if platform == "cpu":
        return jax.devices("cpu")[0]
    try:
        device = jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("JAX has no CUDA device here")
    if not cutlassfa_jax.ffi_registered():
        pytest.skip("the extension was built without the JAX FFI handler (see cpp/jax/jax.cmake)")
    return device


def _put(x: np.ndarray, device, dtype: str | None = None):
    return jax.device_put(jnp.asarray(x, _JNP[dtype]) if dtype else jnp.asarray(x), device)


def _backend(platform: str, *host_args, **options) -> str:
    """The backend the call runs on that platform (the bounds are the backend's)."""
    return "cpu" if platform == "cpu" else cutlassfa.select_backend(*host_args, **options)


def _bnhd(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.swapaxes(-2, -3))


def _as_bhnd(x, layout: str) -> np.ndarray:
    """A result in `layout` as float32 numpy in (..., H, N, d)."""
    x = np.asarray(x, np.float32)
    return x if layout == "BHND" else x.swapaxes(-2, -3)


def _rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x as the call sees it in `dtype`, as float32 numpy (the reference's input)."""
    return np.asarray(jnp.asarray(x, _JNP[dtype]).astype(jnp.float32))


# --------------------------------------------------------------------------------------------------
# Dense calls with every score option, both layouts, jit and vmap
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("platform", _PLATFORMS)
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dense_options_under_jit(rng, platform, layout, dtype):
    device = _device(platform)
    b, hq, hk, nq, nk, d = 2, 4, 2, 37, 70, 64
    q, k, v = (_rounded(rng.standard_normal(s), dtype) for s in ((b, hq, nq, d), (b, hk, nk, d), (b, hk, nk, d)))
    sinks = rng.standard_normal(hq).astype(np.float32)
    slopes = rng.uniform(0.01, 0.2, (b, hq)).astype(np.float32)
    options = dict(window=(20, 3), softcap=15.0, sinks=sinks, alibi_slopes=slopes)
    ref, ref_lse = attention_reference(q, k, v, **options)
    args = (q, k, v) if layout == "BHND" else tuple(_bnhd(x) for x in (q, k, v))
    jq, jk, jv = (_put(x, device, dtype) for x in args)
    jsinks, jslopes = _put(sinks, device), _put(slopes, device)

    @jax.jit
    def call(q, k, v, sinks, slopes):
        return cfa_jax.forward(q, k, v, window=(20, 3), softcap=15.0, sinks=sinks, alibi_slopes=slopes,
                               layout=layout, return_lse=True)

    out, lse = call(jq, jk, jv, jsinks, jslopes)
    assert out.shape == jq.shape and out.dtype == jq.dtype and lse.shape == (b, hq, nq)
    backend = _backend(platform, q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), **options)
    assert_close_on_host(backend, dtype, _as_bhnd(out, layout), lse, ref, ref_lse)


@pytest.mark.parametrize("platform", _PLATFORMS)
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_vmap_folds_q_k_v_and_loops_other_operands(rng, platform, layout):
    device = _device(platform)
    dtype = "bfloat16"
    shape_q, shape_k = ((2, 4, 33, 64), (2, 2, 50, 64)) if layout == "BHND" else ((2, 33, 4, 64), (2, 50, 2, 64))
    qs = _put(rng.standard_normal((3,) + shape_q), device, dtype)
    k, v = (_put(rng.standard_normal(shape_k), device, dtype) for _ in range(2))
    sinks = _put(rng.standard_normal((3, 4)).astype(np.float32), device)
    plain = jax.jit(jax.vmap(lambda q: cfa_jax.forward(q, k, v, causal=True, layout=layout)))(qs)
    with_sinks = jax.jit(jax.vmap(lambda q, s: cfa_jax.forward(q, k, v, causal=True, sinks=s, layout=layout)))(qs,
                                                                                                              sinks)
    windowed = jax.jit(jax.vmap(lambda q: cfa_jax.forward(q, k, v, window=(9, 4), softcap=5.0, layout=layout)))(qs)
    kk, vv = (_as_bhnd(x, layout) for x in (k, v))
    backend = "cpu" if platform == "cpu" else "tensorcore"
    for i in range(3):
        qq = _as_bhnd(qs[i], layout)
        got = [_as_bhnd(x[i], layout) for x in (plain, with_sinks, windowed)]
        refs = [attention_reference(qq, kk, vv, causal=True)[0],
                attention_reference(qq, kk, vv, causal=True, sinks=np.asarray(sinks[i]))[0],
                attention_reference(qq, kk, vv, window=(9, 4), softcap=5.0)[0]]
        for out, ref in zip(got, refs):
            assert rel_l2(out, ref) <= bound_for(backend, dtype).rel_l2


# --------------------------------------------------------------------------------------------------
# KV caches: contiguous and paged, appended keys returned functionally, fp8
# --------------------------------------------------------------------------------------------------

def _cache_case(rng, paged: bool, b=3, hq=8, hk=2, nq=4, d=64, page=16, capacity=96, n_new=3):
    q = rng.standard_normal((b, hq, nq, d)).astype(np.float32)
    if paged:
        pages = b * capacity // page
        k, v = (rng.standard_normal((pages, hk, page, d)).astype(np.float32) for _ in range(2))
        table = rng.permutation(pages).reshape(b, capacity // page).astype(np.int32)
    else:
        k, v = (rng.standard_normal((b, hk, capacity, d)).astype(np.float32) for _ in range(2))
        table = None
    lengths = np.array([0, 41, capacity - n_new], np.int32)[:b]
    k_new, v_new = (rng.standard_normal((b, hk, n_new, d)).astype(np.float32) for _ in range(2))
    return q, k, v, table, lengths, k_new, v_new, page


@pytest.mark.parametrize("platform", _PLATFORMS)
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
@pytest.mark.parametrize("paged", [False, True])
def test_cache_with_appended_keys_returns_the_caches(rng, platform, layout, paged):
    device = _device(platform)
    dtype = "bfloat16"
    q, k, v, table, lengths, k_new, v_new, page = _cache_case(rng, paged)
    q, k, v, k_new, v_new = (_rounded(x, dtype) for x in (q, k, v, k_new, v_new))
    slopes = rng.uniform(0.01, 0.1, q.shape[1]).astype(np.float32)
    options = dict(cache_seqlens=lengths, block_table=table, causal=True, alibi_slopes=slopes)
    ref, ref_lse = kvcache_reference(q, k, v, k_new=k_new, v_new=v_new, **options)
    want_k, want_v = (cache_after_append(c, n, lengths, table, page) for c, n in ((k, k_new), (v, v_new)))
    host = (q, k, v, k_new, v_new) if layout == "BHND" else tuple(_bnhd(x) for x in (q, k, v, k_new, v_new))
    jq, jk, jv, jk_new, jv_new = (_put(x, device, dtype) for x in host)
    device_options = {name: None if value is None else _put(value, device) if isinstance(value, np.ndarray) else value
                      for name, value in options.items()}

    call = jax.jit(functools.partial(cfa_jax.forward, layout=layout, return_lse=True, **device_options))
    out, lse, k_after, v_after = call(jq, jk, jv, k_new=jk_new, v_new=jv_new)
    backend = _backend(platform, q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                       k_new=k_new.astype(np.float16), v_new=v_new.astype(np.float16), **options)
    assert_close_on_host(backend, dtype, _as_bhnd(out, layout), lse, ref, ref_lse)
    for after, want, given, cache in ((k_after, want_k, jk, k), (v_after, want_v, jv, v)):
        np.testing.assert_array_equal(_as_bhnd(after, layout), want)
        np.testing.assert_array_equal(_as_bhnd(given, layout), cache)  # the input is left as it was


@pytest.mark.parametrize("platform", _PLATFORMS)
def test_vmap_of_a_cache_call_with_appended_keys(rng, platform):
    """Per-entry lengths and appended keys under vmap: one call per mapped element, each as alone."""
    device = _device(platform)
    dtype = "bfloat16"
    cases = [_cache_case(rng, False, b=2) for _ in range(2)]
    stacked = [np.stack([_rounded(case[i], dtype) for case in cases]) for i in (0, 1, 2, 5, 6)]
    lengths = np.stack([np.array([7, 50], np.int32), np.array([0, 93], np.int32)])
    jq, jk, jv, jk_new, jv_new = (_put(x, device, dtype) for x in stacked)

    def one(q, k, v, k_new, v_new, n):
        return cfa_jax.forward(q, k, v, cache_seqlens=n, k_new=k_new, v_new=v_new, causal=True)

    out, k_after, v_after = jax.jit(jax.vmap(one))(jq, jk, jv, jk_new, jv_new, _put(lengths, device))
    backend = "cpu" if platform == "cpu" else "tensorcore"
    for e in range(2):
        q, k, v, k_new, v_new = (x[e] for x in stacked)
        ref, _ = kvcache_reference(q, k, v, k_new=k_new, v_new=v_new, cache_seqlens=lengths[e], causal=True)
        assert rel_l2(np.asarray(out[e], np.float64), ref) <= bound_for(backend, dtype).rel_l2
        np.testing.assert_array_equal(np.asarray(k_after[e], np.float32), cache_after_append(k, k_new, lengths[e]))
        np.testing.assert_array_equal(np.asarray(v_after[e], np.float32), cache_after_append(v, v_new, lengths[e]))


@pytest.mark.parametrize("platform", _PLATFORMS)
def test_vmap_of_a_paged_cache_call(rng, platform):
    """A pool of pages and a table per mapped element (e.g. per model replica), BNHD."""
    device = _device(platform)
    dtype = "float16"
    cases = [_cache_case(rng, True, b=2, capacity=64) for _ in range(2)]
    q, k, v, table = (np.stack([case[i] for case in cases]) for i in range(4))
    q, k, v = (_rounded(x, dtype) for x in (q, k, v))
    lengths = np.array([[5, 64], [33, 1]], np.int32)
    host = (_bnhd(q), _bnhd(k), _bnhd(v))
    jq, jk, jv = (_put(x, device, dtype) for x in host)

    def one(q, k, v, table, n):
        return cfa_jax.forward(q, k, v, cache_seqlens=n, block_table=table, window=(20, 0), layout="BNHD")

    out = jax.jit(jax.vmap(one))(jq, jk, jv, _put(table, device), _put(lengths, device))
    backend = "cpu" if platform == "cpu" else "tensorcore"
    for e in range(2):
        ref, _ = kvcache_reference(q[e], k[e], v[e], cache_seqlens=lengths[e], block_table=table[e], window=(20, 0))
        assert rel_l2(np.asarray(out[e], np.float64).swapaxes(1, 2), ref) <= bound_for(backend, dtype).rel_l2


@pytest.mark.parametrize("platform", _PLATFORMS)
@pytest.mark.parametrize("paged", [False, True])
def test_fp8_cache_under_jit(rng, platform, paged):
    device = _device(platform)
    import ml_dtypes

    q, k, v, table, lengths, _, _, page = _cache_case(rng, paged)
    fp8 = ml_dtypes.float8_e4m3fn
    k8, v8 = (np.asarray(x * 8).astype(fp8) for x in (k, v))
    descale = np.full((q.shape[0], k.shape[1]), 0.125, np.float32)
    options = dict(cache_seqlens=lengths, block_table=table, k_descale=descale, v_descale=0.125)
    q = _rounded(q, "bfloat16")
    ref, ref_lse = kvcache_reference(q, k8.astype(np.float32), v8.astype(np.float32), **options)
    jq = _put(q, device, "bfloat16")
    jk, jv = (jax.device_put(jnp.asarray(x), device) for x in (k8, v8))
    device_options = {name: _put(value, device) if isinstance(value, np.ndarray) else value
                      for name, value in options.items() if value is not None}
    out, lse = jax.jit(functools.partial(cfa_jax.forward, return_lse=True, **device_options))(jq, jk, jv)
    backend = "cpu" if platform == "cpu" else "tensorcore"
    assert_close_on_host(backend, "bfloat16", out, lse, ref, ref_lse)


# --------------------------------------------------------------------------------------------------
# varlen
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("platform", _PLATFORMS)
def test_varlen_under_jit(rng, platform):
    device = _device(platform)
    dtype = "float16"
    lengths_q, lengths_k = [5, 0, 33, 17], [9, 4, 40, 17]
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = _rounded(rng.standard_normal((cu_q[-1], 4, 64)), dtype)
    k, v = (_rounded(rng.standard_normal((cu_k[-1], 2, 64)), dtype) for _ in range(2))
    sinks = rng.standard_normal(4).astype(np.float32)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, window=(12, 0), sinks=sinks)
    jq, jk, jv = (_put(x, device, dtype) for x in (q, k, v))
    jcu_q, jcu_k, jsinks = (_put(x, device) for x in (cu_q, cu_k, sinks))
    call = jax.jit(functools.partial(cfa_jax.varlen_forward, max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k),
                                     causal=True, window=(12, 0), return_lse=True))
    out, lse = call(jq, jk, jv, jcu_q, jcu_k, sinks=jsinks)
    assert lse.shape == (4, cu_q[-1])
    backend = _backend(platform, q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                       cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, window=(12, 0), sinks=sinks)
    assert_close_on_host(backend, dtype, out, lse, ref, ref_lse)
    # cutlassfa.varlen_forward takes JAX arrays through the same path
    eager = cutlassfa.varlen_forward(jq, jk, jv, jcu_q, jcu_k, causal=True, window=(12, 0), sinks=jsinks)
    assert_close_on_host(backend, dtype, eager, lse, ref, ref_lse)


@pytest.mark.parametrize("platform", _PLATFORMS)
def test_varlen_under_vmap(rng, platform):
    device = _device(platform)
    dtype = "bfloat16"
    cu = np.array([[0, 10, 10, 24], [0, 3, 20, 24]], np.int32)
    q, k, v = (_rounded(rng.standard_normal((2, 24, 4, 64)), dtype) for _ in range(3))
    call = jax.jit(jax.vmap(lambda q, k, v, cu: cfa_jax.varlen_forward(q, k, v, cu, cu, max_seqlen_q=17,
                                                                       max_seqlen_k=17, causal=True, softcap=4.0)))
    out = call(*(_put(x, device, dtype) for x in (q, k, v)), _put(cu, device))
    backend = "cpu" if platform == "cpu" else "tensorcore"
    for e in range(2):
        ref, _ = varlen_reference(q[e], k[e], v[e], cu[e], cu[e], causal=True, softcap=4.0)
        assert rel_l2(np.asarray(out[e], np.float64), ref) <= bound_for(backend, dtype).rel_l2


def test_varlen_max_seqlen_must_be_static(rng):
    q = jnp.zeros((8, 2, 64), jnp.float16)
    cu = jnp.asarray([0, 8], jnp.int32)
    with pytest.raises(TypeError, match="max_seqlen_q must be a Python int"):
        jax.jit(lambda m: cfa_jax.varlen_forward(q, q, q, cu, cu, max_seqlen_q=m))(jnp.int32(8))


def test_refusals_name_the_argument():
    q = jnp.zeros((1, 2, 8, 64), jnp.float16)
    with pytest.raises(ValueError, match="layout"):
        cfa_jax.forward(q, q, q, layout="NHD")
    with pytest.raises(TypeError, match="cutlassfa.jax.forward"):
        cutlassfa.forward(q, q, q, cache_seqlens=jnp.zeros((1,), jnp.int32), k_new=q, v_new=q)
    with pytest.raises(ValueError, match="cache_seqlens"):  # the extension's validator, at trace time
        jax.jit(lambda q, n: cfa_jax.forward(q, q, q, cache_seqlens=n))(q, jnp.zeros((3,), jnp.int32))


# --------------------------------------------------------------------------------------------------
# The CUDA lowering, on any machine
# --------------------------------------------------------------------------------------------------

def _cuda_module(fn, *args) -> str:
    no_guarantee = [jax.export.DisabledSafetyCheck.custom_call(cutlassfa_jax.FFI_TARGET)]
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=no_guarantee)(*shapes).mlir_module()


def _ffi_call(**statics) -> cutlassfa_jax._Call:
    return cutlassfa_jax._Call(False, 0.125, "cpu", "tensorcore", 3, **statics)


def test_bnhd_lowering_has_no_transpose():
    call = _ffi_call(layout="BNHD", window=(64, 0), softcap=30.0)
    q = jnp.zeros((2, 100, 8, 128), jnp.bfloat16)
    k = jnp.zeros((2, 120, 2, 128), jnp.bfloat16)
    text = _cuda_module(lambda q, k, v: cutlassfa_jax._attention_impl(call, q, k, v), q, k, k)
    lines = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert len(lines) == 1 and "@cutlassfa_forward(" in lines[0]
    for attribute in ("layout = 1 : i32", "window_left = 64", "window_right = 0", "softcap = 3.000000e+01"):
        assert attribute in lines[0]
    assert "(tensor<2x100x8x128xbf16>, tensor<2x8x100xf32>)" in lines[0]  # out (BNHD), lse (B, H, N)
    assert "stablehlo.transpose" not in text and "callback" not in text


def test_drop_in_lowers_to_one_custom_call_without_transpose(monkeypatch):
    from cutlassfa.jax import dot_product_attention

    q = jnp.zeros((4, 256, 16, 128), jnp.bfloat16)
    k = jnp.zeros((4, 256, 4, 128), jnp.bfloat16)
    # As on a machine with a GPU and the handler: the call validated, then resolved to tensorcore.
    validate = cutlassfa.select_backend
    monkeypatch.setattr(cutlassfa, "select_backend", lambda *a, **o: validate(*a, **o) and "tensorcore")
    monkeypatch.setattr(cutlassfa_jax, "ffi_registered", lambda: True)
    text = _cuda_module(lambda q, k, v: dot_product_attention(q, k, v, is_causal=True), q, k, k)
    assert text.count("stablehlo.custom_call @cutlassfa_forward(") == 1 and "stablehlo.transpose" not in text
    line = next(line for line in text.splitlines() if "stablehlo.custom_call" in line)
    assert "(tensor<4x256x16x128xbf16>, tensor<0xf32>)" in line  # no lse asked for: none written


def test_appending_call_aliases_the_caches():
    call = _ffi_call(arrays=(("cache_seqlens", 1), ("k_new", 4), ("v_new", 4)))
    q = jnp.zeros((2, 4, 1, 64), jnp.bfloat16)
    k = jnp.zeros((2, 2, 128, 64), jnp.bfloat16)
    new = jnp.zeros((2, 2, 1, 64), jnp.bfloat16)
    lengths = jnp.zeros((2,), jnp.int32)
    text = _cuda_module(lambda q, k, v, n, kn, vn: cutlassfa_jax._attention_impl(call, q, k, v, n, kn, vn),
                        q, k, k, lengths, new, new)
    line = next(line for line in text.splitlines() if "stablehlo.custom_call" in line)
    assert 'operands = "cache_seqlens,k_new,v_new"' in line
    assert "output_operand_aliases" in line
    assert "tensor<2x2x128x64xbf16>, tensor<2x2x128x64xbf16>)" in line  # the caches among the results


def test_ffi_handler_reads_every_option_on_xla_cpu(rng, ffi_harness):
    """The real handler on XLA's CPU platform (tests/jax_ffi_harness): a BNHD dense call is computed and
    compared; cache, paged, fp8 and varlen calls are decoded into the Problem the extension would build."""
    with jax.default_device(jax.devices("cpu")[0]):  # JAX's default device is a GPU where one is present
        _handler_cases(rng, ffi_harness)


def _handler_cases(rng, ffi_harness):
    q = jnp.asarray(rng.standard_normal((2, 33, 4, 64)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((2, 50, 2, 64)), jnp.float32) for _ in range(2))
    call = _ffi_call(layout="BNHD", window=(10, 2))
    out, lse = jax.jit(lambda q, k, v: cutlassfa_jax._on_device(call, q, k, v))(q, k, v)
    ref, ref_lse = attention_reference(*(np.asarray(x).swapaxes(1, 2) for x in (q, k, v)), window=(10, 2),
                                       softmax_scale=0.125)
    assert rel_l2(np.asarray(out).swapaxes(1, 2), ref) < 1e-5
    np.testing.assert_allclose(np.asarray(lse), ref_lse, atol=1e-4)
    p = ffi_harness.last_params()
    assert p["q_strides"] == (33 * 4 * 64, 64, 4 * 64) and p["k_strides"] == (50 * 2 * 64, 64, 2 * 64)
    assert p["lse_strides"] == (4 * 33, 33) and p["window"] == (10, 2) and p["variant"] and p["lse"]
    no_lse = _ffi_call(layout="BNHD", window=(10, 2), lse=False)
    out, lse = jax.jit(lambda q, k, v: cutlassfa_jax._on_device(no_lse, q, k, v))(q, k, v)
    assert lse.shape == (0,) and not ffi_harness.last_params()["lse"]
    assert rel_l2(np.asarray(out).swapaxes(1, 2), ref) < 1e-5

    # A paged fp8 cache with appended keys, sinks and per-entry descales, BNHD.
    pages, page, hk, d = 12, 16, 2, 64
    q = jnp.zeros((3, 2, 4, d), jnp.bfloat16)
    cache = jnp.zeros((pages, page, hk, d), jnp.float8_e4m3fn)
    new = jnp.zeros((3, 2, hk, d), jnp.float8_e4m3fn)
    lengths = jnp.asarray([3, 20, 40], jnp.int32)
    table = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    sinks = jnp.zeros((4,), jnp.float32)
    descale = jnp.ones((3, hk), jnp.float32)
    call = _ffi_call(layout="BNHD", arrays=(("cache_seqlens", 1), ("block_table", 2), ("k_new", 4), ("v_new", 4),
                                            ("sinks", 1), ("k_descale", 2)))
    results = jax.jit(lambda *a: cutlassfa_jax._on_device(call, *a))(q, cache, cache, lengths, table, new, new, sinks,
                                                                      descale)
    assert len(results) == 4 and results[2].shape == cache.shape
    p = ffi_harness.last_params()
    assert (p["kv_cache"], p["paged"], p["kv_fp8"], p["appended"]) == (True, True, True, True)
    assert (p["page_size"], p["num_pages"], p["block_table_stride"], p["seqlen_k"], p["n_new"]) == (16, 12, 4, 64, 2)
    assert p["k_strides"] == (page * hk * d, d, hk * d)
    assert p["given"] == (True, False, True, False, False, True, False, True, False)
    assert p["k_descale_strides"] == (hk, 1)

    # varlen: (total, H, d), max_seqlen from the call, lse (H, total_q)
    q = jnp.zeros((30, 4, 64), jnp.float16)
    k = jnp.zeros((50, 2, 64), jnp.float16)
    cu_q, cu_k = jnp.asarray([0, 10, 30], jnp.int32), jnp.asarray([0, 25, 50], jnp.int32)
    call = cutlassfa_jax._Call(False, None, "cpu", "tensorcore", 3, arrays=(("cu_seqlens_q", 1), ("cu_seqlens_k", 1)),
                               max_seqlen=(20, 25))  # the default scale: resolved by the handler
    jax.jit(lambda *a: cutlassfa_jax._on_device(call, *a))(q, k, k, cu_q, cu_k)
    p = ffi_harness.last_params()
    assert p["softmax_scale"] == np.float32(1 / np.sqrt(64))
    assert (p["varlen"], p["batch"], p["seqlen_q"], p["seqlen_k"], p["total_q"], p["total_k"]) == (
        True, 2, 20, 25, 30, 50)
    assert p["q_strides"] == (0, 64, 4 * 64) and p["lse_strides"] == (0, 30) and p["num_splits"] == 1

    with pytest.raises(Exception, match="unknown operand"):
        call = _ffi_call(arrays=(("lengths", 1),))
        jax.jit(lambda *a: cutlassfa_jax._on_device(call, *a))(q, k, k, cu_q)[0].block_until_ready()
