"""fp8 attention on the GPU (the tensorcore backend's sm90ws fp8 kernel, sm_90): float8_e4m3fn q, k and v
with the three descale shapes against float64 attention of the dequantized inputs, GQA, causal and
windows, sinks, Nq != Nk, out_dtype bfloat16 / float16, `out=`, lse; the plan; and the refusals (other backends,
head dims, options). Skips cleanly without an sm_90 GPU, PyTorch with CUDA, or ml_dtypes.

The bound of O is the e4m3 rounding of P (bench/fp8_rounding_model.py: 2.0-2.8 % rel-L2 on random inputs),
with room: 4 %."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa.reference import attention_reference, rel_l2
from gpu_results import host64

pytestmark = pytest.mark.gpu
ml_dtypes = pytest.importorskip("ml_dtypes", reason="optional package ml_dtypes (float8_e4m3fn)")
F8 = np.dtype(ml_dtypes.float8_e4m3fn)
O_BOUND = 0.04   # P in e4m3 (the model's 2.0-2.8 %), then O's own rounding
LSE_BOUND = 1e-2  # lse from S, which Hopper's fp8 MMA accumulates with ~14 bits (H100: up to 5e-3 here)
FORMS = [None, "float", "head", "entry_head"]


def fp8_head_dims() -> tuple[int, ...]:
    return tuple(cutlassfa._C.head_dims.get("sm90ws_fp8", ())) if cutlassfa._C is not None else ()


@pytest.fixture
def fp8_hopper(hopper):
    """torch on an sm_90 GPU with an sm_90a build that lists fp8 head dims."""
    if not fp8_head_dims():
        pytest.skip("build: no fp8 head dims (CUTLASSFA_SM90WS_FP8_HEAD_DIMS)")
    return hopper


def fp8(rng, shape, spread=3.0):
    return (rng.uniform(-spread, spread, shape)).astype(F8)


def descale(rng, form, batch, heads_kv):
    if form is None:
        return None
    if form == "float":
        return float(rng.uniform(0.25, 1.0))
    return rng.uniform(0.25, 1.0, (heads_kv,) if form == "head" else (batch, heads_kv)).astype(np.float32)


def dequantized(x, scale, heads_kv):
    """x (B, H, N, d) in float64 times its descale, head h reading entry h // (H / heads_kv)."""
    table = np.ones((x.shape[0], heads_kv)) * (1.0 if scale is None else np.asarray(scale, np.float64))
    return x.astype(np.float64) * np.repeat(table, x.shape[1] // heads_kv, axis=1)[:, :, None, None]


def to_cuda_fp8(torch, x):
    return torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn).cuda()


def run_case(torch, rng, d, b, hq, hkv, nq, nk, forms, out_dtype=None, causal=False, window=None, out=None,
             sinks=None):
    q, k, v = fp8(rng, (b, hq, nq, d)), fp8(rng, (b, hkv, nk, d)), fp8(rng, (b, hkv, nk, d))
    qd, kd, vd = (descale(rng, f, b, hkv) for f in forms)
    as_torch = lambda s: s if s is None or isinstance(s, float) else torch.from_numpy(s).cuda()  # noqa: E731
    got, lse = cutlassfa.forward(to_cuda_fp8(torch, q), to_cuda_fp8(torch, k), to_cuda_fp8(torch, v),
                                 q_descale=as_torch(qd), k_descale=as_torch(kd), v_descale=as_torch(vd),
                                 out_dtype=out_dtype, causal=causal, window=window, out=out, return_lse=True,
                                 sinks=as_torch(sinks), backend="tensorcore")
    ref, ref_lse = attention_reference(dequantized(q, qd, hkv), dequantized(k, kd, hkv), dequantized(v, vd, hkv),
                                       causal=causal, window=window, sinks=sinks)
    return got, lse, ref, ref_lse


def assert_close(got, lse, ref, ref_lse):
    out, lse = host64(got), host64(lse)
    assert np.isfinite(out).all()
    assert rel_l2(out, ref) <= O_BOUND
    empty = np.isneginf(ref_lse)
    assert (np.isneginf(lse) == empty).all() and (out[empty] == 0).all()
    assert np.abs(lse[~empty] - ref_lse[~empty]).max(initial=0.0) <= LSE_BOUND


@pytest.mark.parametrize("forms", [(f, g, h) for f, g, h in zip(FORMS, FORMS[1:] + FORMS[:1], FORMS[2:] + FORMS[:2])],
                         ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 8, 2, 77, 257), (1, 4, 4, 257, 77), (2, 6, 1, 300, 300), (1, 2, 2, 1, 130)],
                         ids=str)
def test_matches_the_dequantized_reference(fp8_hopper, rng, forms, causal, shape):
    for d in fp8_head_dims():
        got, lse, ref, ref_lse = run_case(fp8_hopper, rng, d, *shape, forms, causal=causal)
        assert got.dtype == fp8_hopper.bfloat16
        assert_close(got, lse, ref, ref_lse)


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
def test_out_dtype_and_out(fp8_hopper, rng, out_dtype):
    torch = fp8_hopper
    d = fp8_head_dims()[0]
    out = torch.full((2, 8, 96, d), float("nan"), dtype=getattr(torch, out_dtype), device="cuda")
    got, lse, ref, ref_lse = run_case(torch, rng, d, 2, 8, 2, 96, 200, ("head", "entry_head", "float"),
                                      out_dtype=getattr(torch, out_dtype), causal=True, out=out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == getattr(torch, out_dtype)
    assert_close(got, lse, ref, ref_lse)


def test_a_sliding_window(fp8_hopper, rng):
    d = fp8_head_dims()[0]
    got, lse, ref, ref_lse = run_case(fp8_hopper, rng, d, 1, 4, 2, 300, 500, ("float", None, "head"), window=(64, 0))
    assert_close(got, lse, ref, ref_lse)


@pytest.mark.parametrize("causal", [False, True])
def test_sinks(fp8_hopper, rng, causal):
    """gpt-oss's sinks on the fp8 kernel (the shared epilogue): logits around the rows' lse, so that the
    sink takes a visible share of each row; Nq > Nk leaves causal rows with no key but the sink."""
    for d in fp8_head_dims():
        sinks = rng.normal(2.0, 2.0, 8).astype(np.float32)
        got, lse, ref, ref_lse = run_case(fp8_hopper, rng, d, 2, 8, 2, 150, 100, ("head", "float", "entry_head"),
                                          causal=causal, sinks=sinks)
        assert_close(got, lse, ref, ref_lse)


def test_the_plan_is_the_fp8_kernel(fp8_hopper, rng):
    d = fp8_head_dims()[0]
    q, k = (to_cuda_fp8(fp8_hopper, fp8(rng, (1, 4, 256, d))) for _ in range(2))
    plan = cutlassfa.plan(q, k, k, causal=True)
    assert plan["backend"] == "tensorcore" and plan["kernel"] == "sm90ws" and plan["num_splits"] == 1
    assert not plan["fp8_dequantized"]


@pytest.mark.parametrize("backend", ["tensorcore_sm80", "large_tile", "small_tile", "naive"])
def test_other_backends_refuse_with_the_reason(fp8_hopper, rng, backend):
    d = fp8_head_dims()[0]
    q = to_cuda_fp8(fp8_hopper, fp8(rng, (1, 2, 16, d)))
    with pytest.raises(ValueError, match="no fp8 attention kernel"):
        cutlassfa.forward(q, q, q, backend=backend)
    assert not cutlassfa.supports(backend, "float8_e4m3fn", d).ok


def test_refused_head_dim_and_options(fp8_hopper, rng):
    torch = fp8_hopper
    q = to_cuda_fp8(torch, fp8(rng, (1, 2, 16, 96)))
    with pytest.raises(ValueError, match="head dims"):
        cutlassfa.forward(q, q, q, backend="tensorcore")
    assert not cutlassfa.supports("tensorcore", "float8_e4m3fn", 96).ok
    d = fp8_head_dims()[0]
    q = to_cuda_fp8(torch, fp8(rng, (1, 2, 16, d)))
    for options in ({"softcap": 5.0}, {"alibi_slopes": torch.zeros(2, device="cuda")}, {"num_splits": 2}):
        with pytest.raises(ValueError, match="fp8 attention"):
            cutlassfa.forward(q, q, q, backend="tensorcore", **options)
    assert cutlassfa.supports("tensorcore", "float8_e4m3fn", d).ok
