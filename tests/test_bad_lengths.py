"""KV-cache lengths nobody checked (device cache_seqlens / cache_leftpad are not read on the host) behave as
documented, on every backend alike: an entry's keys are cache_seqlens[b] + Nnew clamped to [0, capacity],
its left padding is clamped to [0, keys], and appended rows that would land outside the cache (past the
capacity, or anywhere for a negative cache_seqlens[b]) are dropped (cpp/include/cutlassfa/rules.h,
src/append_kv.cu; python/cutlassfa/_options.py KVCacheArgs). The cpu backend and the float64 reference take
the same unchecked host values and give the same result.

Every cache position no entry may read holds NaN, so a kernel that read past the clamped length (or a
wrapped negative index) would not be finite. compute-sanitizer runs this file on the GPU machine."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.cpu import kvcache_forward_cpu
from cutlassfa.reference import kvcache_reference, rel_l2
from gpu_results import assert_close_on_host, assert_matches_reference, host64

GPU_BACKENDS = ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"]
CAPACITY = 96
# Per entry (cache_seqlens, cache_leftpad): within range; past the capacity; negative; near 2^31 (the sum
# with Nnew must not wrap); leftpad past the keys; negative leftpad.
LENGTHS = [(40, 3), (CAPACITY + 7, 0), (-5, 0), (2**31 - 2, 10), (30, 70), (50, -4)]


def _problem(rng, *, hq, hkv, nq, d, n_new, paged, page_size=16):
    """q, caches (NaN at positions past what each entry can attend), k_new / v_new, lengths, leftpads and
    a block table (paged: every slot a distinct page, CAPACITY // page_size slots)."""
    b = len(LENGTHS)
    lens = np.array([n for n, _ in LENGTHS], np.int64).astype(np.int32)
    leftpad = np.array([p for _, p in LENGTHS], np.int32)
    q = rng.standard_normal((b, hq, nq, d)).astype(np.float16)
    dense = rng.standard_normal((2, b, hkv, CAPACITY, d)).astype(np.float16)
    for i, (n, _) in enumerate(LENGTHS):  # keys this entry holds before appending: the rest NaN
        dense[:, i, :, max(min(n, CAPACITY), 0) if n >= 0 else max(n + n_new, 0):] = np.nan
    new = [rng.standard_normal((b, hkv, n_new, d)).astype(np.float16) for _ in range(2)] if n_new else None
    if not paged:
        return q, dense[0], dense[1], lens, leftpad, None, new
    slots = CAPACITY // page_size
    table = rng.permutation(b * slots).reshape(b, slots).astype(np.int32)
    k, v = (np.full((b * slots, hkv, page_size, d), np.nan, np.float16) for _ in range(2))
    for i in range(b):
        for s in range(slots):
            for cache, source in ((k, dense[0]), (v, dense[1])):
                cache[table[i, s]] = source[i, :, s * page_size : (s + 1) * page_size]
    return q, k, v, lens, leftpad, table, new


CASES = {  # (hq, hkv, nq, d, n_new, paged): decode (the decode kernel on tensor cores) and prefill shapes
    "decode-contiguous": (8, 2, 1, 128, 0, False),
    "decode-paged-append": (8, 2, 1, 128, 4, True),
    "prefill-contiguous-append": (4, 2, 40, 64, 20, False),
    "prefill-paged": (4, 1, 70, 64, 0, True),
}


def _reference(q, k, v, lens, leftpad, table, new, causal):
    k_new, v_new = new if new else (None, None)
    return kvcache_reference(q, k, v, cache_seqlens=lens, cache_leftpad=leftpad, block_table=table, k_new=k_new,
                             v_new=v_new, causal=causal)


def _appended(cache, new, lens, table):
    """The cache with each entry's new rows written where they fit (positions [0, capacity) from a
    non-negative start), the others dropped."""
    expected = cache.copy()
    for b in range(new.shape[0]):
        for j in range(new.shape[2]):
            p = int(lens[b]) + j
            if int(lens[b]) < 0 or p >= CAPACITY:
                continue
            if table is None:
                expected[b, :, p] = new[b, :, j]
            else:
                page_size = cache.shape[2]
                expected[table[b, p // page_size], :, p % page_size] = new[b, :, j]
    return expected


def test_the_reference_clamps_as_documented(rng):
    """kvcache_reference with unchecked lengths equals the reference of the same call with the lengths
    clamped by hand (and the rows that fit appended into a copy of the cache)."""
    q, k, v, lens, leftpad, _, (k_new, v_new) = _problem(rng, hq=2, hkv=1, nq=3, d=16, n_new=5, paged=False)
    out, lse = _reference(q, k, v, lens, leftpad, None, (k_new, v_new), True)
    k_after, v_after = _appended(k, k_new, lens, None), _appended(v, v_new, lens, None)
    for b, (n, pad) in enumerate(LENGTHS):
        keys = min(max(n + 5, 0), CAPACITY)
        lp = min(max(pad, 0), keys)
        one, one_lse = kvcache_reference(q[b : b + 1], k_after[b : b + 1, :, :keys], v_after[b : b + 1, :, :keys],
                                         cache_leftpad=[lp], causal=True)
        np.testing.assert_allclose(out[b : b + 1], one, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(lse[b : b + 1], one_lse)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_unchecked_lengths_on_the_cpu(rng, case):
    hq, hkv, nq, d, n_new, paged = CASES[case]
    q, k, v, lens, leftpad, table, new = _problem(rng, hq=hq, hkv=hkv, nq=nq, d=d, n_new=n_new, paged=paged)
    ref, ref_lse = _reference(q, k, v, lens, leftpad, table, new, True)
    k_before, v_before = k.copy(), v.copy()
    k_new, v_new = new if new else (None, None)
    out, lse = kvcache_forward_cpu(q, k, v, cache_seqlens=lens, cache_leftpad=leftpad, block_table=table,
                                   k_new=k_new, v_new=v_new, causal=True, return_lse=True)
    bound = bound_for("cpu", "float16")
    assert np.isfinite(out).all()
    assert rel_l2(out, ref) <= bound.rel_l2
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    seen = np.isfinite(ref_lse)
    assert np.abs(lse[seen] - ref_lse[seen]).max() <= bound.lse
    if new:
        np.testing.assert_array_equal(k, _appended(k_before, k_new, lens, table))
        np.testing.assert_array_equal(v, _appended(v_before, v_new, lens, table))


def test_host_lengths_out_of_range_are_refused(rng):
    """Host values are checked: the same lengths given as host ints are a ValueError, not clamped."""
    q, k, v, lens, leftpad, _, _ = _problem(rng, hq=2, hkv=1, nq=1, d=64, n_new=0, paged=False)
    with pytest.raises(ValueError, match="cache_seqlens"):
        cutlassfa.forward(q, k, v, cache_seqlens=lens, backend="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_unchecked_lengths_on_the_gpu(torch, rng, backend, need_backend, case):
    need_backend(backend)
    hq, hkv, nq, d, n_new, paged = CASES[case]
    q, k, v, lens, leftpad, table, new = _problem(rng, hq=hq, hkv=hkv, nq=nq, d=d, n_new=n_new, paged=paged)
    ref, ref_lse = _reference(q, k, v, lens, leftpad, table, new, True)
    cuda = lambda x: torch.from_numpy(x).cuda()  # noqa: E731
    dk, dv = cuda(k), cuda(v)
    extra = {} if table is None else dict(block_table=cuda(table))
    if new:
        extra.update(k_new=cuda(new[0]), v_new=cuda(new[1]))
    for splits in (1, 3):
        if new and splits == 3:  # appending twice would write the same rows again: a fresh cache
            dk, dv = cuda(k), cuda(v)
        out, lse = cutlassfa.forward(cuda(q), dk, dv, cache_seqlens=cuda(lens), cache_leftpad=cuda(leftpad),
                                     causal=True, num_splits=splits, backend=backend, return_lse=True, **extra)
        assert_matches_reference(backend, "float16", out, lse, ref, ref_lse)
    if new:
        np.testing.assert_array_equal(host64(dk), _appended(k, new[0], lens, table).astype(np.float64))
        np.testing.assert_array_equal(host64(dv), _appended(v, new[1], lens, table).astype(np.float64))


# ---- varlen: unchecked cu_seqlens --------------------------------------------------------------------------
# total_q 100, total_k 120, max_seqlen_q 40, max_seqlen_k 50. q: an entry longer than max_seqlen_q, one
# running past total_q, one starting past it, rows 60-70 covered by none (so no two entries write a row);
# k: a negative first row, a decreasing pair (no keys), one longer than max_seqlen_k, one past total_k,
# one starting past it.
VARLEN_CU_Q = [0, 20, 70, 95, 130, 150]
VARLEN_CU_K = [-10, 30, 25, 80, 200, 90]
VARLEN_ROWS = [(0, 20, 0, 30), (20, 60, 30, 30), (70, 95, 25, 75), (95, 100, 80, 120), (100, 100, 120, 120)]


def _varlen_problem(rng, d=64, hq=4, hkv=2):
    q = rng.standard_normal((100, hq, d)).astype(np.float16)
    k, v = (rng.standard_normal((120, hkv, d)).astype(np.float16) for _ in range(2))
    return q, k, v, np.array(VARLEN_CU_Q, np.int32), np.array(VARLEN_CU_K, np.int32)


def _covered_rows():
    return np.concatenate([np.arange(q0, q1) for q0, q1, _, _ in VARLEN_ROWS])


def test_the_varlen_reference_clamps_as_documented(rng):
    from cutlassfa.reference import varlen_reference

    q, k, v, cu_q, cu_k = _varlen_problem(rng, d=16)
    out, lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, max_seqlen_q=40, max_seqlen_k=50)
    for q0, q1, k0, k1 in VARLEN_ROWS:
        one, one_lse = varlen_reference(q[q0:q1], k[k0:k1], v[k0:k1], [0, q1 - q0], [0, k1 - k0], causal=True)
        np.testing.assert_array_equal(out[q0:q1], one)
        np.testing.assert_array_equal(lse[:, q0:q1], one_lse)
    assert (out[60:70] == 0).all() and np.isneginf(lse[:, 60:70]).all()


def test_unchecked_cu_seqlens_on_the_cpu(rng):
    from cutlassfa.cpu import varlen_forward_cpu
    from cutlassfa.reference import varlen_reference

    q, k, v, cu_q, cu_k = _varlen_problem(rng)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, max_seqlen_q=40, max_seqlen_k=50)
    out = np.zeros_like(q)
    _, lse = varlen_forward_cpu(q, k, v, cu_q, cu_k, max_seqlen_q=40, max_seqlen_k=50, causal=True, out=out,
                                return_lse=True)
    bound = bound_for("cpu", "float16")
    assert rel_l2(out, ref) <= bound.rel_l2
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    seen = np.isfinite(ref_lse)
    assert np.abs(lse[seen] - ref_lse[seen]).max() <= bound.lse


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("d", [64, 128, 96])
def test_unchecked_cu_seqlens_on_the_gpu(torch, rng, backend, need_backend, d):
    """Device cu_seqlens out of range: each sequence clamped as the reference clamps it; rows no sequence
    covers are left as they were (out= holds zeros)."""
    from cutlassfa.reference import varlen_reference

    need_backend(backend)
    q, k, v, cu_q, cu_k = _varlen_problem(rng, d=d)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, max_seqlen_q=40, max_seqlen_k=50)
    cuda = lambda x: torch.from_numpy(x).cuda()  # noqa: E731
    out = torch.zeros(q.shape, dtype=torch.float16, device="cuda")
    _, lse = cutlassfa.varlen_forward(cuda(q), cuda(k), cuda(v), cuda(cu_q), cuda(cu_k), max_seqlen_q=40,
                                      max_seqlen_k=50, causal=True, backend=backend, return_lse=True, out=out)
    rows = _covered_rows()
    assert_close_on_host(backend, "float16", host64(out)[rows], host64(lse)[:, rows], ref[rows], ref_lse[:, rows])
    assert (host64(out)[60:70] == 0).all()
