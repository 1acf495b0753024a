"""float8_e4m3fn KV caches with dequantization scales (k_descale / v_descale, FlashAttention-3's
convention) on the cpu backend and in the reference: entry b's keys and values of head h are read as
k * k_descale[b, h] and v * v_descale[b, h], with q in float16 / bfloat16.

Checked three ways: the cpu backend against the float64 reference on the same fp8 inputs; both against
themselves on caches dequantized by hand (float32 / float64 copies multiplied by the scales, so the
descale arguments must mean exactly that); and the fp8 keys appended into the caches bit for bit.
Every cache slot that must not be read holds fp8 NaN, so reading one shows up as NaN."""

from __future__ import annotations

import numpy as np
import pytest

from attention_oracle import cache_after_append
from cutlassfa._kv_sources import DenseKeys, PagedKeys
from cutlassfa._options import per_head
from cutlassfa.cpu import kvcache_forward_cpu
from cutlassfa.reference import kvcache_reference, rel_l2

ml_dtypes = pytest.importorskip("ml_dtypes", reason="optional package ml_dtypes (float8_e4m3fn)")
F8 = np.dtype(ml_dtypes.float8_e4m3fn)
HQ, HKV = 8, 2
LENGTHS = [0, 7, 40, 150]  # ragged, with an empty cache
DESCALE_FORMS = [None, "float", "0d", "head", "entry_head"]


def fp8(rng, shape):
    """Random fp8 values spread over e4m3's range (|x| up to ~16, many exponents)."""
    return (rng.standard_normal(shape) * 4).astype(F8)


def draw_descale(rng, form, batch):
    """A fresh random descale in one of the accepted forms: uniform 0.01..0.1, small enough that a
    forgotten scale changes the result."""
    if form is None:
        return None
    if form == "float":
        return float(rng.uniform(0.01, 0.1))
    if form == "0d":
        return np.array(rng.uniform(0.01, 0.1), np.float32)
    shape = (HKV,) if form == "head" else (batch, HKV)
    return rng.uniform(0.01, 0.1, shape).astype(np.float32)


def as_table(descale, batch):
    """The (B, Hkv) float32 scales a descale stands for, by numpy broadcasting (not the helper under test)."""
    table = np.ones((batch, HKV), np.float32)
    return table if descale is None else table * np.asarray(descale, np.float32)


class Fp8Case:
    """fp8 caches of len(lengths) entries: contiguous (B, Hkv, Ncache, d) or paged (num_pages, Hkv,
    page_size, d) with pages handed out in a shuffled order; q of `q_dtype`, scaled so that the scores
    spread (a softmax far from uniform, so that the scales matter)."""

    def __init__(self, rng, lengths, *, d, nq, n_new, page_size, q_dtype, leftpad=False):
        b = len(lengths)
        self.lengths = np.array(lengths, np.int32)
        total = self.lengths + n_new
        self.q = (rng.standard_normal((b, HQ, nq, d)) * 8).astype(q_dtype)
        self.k_new = self.v_new = None
        if n_new:
            self.k_new, self.v_new = fp8(rng, (b, HKV, n_new, d)), fp8(rng, (b, HKV, n_new, d))
        self.leftpad = np.array([rng.integers(0, n + 1) for n in lengths], np.int32) if leftpad else None
        self.page_size = page_size
        self.block_table = None
        if page_size is None:
            shape = (b, HKV, int(total.max()) + 3, d)
        else:
            per_entry = [-(-int(n) // page_size) for n in total]
            num_pages = sum(per_entry) + 3  # and a few pages nobody uses
            order = rng.permutation(num_pages)
            self.block_table = np.full((b, max(per_entry + [1]) + 1), -1, np.int32)  # a spare column at -1
            at = 0
            for i, n in enumerate(per_entry):
                self.block_table[i, :n] = order[at : at + n]
                at += n
            shape = (num_pages, HKV, page_size, d)
        self.k_cache, self.v_cache = np.full(shape, np.nan, F8), np.full(shape, np.nan, F8)
        for i, n in enumerate(lengths):
            lo = 0 if self.leftpad is None else int(self.leftpad[i])
            for c in (self.k_cache, self.v_cache):
                if page_size is None:
                    c[i, :, lo:n] = fp8(rng, (HKV, n - lo, d))
                    continue
                for p in range(lo, n):
                    c[self.block_table[i, p // page_size], :, p % page_size] = fp8(rng, (HKV, d))

    def kwargs(self, **mode):
        return dict(cache_seqlens=self.lengths, cache_leftpad=self.leftpad, block_table=self.block_table,
                    k_new=self.k_new, v_new=self.v_new, **mode)

    def dequantized(self, k_descale, v_descale, dtype):
        """(k_cache, v_cache, k_new, v_new) converted to `dtype` and multiplied by the scales of their
        entry and head; a page takes the scales of the entry whose table holds it (pages nobody holds:
        NaN, times 1)."""
        b = len(self.lengths)
        out = []
        for cache, new, descale in ((self.k_cache, self.k_new, k_descale), (self.v_cache, self.v_new, v_descale)):
            table = as_table(descale, b).astype(dtype)
            if self.block_table is None:
                per_slot = table
            else:
                per_slot = np.ones((cache.shape[0], HKV), dtype)
                for i in range(b):
                    held = self.block_table[i][self.block_table[i] >= 0]
                    per_slot[held] = table[i]
            out.append(cache.astype(dtype) * per_slot[:, :, None, None])
            out.append(None if new is None else new.astype(dtype) * table[:, :, None, None])
        k_cache, k_new, v_cache, v_new = out
        return k_cache, v_cache, k_new, v_new


def assert_same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def expected_after_append(case, cache, new):
    """The cache as it must be after appending `new` at [L_b, L_b + Nnew) of each entry."""
    return cache_after_append(cache, new, case.lengths, case.block_table, case.page_size)


MODES = [(1, False), (4, True), (4, False)]
MODE_IDS = ["decode", "causal4", "full4"]


@pytest.mark.parametrize("q_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("form", DESCALE_FORMS)
@pytest.mark.parametrize("n_new", [0, 3])
@pytest.mark.parametrize("nq,causal", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
def test_cpu_matches_reference(rng, resolve_dtype, page_size, d, nq, causal, n_new, form, q_dtype):
    case = Fp8Case(rng, LENGTHS, d=d, nq=nq, n_new=n_new, page_size=page_size, q_dtype=resolve_dtype(q_dtype))
    descales = dict(k_descale=draw_descale(rng, form, len(LENGTHS)), v_descale=draw_descale(rng, form, len(LENGTHS)))
    k_before, v_before = case.k_cache.copy(), case.v_cache.copy()
    ref_out, ref_lse = kvcache_reference(case.q, case.k_cache, case.v_cache, **case.kwargs(causal=causal),
                                         **descales)
    assert_same_bits(case.k_cache, k_before)  # the reference never writes the caches
    assert_same_bits(case.v_cache, v_before)

    out, lse = kvcache_forward_cpu(case.q, case.k_cache, case.v_cache, return_lse=True, block_n=32, block_m=8,
                                   **case.kwargs(causal=causal), **descales)
    assert out.dtype == case.q.dtype and out.shape == case.q.shape
    assert rel_l2(out, ref_out) <= 1e-2, f"out rel-L2 {rel_l2(out, ref_out):.3e}"
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    assert rel_l2(lse, ref_lse) <= 1e-4, f"lse rel-L2 {rel_l2(lse, ref_lse):.3e}"
    # The fp8 keys land in the caches bit for bit; nothing else changes.
    assert_same_bits(case.k_cache, expected_after_append(case, k_before, case.k_new))
    assert_same_bits(case.v_cache, expected_after_append(case, v_before, case.v_new))


@pytest.mark.parametrize("q_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("form", DESCALE_FORMS)
@pytest.mark.parametrize("leftpad", [False, True], ids=["", "leftpad"])
@pytest.mark.parametrize("nq,causal", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
def test_descales_mean_dequantized_caches(rng, resolve_dtype, page_size, nq, causal, leftpad, form, q_dtype):
    """fp8 + descales gives what the same function gives on the caches dequantized by hand: the cpu
    backend on float32 copies (the same float32 products, so equal up to one rounding of the output),
    the reference on float64 copies (exact)."""
    dtype = resolve_dtype(q_dtype)
    case = Fp8Case(rng, LENGTHS, d=64, nq=nq, n_new=2, page_size=page_size, q_dtype=dtype, leftpad=leftpad)
    descales = dict(k_descale=draw_descale(rng, form, len(LENGTHS)), v_descale=draw_descale(rng, form, len(LENGTHS)))
    k32, v32, k_new32, v_new32 = case.dequantized(descales["k_descale"], descales["v_descale"], np.float32)
    k64, v64, k_new64, v_new64 = case.dequantized(descales["k_descale"], descales["v_descale"], np.float64)

    ref = kvcache_reference(case.q, case.k_cache, case.v_cache, **case.kwargs(causal=causal), **descales)
    want_ref = kvcache_reference(case.q, k64, v64, **{**case.kwargs(causal=causal), "k_new": k_new64,
                                                      "v_new": v_new64})
    for got, want in zip(ref, want_ref):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)

    out, lse = kvcache_forward_cpu(case.q, case.k_cache, case.v_cache, return_lse=True, block_n=32, block_m=8,
                                   **case.kwargs(causal=causal), **descales)
    want_out, want_lse = kvcache_forward_cpu(case.q, k32, v32, return_lse=True, block_n=32, block_m=8,
                                             **{**case.kwargs(causal=causal), "k_new": k_new32, "v_new": v_new32})
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=1e-6)
    # Within one unit in the last place of q's dtype.
    ulp = np.float32(ml_dtypes.finfo(dtype).eps)
    got, want = out.astype(np.float32), want_out.astype(np.float32)
    assert (np.abs(got - want) <= ulp * np.maximum(np.abs(got), np.abs(want))).all()
    # And the scales matter: the unscaled fp8 caches give something else.
    if form is not None:
        plain = kvcache_reference(case.q, case.k_cache, case.v_cache, **case.kwargs(causal=causal))[0]
        assert rel_l2(plain, ref[0]) > 0.05


@pytest.mark.parametrize("page_size", [None, 16], ids=lambda p: f"page{p}" if p else "contiguous")
def test_fp8_appends_every_bit_pattern(rng, page_size):
    """All 256 fp8 bit patterns (NaN, -0, subnormals, +-448) appended: the caches hold them unchanged."""
    case = Fp8Case(rng, [3, 20], d=64, nq=1, n_new=16, page_size=page_size, q_dtype=np.float16)
    patterns = np.arange(256, dtype=np.uint8).view(F8)
    case.k_new = patterns.reshape(1, 2, 16, 8).repeat(8, axis=-1).repeat(2, axis=0)
    case.v_new = patterns[::-1].reshape(1, 2, 16, 8).repeat(8, axis=-1).repeat(2, axis=0)
    expect_k = expected_after_append(case, case.k_cache, case.k_new)
    expect_v = expected_after_append(case, case.v_cache, case.v_new)
    kvcache_forward_cpu(case.q, case.k_cache, case.v_cache, k_descale=np.float32(0.5), **case.kwargs())
    assert_same_bits(case.k_cache, expect_k)
    assert_same_bits(case.v_cache, expect_v)


def test_key_sources_descale_tiles_and_magnitudes(rng):
    """Tiles and largest magnitudes are those of k * k_scale and v * v_scale, per head; without scales the
    tile of a cache already in the compute dtype is the cache itself (no copy)."""
    k, v = fp8(rng, (1, HKV, 40, 64)), fp8(rng, (1, HKV, 40, 64))
    k_scale, v_scale = (rng.uniform(0.01, 0.1, (1, HKV)).astype(np.float32) for _ in range(2))
    want_k = k.astype(np.float32) * k_scale[..., None, None]
    want_v = v.astype(np.float32) * v_scale[..., None, None]
    pages = np.array([2, 0, 1])  # the same keys, paged: 16 a page, out of order
    k_pages, v_pages = np.zeros((3, HKV, 16, 64), F8), np.zeros((3, HKV, 16, 64), F8)
    for p in range(40):
        k_pages[pages[p // 16], :, p % 16], v_pages[pages[p // 16], :, p % 16] = k[0, :, p], v[0, :, p]
    for keys in (DenseKeys(k, v, k_scale=k_scale, v_scale=v_scale),
                 PagedKeys(k_pages, v_pages, pages, 16, 0, 40, k_scale=k_scale[0], v_scale=v_scale[0])):
        tk, tv = keys.tile(5, 37, np.dtype(np.float32))
        assert tk.dtype == tv.dtype == np.float32
        assert_same_bits(tk, want_k[:, :, 5:37])
        assert_same_bits(tv, want_v[:, :, 5:37])
        for count in (None, 30):
            k_max, v_max = keys.max_abs(count)
            assert k_max == pytest.approx(float(np.abs(want_k[:, :, :count]).max()), rel=1e-6)
            assert v_max == pytest.approx(float(np.abs(want_v[:, :, :count]).max()), rel=1e-6)
    cache = k.astype(np.float32)
    assert np.shares_memory(DenseKeys(cache, cache).tile(0, 40, np.dtype(np.float32))[0], cache)


def test_per_head_descale_forms():
    heads = np.array([0.5, 0.25], np.float32)
    table = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    assert per_head(None, 3, 2, "k_descale", one_value=True) is None
    for value, want in ((0.5, np.full((3, 2), 0.5)), (np.array(0.5), np.full((3, 2), 0.5)), (heads, [heads] * 3),
                        (table, table)):
        got = per_head(value, 3, 2, "k_descale", one_value=True)
        assert got.dtype == np.float32 and got.shape == (3, 2)
        np.testing.assert_array_equal(got, want)
    for bad in (np.ones(3, np.float32), np.ones((2, 3), np.float32), np.ones((1, 2), np.float32)):
        with pytest.raises(ValueError, match="descale"):
            per_head(bad, 3, 2, "k_descale", one_value=True)
