"""The attention variants through the public API, on every backend: sliding windows, softcap, head
dims 8..256, KV caches (contiguous, paged, appended keys, split counts) and varlen, each against the
float64 reference. GPU backends get PyTorch CUDA tensors (numpy where PyTorch has no CUDA: the plain
calls, and the refusals that come before any array is read) and skip with the reason where they
cannot run; `cpu` gets numpy.

Until `forward` takes an argument (`window`, `cache_seqlens`, ...) or `varlen_forward` exists, the
tests that need it skip saying so."""

from __future__ import annotations

import inspect
import time

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2, varlen_reference

GPU_BACKENDS = ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"]
BACKENDS = [pytest.param(b, marks=pytest.mark.gpu) for b in GPU_BACKENDS] + ["cpu"]
_status = cutlassfa.backends()
_FORWARD_ARGS = inspect.signature(cutlassfa.forward).parameters


def _need(backend, *args, varlen=False):
    if not _status[backend].available:
        pytest.skip(f"{backend}: {_status[backend].reason}")
    missing = [a for a in args if a not in _FORWARD_ARGS]
    if missing:
        pytest.skip(f"cutlassfa.forward has no {', '.join(missing)} argument yet")
    if varlen and not hasattr(cutlassfa, "varlen_forward"):
        pytest.skip("cutlassfa.varlen_forward does not exist yet")
    if backend != "cpu" and (args or varlen) and _torch() is None:
        pytest.skip("optional package torch with CUDA: GPU backends take the variants on CUDA arrays")
    if not args and not varlen and not cutlassfa.supports("cpu", "float32", 64):  # a plain call
        pytest.skip(cutlassfa.supports("cpu", "float32", 64).reason)


def _supported(backend, dtype, d, **mode):
    """Skip what the backend says in advance it does not take (cutlassfa.supports)."""
    supports = getattr(cutlassfa, "supports", None)
    if supports is None:
        pytest.skip("cutlassfa.supports does not exist yet")
    answer = supports(backend, dtype, d, **mode)
    if not answer:
        pytest.skip(f"{backend} does not support {dtype} d={d} {mode}: {answer.reason}")
    return answer


def _refused_as_documented(backend, dtype, d, qkv, **mode):
    """True when `backend` reports (d, dtype) as a documented limit in advance (supports' reason starts
    with cutlassfa._api.LIMIT_PREFIX); the call must then be refused with a ValueError, never computed.
    Gaps that are not documented limits are skipped by _supported instead (a failure under
    CUTLASSFA_REQUIRE_GPU)."""
    answer = cutlassfa.supports(backend, dtype, d, **mode)
    if answer or not answer.reason.startswith(cutlassfa._api.LIMIT_PREFIX):
        return False
    with pytest.raises(ValueError, match="head dim"):
        cutlassfa.forward(*(to_backend(backend, x) for x in qkv), backend=backend, **mode)
    return True


def _np_dtype(dtype):
    if dtype == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(dtype)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def to_backend(backend, x):
    """numpy for cpu (and GPU backends without PyTorch CUDA); a CUDA tensor otherwise. Index arrays
    (int) go along, as int32."""
    torch = _torch()
    if backend == "cpu" or torch is None or x is None:
        return x
    if x.dtype.kind in "iu":
        return torch.from_numpy(x.astype(np.int32)).cuda()
    name = x.dtype.name
    return torch.from_numpy(x.astype(np.float32)).to("cuda", getattr(torch, name))


def to_numpy(x):
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return x.float().cpu().numpy().astype(np.float64)


def assert_close(backend, dtype, out, lse, ref, ref_lse):
    out, lse = to_numpy(out), to_numpy(lse)
    err = rel_l2(out, ref)
    assert err <= bound_for(backend, dtype).rel_l2, f"{backend} {dtype}: rel-L2 {err:.3e}"
    seen = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isneginf(lse), ~seen)  # rows that see no key: lse -inf ...
    assert (out[~seen] == 0).all()  # ... and out 0
    assert np.abs(lse[seen] - ref_lse[seen]).max(initial=0) <= bound_for(backend, dtype).lse


def inputs(rng, b, hq, hkv, nq, nk, d, dtype, scale=1.0):
    t = _np_dtype(dtype)
    return tuple((rng.standard_normal((b, h, n, d)) * s).astype(t)
                 for h, n, s in ((hq, nq, scale), (hkv, nk, scale), (hkv, nk, 1.0)))


# ---- windows and softcap ------------------------------------------------------------------------------

WINDOWS = [((0, 0), False), ((1, 1), False), ((7, 3), False), ((5000, 5000), False), ((64, -1), False),
           ((-1, 64), False), ((16, 0), True), ((-1, -1), True)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("window,causal", WINDOWS, ids=str)
@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_window_and_softcap(rng, backend, dtype, window, causal, softcap):
    _need(backend, "window", "softcap")
    _supported(backend, dtype, 64, causal=causal, window=window, softcap=softcap)
    for b, hq, hkv, nq, nk in ((1, 2, 2, 257, 257), (2, 4, 2, 77, 300), (1, 2, 1, 300, 100)):
        q, k, v = inputs(rng, b, hq, hkv, nq, nk, 64, dtype, scale=2.0 if softcap else 1.0)
        out, lse = cutlassfa.forward(*(to_backend(backend, x) for x in (q, k, v)), causal=causal, window=window,
                                     softcap=softcap, backend=backend, return_lse=True)
        ref, ref_lse = attention_reference(q, k, v, causal=causal, window=window, softcap=softcap)
        assert_close(backend, dtype, out, lse, ref, ref_lse)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("window,causal", WINDOWS, ids=str)
def test_window_without_softcap_at_wide_head_dims(rng, backend, dtype, d, window, causal):
    """Windows without softcap at the head dims whose kernels differ from d = 64's (on sm_90, d = 128
    runs the warp-specialized kernel), ragged, GQA, Nq != Nk both ways."""
    _need(backend, "window")
    if _refused_as_documented(backend, dtype, d, inputs(rng, 1, 2, 2, 9, 9, d, dtype), causal=causal, window=window):
        return
    _supported(backend, dtype, d, causal=causal, window=window)
    for b, hq, hkv, nq, nk in ((1, 2, 2, 257, 257), (2, 4, 2, 77, 300), (1, 2, 1, 300, 100)):
        q, k, v = inputs(rng, b, hq, hkv, nq, nk, d, dtype)
        out, lse = cutlassfa.forward(*(to_backend(backend, x) for x in (q, k, v)), causal=causal, window=window,
                                     backend=backend, return_lse=True)
        assert_close(backend, dtype, out, lse, *attention_reference(q, k, v, causal=causal, window=window))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("d", range(8, 257, 8))
def test_every_head_dim(rng, backend, dtype, d):
    _need(backend)
    q, k, v = inputs(rng, 1, 4, 2, 130, 190, d, dtype)
    if _refused_as_documented(backend, dtype, d, (q, k, v), causal=True):
        return
    _supported(backend, dtype, d, causal=True)
    out, lse = cutlassfa.forward(*(to_backend(backend, x) for x in (q, k, v)), causal=True, backend=backend,
                                 return_lse=True)
    assert tuple(out.shape) == q.shape
    assert_close(backend, dtype, out, lse, *attention_reference(q, k, v, causal=True))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d", range(8, 257, 8))
def test_every_head_dim_with_window_and_softcap(rng, backend, dtype, d):
    _need(backend, "window", "softcap")
    q, k, v = inputs(rng, 1, 4, 2, 70, 110, d, dtype)
    if _refused_as_documented(backend, dtype, d, (q, k, v), causal=True, window=(40, 0), softcap=20.0):
        return
    _supported(backend, dtype, d, causal=True, window=(40, 0), softcap=20.0)
    out, lse = cutlassfa.forward(*(to_backend(backend, x) for x in (q, k, v)), causal=True, window=(40, 0),
                                 softcap=20.0, backend=backend, return_lse=True)
    assert tuple(out.shape) == q.shape
    assert_close(backend, dtype, out, lse, *attention_reference(q, k, v, causal=True, window=(40, 0), softcap=20.0))


@pytest.mark.gpu
@pytest.mark.exclusive  # wall time
@pytest.mark.parametrize("backend", GPU_BACKENDS[:4])
def test_window_cost_grows_with_the_window(rng, backend):
    # Visible pairs of window (512, 0) at N = 16384 are 6% of causal's; skipping tiles outside the
    # window must show up in the time (0.35 leaves room for tile granularity and launch overheads).
    _need(backend, "window")
    torch = _torch() or pytest.skip("needs PyTorch with CUDA for device arrays")
    q, k, v = (torch.randn(1, 8, 16384, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def median_ms(**mode):
        times = []
        for _ in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            cutlassfa.forward(q, k, v, backend=backend, **mode)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return sorted(times)[2]

    median_ms(causal=True)  # warm up
    assert median_ms(causal=True, window=(512, 0)) <= 0.35 * median_ms(causal=True)


# ---- KV caches --------------------------------------------------------------------------------------


def paged(rng, lengths, hkv, d, page_size, dtype):
    """A shuffled paged cache holding `lengths` keys per entry (plus room for 4 more)."""
    per_entry = [-(-(n + 4) // page_size) for n in lengths]
    max_pages, num_pages = max(per_entry), sum(per_entry) + 2
    order = rng.permutation(num_pages)
    table = np.zeros((len(lengths), max_pages), np.int32)
    at = 0
    for i, n in enumerate(per_entry):
        table[i, :n] = order[at : at + n]
        at += n
    k, v = (rng.standard_normal((num_pages, hkv, page_size, d)).astype(_np_dtype(dtype)) for _ in range(2))
    return k, v, table


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("page_size", [None, 1, 7, 16, 256], ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (8, 1)], ids=str)
@pytest.mark.parametrize("nq,causal,n_new", [(1, False, 0), (1, True, 1), (4, True, 4)], ids=str)
def test_kvcache(rng, backend, dtype, page_size, hq, hkv, nq, causal, n_new):
    _need(backend, "cache_seqlens", "block_table", "k_new")
    _supported(backend, dtype, 64, causal=causal, kv_cache=True, paged=page_size is not None)
    lengths = [0, 1, 200, 613]  # ragged, one empty cache
    t = _np_dtype(dtype)
    q = rng.standard_normal((4, hq, nq, 64)).astype(t)
    if page_size is None:
        k, v = (rng.standard_normal((4, hkv, 620, 64)).astype(t) for _ in range(2))
        table = None
    else:
        k, v, table = paged(rng, lengths, hkv, 64, page_size, dtype)
    k_new = v_new = None
    if n_new:
        k_new, v_new = (rng.standard_normal((4, hkv, n_new, 64)).astype(t) for _ in range(2))
    seqlens = np.array(lengths, np.int32)
    kw = dict(cache_seqlens=seqlens, block_table=table, k_new=k_new, v_new=v_new, causal=causal)
    ref, ref_lse = kvcache_reference(q, k, v, **kw)  # before the call appends into the cache
    dev = {name: to_backend(backend, x) for name, x in dict(q=q, k=k, v=v, **kw).items() if name != "causal"}
    results = []
    for splits in (None, 1, 3, 16):
        if splits is not None and "num_splits" not in _FORWARD_ARGS:
            continue
        extra = {} if splits is None else {"num_splits": splits}
        out, lse = cutlassfa.forward(dev["q"], dev["k"], dev["v"], causal=causal,
                                     backend=backend, return_lse=True,
                                     **{n: dev[n] for n in ("cache_seqlens", "block_table", "k_new", "v_new")},
                                     **extra)
        assert_close(backend, dtype, out, lse, ref, ref_lse)
        results.append(to_numpy(out))
    # The split count changes nothing beyond rounding.
    for other in results[1:]:
        assert rel_l2(other, results[0]) <= 2 * bound_for(backend, dtype).rel_l2
    if n_new:  # the new keys sit at cache_seqlens[b] of each entry
        k_after = to_numpy(dev["k"])
        for i, n in enumerate(lengths):
            for j in range(n_new):
                p = n + j
                got = k_after[i, :, p] if table is None else k_after[table[i, p // page_size], :, p % page_size]
                np.testing.assert_array_equal(got, k_new[i, :, j].astype(np.float64))
        np.testing.assert_array_equal(to_numpy(dev["cache_seqlens"]), lengths)  # not modified


@pytest.mark.parametrize("backend", BACKENDS)
def test_kvcache_bad_block_table_writes_nothing(rng, backend):
    _need(backend, "cache_seqlens", "block_table", "k_new")
    k, v, table = paged(rng, [5, 9], 2, 64, 4, "float16")
    q = rng.standard_normal((2, 2, 1, 64)).astype(np.float16)
    k_new = v_new = rng.standard_normal((2, 2, 1, 64)).astype(np.float16)
    table[1, 0] = k.shape[0]  # one page past the end
    before = k.copy()
    with pytest.raises(ValueError, match="block_table"):
        cutlassfa.forward(q, k, v, cache_seqlens=np.array([5, 9], np.int32), block_table=table, k_new=k_new,
                          v_new=v_new, backend=backend)
    np.testing.assert_array_equal(k, before)


# ---- varlen -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, (32, 0)), (False, (8, 8))], ids=str)
def test_varlen(rng, backend, dtype, causal, window):
    _need(backend, "window", varlen=True)
    _supported(backend, dtype, 128, causal=causal, varlen=True)
    lens_q, lens_k = [0, 130, 1, 300, 64], [10, 130, 77, 300, 0]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    t = _np_dtype(dtype)
    q = rng.standard_normal((int(cu_q[-1]), 8, 128)).astype(t)
    k, v = (rng.standard_normal((int(cu_k[-1]), 2, 128)).astype(t) for _ in range(2))
    out, lse = cutlassfa.varlen_forward(*(to_backend(backend, x) for x in (q, k, v, cu_q, cu_k)),
                                        max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), causal=causal,
                                        window=window, backend=backend, return_lse=True)
    assert tuple(out.shape) == q.shape and tuple(lse.shape) == (8, q.shape[0])
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=causal, window=window)
    # Rows as (Hq, total_q, d), the layout of lse.
    assert_close(backend, dtype, to_numpy(out).transpose(1, 0, 2), lse, ref.transpose(1, 0, 2), ref_lse)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cu_q", [[0, 5, 3, 10], [0, 5, 9], [1, 5, 10]], ids=str)
def test_varlen_bad_cu_seqlens(rng, backend, cu_q):
    _need(backend, varlen=True)
    q = rng.standard_normal((10, 2, 64)).astype(np.float16)
    k = rng.standard_normal((12, 2, 64)).astype(np.float16)
    with pytest.raises(ValueError, match="cu_seqlens"):
        cutlassfa.varlen_forward(q, k, k, np.array(cu_q, np.int32), np.array([0, 6, 8, 12], np.int32),
                                 backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kw,name", [(dict(window=(-2, 0)), "window"), (dict(window=(4, 1), causal=True), "window"),
                                     (dict(softcap=-1.0), "softcap"), (dict(softcap=float("nan")), "softcap")], ids=str)
def test_bad_values_name_the_argument(rng, backend, kw, name):
    _need(backend, "window", "softcap")
    q, k, v = inputs(rng, 1, 2, 2, 8, 8, 64, "float16")
    with pytest.raises(ValueError, match=name):
        cutlassfa.forward(q, k, v, backend=backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [4, 12, 100, 264])
def test_bad_head_dims_are_refused(rng, backend, d):
    _need(backend)
    q, k, v = inputs(rng, 1, 2, 2, 8, 8, d, "float16")
    with pytest.raises(ValueError, match="head dim"):
        cutlassfa.forward(q, k, v, backend=backend)
