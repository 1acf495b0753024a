"""The public API on the host: argument validation (each invalid class refused cleanly, `out` untouched,
the next call fine), empty problems, ranks, strides, `out`, lse, and backend reporting. Runs without a
GPU; with one, host arrays go through the GPU path and the same assertions hold."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, rel_l2


def _bound(q, k, v, fp32_bound=1e-5):
    """Rel-L2 bound for fp32 inputs on the backend `auto` runs: tensorcore rounds them to fp16."""
    return 2e-3 if cutlassfa.select_backend(q, k, v) == "tensorcore" else fp32_bound


def _qkv(rng, b=2, hq=2, hk=2, nq=33, nk=47, d=32, dtype=np.float32):
    q = rng.standard_normal((b, hq, nq, d)).astype(dtype)
    k = rng.standard_normal((b, hk, nk, d)).astype(dtype)
    v = rng.standard_normal((b, hk, nk, d)).astype(dtype)
    return q, k, v


def _expect_refused(rng, error, match, **overrides):
    """Calls forward with one bad argument; checks the error names it, `out` is untouched and the next
    valid call still works."""
    q, k, v = _qkv(rng)
    out = np.full(q.shape, 7.0, dtype=np.float32)
    args = dict(q=q, k=k, v=v, out=out)
    args.update(overrides)
    poisoned = args["out"].copy() if isinstance(args["out"], np.ndarray) else None
    with pytest.raises(error, match=match):
        cutlassfa.forward(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    if poisoned is not None:
        np.testing.assert_array_equal(args["out"], poisoned)
    good = cutlassfa.forward(q, k, v)
    ref, _ = attention_reference(q, k, v)
    assert rel_l2(good, ref) < 1e-3


@pytest.mark.parametrize("shape", [(2, 33, 32, 1, 1), (33, 32)])
def test_wrong_rank(rng, shape):
    _expect_refused(rng, ValueError, "q must be 4-D", q=rng.standard_normal(shape).astype(np.float32))


def test_mismatched_batch(rng):
    _expect_refused(rng, ValueError, "batch", k=rng.standard_normal((3, 2, 47, 32)).astype(np.float32))


def test_mismatched_head_dim(rng):
    _expect_refused(rng, ValueError, "head dim", v=rng.standard_normal((2, 2, 47, 64)).astype(np.float32))


def test_mismatched_kv_length(rng):
    _expect_refused(rng, ValueError, "sequence length", v=rng.standard_normal((2, 2, 46, 32)).astype(np.float32))


def test_heads_not_multiple(rng):
    q = rng.standard_normal((2, 3, 33, 32)).astype(np.float32)
    _expect_refused(rng, ValueError, "multiple", q=q, out=np.zeros_like(q))


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_unsupported_dtype(rng, dtype):
    q = rng.standard_normal((2, 2, 33, 32)).astype(dtype)
    _expect_refused(rng, TypeError, "q has dtype", q=q, k=q[:, :, :1].repeat(47, 2), v=q[:, :, :1].repeat(47, 2))


@pytest.mark.parametrize("d", [0, 12, 100, 264])  # refused on every backend: not a multiple of 8 in 8..256
def test_unsupported_head_dim(rng, d):
    q, k, v = (rng.standard_normal((2, 2, 5, d)).astype(np.float32) for _ in range(3))
    _expect_refused(rng, ValueError, "head dim", q=q, k=k, v=v, out=None)


def test_mixed_dtypes(rng):
    _expect_refused(rng, TypeError, "same dtype", k=rng.standard_normal((2, 2, 47, 32)).astype(np.float16))


def test_non_contiguous_last_dim(rng):
    k = rng.standard_normal((2, 2, 47, 64)).astype(np.float32)[..., ::2]
    _expect_refused(rng, ValueError, "k must be contiguous in its last dim", k=k)


@pytest.mark.parametrize("bad", [np.zeros((2, 2, 33, 64), np.float32), np.zeros((2, 2, 32, 32), np.float32)])
def test_out_wrong_shape(rng, bad):
    _expect_refused(rng, ValueError, "out must have shape", out=bad)


def test_out_wrong_dtype(rng):
    _expect_refused(rng, TypeError, "out must have dtype", out=np.zeros((2, 2, 33, 32), np.float16))


def test_out_not_an_array(rng):
    _expect_refused(rng, TypeError, "out must be", out=[[0.0]])


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_non_finite_scale(rng, scale):
    _expect_refused(rng, ValueError, "softmax_scale must be finite", softmax_scale=scale)


def test_scale_of_wrong_type(rng):
    _expect_refused(rng, TypeError, "softmax_scale", softmax_scale="0.1")


def test_unknown_backend(rng):
    _expect_refused(rng, ValueError, "unknown backend", backend="flash3")


def test_backend_not_a_string(rng):
    _expect_refused(rng, TypeError, "backend must be a str", backend=3)


def test_causal_not_a_bool(rng):
    _expect_refused(rng, TypeError, "causal must be a bool", causal="yes")


def test_not_an_array(rng):
    _expect_refused(rng, TypeError, "q must be a numpy array", q=[[1.0] * 32])


@pytest.mark.parametrize("backend", ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"])
def test_gpu_backend_without_gpu_is_a_clear_error(rng, backend):
    if not cutlassfa.backends()["small_tile"].available:
        _expect_refused(rng, RuntimeError, f"backend '{backend}' is not available", backend=backend)
        return
    # A GPU is present: hide it from a fresh process.
    code = ("import cutlassfa, numpy as np\n"
            "q = np.ones((1, 1, 4, 32), np.float32)\n"
            "try:\n"
            f"    cutlassfa.forward(q, q, q, backend={backend!r})\n"
            "except RuntimeError as error:\n"
            "    print('refused:', error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert f"refused: backend '{backend}' is not available" in result.stdout


def test_backends_report():
    statuses = cutlassfa.backends()
    assert set(statuses) == set(cutlassfa.BACKENDS)
    assert statuses["cpu"].available
    for status in statuses.values():
        assert status.available or status.reason  # every unavailable backend says why


def test_import_without_gpu():
    code = "import cutlassfa, numpy as np; q = np.ones((1, 1, 4, 32), np.float32); print(cutlassfa.forward(q, q, q).shape)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert "(1, 1, 4, 32)" in result.stdout


@pytest.mark.parametrize("shape", [(0, 2, 5, 32), (2, 0, 5, 32), (2, 2, 0, 32)])
def test_empty_problems_give_empty_results(rng, shape):
    q = rng.standard_normal(shape).astype(np.float32)
    k = rng.standard_normal((shape[0], shape[1], 7, 32)).astype(np.float32)
    out, lse = cutlassfa.forward(q, k, k, return_lse=True)
    assert out.shape == shape and lse.shape == shape[:-1]


def test_no_keys_gives_zero_and_minus_inf(rng):
    q = rng.standard_normal((2, 2, 5, 32)).astype(np.float32)
    k = np.zeros((2, 2, 0, 32), np.float32)
    out, lse = cutlassfa.forward(q, k, k, return_lse=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)


def test_three_d_inputs_match_four_d(rng):
    q, k, v = _qkv(rng, hq=1, hk=1)
    out3, lse3 = cutlassfa.forward(q[:, 0], k[:, 0], v[:, 0], return_lse=True)
    out4, lse4 = cutlassfa.forward(q, k, v, return_lse=True)
    assert out3.shape == (2, 33, 32) and lse3.shape == (2, 33)
    np.testing.assert_allclose(out3, out4[:, 0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse3, lse4[:, 0], rtol=1e-6, atol=1e-6)


def test_transposed_bnhd_layout_without_copy(rng):
    """A (B, N, H, d) tensor viewed as (B, H, N, d): arbitrary strides except the last."""
    q = rng.standard_normal((2, 33, 4, 64)).astype(np.float32).transpose(0, 2, 1, 3)
    k = rng.standard_normal((2, 47, 2, 64)).astype(np.float32).transpose(0, 2, 1, 3)
    v = rng.standard_normal((2, 47, 2, 64)).astype(np.float32).transpose(0, 2, 1, 3)
    out = cutlassfa.forward(q, k, v, causal=True)
    ref, _ = attention_reference(q, k, v, causal=True)
    assert rel_l2(out, ref) < _bound(q, k, v)


def test_out_is_written_and_returned(rng):
    q, k, v = _qkv(rng)
    out = np.full(q.shape, np.nan, np.float32)
    result, lse = cutlassfa.forward(q, k, v, out=out, return_lse=True)
    assert result is out
    ref, ref_lse = attention_reference(q, k, v)
    assert rel_l2(out, ref) < _bound(q, k, v)
    # The gate's lse bound of the backend `auto` ran (5e-5 for fp32 on every backend, 1e-5 measured).
    lse_bound = bound_for(cutlassfa.select_backend(q, k, v), "float32").lse
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=lse_bound)


def test_strided_out(rng):
    q, k, v = _qkv(rng)
    storage = np.full((2, 33, 2, 32), np.nan, np.float32)
    out = storage.transpose(0, 2, 1, 3)
    cutlassfa.forward(q, k, v, out=out)
    ref, _ = attention_reference(q, k, v)
    assert rel_l2(out, ref) < _bound(q, k, v)


def test_select_backend_reports_what_runs(rng):
    q, k, v = _qkv(rng)
    chosen = cutlassfa.select_backend(q, k, v)
    assert chosen in cutlassfa.BACKENDS
    if not cutlassfa.backends()["small_tile"].available:
        assert chosen == "cpu"
    assert cutlassfa.select_backend(q, k, v, backend="cpu") == "cpu"


def test_softmax_scale_is_used(rng):
    q, k, v = _qkv(rng)
    for scale in (1e-6, 0.05, 30.0):
        out = cutlassfa.forward(q, k, v, softmax_scale=scale)
        ref, _ = attention_reference(q, k, v, softmax_scale=scale)
        assert rel_l2(out, ref) < 10 * _bound(q, k, v), scale
