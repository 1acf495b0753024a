"""The extension's validator of the variant arguments (cpp/bindings/request.cpp), through
`_C.validate` on host arrays: it runs in every build, the CPU-only one included (no GPU
needed). Each bad input is refused with the ValueError / TypeError naming the argument; good inputs
resolve to a backend."""

from __future__ import annotations

import numpy as np
import pytest

from cutlassfa import _api

_C = _api._C
pytestmark = pytest.mark.skipif(_C is None or not hasattr(_C, "validate"),
                                reason="optional package: the cutlassfa extension is not built")
AUTO = -1


def _kv(rng, b=2, hq=4, hkv=2, nq=3, capacity=40, d=64, dtype=np.float16):
    q = rng.standard_normal((b, hq, nq, d)).astype(dtype)
    k, v = (rng.standard_normal((b, hkv, capacity, d)).astype(dtype) for _ in range(2))
    return q, k, v


def _paged(rng, pages=9, page_size=7, hkv=2, d=64, dtype=np.float16):
    return tuple(rng.standard_normal((pages, hkv, page_size, d)).astype(dtype) for _ in range(2))


def _validate(q, k, v, out=None, causal=False, backend=AUTO, **kw):
    return _C.validate(q, k, v, out, causal, None, backend, **kw)


def test_good_calls_resolve_to_a_backend(rng):
    q, k, v = _kv(rng)
    assert _validate(q, k, v, window=(5, -1), causal=True, softcap=3.0, num_splits=4) in (0, 1, 2, 3, 4, _api._CPU)
    assert _validate(q, k, v, cache_seqlens=[3, 40], cache_leftpad=np.array([1, 0], np.int64)) >= 0
    kp, vp = _paged(rng)
    table = rng.permutation(9)[:6].reshape(2, 3).astype(np.int32)
    new = np.zeros((2, 2, 2, 64), np.float16)
    assert _validate(q, kp, vp, cache_seqlens=(5, 19), block_table=table, k_new=new, v_new=new) >= 0
    qv = rng.standard_normal((10, 4, 64)).astype(np.float32)
    kv = rng.standard_normal((12, 2, 64)).astype(np.float32)
    assert _validate(qv, kv, kv, cu_seqlens_q=[0, 0, 10], cu_seqlens_k=[0, 12, 12], max_seqlen_q=10) >= 0


@pytest.mark.parametrize("kw,error,name", [
    (dict(window=(-2, -1)), ValueError, "window"),
    (dict(window=(-1, 3), causal=True), ValueError, "window"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(softcap=float("inf")), ValueError, "softcap"),
    (dict(num_splits=-1), ValueError, "num_splits"),
    (dict(cache_seqlens=[3, 41]), ValueError, "cache_seqlens"),
    (dict(cache_seqlens=[-1, 0]), ValueError, "cache_seqlens"),
    (dict(cache_seqlens=[3]), ValueError, "cache_seqlens"),
    (dict(cache_seqlens=np.array([1.0, 2.0])), TypeError, "cache_seqlens"),
    (dict(cache_seqlens=[[1, 2]]), ValueError, "cache_seqlens"),
    (dict(cache_seqlens="12"), TypeError, "cache_seqlens"),
    (dict(cache_seqlens=[2, 2], cache_leftpad=[3, 0]), ValueError, "cache_leftpad"),
    (dict(cache_seqlens=[2**40, 0]), ValueError, "cache_seqlens"),
    (dict(k_new=np.zeros((2, 2, 1, 64), np.float16)), ValueError, "v_new"),
    (dict(k_new=np.zeros((2, 2, 1, 64), np.float16), v_new=np.zeros((2, 2, 1, 64), np.float16)), ValueError,
     "cache_seqlens"),
    (dict(cache_seqlens=[1, 1], k_new=np.zeros((2, 1, 1, 64), np.float16), v_new=np.zeros((2, 1, 1, 64), np.float16)),
     ValueError, "k_new"),
    (dict(cache_seqlens=[1, 1], k_new=np.zeros((2, 2, 1, 64), np.float32), v_new=np.zeros((2, 2, 1, 64), np.float32)),
     TypeError, "k_new"),
    (dict(cache_seqlens=[1, 1], k_new=np.zeros((2, 2, 1, 64), np.float16), v_new=np.zeros((2, 2, 2, 64), np.float16)),
     ValueError, "v_new"),
    (dict(cache_seqlens=[39, 1], k_new=np.zeros((2, 2, 2, 64), np.float16), v_new=np.zeros((2, 2, 2, 64), np.float16)),
     ValueError, "cache_seqlens"),
], ids=str)
def test_bad_kvcache_arguments_name_the_argument(rng, kw, error, name):
    q, k, v = _kv(rng)
    causal = kw.pop("causal", False)
    with pytest.raises(error, match=name):
        _validate(q, k, v, causal=causal, **kw)


@pytest.mark.parametrize("kw,error,name", [
    (dict(cache_seqlens=[1, 2]), ValueError, "block_table"),  # a page index past the end
    (dict(cache_seqlens=[1, 2], table=np.zeros((3, 3), np.int32)), ValueError, "block_table"),
    (dict(cache_seqlens=[1, 2], table=np.zeros(6, np.int32)), ValueError, "block_table"),
    (dict(cache_seqlens=[1, 22]), ValueError, "cache_seqlens"),  # 3 pages of 7 keys
    (dict(table=np.zeros((2, 3), np.int32)), ValueError, "cache_seqlens"),
], ids=str)
def test_bad_paged_arguments_name_the_argument(rng, kw, error, name):
    q, _, _ = _kv(rng)
    k, v = _paged(rng)
    table = kw.pop("table", None)
    if table is None:
        table = np.array([[0, 1, 2], [9, 3, 4]], np.int32)
        if kw["cache_seqlens"][1] == 22:
            table[1, 0] = 5
    with pytest.raises(error, match=name):
        _validate(q, k, v, block_table=table, **kw)


def test_bad_cache_shapes(rng):
    q, k, v = _kv(rng)
    with pytest.raises(ValueError, match="batch size"):
        _validate(q, k[:1], v[:1], cache_seqlens=[1, 1])
    with pytest.raises(ValueError, match="v must have k's shape"):
        _validate(q, k, v[:, :, :5], cache_seqlens=[1, 1])
    with pytest.raises(ValueError, match="heads of q"):
        _validate(q[:, :3], k, v, cache_seqlens=[1, 1])
    with pytest.raises(ValueError, match="out must have shape"):
        _validate(q, k, v, out=np.zeros((2, 4, 2, 64), np.float16), cache_seqlens=[1, 1])
    with pytest.raises(ValueError, match="q must be 4-D"):
        _validate(q[0], k[0], v[0], cache_seqlens=[1])
    readonly = k.copy()
    readonly.flags.writeable = False
    new = np.zeros((2, 2, 1, 64), np.float16)
    with pytest.raises(ValueError, match="read-only"):
        _validate(q, readonly, v, cache_seqlens=[1, 1], k_new=new, v_new=new)


@pytest.mark.parametrize("cu_q,cu_k,kw,name", [
    ([0, 5, 3, 10], [0, 6, 8, 12], {}, "cu_seqlens_q"),
    ([0, 5, 9], [0, 6, 12], {}, "cu_seqlens_q"),
    ([1, 5, 10], [0, 6, 12], {}, "cu_seqlens_q"),
    ([0, 5, 10], [0, 6, 11], {}, "cu_seqlens_k"),
    ([0, 5, 10], [0, 12], {}, "cu_seqlens"),
    ([0, 5, 10], [0, 6, 12], dict(max_seqlen_q=4), "max_seqlen_q"),
    ([0, 5, 10], [0, 6, 12], dict(max_seqlen_k=5), "max_seqlen_k"),
    ([0, 5, 10], np.array([0.0, 6.0, 12.0]), {}, "cu_seqlens_k"),
], ids=str)
def test_bad_varlen_arguments_name_the_argument(rng, cu_q, cu_k, kw, name):
    q = rng.standard_normal((10, 4, 64)).astype(np.float16)
    k = rng.standard_normal((12, 2, 64)).astype(np.float16)
    with pytest.raises((ValueError, TypeError), match=name):
        _validate(q, k, k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)


def test_varlen_shapes(rng):
    q = rng.standard_normal((10, 4, 64)).astype(np.float16)
    k = rng.standard_normal((12, 2, 64)).astype(np.float16)
    with pytest.raises(ValueError, match="q must be 3-D"):
        _validate(q[None], k[None], k[None], cu_seqlens_q=[0, 10], cu_seqlens_k=[0, 12])
    with pytest.raises(ValueError, match="cu_seqlens_k is missing"):
        _validate(q, k, k, cu_seqlens_q=[0, 10])
    with pytest.raises(ValueError, match="out must have shape"):
        _validate(q, k, k, out=np.zeros((10, 4, 32), np.float16), cu_seqlens_q=[0, 10], cu_seqlens_k=[0, 12])
    with pytest.raises(ValueError, match="head dim"):
        _validate(q[..., :12], k[..., :12], k[..., :12], cu_seqlens_q=[0, 10], cu_seqlens_k=[0, 12])
