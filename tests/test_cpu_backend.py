"""The numpy "cpu" backend (blockwise online softmax) against the float64 reference.

Tolerances come from measurement (seeds varied, all shapes of the matrix below):
* float32: rel-L2 of out measured <= 4e-7 (about the fp32 naive error), bound 2e-6 (or 2x naive
  for ill-conditioned inputs);
* float16/bfloat16: out is computed in fp32 and rounded once, measured 0.35-0.55x the error of the
  same-precision naive computation; bound = 2x naive + a floor for shapes where the naive error is ~0
  (Nk = 1: out is exactly a row of V), the floor being half the dtype's epsilon;
* lse (float32, from fp32 sums): rel-L2 measured <= 1.2e-7, bound 1e-6 for every dtype.
"""

from __future__ import annotations

import time
import tracemalloc
import warnings

import numpy as np
import pytest

from cutlassfa.cpu import forward_cpu
from cutlassfa.reference import attention_reference, naive_same_precision, rel_l2

EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
FP32_OUT_TOL = 2e-6
LSE_TOL = 1e-6


def out_tolerance(dtype_name: str, naive_err: float, naive_factor: float = 2.0) -> float:
    if dtype_name == "float32":
        return max(FP32_OUT_TOL, naive_factor * naive_err)
    return naive_factor * naive_err + EPS[dtype_name] / 2


def check_against_reference(q, k, v, *, causal, scale=None, naive_factor=2.0, window=None, softcap=0.0, **kw):
    """Run forward_cpu and assert out/lse agree with the reference; returns (out, lse)."""
    name = q.dtype.name
    mode = dict(causal=causal, softmax_scale=scale, window=window, softcap=softcap)
    out, lse = forward_cpu(q, k, v, return_lse=True, **mode, **kw)
    ref, ref_lse = attention_reference(q, k, v, **mode)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == q.shape[:3]
    naive_err = rel_l2(naive_same_precision(q, k, v, q.dtype, **mode), ref)
    err, tol = rel_l2(out, ref), out_tolerance(name, naive_err, naive_factor)
    assert err <= tol, f"{name} out rel-L2 {err:.3e} > {tol:.3e} (naive {naive_err:.3e})"
    # Exactly the same rows are fully masked (-inf), and the rest is accurate.
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    assert rel_l2(lse, ref_lse) <= LSE_TOL
    return out, lse


# ---- the matrix: dtype x head dim x causal x ragged / unequal N x GQA ----------------------------

SEQLENS = [(1, 1), (7, 7), (127, 127), (129, 129), (300, 300), (1, 300), (300, 1), (7, 129), (129, 7), (127, 300)]
HEADS = [(2, 2), (4, 2), (4, 1)]


@pytest.mark.parametrize("hq,hkv", HEADS, ids=lambda h: str(h))
@pytest.mark.parametrize("nq,nk", SEQLENS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_matrix(make_qkv, resolve_dtype, dtype, d, causal, nq, nk, hq, hkv):
    q, k, v = make_qkv(2, hq, hkv, nq, nk, d, resolve_dtype(dtype))
    check_against_reference(q, k, v, causal=causal)


# ---- windows, softcap, head dims ------------------------------------------------------------------

# (window, causal): sizes 0, 1, small, larger than N, left-only, right-only, and combined with causal.
WINDOWS = [((0, 0), False), ((1, 1), False), ((5, 3), False), ((1000, 1000), False), ((16, -1), False),
           ((-1, 16), False), ((0, -1), True), ((16, 0), True), ((1, 0), True), ((40, 0), False)]
WINDOW_SEQLENS = [(1, 1), (129, 129), (300, 300), (7, 300), (300, 7), (129, 257)]


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 1)], ids=lambda h: str(h))
@pytest.mark.parametrize("nq,nk", WINDOW_SEQLENS)
@pytest.mark.parametrize("window,causal", WINDOWS, ids=lambda w: str(w))
def test_window_matrix(make_qkv, window, causal, nq, nk, hq, hkv):
    q, k, v = make_qkv(2, hq, hkv, nq, nk, 32)
    check_against_reference(q, k, v, causal=causal, window=window, block_m=64, block_n=32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("window,causal", [((0, 0), False), ((7, 2), False), ((16, 0), True)], ids=str)
def test_window_half_precision(make_qkv, resolve_dtype, dtype, window, causal):
    q, k, v = make_qkv(2, 4, 2, 133, 200, 64, resolve_dtype(dtype))
    check_against_reference(q, k, v, causal=causal, window=window, block_m=32, block_n=16)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("softcap", [0.5, 30.0])
@pytest.mark.parametrize("window,causal", [(None, False), (None, True), ((8, 0), True), ((3, 5), False)], ids=str)
def test_softcap(make_qkv, resolve_dtype, dtype, softcap, window, causal):
    # Scores of std 2 so that a cap of 0.5 bends most of them and 30 only the tails.
    q, k, v = make_qkv(2, 4, 2, 70, 150, 32, resolve_dtype(dtype), scale=2.0)
    out, lse = check_against_reference(q, k, v, causal=causal, window=window, softcap=softcap, block_n=32)
    # lse of capped scores: at most softcap + log(keys seen).
    assert (lse[np.isfinite(lse)] <= softcap + np.log(150) + 1e-5).all()


@pytest.mark.parametrize("d", range(8, 257, 8))
def test_every_head_dim(make_qkv, resolve_dtype, d):
    # Cycle the dtypes over the head dims to keep the test count small.
    dtype = ("float32", "float16", "bfloat16")[(d // 8) % 3]
    q, k, v = make_qkv(1, 2, 1, 33, 47, d, resolve_dtype(dtype))
    check_against_reference(q, k, v, causal=d % 16 == 0, window=(9, -1) if d % 24 == 0 else None, block_n=16)


# ---- the tiles the windowed loop visits ---------------------------------------------------------------


@pytest.mark.parametrize("nq,nk,window,causal", [
    (300, 300, (20, 0), True), (300, 300, (0, 0), False), (100, 333, (10, 50), False), (333, 100, (-1, 5), False),
    (256, 256, (-1, -1), True), (200, 200, (1000, 1000), False), (50, 80, (-1, -1), False),
])
@pytest.mark.parametrize("block_m,block_n", [(64, 32), (37, 16), (128, 128)])
def test_visits_exactly_the_trip_count_tiles(make_qkv, monkeypatch, nq, nk, window, causal, block_m, block_n):
    from cutlassfa import _kv_sources, cpu, masks

    loads, masked = [], []
    load, mask = _kv_sources.DenseKeys.tile, cpu._mask_tile
    monkeypatch.setattr(_kv_sources.DenseKeys, "tile",
                        lambda self, j0, j1, dt: loads.append((j0, j1)) or load(self, j0, j1, dt))
    monkeypatch.setattr(cpu, "_mask_tile", lambda tS, lo, hi, g: masked.append(len(loads) - 1) or mask(tS, lo, hi, g))
    q, k, v = make_qkv(1, 2, 2, nq, nk, 16)
    check_against_reference(q, k, v, causal=causal, window=window, block_m=block_m, block_n=block_n)

    w = masks.resolve_window(causal, window)
    want_loads, want_masked = [], []
    for m0 in range(0, nq, block_m):
        trips = masks.tile_trips(m0, min(nq, m0 + block_m), nq, nk, w, block_n)
        for n in range(trips.first, trips.last):
            if trips.is_masked(n):
                want_masked.append(len(want_loads))
            want_loads.append((n * block_n, min(nk, (n + 1) * block_n)))
    assert loads == want_loads and masked == want_masked
    assert len(loads) == masks.tile_counts(nq, nk, w, block_m, block_n)[0]
    if window == (20, 0):  # the window's work grows as N x window: 2 tiles of 32 keys per 64 rows
        assert len(loads) <= 2 * (-(-nq // block_m)) * (-(-(20 + block_m) // block_n) + 1)


# ---- block sizes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("block_n", [1, 16, 63, 64, 65, 128, 299, 300, 301, 1000])
@pytest.mark.parametrize("block_m", [7, 64, 200, 512])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_block_sizes(make_qkv, block_n, block_m, causal):
    # Nq < Nk so that bottom-right causal skipping and partial diagonal blocks both occur.
    q, k, v = make_qkv(1, 2, 1, 200, 300, 32)
    check_against_reference(q, k, v, causal=causal, block_n=block_n, block_m=block_m)


def test_block_sizes_agree_with_each_other(make_qkv):
    q, k, v = make_qkv(2, 2, 2, 150, 150, 64)
    base = forward_cpu(q, k, v, causal=True, softmax_scale=None, return_lse=False)
    for bn, bm in ((1, 7), (37, 150), (150, 1)):
        other = forward_cpu(q, k, v, causal=True, softmax_scale=None, return_lse=False, block_n=bn, block_m=bm)
        assert rel_l2(other, base) < 1e-6


def test_rejects_nonpositive_block(make_qkv):
    q, k, v = make_qkv(1, 1, 1, 4, 4, 32)
    with pytest.raises(ValueError):
        forward_cpu(q, k, v, causal=False, softmax_scale=None, return_lse=False, block_n=0)


def test_small_batch_chunks(make_qkv, monkeypatch):
    # Force one batch per chunk to cover the batch-chunk loop.
    from cutlassfa import cpu

    monkeypatch.setattr(cpu, "_STEP_ELEMS", 1)
    q, k, v = make_qkv(3, 4, 2, 20, 33, 32)
    check_against_reference(q, k, v, causal=True, block_n=8, block_m=8)


# ---- masking, NaN, warnings -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_masked_rows_without_warnings(make_qkv, resolve_dtype, dtype):
    # Nq=300 > Nk=7 causal: rows 0..292 see no key.
    q, k, v = make_qkv(2, 2, 1, 300, 7, 32, resolve_dtype(dtype))
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        out, lse = forward_cpu(q, k, v, causal=True, softmax_scale=None, return_lse=True, block_n=4)
    assert (out[:, :, :293].astype(np.float32) == 0).all()
    assert (lse[:, :, :293] == -np.inf).all()
    assert np.isfinite(out.astype(np.float32)).all() and not np.isnan(lse).any()
    np.testing.assert_allclose(out[:, :, 293].astype(np.float32), v[:, 0, 0].astype(np.float32)[:, None].repeat(2, 1))


def test_nan_in_q_reaches_only_its_row(make_qkv):
    q, k, v = make_qkv(1, 2, 2, 50, 60, 32)
    q[0, 1, 17, 3] = np.nan
    out, lse = forward_cpu(q, k, v, causal=False, softmax_scale=None, return_lse=True)
    assert np.isnan(out[0, 1, 17]).all() and np.isnan(lse[0, 1, 17])
    bad = np.zeros(out.shape[:3], dtype=bool)
    bad[0, 1, 17] = True
    assert np.isfinite(out[~bad]).all() and np.isfinite(lse[~bad]).all()


def test_nan_in_k_reaches_only_rows_that_see_it(make_qkv):
    # Causal, Nq = Nk = 40, NaN at key 25: rows 0..24 never see it (their key blocks are cut off at
    # the diagonal or masked), rows 25..39 do.
    q, k, v = make_qkv(1, 1, 1, 40, 40, 32)
    k[0, 0, 25, 0] = np.nan
    out = forward_cpu(q, k, v, causal=True, softmax_scale=None, return_lse=False, block_n=8, block_m=8)
    assert np.isfinite(out[0, 0, :25]).all()
    assert np.isnan(out[0, 0, 25:]).all()


# ---- precision criteria and properties ------------------------------------------------------------


@pytest.mark.parametrize("n,d", [(128, 32), (512, 64), (300, 32)])
def test_hw4_criterion(rng, n, d):
    # HW4: fp32 inputs uniform in [-3, 3], every output within 5e-3 of the exact answer.
    q, k, v = (rng.uniform(-3, 3, (2, 1, n, d)).astype(np.float32) for _ in range(3))
    out = forward_cpu(q, k, v, causal=False, softmax_scale=None, return_lse=False)
    ref, _ = attention_reference(q, k, v)
    assert np.abs(out - ref).max() <= 5e-3


def test_custom_scale(make_qkv):
    q, k, v = make_qkv(1, 2, 2, 33, 45, 64)
    for scale in (0.0, 0.01, 1.7):
        check_against_reference(q, k, v, causal=True, scale=scale)


def test_large_scores_are_stable(make_qkv):
    # Scores reach ~100: exp without the running max would overflow float32 (at 88.7). The error is
    # then set by conditioning (|S|·eps in the logits), for the naive fp32 computation too: measured
    # up to 2.1x the naive error over 30 seeds, hence 3x here.
    q, k, v = make_qkv(1, 1, 1, 64, 200, 64, scale=6.0)
    out, _ = check_against_reference(q, k, v, causal=False, block_n=32, naive_factor=3.0)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("magnitude", [1e19, 1e30, 3e38])
def test_huge_finite_inputs_do_not_overflow(rng, magnitude):
    # q.k of fp32 inputs of 1e19 passes float32's 3.4e38; so do the weighted sums of values of 3e38.
    # The loop then runs in float64 and the result is still the exact one.
    q, k, v = (rng.uniform(-1, 1, (1, 2, 40, 32)) * magnitude for _ in range(3))
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    for causal, window, softcap in ((False, None, 0.0), (True, (5, 0), 0.0), (False, None, 20.0)):
        out, lse = forward_cpu(q, k, v, causal=causal, softmax_scale=None, return_lse=True, window=window,
                               softcap=softcap, block_n=16)
        ref, ref_lse = attention_reference(q, k, v, causal=causal, window=window, softcap=softcap)
        assert np.isfinite(out).all()
        assert rel_l2(out, ref) <= FP32_OUT_TOL
        finite = np.abs(ref_lse) < 3e38  # lse beyond float32's range is stored as +-inf
        assert np.isfinite(lse[finite]).all() and rel_l2(lse[finite], ref_lse[finite]) <= LSE_TOL


def test_huge_bfloat16_inputs(make_qkv, resolve_dtype):
    # bfloat16 spans float32's range: q.k of 1e50 overflows float32 although the scaled scores (1e30)
    # and lse do not. (naive_same_precision overflows here, so the bound is the output rounding.)
    dt = resolve_dtype("bfloat16")
    q, k, v = (x * np.float32(1e25) for x in make_qkv(1, 2, 1, 20, 30, 64))
    q, k, v = q.astype(dt), k.astype(dt), (v * np.float32(1e12)).astype(dt)
    out, lse = forward_cpu(q, k, v, causal=True, softmax_scale=1e-20, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, causal=True, softmax_scale=1e-20)
    assert np.isfinite(out.astype(np.float32)).all() and np.isfinite(lse).all()
    assert rel_l2(out, ref) <= EPS["bfloat16"] / 2 and rel_l2(lse, ref_lse) <= LSE_TOL


def test_scale_overflowing_float64_is_refused(make_qkv):
    q, k, v = (x * np.float32(1e30) for x in make_qkv(1, 1, 1, 4, 4, 32))
    with pytest.raises(ValueError, match="softmax_scale"):
        forward_cpu(q, k, v, causal=False, softmax_scale=1e250, return_lse=False)
    with pytest.raises(ValueError, match="softcap"):
        forward_cpu(q, k, v, causal=False, softmax_scale=1e300, softcap=1e-20, return_lse=False)


def test_output_is_convex_combination_of_values(make_qkv):
    q, k, v = make_qkv(2, 2, 2, 77, 91, 32)
    out = forward_cpu(q, k, v, causal=True, softmax_scale=None, return_lse=False)
    lo, hi = v.min(axis=2, keepdims=True), v.max(axis=2, keepdims=True)
    assert (out >= lo - 1e-5).all() and (out <= hi + 1e-5).all()


# ---- out=, strides, sizes ------------------------------------------------------------------------


def test_writes_into_out_with_strides(make_qkv, resolve_dtype):
    dt = resolve_dtype("float16")
    q, k, v = make_qkv(2, 4, 2, 30, 40, 64, dt)
    backing = np.full((2, 30, 4, 64), 7, dtype=dt)  # (B, N, H, d) memory seen as (B, H, N, d)
    out = backing.transpose(0, 2, 1, 3)
    got = forward_cpu(q, k, v, causal=False, softmax_scale=None, return_lse=False, out=out)
    assert got is out
    want = forward_cpu(q, k, v, causal=False, softmax_scale=None, return_lse=False)
    np.testing.assert_array_equal(backing.transpose(0, 2, 1, 3), want)


def test_strided_inputs(make_qkv, resolve_dtype):
    dt = resolve_dtype("bfloat16")
    q, k, v = make_qkv(2, 4, 2, 50, 70, 32, dt)
    # (B, N, H, d) layouts and a sliced batch: every stride but the last differs from compact.
    qs, ks, vs = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (q, k, v))
    big = np.zeros((4, 4, 50, 32), dtype=dt)
    big[::2] = q
    assert not qs.flags.c_contiguous
    got = forward_cpu(big[::2], ks, vs, causal=True, softmax_scale=None, return_lse=False)
    want = forward_cpu(q, k, v, causal=True, softmax_scale=None, return_lse=False)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(forward_cpu(qs, k, v, causal=True, softmax_scale=None, return_lse=False), want)


def test_empty_shapes():
    z = np.zeros((0, 2, 5, 32), dtype=np.float32)
    out, lse = forward_cpu(z, z, z, causal=False, softmax_scale=None, return_lse=True)
    assert out.shape == (0, 2, 5, 32) and lse.shape == (0, 2, 5)
    q = np.ones((1, 2, 3, 32), dtype=np.float32)
    kv = np.zeros((1, 1, 0, 32), dtype=np.float32)
    out, lse = forward_cpu(q, kv, kv, causal=True, softmax_scale=None, return_lse=True)
    assert (out == 0).all() and (lse == -np.inf).all()


def test_memory_is_linear_in_n(rng):
    # The full score matrix of one (4096 x 4096) head would be 64 MiB in float32, 128 MiB in fp64.
    n, d = 4096, 32
    q, k, v = (rng.standard_normal((1, 1, n, d)).astype(np.float32) for _ in range(3))
    tracemalloc.start()
    try:
        # Big blocks keep the step count (and tracemalloc's overhead) small.
        forward_cpu(q, k, v, causal=False, softmax_scale=None, return_lse=True, block_m=512, block_n=512)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A few 512 x 512 float32 temporaries (1 MiB each) plus the 0.5 MiB output: measured 4.7 MiB
    # (0.8 MiB with the default 128 x 128 blocks; 194 MiB with one 4096 x 4096 block).
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB"


@pytest.mark.exclusive  # wall time
def test_speed(rng):
    # (2, 16, 1024, 64) float32 measured at ~0.2 s on 2 cores; 10 s leaves room for slow CI.
    q, k, v = (rng.standard_normal((2, 16, 1024, 64)).astype(np.float32) for _ in range(3))
    t = time.perf_counter()
    forward_cpu(q, k, v, causal=False, softmax_scale=None, return_lse=True)
    assert time.perf_counter() - t < 10.0


# ---- through the public API: cutlassfa.forward(..., backend="cpu") ----------------------------------
# The same checks through the public entry point.

from cutlassfa import forward as api_forward  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_forward_cpu_backend_4d(make_qkv, resolve_dtype, dtype):
    q, k, v = make_qkv(2, 4, 2, 65, 130, 64, resolve_dtype(dtype))
    out, lse = api_forward(q, k, v, causal=True, backend="cpu", return_lse=True)
    want, want_lse = forward_cpu(q, k, v, causal=True, softmax_scale=None, return_lse=True)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)
    check_against_reference(q, k, v, causal=True)


def test_forward_cpu_backend_3d_and_out(make_qkv):
    q, k, v = (x[:, 0] for x in make_qkv(3, 1, 1, 9, 17, 32))  # (B, N, d)
    out, lse = api_forward(q, k, v, backend="cpu", return_lse=True, softmax_scale=0.3)
    assert out.shape == (3, 9, 32) and lse.shape == (3, 9)
    ref, ref_lse = attention_reference(q, k, v, softmax_scale=0.3)
    assert rel_l2(out, ref) <= FP32_OUT_TOL and rel_l2(lse, ref_lse) <= LSE_TOL
    buf = np.empty_like(q)
    assert api_forward(q, k, v, backend="cpu", softmax_scale=0.3, out=buf) is buf
    np.testing.assert_array_equal(buf, out)


def test_forward_cpu_backend_empty():
    z = np.zeros((0, 2, 4, 32), dtype=np.float32)
    out, lse = api_forward(z, z, z, backend="cpu", return_lse=True)
    assert out.shape == (0, 2, 4, 32) and lse.shape == (0, 2, 4)
