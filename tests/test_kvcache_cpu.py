"""KV caches on the cpu backend and in the reference: contiguous and paged caches, ragged lengths, left
padding, keys appended into the cache, against an independent per-entry computation
(attention_oracle: caches gathered position by position, the mask formula written out).

Every cache slot that must not be read (past an entry's length, before its left padding, unused
pages) holds NaN, so reading one shows up as NaN in the output."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from attention_oracle import assert_matches, cache_after_append, dense_attention, gather_entry, visible
from cutlassfa import _kv_sources, masks
from cutlassfa.cpu import kvcache_forward_cpu
from cutlassfa.reference import kvcache_reference

D = 32


class Case:
    """A random cache of B entries: contiguous (B, Hkv, Ncache, d), or paged (num_pages, Hkv,
    page_size, d) with pages handed out in a shuffled order."""

    def __init__(self, rng, lengths, *, hq=4, hkv=2, nq=1, n_new=0, page_size=None, leftpad=False,
                 dtype=np.float32, vllm_layout=False):
        b = len(lengths)
        self.lengths = np.array(lengths, dtype=np.int32)
        total = self.lengths + n_new
        self.q = rng.standard_normal((b, hq, nq, D)).astype(dtype)
        self.k_new = self.v_new = None
        if n_new:
            self.k_new, self.v_new = (rng.standard_normal((b, hkv, n_new, D)).astype(dtype) for _ in range(2))
        self.leftpad = np.array([rng.integers(0, n + 1) for n in lengths], np.int32) if leftpad else None
        self.page_size = page_size
        if page_size is None:
            shape = (b, hkv, int(total.max(initial=0)) + 3, D)
            self.k_cache, self.v_cache = (np.full(shape, np.nan, dtype) for _ in range(2))
            self.block_table = None
            for i, n in enumerate(lengths):
                lo = 0 if self.leftpad is None else self.leftpad[i]
                for c in (self.k_cache, self.v_cache):
                    c[i, :, lo:n] = rng.standard_normal((hkv, n - lo, D))
        else:
            per_entry = [-(-int(n) // page_size) for n in total]
            max_pages = max(per_entry + [1]) + 1  # one spare column, left at -1
            num_pages = sum(per_entry) + 3  # and a few pages nobody uses
            order = rng.permutation(num_pages)
            self.block_table = np.full((b, max_pages), -1, np.int32)
            at = 0
            for i, n in enumerate(per_entry):
                self.block_table[i, :n] = order[at : at + n]
                at += n
            shape = (num_pages, page_size, hkv, D) if vllm_layout else (num_pages, hkv, page_size, D)
            self.k_cache, self.v_cache = (np.full(shape, np.nan, dtype) for _ in range(2))
            if vllm_layout:  # (num_pages, page_size, Hkv, d) memory, seen as (num_pages, Hkv, page_size, d)
                self.k_cache, self.v_cache = (c.transpose(0, 2, 1, 3) for c in (self.k_cache, self.v_cache))
            for i, n in enumerate(lengths):
                lo = 0 if self.leftpad is None else self.leftpad[i]
                for p in range(lo, n):
                    page, row = self.block_table[i, p // page_size], p % page_size
                    for c in (self.k_cache, self.v_cache):
                        c[page, :, row] = rng.standard_normal((hkv, D))

    def kwargs(self, **mode):
        return dict(cache_seqlens=self.lengths, cache_leftpad=self.leftpad, block_table=self.block_table,
                    k_new=self.k_new, v_new=self.v_new, **mode)

    def oracle(self, causal=False, window=(-1, -1), softcap=0.0):
        """Per entry: gather keys [0, L) by position, append the new keys, attend with the formula's mask."""
        left, right = window
        if causal:
            right = 0
        outs, lses = [], []
        for i, n in enumerate(self.lengths):
            pages = None if self.block_table is None else self.block_table[i]
            src_k = self.k_cache[i] if pages is None else self.k_cache
            src_v = self.v_cache[i] if pages is None else self.v_cache
            keys = gather_entry(src_k, int(n), pages, self.page_size)
            vals = gather_entry(src_v, int(n), pages, self.page_size)
            if self.k_new is not None:
                keys = np.concatenate([keys, self.k_new[i].astype(np.float64)], axis=1)
                vals = np.concatenate([vals, self.v_new[i].astype(np.float64)], axis=1)
            lp = 0 if self.leftpad is None else int(self.leftpad[i])
            mask = visible(self.q.shape[2], keys.shape[1], left, right, lp)
            o, l_ = dense_attention(self.q[i], keys, vals, mask, softcap=softcap)
            outs.append(o)
            lses.append(l_)
        return np.stack(outs), np.stack(lses)


def assert_same_bits(a, b):
    """Bit-identical arrays (NaN slots included, for every dtype)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def run_and_check(case, **mode):
    """The oracle first (it reads the caches before anything is appended), then the reference (which
    must leave the caches alone) and the cpu backend (which appends k_new / v_new into them)."""
    want_out, want_lse = case.oracle(**{k: v for k, v in mode.items() if k in ("causal", "window", "softcap")})
    before = (case.k_cache.copy(), case.v_cache.copy(), case.lengths.copy())
    ref_out, ref_lse = kvcache_reference(case.q, case.k_cache, case.v_cache, **case.kwargs(**mode))
    np.testing.assert_allclose(ref_out, want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ref_lse, want_lse, rtol=1e-10, atol=1e-12)
    assert_same_bits(case.k_cache, before[0])  # the reference never writes the caches

    out, lse = kvcache_forward_cpu(case.q, case.k_cache, case.v_cache, return_lse=True, block_n=16, block_m=8,
                                   **case.kwargs(**mode))
    assert out.dtype == case.q.dtype and out.shape == case.q.shape and lse.shape == case.q.shape[:3]
    assert_matches(out, lse, want_out, want_lse, case.q.dtype.name)
    np.testing.assert_array_equal(case.lengths, before[2])  # cache_seqlens is not modified
    check_appended(case, *before[:2])
    return out, lse


def check_appended(case, k_before, v_before):
    """The new keys sit at [L_b, L_b + Nnew) of each entry; every other slot is unchanged."""
    for cache, old, new in ((case.k_cache, k_before, case.k_new), (case.v_cache, v_before, case.v_new)):
        assert_same_bits(cache, cache_after_append(old, new, case.lengths, case.block_table, case.page_size))


# ---- the matrix: contiguous / page sizes x GQA x decode / several queries x causal x appended keys ----

LENGTHS = [0, 1, 37, 300]  # ragged, with an empty cache


@pytest.mark.parametrize("n_new", [0, 3])
@pytest.mark.parametrize("nq,causal", [(1, False), (5, True), (5, False)], ids=["decode", "causal5", "full5"])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2), (8, 1)], ids=str)
@pytest.mark.parametrize("page_size", [None, 1, 7, 16, 256], ids=lambda p: f"page{p}" if p else "contiguous")
def test_matrix(rng, page_size, hq, hkv, nq, causal, n_new):
    case = Case(rng, LENGTHS, hq=hq, hkv=hkv, nq=nq, n_new=n_new, page_size=page_size)
    run_and_check(case, causal=causal)


@pytest.mark.parametrize("page_size", [None, 7, 16])
@pytest.mark.parametrize("window,causal,softcap", [
    ((16, 0), True, 0.0), ((4, 2), False, 0.0), ((-1, -1), False, 5.0), ((8, -1), True, 2.0), ((0, 0), False, 0.0),
], ids=str)
def test_window_and_softcap(rng, page_size, window, causal, softcap):
    case = Case(rng, [5, 64, 130], nq=4, n_new=2, page_size=page_size)
    run_and_check(case, causal=causal, window=window, softcap=softcap)


@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_left_padding(rng, page_size, causal):
    case = Case(rng, [40, 9, 100, 0], nq=3, n_new=2, page_size=page_size, leftpad=True)
    run_and_check(case, causal=causal, window=(20, -1))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("page_size", [None, 16])
def test_half_precision(rng, resolve_dtype, dtype, page_size):
    case = Case(rng, [3, 77, 200], nq=2, n_new=2, page_size=page_size, dtype=resolve_dtype(dtype))
    run_and_check(case, causal=True)


def test_vllm_page_layout_passes_transposed(rng):
    # (num_pages, page_size, Hkv, d) caches, the layout of vLLM and FlashAttention, as a strided view.
    case = Case(rng, [33, 0, 70], nq=2, n_new=1, page_size=16, vllm_layout=True)
    assert not case.k_cache.flags.c_contiguous
    run_and_check(case, causal=True)


def test_without_cache_seqlens_the_whole_cache_is_attended(rng):
    q = rng.standard_normal((2, 4, 3, D)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 50, D)).astype(np.float32) for _ in range(2))
    out, lse = kvcache_forward_cpu(q, k, v, causal=True, return_lse=True)
    want = [dense_attention(q[i], k[i], v[i], visible(3, 50, -1, 0)) for i in range(2)]
    assert_matches(out, lse, np.stack([w[0] for w in want]), np.stack([w[1] for w in want]))


def test_writes_into_out(rng):
    case = Case(rng, [10, 20], nq=2, page_size=7)
    buf = np.full((2, 4, 2, D), 7, np.float32)
    got = kvcache_forward_cpu(case.q, case.k_cache, case.v_cache, out=buf, **case.kwargs(causal=True))
    assert got is buf
    np.testing.assert_array_equal(buf, kvcache_forward_cpu(case.q, case.k_cache, case.v_cache,
                                                           **case.kwargs(causal=True)))


def test_paged_tiles_follow_the_trip_counts(rng, monkeypatch):
    loads = []
    tile = _kv_sources.PagedKeys.tile
    monkeypatch.setattr(_kv_sources.PagedKeys, "tile",
                        lambda self, j0, j1, dt: loads.append((j0, j1)) or tile(self, j0, j1, dt))
    case = Case(rng, [500], nq=3, page_size=16)
    run_and_check(case, causal=True, window=(40, 0))
    w = masks.Window(40, 0)
    trips = masks.tile_trips(0, 3, 3, 500, w, 16)
    assert loads == [(n * 16, min(500, (n + 1) * 16)) for n in range(trips.first, trips.last)]
    assert len(loads) == 4  # keys 457..499 of 500: tiles 28..31, not 32 tiles


# ---- bad input: refused (the extension's validator, before the cpu backend), nothing written --------


@pytest.mark.parametrize("change,name", [
    (dict(block_table="out_of_range"), "block_table"),
    (dict(cache_seqlens="too_long"), "cache_seqlens"),
    (dict(cache_leftpad="too_large"), "cache_leftpad"),
    (dict(v_new="wrong_shape"), "v_new"),
    (dict(window=(-3, 0)), "window"),
    (dict(softcap=-1.0), "softcap"),
    (dict(softmax_scale=1e300), "softmax_scale"),  # scores past float64: found before anything is written
])
@pytest.mark.skipif(cutlassfa._api._C is None, reason="optional package: the cutlassfa extension is not built")
def test_bad_input_writes_nothing(rng, change, name):
    case = Case(rng, [5, 9], nq=2, n_new=2, page_size=4)
    kw = case.kwargs(causal=True)
    key, value = next(iter(change.items()))
    if value == "out_of_range":
        value = case.block_table.copy()
        value[1, 0] = case.k_cache.shape[0]
    elif value == "too_long":
        value = np.array([5, case.block_table.shape[1] * 4 - 1], np.int32)  # + 2 new keys passes the end
    elif value == "too_large":
        value = np.array([0, 10], np.int32)
    elif value == "wrong_shape":
        value = case.v_new[:, :, :1]
    kw[key] = value
    k_before, v_before = case.k_cache.copy(), case.v_cache.copy()
    out = np.full(case.q.shape, 3, np.float32)
    with pytest.raises((ValueError, TypeError), match=name):
        cutlassfa.forward(case.q, case.k_cache, case.v_cache, out=out, backend="cpu", **kw)
    assert_same_bits(case.k_cache, k_before)
    assert_same_bits(case.v_cache, v_before)
    assert (out == 3).all()


@pytest.mark.skipif(cutlassfa._api._C is None, reason="optional package: the cutlassfa extension is not built")
def test_read_only_cache_with_new_keys_is_refused(rng):
    case = Case(rng, [5, 9], nq=2, n_new=2)
    case.k_cache.flags.writeable = False
    v_before = case.v_cache.copy()
    with pytest.raises(ValueError, match="read-only"):
        cutlassfa.forward(case.q, case.k_cache, case.v_cache, backend="cpu", **case.kwargs())
    assert_same_bits(case.v_cache, v_before)
    # Without new keys nothing is written, so a read-only cache is fine.
    case.k_new = case.v_new = None
    out, lse = kvcache_forward_cpu(case.q, case.k_cache, case.v_cache, return_lse=True, **case.kwargs())
    assert_matches(out, lse, *case.oracle())
