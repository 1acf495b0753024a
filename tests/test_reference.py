"""The float64 reference: against a row-by-row implementation, hand-derived cases and its helpers."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutlassfa import reference
from cutlassfa.reference import attention_reference, naive_same_precision, rel_l2


def rowwise_attention(q, k, v, causal=False, scale=None, left=-1, right=-1, softcap=0.0):
    """Straightforward per-row attention with Python loops; 4-D float64 only. Independent of the
    module under test: it shares neither the mask nor the GQA mapping code. Window (left, right) and
    causal combine as the issue states: causal bounds the right side at 0."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((b, hq, nq, d))
    lse = np.full((b, hq, nq), -math.inf)

    def sees(i, j):
        pos = i + nk - nq  # the key position query i is aligned with
        return ((not causal or j <= pos) and (left < 0 or j >= pos - left) and (right < 0 or j <= pos + right))

    def cap(x):
        return softcap * math.tanh(x / softcap) if softcap > 0 else x

    for bi in range(b):
        for h in range(hq):
            kv = h * hkv // hq  # same as h // (hq // hkv) for hq a multiple of hkv
            for i in range(nq):
                keys = [j for j in range(nk) if sees(i, j)]
                if not keys:
                    continue
                s = [cap(scale * float(np.dot(q[bi, h, i], k[bi, kv, j]))) for j in keys]
                top = max(s)
                w = [math.exp(x - top) for x in s]
                total = math.fsum(w)
                out[bi, h, i] = sum(wj * v[bi, kv, j] for wj, j in zip(w, keys)) / total
                lse[bi, h, i] = top + math.log(total)
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv", [(1, 1), (2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("nq,nk", [(1, 1), (5, 5), (3, 8), (8, 3), (1, 6), (6, 1)])
def test_matches_rowwise(rng, causal, hq, hkv, nq, nk):
    q = rng.standard_normal((2, hq, nq, 4))
    k = rng.standard_normal((2, hkv, nk, 4))
    v = rng.standard_normal((2, hkv, nk, 4))
    out, lse = attention_reference(q, k, v, causal=causal)
    want_out, want_lse = rowwise_attention(q, k, v, causal)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(
        st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (3, 3), (6, 2)]), st.integers(1, 9), st.integers(1, 9),
        st.sampled_from([1, 2, 8]),
    ),
    causal=st.booleans(),
    scale=st.one_of(st.none(), st.floats(0.01, 4.0)),
    seed=st.integers(0, 2**32 - 1),
)
def test_matches_rowwise_property(shape, causal, scale, seed):
    b, (hq, hkv), nq, nk, d = shape
    g = np.random.default_rng(seed)
    q, k, v = (g.uniform(-3, 3, (b, h, n, d)) for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))
    out, lse = attention_reference(q, k, v, causal=causal, softmax_scale=scale)
    want_out, want_lse = rowwise_attention(q, k, v, causal, scale)
    np.testing.assert_allclose(out, want_out, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-11, atol=1e-11)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(st.sampled_from([(1, 1), (4, 2), (3, 1)]), st.integers(1, 12), st.integers(1, 12)),
    window=st.tuples(st.sampled_from([-1, 0, 1, 2, 5, 20]), st.sampled_from([-1, 0, 1, 3, 20])),
    causal=st.booleans(),
    softcap=st.sampled_from([0.0, 0.5, 2.0, 30.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_window_and_softcap_match_rowwise(shape, window, causal, softcap, seed):
    (hq, hkv), nq, nk = shape
    left, right = window
    if causal and right > 0:
        right = 0
    g = np.random.default_rng(seed)
    q, k, v = (g.uniform(-3, 3, (2, h, n, 8)) for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))
    out, lse = attention_reference(q, k, v, causal=causal, window=(left, right), softcap=softcap)
    want_out, want_lse = rowwise_attention(q, k, v, causal, left=left, right=right, softcap=softcap)
    np.testing.assert_allclose(out, want_out, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-11, atol=1e-11)


def test_softcap_bounds_the_scores(rng):
    # Capped scores lie in (-c, c): lse <= c + log(Nk), and a huge cap is no cap at all.
    q, k, v = (rng.standard_normal((1, 2, 5, 16)) * 4 for _ in range(3))
    _, lse = attention_reference(q, k, v, softcap=1.0)
    assert (lse < 1.0 + math.log(5)).all() and (lse > -1.0 + math.log(5)).all()
    out, lse = attention_reference(q, k, v, softcap=1e9)
    want, want_lse = attention_reference(q, k, v)
    np.testing.assert_allclose(out, want, rtol=1e-9)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-9)


def test_window_rejects_bad_values():
    q = np.zeros((1, 1, 2, 8))
    with pytest.raises(ValueError, match="window"):
        attention_reference(q, q, q, window=(-2, 0))
    with pytest.raises(ValueError, match="window"):
        attention_reference(q, q, q, causal=True, window=(3, 2))
    with pytest.raises(ValueError, match="softcap"):
        attention_reference(q, q, q, softcap=-1.0)


def test_uniform_keys_give_mean_of_values(rng):
    # All keys equal -> all scores equal -> softmax is uniform -> out = mean(V), lse = s + log(Nk).
    nk, d = 9, 8
    q = rng.standard_normal((1, 2, 3, d))
    key = rng.standard_normal(d)
    k = np.broadcast_to(key, (1, 2, nk, d)).copy()
    v = rng.standard_normal((1, 2, nk, d))
    out, lse = attention_reference(q, k, v)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=2, keepdims=True), out.shape), rtol=1e-12)
    s = (q @ key) / math.sqrt(d)
    np.testing.assert_allclose(lse, s + math.log(nk), rtol=1e-12)


def test_causal_first_row_sees_only_first_key(rng):
    q, k, v = (rng.standard_normal((2, 3, 6, 4)) for _ in range(3))
    out, lse = attention_reference(q, k, v, causal=True)
    np.testing.assert_allclose(out[:, :, 0], v[:, :, 0], rtol=1e-12)
    np.testing.assert_allclose(lse[:, :, 0], np.einsum("bhd,bhd->bh", q[:, :, 0], k[:, :, 0]) / 2.0, rtol=1e-12)
    # The last row sees every key: identical to the non-causal result.
    full, full_lse = attention_reference(q, k, v)
    np.testing.assert_allclose(out[:, :, -1], full[:, :, -1], rtol=1e-12)
    np.testing.assert_allclose(lse[:, :, -1], full_lse[:, :, -1], rtol=1e-12)


def test_causal_is_bottom_right_aligned_when_nq_lt_nk(rng):
    # Nq=2, Nk=5: row 0 sees keys 0..3, row 1 sees all five.
    q = rng.standard_normal((1, 1, 2, 4))
    k, v = rng.standard_normal((1, 1, 5, 4)), rng.standard_normal((1, 1, 5, 4))
    out, _ = attention_reference(q, k, v, causal=True)
    row0, _ = attention_reference(q[:, :, :1], k[:, :, :4], v[:, :, :4])
    row1, _ = attention_reference(q[:, :, 1:], k, v)
    np.testing.assert_allclose(out[:, :, :1], row0, rtol=1e-12)
    np.testing.assert_allclose(out[:, :, 1:], row1, rtol=1e-12)


def test_fully_masked_rows_are_zero_and_minus_inf(rng):
    # Nq=5 > Nk=2 causal: rows 0..2 see no key (j <= i - 3), rows 3 and 4 see keys 0 and 0..1.
    q = rng.standard_normal((2, 2, 5, 4))
    k, v = rng.standard_normal((2, 2, 2, 4)), rng.standard_normal((2, 2, 2, 4))
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        out, lse = attention_reference(q, k, v, causal=True)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert (out[:, :, :3] == 0).all()
    assert (lse[:, :, :3] == -np.inf).all()
    np.testing.assert_allclose(out[:, :, 3], v[:, :, 0], rtol=1e-12)
    assert np.isfinite(lse[:, :, 3:]).all()


def test_3d_input_gives_3d_output(rng):
    q, k, v = (rng.standard_normal((3, 7, 8)) for _ in range(3))
    out, lse = attention_reference(q, k, v, causal=True)
    assert out.shape == (3, 7, 8) and lse.shape == (3, 7)
    out4, lse4 = attention_reference(q[:, None], k[:, None], v[:, None], causal=True)
    np.testing.assert_array_equal(out, out4[:, 0])
    np.testing.assert_array_equal(lse, lse4[:, 0])


def test_gqa_head_mapping(rng):
    # Hq=4, Hkv=2: heads 0,1 read kv head 0; heads 2,3 read kv head 1.
    q = rng.standard_normal((1, 4, 5, 8))
    k, v = rng.standard_normal((1, 2, 6, 8)), rng.standard_normal((1, 2, 6, 8))
    out, _ = attention_reference(q, k, v)
    for h in range(4):
        single, _ = attention_reference(q[:, h : h + 1], k[:, h // 2 : h // 2 + 1], v[:, h // 2 : h // 2 + 1])
        np.testing.assert_allclose(out[:, h : h + 1], single, rtol=1e-12)


def test_softmax_scale_is_applied(rng):
    q, k, v = (rng.standard_normal((1, 1, 4, 8)) for _ in range(3))
    scaled, lse = attention_reference(q, k, v, softmax_scale=0.7)
    pre, pre_lse = attention_reference(q * 0.7 * math.sqrt(8), k, v)  # default scale 1/sqrt(8)
    # Two float64 roundings of O(1) sums: an output near 0 differs by ~1e-16 absolute (seed 835411777: 3.4e-16
    # on 1.5e-4, over rtol alone), hence the absolute floor of the other float64 comparisons here.
    np.testing.assert_allclose(scaled, pre, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, pre_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_chunking_does_not_change_the_result(rng, monkeypatch, causal):
    q = rng.standard_normal((3, 4, 37, 8))
    k, v = rng.standard_normal((3, 2, 41, 8)), rng.standard_normal((3, 2, 41, 8))
    whole = attention_reference(q, k, v, causal=causal)
    for elems in (1, 4 * 41 * 5, 4 * 37 * 41 * 2):  # one row, several rows, two batches at a time
        monkeypatch.setattr(reference, "_CHUNK_ELEMS", elems)
        part = attention_reference(q, k, v, causal=causal)
        np.testing.assert_allclose(part[0], whole[0], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(part[1], whole[1], rtol=1e-13)


def test_nan_propagates_to_the_rows_that_read_it(rng):
    q, k, v = (rng.standard_normal((1, 1, 4, 4)) for _ in range(3))
    q[0, 0, 1, 2] = np.nan
    out, lse = attention_reference(q, k, v)
    assert np.isnan(out[0, 0, 1]).all() and np.isnan(lse[0, 0, 1])
    assert np.isfinite(np.delete(out[0, 0], 1, axis=0)).all()


def test_empty_inputs():
    out, lse = attention_reference(np.zeros((0, 2, 3, 4)), np.zeros((0, 2, 3, 4)), np.zeros((0, 2, 3, 4)))
    assert out.shape == (0, 2, 3, 4) and lse.shape == (0, 2, 3)
    out, lse = attention_reference(np.ones((1, 1, 3, 4)), np.zeros((1, 1, 0, 4)), np.zeros((1, 1, 0, 4)))
    assert (out == 0).all() and (lse == -np.inf).all()


def test_accepts_low_precision_inputs(rng, bf16):
    x = rng.standard_normal((1, 1, 5, 8))
    for dt in (np.float16, bf16, np.float32):
        out, lse = attention_reference(x.astype(dt), x.astype(dt), x.astype(dt))
        assert out.dtype == np.float64 and lse.dtype == np.float64
        want, _ = rowwise_attention(*(x.astype(dt).astype(np.float64) for _ in range(3)))
        np.testing.assert_allclose(out, want, rtol=1e-12)


@pytest.mark.parametrize(
    "shapes",
    [((1, 3, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)), ((1, 1, 2, 4), (1, 1, 2, 4), (1, 1, 3, 4)), ((1, 2, 4), (1, 1, 2, 4), (1, 1, 2, 4))],
)
def test_rejects_inconsistent_shapes(shapes):
    with pytest.raises(ValueError):
        attention_reference(*(np.zeros(s) for s in shapes))


# ---- rel_l2 ------------------------------------------------------------------------------------


def test_rel_l2_hand_values():
    assert rel_l2([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert rel_l2([3.0, 4.5], [3.0, 4.0]) == pytest.approx(0.1)  # 0.5 / 5
    assert rel_l2([1.0, 0.0], [0.0, 0.0]) == pytest.approx(1.0)  # absolute when ||ref|| == 0


def test_rel_l2_nan_and_inf():
    assert rel_l2([np.nan, 1.0], [1.0, 1.0]) == math.inf
    assert rel_l2([1.0, 1.0], [np.nan, 1.0]) == math.inf
    assert rel_l2([np.inf, 1.0], [1.0, 1.0]) == math.inf
    # Matching -inf (lse of fully masked rows) is no error; the finite part still counts.
    assert rel_l2([-np.inf, 3.0, 4.5], [-np.inf, 3.0, 4.0]) == pytest.approx(0.1)
    assert rel_l2([-np.inf, 1.0], [0.0, 1.0]) == math.inf


def test_rel_l2_shape_mismatch():
    with pytest.raises(ValueError):
        rel_l2(np.zeros(3), np.zeros(4))


# ---- naive_same_precision ---------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_naive_same_precision_fp32_is_close(rng, causal):
    q, k, v = (rng.standard_normal((2, 2, 33, 32)).astype(np.float32) for _ in range(3))
    ref, _ = attention_reference(q, k, v, causal=causal)
    naive = naive_same_precision(q, k, v, np.float32, causal=causal)
    assert naive.dtype == np.float64
    assert rel_l2(naive, ref) < 2e-6


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_naive_same_precision_error_is_of_its_dtype(rng, resolve_dtype, dtype):
    dt = resolve_dtype(dtype)
    eps = {"float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]  # machine epsilon
    q, k, v = (rng.standard_normal((2, 4, 65, 64)).astype(dt) for _ in range(3))
    ref, _ = attention_reference(q, k, v)
    err = rel_l2(naive_same_precision(q, k, v, dt), ref)
    # Rounding S, P and O each cost about eps/2; the sum must be visible but bounded.
    assert eps / 20 < err < 4 * eps


def test_naive_same_precision_rounds_p_to_e4m3(rng):
    """fp8 attention's yardstick: P = exp(S - max) in e4m3 (3 mantissa bits, 2^-4 relative) before P V, the
    row's sum after: an error of the order of e4m3's rounding, far above float32's; exact where a row sees
    one key (P = 1)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    e4m3 = np.dtype(ml_dtypes.float8_e4m3fn)
    q, k, v = (rng.standard_normal((2, 2, 65, 64)).astype(np.float32) for _ in range(3))
    ref, _ = attention_reference(q, k, v, causal=True)
    err = rel_l2(naive_same_precision(q, k, v, np.float32, causal=True, p_dtype=e4m3), ref)
    assert 2.0**-4 / 20 < err < 2.0**-4, err
    assert rel_l2(naive_same_precision(q, k, v, np.float32, causal=True), ref) < 2e-6
    one = naive_same_precision(q[:, :, :1], k[:, :, :1], v[:, :, :1], np.float32, p_dtype=e4m3)
    np.testing.assert_allclose(one, np.broadcast_to(v[:, :, :1], one.shape), rtol=1e-6)


@pytest.mark.parametrize("window,softcap", [((4, 0), 0.0), ((-1, -1), 5.0), ((2, 3), 1.0)])
def test_naive_same_precision_window_and_softcap(rng, window, softcap):
    q, k, v = (rng.standard_normal((1, 2, 40, 32)).astype(np.float32) for _ in range(3))
    ref, _ = attention_reference(q, k, v, window=window, softcap=softcap)
    naive = naive_same_precision(q, k, v, np.float32, window=window, softcap=softcap)
    assert rel_l2(naive, ref) < 2e-6
    # The window changes the result: the bound above is not met by ignoring it.
    assert window == (-1, -1) or rel_l2(naive_same_precision(q, k, v, np.float32, softcap=softcap), ref) > 1e-2


def test_naive_same_precision_masks_like_the_reference(rng):
    q = rng.standard_normal((1, 2, 6, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, 3, 32)).astype(np.float32) for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        naive = naive_same_precision(q, k, v, np.float16, causal=True)
    ref, _ = attention_reference(q, k, v, causal=True)
    assert (naive[:, :, :3] == 0).all()  # rows 0..2 see no key
    np.testing.assert_allclose(naive, ref, atol=5e-3)
