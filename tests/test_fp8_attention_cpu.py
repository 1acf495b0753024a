"""fp8 attention: q, k and v of float8_e4m3fn with q_descale / k_descale / v_descale (FlashAttention-3's
convention: query head h reads the descale of its K/V head, h // (Hq / Hkv)), the result in out_dtype
(bfloat16 by default, float16 allowed). The cpu backend and the float64 reference, through every entry:
`forward` (dense 4-D and 3-D, KV caches with appended fp8 keys), `varlen_forward`, PyTorch CPU tensors
(eager, the operator under torch.compile) and JAX (jit, a host callback).

The expected result is computed here from inputs dequantized by hand (numpy broadcasting of the scales,
not the helper under test), in float64. Bad arguments raise, naming the argument, with `out` untouched."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2, varlen_reference

ml_dtypes = pytest.importorskip("ml_dtypes", reason="optional package ml_dtypes (float8_e4m3fn)")
F8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
HQ, HKV = 8, 2
FORMS = [None, "float", "head", "entry_head"]
# The output rounds once from float32 to bfloat16 (8 bits of mantissa): ~2e-3 relative per element.
OUT_BOUND = {"bfloat16": 8e-3, "float16": 2e-3}


def fp8(rng, shape, spread=4.0):
    """Random fp8 values over e4m3's range (|x| up to ~16, many exponents)."""
    return (rng.standard_normal(shape) * spread).astype(F8)


def draw(rng, form, batch, heads=HKV):
    """A random descale of one accepted form, 0.05..0.5: small enough that a forgotten scale shows."""
    if form is None:
        return None
    if form == "float":
        return float(rng.uniform(0.05, 0.5))
    return rng.uniform(0.05, 0.5, (heads,) if form == "head" else (batch, heads)).astype(np.float32)


def table(descale, batch, heads=HKV):
    """The (B, Hkv) scales a descale stands for (float32 values, as the call reads them)."""
    return np.ones((batch, heads)) * (1.0 if descale is None else np.asarray(descale, np.float32).astype(np.float64))


def by_hand(x, descale, heads_kv=HKV):
    """x (B, H, N, d) in float64 times its descale, head h reading entry h // (H / heads_kv)."""
    scales = np.repeat(table(descale, x.shape[0], heads_kv), x.shape[1] // heads_kv, axis=1)
    return x.astype(np.float64) * scales[:, :, None, None]


@pytest.mark.parametrize("q_form, k_form, v_form", [(f, g, h) for f, g, h in
                                                     zip(FORMS, FORMS[1:] + FORMS[:1], FORMS[2:] + FORMS[:2])])
@pytest.mark.parametrize("out_dtype", [None, "float16"])
@pytest.mark.parametrize("mask", [{}, {"causal": True}, {"window": (24, 8), "softcap": 10.0}])
def test_dense_fp8_matches_the_dequantized_reference(rng, q_form, k_form, v_form, out_dtype, mask):
    b, nq, nk, d = 2, 40, 72, 64
    q, k, v = fp8(rng, (b, HQ, nq, d)), fp8(rng, (b, HKV, nk, d)), fp8(rng, (b, HKV, nk, d), 1.0)
    qd, kd, vd = draw(rng, q_form, b), draw(rng, k_form, b), draw(rng, v_form, b)
    out, lse = cutlassfa.forward(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, out_dtype=out_dtype,
                                 backend="cpu", return_lse=True, **mask)
    expected, expected_lse = attention_reference(by_hand(q, qd), by_hand(k, kd), by_hand(v, vd), **mask)
    name = out_dtype or "bfloat16"
    assert out.dtype == (BF16 if name == "bfloat16" else np.float16) and lse.dtype == np.float32
    assert rel_l2(out, expected) < OUT_BOUND[name]
    assert np.abs(lse - expected_lse).max() < 1e-4 * np.abs(expected_lse).max()
    # The reference itself takes the descales as the hand-made inputs mean them.
    ref, ref_lse = attention_reference(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, **mask)
    np.testing.assert_allclose(ref, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref_lse, expected_lse, rtol=1e-12)


def test_a_forgotten_descale_changes_the_result(rng):
    q, k, v = fp8(rng, (1, HQ, 16, 32)), fp8(rng, (1, HKV, 16, 32)), fp8(rng, (1, HKV, 16, 32), 1.0)
    qd = np.array([0.1, 0.4], np.float32)
    scaled = cutlassfa.forward(q, k, v, q_descale=qd, backend="cpu").astype(np.float32)
    plain = cutlassfa.forward(q, k, v, backend="cpu").astype(np.float32)
    swapped = cutlassfa.forward(q, k, v, q_descale=qd[::-1].copy(), backend="cpu").astype(np.float32)
    assert rel_l2(scaled, plain) > 0.05 and rel_l2(scaled, swapped) > 0.05  # which K/V head's entry matters


def test_three_dim_arrays_are_one_head(rng):
    q, k, v = fp8(rng, (3, 20, 32)), fp8(rng, (3, 30, 32)), fp8(rng, (3, 30, 32), 1.0)
    qd, kd = np.array([[0.2], [0.3], [0.4]], np.float32), 0.25
    out = cutlassfa.forward(q, k, v, causal=True, q_descale=qd, k_descale=kd, backend="cpu")
    expected, _ = attention_reference(by_hand(q[:, None], qd, 1), by_hand(k[:, None], kd, 1),
                                      v[:, None].astype(np.float64), causal=True)
    assert out.shape == q.shape and rel_l2(out, expected[:, 0]) < OUT_BOUND["bfloat16"]


def test_out_is_written_in_out_dtype(rng):
    q, k, v = fp8(rng, (1, HQ, 8, 32)), fp8(rng, (1, HKV, 8, 32)), fp8(rng, (1, HKV, 8, 32))
    out = np.full(q.shape, np.nan, np.float16)
    got = cutlassfa.forward(q, k, v, out=out, out_dtype=np.float16, backend="cpu")
    assert got is out and not np.isnan(out).any()
    with pytest.raises(TypeError, match="out must have dtype bfloat16"):
        cutlassfa.forward(q, k, v, out=np.zeros(q.shape, np.float16), backend="cpu")


def test_varlen_fp8_with_per_entry_descales(rng):
    cu_q, cu_k = np.array([0, 5, 5, 37], np.int32), np.array([0, 9, 20, 64], np.int32)  # an empty query entry
    q, k, v = fp8(rng, (37, HQ, 64)), fp8(rng, (64, HKV, 64)), fp8(rng, (64, HKV, 64), 1.0)
    qd, kd, vd = (draw(rng, "entry_head", 3) for _ in range(3))
    out, lse = cutlassfa.varlen_forward(q, k, v, cu_q, cu_k, causal=True, q_descale=qd, k_descale=kd, v_descale=vd,
                                        out_dtype="float16", backend="cpu", return_lse=True)
    rows_q, rows_k = np.repeat(np.arange(3), np.diff(cu_q)), np.repeat(np.arange(3), np.diff(cu_k))
    group = HQ // HKV
    dq = q.astype(np.float64) * np.repeat(qd, group, axis=1)[rows_q][:, :, None]
    dk, dv = (x.astype(np.float64) * s[rows_k][:, :, None] for x, s in ((k, kd), (v, vd)))
    expected, expected_lse = varlen_reference(dq, dk, dv, cu_q, cu_k, causal=True)
    assert out.dtype == np.float16 and rel_l2(out, expected) < OUT_BOUND["float16"]
    seen = np.isfinite(expected_lse)
    assert np.abs(lse[seen] - expected_lse[seen]).max() < 1e-3
    ref, _ = varlen_reference(q, k, v, cu_q, cu_k, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    np.testing.assert_allclose(ref, expected, rtol=1e-12, atol=1e-12)


def test_fp8_q_over_an_fp8_cache_appends_the_new_keys(rng):
    b, cap, d, n_new = 3, 48, 64, 2
    lengths = np.array([0, 17, 40], np.int32)
    k_cache, v_cache = fp8(rng, (b, HKV, cap, d)), fp8(rng, (b, HKV, cap, d), 1.0)
    k_new, v_new = fp8(rng, (b, HKV, n_new, d)), fp8(rng, (b, HKV, n_new, d), 1.0)
    q = fp8(rng, (b, HQ, n_new, d))
    qd, kd, vd = draw(rng, "entry_head", b), draw(rng, "head", b), 0.3
    before_k, before_v = k_cache.copy(), v_cache.copy()
    expected, _ = kvcache_reference(q, before_k, before_v, cache_seqlens=lengths, k_new=k_new, v_new=v_new,
                                    causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    out = cutlassfa.forward(q, k_cache, v_cache, cache_seqlens=lengths, k_new=k_new, v_new=v_new, causal=True,
                            q_descale=qd, k_descale=kd, v_descale=vd, backend="cpu")
    assert out.dtype == BF16 and rel_l2(out, expected) < OUT_BOUND["bfloat16"]
    for i, n in enumerate(lengths):  # the new keys land in the caches as fp8 bytes
        assert k_cache[i, :, n:n + n_new].tobytes() == k_new[i].tobytes()
        assert v_cache[i, :, n:n + n_new].tobytes() == v_new[i].tobytes()
    # q's descale is its K/V head's: the reference on q dequantized by hand agrees.
    by_hand_q, _ = kvcache_reference(by_hand(q, qd), before_k, before_v, cache_seqlens=lengths, k_new=k_new,
                                     v_new=v_new, causal=True, k_descale=kd, v_descale=vd)
    np.testing.assert_allclose(by_hand_q, expected, rtol=1e-12, atol=1e-12)


BAD_CALLS = [
    (dict(out_dtype="float32"), ValueError, "out_dtype of fp8 attention must be bfloat16 or float16"),
    (dict(out_dtype=3), TypeError, "out_dtype must be a dtype or its name"),
    (dict(q_descale=np.ones(3, np.float32)), ValueError, r"q_descale must have shape \(\) \(a float\), \(2,\)"),
    (dict(q_descale=np.ones(2, np.int32)), TypeError, "q_descale must be float32"),
    (dict(k_descale=float("nan")), ValueError, "k_descale must be finite"),
    (dict(q="float16"), TypeError, "fp8 attention over dense or packed arrays takes a float8_e4m3fn q too"),
    (dict(k="float16", v="float16"), TypeError, "q is float8_e4m3fn: k and v must be float8_e4m3fn too"),
    (dict(q="float16", k="float16", v="float16", q_descale=1.0), ValueError, "q_descale scales a float8_e4m3fn q"),
    (dict(q="float16", k="float16", v="float16", out_dtype="bfloat16"), ValueError,
     "out_dtype is for fp8 attention"),
]


@pytest.mark.parametrize("change, error, message", BAD_CALLS)
def test_bad_fp8_calls_raise_naming_the_argument_and_write_nothing(rng, change, error, message):
    arrays = {"q": fp8(rng, (2, HQ, 8, 32)), "k": fp8(rng, (2, HKV, 8, 32)), "v": fp8(rng, (2, HKV, 8, 32))}
    options = dict(change)
    for name in ("q", "k", "v"):
        if isinstance(options.get(name), str):
            arrays[name] = arrays[name].astype(np.float32).astype(options.pop(name))
    is_fp8 = arrays["q"].dtype == F8
    out = np.full(arrays["q"].shape, 7, BF16 if is_fp8 else arrays["q"].dtype)
    with pytest.raises(error, match=message):
        cutlassfa.forward(*arrays.values(), out=out, backend="cpu", **options)
    assert (out.astype(np.float32) == 7).all()


def test_supports_says_fp8_attention_runs_on_the_cpu_backend():
    assert cutlassfa.supports("cpu", "float8_e4m3fn", 128).ok
    assert cutlassfa.supports("cpu", "float8_e4m3fn", 64, varlen=True, causal=True).ok
    refused = cutlassfa.supports("cpu", "float8_e5m2", 64)
    assert not refused.ok and "float8_e4m3fn" in refused.reason


def test_the_refusals_name_the_backend_the_device_and_the_head_dims():
    # No GPU needed: the extension's refusal (what `supports` and the validator say) for a device of no
    # capability, and for each backend.
    refusal = cutlassfa._C.head_dim_refusal
    for backend in ("tensorcore_sm80", "large_tile", "small_tile", "naive"):
        reason = refusal(getattr(cutlassfa._C.Backend, backend), 128, "float8_e4m3fn")
        assert "no fp8 attention kernel" in reason and "tensorcore backend runs it on sm_90" in reason
    reason = refusal(cutlassfa._C.Backend.tensorcore, 128, "float8_e4m3fn")
    if not cutlassfa._C.head_dims["sm90ws_fp8"]:
        assert "this build does not have" in reason
    elif cutlassfa.device_info().get("compute_capability") != (9, 0):
        assert "sm_90 only" in reason
    assert "fp8" not in refusal(cutlassfa._C.Backend.tensorcore, 128, "bfloat16")


@pytest.mark.parametrize("option", ["varlen", "kv_cache", "softcap", "alibi", "split"])
def test_the_gpu_kernel_options_refusal_names_the_option(option):
    """What `supports` asks for fp8 attention on a GPU backend before any array exists: the same words as
    the call's refusal (request.cpp), one option at a time."""
    flags = dict.fromkeys(("varlen", "kv_cache", "softcap", "alibi", "split"), False)
    assert cutlassfa._C.fp8_attention_options_refusal(**flags) == ""
    reason = cutlassfa._C.fp8_attention_options_refusal(**{**flags, option: True})
    named = {"varlen": "varlen batch", "kv_cache": "KV cache", "softcap": "softcap", "alibi": "alibi_slopes",
             "split": "num_splits > 1"}[option]
    assert reason.startswith("fp8 attention") and reason.split("; got ")[1].startswith(("a " + named, named))


def test_a_plan_for_sm90_takes_the_fp8_kernel_and_others_refuse(rng):
    if not hasattr(cutlassfa._C, "plan"):
        pytest.skip("build: planning for a GPU needs the CUDA build of the extension")
    dims = cutlassfa._C.head_dims["sm90ws_fp8"]
    if not dims:
        pytest.skip("build: no fp8 head dims (an sm_90a build lists them)")
    d = dims[0]
    q, k = fp8(rng, (1, HQ, 64, d)), fp8(rng, (1, HKV, 64, d))
    plan = cutlassfa.plan(q, k, k, causal=True, backend="tensorcore", device=(90, 132))
    assert plan["kernel"] == "sm90ws" and plan["num_splits"] == 1 and not plan["fp8_dequantized"]
    # sm_89: refused as fp8 attention's (a build with sm_80 kernels), or as no kernel at all (an sm_90a-only build)
    with pytest.raises((ValueError, RuntimeError), match="sm_90 only|not compiled for sm_89"):
        cutlassfa.plan(q, k, k, backend="tensorcore", device=(89, 128))
    with pytest.raises(ValueError, match="no fp8 attention kernel"):
        cutlassfa.plan(q, k, k, backend="tensorcore_sm80", device=(90, 132))
    with pytest.raises(ValueError, match="softcap"):
        cutlassfa.plan(q, k, k, backend="tensorcore", device=(90, 132), softcap=5.0)
    q96 = fp8(rng, (1, HQ, 64, 96))
    with pytest.raises(ValueError, match="head dims"):
        cutlassfa.plan(q96, q96[:, :HKV], q96[:, :HKV], backend="tensorcore", device=(90, 132))


# --- frameworks -----------------------------------------------------------------------------------------

def test_torch_cpu_tensors_eager_and_compiled(rng):
    torch = pytest.importorskip("torch", reason="optional package torch")
    q, k, v = fp8(rng, (2, HQ, 24, 64)), fp8(rng, (2, HKV, 24, 64)), fp8(rng, (2, HKV, 24, 64), 1.0)
    qd = draw(rng, "head", 2)
    as_torch = [torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn) for x in (q, k, v)]
    expected, _ = attention_reference(by_hand(q, qd), by_hand(k, 0.5), v.astype(np.float64), causal=True)

    def attend(q, k, v):
        return cutlassfa.forward(q, k, v, causal=True, q_descale=torch.from_numpy(qd), k_descale=0.5,
                                 out_dtype=torch.float16, backend="cpu")  # host tensors may run on a GPU

    eager = attend(*as_torch)
    assert eager.dtype == torch.float16 and rel_l2(eager.numpy(), expected) < OUT_BOUND["float16"]
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)(*as_torch)
    assert compiled.dtype == torch.float16 and torch.equal(compiled, eager)


def test_jax_jit_and_varlen(rng):
    jax = pytest.importorskip("jax", reason="optional package jax")
    jnp = jax.numpy
    q, k, v = fp8(rng, (2, HQ, 24, 64)), fp8(rng, (2, HKV, 24, 64)), fp8(rng, (2, HKV, 24, 64), 1.0)
    qd = draw(rng, "entry_head", 2)
    expected, _ = attention_reference(by_hand(q, qd), k.astype(np.float64), by_hand(v, 0.25), causal=True)
    attend = jax.jit(lambda q, k, v: cutlassfa.forward(q, k, v, causal=True, q_descale=jnp.asarray(qd),
                                                       v_descale=0.25, out_dtype=jnp.float16, backend="cpu"))
    got = attend(*(jnp.asarray(x) for x in (q, k, v)))
    assert got.dtype == jnp.float16 and rel_l2(np.asarray(got), expected) < OUT_BOUND["float16"]
    cu = np.array([0, 10, 24], np.int32)
    rows = lambda x: x[0].transpose(1, 0, 2)  # noqa: E731  (entry 0's (N, H, d) rows, as a packed batch)
    packed = cutlassfa.varlen_forward(*(jnp.asarray(rows(x)) for x in (q, k, v)), cu, cu, causal=True,
                                      q_descale=qd[0], v_descale=0.25)
    expected_packed, _ = varlen_reference(rows(q), rows(k), rows(v), cu, cu, causal=True, q_descale=qd[0],
                                          v_descale=0.25)
    assert packed.dtype == jnp.bfloat16 and rel_l2(np.asarray(packed), expected_packed) < OUT_BOUND["bfloat16"]
