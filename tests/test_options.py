"""The options of a call, through the one validator every entry uses (the extension's, `_C.validate`,
cpp/bindings/request.cpp): every bad value is refused with the argument named, good ones pass; and the
layouts the numpy code reads from a validated call (cutlassfa._options). Device index arrays are
checked on the GPU (tests/test_variants_gpu.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cutlassfa import _api
from cutlassfa import _options as opt
from cutlassfa.masks import Window

pytestmark = pytest.mark.skipif(_api._C is None, reason="optional package: the cutlassfa extension is not built")


def validate(q, k, v, causal=False, **options):
    """The extension's validator on host arrays; the backend it would run."""
    return _api._C.validate(q, k, v, None, causal, None, _api._CPU, **options)


def check_window(window, causal=False):
    probe = np.zeros((1, 1, 1, 8), np.float32)
    return validate(probe, probe, probe, causal, window=window)


def check_softcap(value):
    probe = np.zeros((1, 1, 1, 8), np.float32)
    return validate(probe, probe, probe, softcap=value)


# ---- head dim, window, softcap ----------------------------------------------------------------------


@pytest.mark.parametrize("d", range(8, 257, 8))
def test_head_dims_accepted(d):
    x = np.zeros((1, 1, 1, d), np.float32)
    assert validate(x, x, x) == _api._CPU


@pytest.mark.parametrize("d", [4, 7, 12, 100, 257, 264, 512])
def test_head_dims_refused(d):
    x = np.zeros((1, 1, 1, d), np.float32)
    with pytest.raises(ValueError, match="head dim"):
        validate(x, x, x)


@pytest.mark.parametrize("causal,window", [
    (False, None), (True, None), (False, (5, 3)), (False, [0, 0]), (True, (7, 0)), (True, (7, -1)),
    (False, (np.int64(4), -1)), (False, Window(2, 2)),
])
def test_window_accepted(causal, window):
    assert check_window(window, causal) == _api._CPU


@pytest.mark.parametrize("window,error", [
    ("ab", TypeError), (3, TypeError), ((1,), TypeError), ((1, 2, 3), TypeError), ((1.0, 2), TypeError),
    ((True, 0), TypeError), ((0, None), TypeError),
    ((-2, 0), ValueError), ((0, -5), ValueError), ((2**31, 0), ValueError),
])
def test_window_refused(window, error):
    with pytest.raises(error, match="window"):
        check_window(window, False)


def test_causal_with_right_bound_refused():
    with pytest.raises(ValueError, match="window.*causal|causal.*window"):
        check_window((16, 1), True)


@pytest.mark.parametrize("value", [0, 0.0, 30, 50.5, np.float32(1.5), np.int32(2)])
def test_softcap_accepted(value):
    assert check_softcap(value) == _api._CPU


@pytest.mark.parametrize("value,error", [
    (-1.0, ValueError), (-1e-30, ValueError), (math.nan, ValueError), (math.inf, ValueError),
    ("1", TypeError), (True, TypeError), ([1.0], TypeError),
])
def test_softcap_refused(value, error):
    with pytest.raises(error, match="softcap"):
        check_softcap(value)


# ---- KV cache ---------------------------------------------------------------------------------------

B, HQ, HKV, NQ, D = 3, 4, 2, 2, 8


def arrays(ncache=10, pages=None, page_size=4, n_new=None, dtype=np.float16):
    q = np.zeros((B, HQ, NQ, D), dtype)
    shape = (B, HKV, ncache, D) if pages is None else (pages, HKV, page_size, D)
    kv = dict(q=q, k_cache=np.zeros(shape, dtype), v_cache=np.zeros(shape, dtype))
    if n_new is not None:
        kv.update(k_new=np.zeros((B, HKV, n_new, D), dtype), v_new=np.zeros((B, HKV, n_new, D), dtype))
    return kv


def _half(x):
    return x.astype(np.float16) if isinstance(x, np.ndarray) and x.dtype == np.float64 else x


def kvcache(**kw):
    """The validator on a KV-cache call (cache_seqlens defaults to full entries, so that the call is one)."""
    a = [_half(kw.pop(key)) for key in ("q", "k_cache", "v_cache")]
    kw.setdefault("cache_seqlens", [a[1].shape[2]] * B)
    return validate(*a, **kw)


def test_kvcache_layout_defaults():
    a = arrays()
    args = opt.kvcache_layout(a["q"], a["k_cache"], a["v_cache"])
    assert not args.paged and args.capacity == 10 and args.n_new == 0
    np.testing.assert_array_equal(args.cache_seqlens, [10, 10, 10])
    np.testing.assert_array_equal(args.cache_leftpad, [0, 0, 0])


def test_kvcache_layout_paged_and_appended():
    table = np.array([[5, 1, 9], [0, 2, 3], [7, 7, 7]])
    a = arrays(pages=10, n_new=2)
    assert kvcache(**a, block_table=table, cache_seqlens=[3, 10, 0], cache_leftpad=[1, 0, 0]) == _api._CPU
    args = opt.kvcache_layout(a["q"], a["k_cache"], a["v_cache"], block_table=table, cache_seqlens=[3, 10, 0],
                              cache_leftpad=[1, 0, 0], k_new=a["k_new"])
    assert args.paged and args.capacity == 12 and args.page_size == 4 and args.n_new == 2
    np.testing.assert_array_equal(args.block_table, table)


def test_kvcache_only_used_pages_are_checked():
    # Entry 0 uses 1 page (3 keys), entry 1 two; the rest of the rows may hold anything (e.g. -1).
    table = np.array([[4, -1, 99], [0, 1, -1], [-1, -1, -1]], dtype=np.int32)
    kvcache(**arrays(pages=5), block_table=table, cache_seqlens=[3, 5, 0])
    with pytest.raises(ValueError, match=r"block_table\[1\]"):
        kvcache(**arrays(pages=5), block_table=table, cache_seqlens=[3, 9, 0])
    with pytest.raises(ValueError, match=r"block_table\[0\]"):
        kvcache(**arrays(pages=4), block_table=table, cache_seqlens=[3, 5, 0])


@pytest.mark.parametrize("change,name,error", [
    (dict(q=np.zeros((B, NQ, D))), "q", ValueError),
    (dict(v_cache=np.zeros((B, HKV, 9, D))), "v must have k's shape", ValueError),
    (dict(k_cache=np.zeros((B, HKV, 10, 16)), v_cache=np.zeros((B, HKV, 10, 16))), "k's head dim", ValueError),
    (dict(k_cache=np.zeros((B, 3, 10, D)), v_cache=np.zeros((B, 3, 10, D))), "heads of k", ValueError),
    (dict(k_cache=np.zeros((B + 1, HKV, 10, D)), v_cache=np.zeros((B + 1, HKV, 10, D))), "batch size", ValueError),
    (dict(cache_seqlens=[1, 2]), "cache_seqlens", ValueError),
    (dict(cache_seqlens=[1, 2, 11]), "cache_seqlens", ValueError),
    (dict(cache_seqlens=[1, -1, 2]), "cache_seqlens", ValueError),
    (dict(cache_seqlens=np.array([1.0, 2.0, 3.0])), "cache_seqlens", TypeError),
    (dict(cache_seqlens=[[1, 2], [3]]), "cache_seqlens", ValueError),
    (dict(cache_seqlens="123"), "cache_seqlens", TypeError),
    (dict(cache_seqlens=[4, 4, 4], cache_leftpad=[0, 5, 0]), "cache_leftpad", ValueError),
    (dict(cache_leftpad=[0, -1, 0]), "cache_leftpad", ValueError),
    (dict(cache_leftpad=[0, 0]), "cache_leftpad", ValueError),
    (dict(cache_leftpad=[0, 11, 0]), "cache_leftpad", ValueError),
])
def test_kvcache_contiguous_refused(change, name, error):
    kw = {**arrays(), **change}
    with pytest.raises(error, match=name):
        kvcache(**kw)


@pytest.mark.parametrize("change,name,error", [
    (dict(block_table=np.zeros(B, np.int32)), "block_table", ValueError),
    (dict(block_table=np.zeros((B + 1, 3), np.int32)), "block_table", ValueError),
    (dict(block_table=np.zeros((B, 3), np.float32)), "block_table", TypeError),
    (dict(block_table=np.array([[0, 1, 2], [3, 4, 6], [0, 0, 0]])), "block_table", ValueError),
    (dict(block_table=np.array([[0, 1, 2], [3, 4, 5], [0, -3, 0]])), "block_table", ValueError),
    (dict(cache_seqlens=None), "cache_seqlens", ValueError),
    (dict(cache_seqlens=[4, 13, 0]), "cache_seqlens", ValueError),
    (dict(k_cache=np.zeros((6, HKV, 0, D)), v_cache=np.zeros((6, HKV, 0, D)), cache_seqlens=[0, 0, 0]), "page size",
     ValueError),
])
def test_kvcache_paged_refused(change, name, error):
    kw = {**arrays(pages=6), "block_table": np.array([[0, 1, 2], [3, 4, 5], [0, 0, 0]]),
          "cache_seqlens": [4, 12, 5], **change}
    with pytest.raises(error, match=name):
        kvcache(**kw)


@pytest.mark.parametrize("change,name,error", [
    (dict(v_new=None), "v_new", ValueError),
    (dict(k_new=None), "k_new", ValueError),
    (dict(k_new=np.zeros((B, HKV, 2, 16), np.float16)), "k_new", ValueError),
    (dict(k_new=np.zeros((B, 1, 2, D), np.float16)), "k_new", ValueError),
    (dict(k_new=np.zeros((B, HKV, 2), np.float16)), "k_new", ValueError),
    (dict(v_new=np.zeros((B, HKV, 3, D), np.float16)), "v_new", ValueError),
    (dict(k_new=np.zeros((B, HKV, 2, D), np.float32), v_new=np.zeros((B, HKV, 2, D), np.float32)), "k_new",
     TypeError),
    (dict(v_new=np.zeros((B, HKV, 2, D), np.float32)), "v_new", TypeError),
    (dict(cache_seqlens=None), "cache_seqlens", ValueError),
    (dict(cache_seqlens=[0, 9, 0]), "cache_seqlens", ValueError),  # 9 + 2 new > 10
])
def test_kvcache_new_keys_refused(change, name, error):
    kw = {**arrays(n_new=2), "cache_seqlens": [0, 8, 3], **change}
    with pytest.raises(error, match=name):
        kvcache(**kw)


# ---- varlen -----------------------------------------------------------------------------------------


def varlen(total_q=7, total_k=9, hq=4, hkv=2, d=8, **kw):
    q, k, v = np.zeros((total_q, hq, d)), np.zeros((total_k, hkv, d)), np.zeros((total_k, hkv, d))
    q, k, v = (_half(kw.pop(name, x)) for name, x in (("q", q), ("k", k), ("v", v)))
    return validate(q, k, v, cu_seqlens_q=kw.pop("cu_q", [0, 3, 3, 7]), cu_seqlens_k=kw.pop("cu_k", [0, 0, 4, 9]), **kw)


def test_varlen_accepted():
    assert varlen(max_seqlen_q=4, max_seqlen_k=5) == _api._CPU
    assert varlen(total_q=0, total_k=0, cu_q=[0], cu_k=np.array([0], np.int32)) == _api._CPU
    args = opt.varlen_layout([0, 3, 3, 7], [0, 0, 4, 9], max_seqlen_q=4, max_seqlen_k=5)
    assert args.batch == 3 and args.max_seqlen_q == 4 and args.max_seqlen_k == 5
    np.testing.assert_array_equal(args.cu_seqlens_k, [0, 0, 4, 9])


@pytest.mark.parametrize("change,name,error", [
    (dict(q=np.zeros((1, 7, 4, 8))), "q", ValueError),
    (dict(v=np.zeros((9, 2, 16))), "v", ValueError),
    (dict(k=np.zeros((9, 2, 16)), v=np.zeros((9, 2, 16))), "k", ValueError),
    (dict(k=np.zeros((9, 3, 8)), v=np.zeros((9, 3, 8))), "heads", ValueError),
    (dict(cu_q=[[0, 3, 3, 7]]), "cu_seqlens_q", ValueError),
    (dict(cu_q=[]), "cu_seqlens_q", ValueError),
    (dict(cu_q=[1, 3, 3, 7]), "cu_seqlens_q", ValueError),
    (dict(cu_k=[0, 5, 4, 9]), "cu_seqlens_k", ValueError),
    (dict(cu_q=[0, 3, 3, 6]), "cu_seqlens_q", ValueError),
    (dict(cu_k=[0, 4, 10]), "cu_seqlens", ValueError),
    (dict(cu_q=np.array([0.0, 3, 3, 7])), "cu_seqlens_q", TypeError),
    (dict(max_seqlen_q=3), "max_seqlen_q", ValueError),  # the longest query sequence has 4 rows
    (dict(max_seqlen_k=-1), "max_seqlen_k", ValueError),
    (dict(max_seqlen_k=True), "max_seqlen_k", TypeError),
    (dict(max_seqlen_q=4.0), "max_seqlen_q", TypeError),
])
def test_varlen_refused(change, name, error):
    with pytest.raises(error, match=name):
        varlen(**change)
