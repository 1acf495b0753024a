"""A block_table entry outside [0, num_pages) in a slot the keys use: its keys count as masked (excluded
from the softmax, never read) and keys appended there are dropped, on every backend alike. A device table
is not checked on the host, so this is what the kernels must do on their own; the cpu backend and the
float64 reference give the same result for the same unchecked host values (they take a table as the
kernels take a device one).

The pages that a clamped index would land on (the first and the last) are unused and hold NaN, and every
page not in the table holds NaN: a kernel that read a missing page's keys from any other page would not
match the reference, or would not be finite. A row whose keys all lie on missing pages gives O = 0 and
lse = -inf. compute-sanitizer runs this file on the GPU machine."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.cpu import kvcache_forward_cpu
from cutlassfa.reference import kvcache_reference, rel_l2
from gpu_results import assert_matches_reference, host64

GPU_BACKENDS = ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"]


def _paged_problem(rng, *, batch_lengths, hq, hkv, nq, d, page_size, n_new=0, dtype=np.float16):
    """q, paged k / v (NaN outside the used pages), k_new / v_new, the lengths and a block table whose
    entries 0..3 have: one negative slot; a slot >= num_pages and one near 2^30; every used slot bad;
    all slots good."""
    per_entry = [-(-(n + n_new) // page_size) for n in batch_lengths]
    used = sum(per_entry)
    num_pages = used + 4  # pages 0 and num_pages - 1 (where a clamp lands) and two more stay unused
    order = 1 + rng.permutation(used + 2)[:used]
    table = np.full((len(batch_lengths), max(per_entry) + 1), num_pages - 1, np.int32)  # spare slots: unused page
    at = 0
    for i, n in enumerate(per_entry):
        table[i, :n] = order[at : at + n]
        at += n
    k, v = (np.full((num_pages, hkv, page_size, d), np.nan, dtype) for _ in range(2))
    for page in order:
        k[page], v[page] = (rng.standard_normal((hkv, page_size, d)).astype(dtype) for _ in range(2))
    # The bad entries, in slots the attended (or appended) keys use.
    table[0, per_entry[0] // 2] = -3
    table[1, 0] = num_pages + 5
    table[1, per_entry[1] - 1] = 2**30
    table[2, : per_entry[2]] = -1
    q = rng.standard_normal((len(batch_lengths), hq, nq, d)).astype(dtype)
    new = [rng.standard_normal((len(batch_lengths), hkv, n_new, d)).astype(dtype) for _ in range(2)] if n_new else None
    return q, k, v, table, np.array(batch_lengths, np.int32), new


def _cuda(torch, x):
    if x.dtype.kind in "iu":
        return torch.from_numpy(x.astype(np.int32)).cuda()
    return torch.from_numpy(x).cuda()


# (hq, hkv, nq, d, page_size, lengths): decode shapes (Nq x Hq / Hkv <= 32: the decode kernel on the
# tensor-core backends, power-of-two pages of 1, 2 or more per warp step and several steps per page)
# and prefill shapes (the tile kernels: pages smaller than a tile, not dividing it, and holding whole tiles).
SHAPES = {
    "decode-d128-page4": (8, 2, 1, 128, 4, [70, 200, 33, 150]),
    "decode-d128-page8": (8, 2, 2, 128, 8, [70, 200, 33, 150]),
    "decode-d128-page32": (8, 1, 4, 128, 32, [300, 257, 64, 100]),
    "decode-d64-page16": (4, 2, 1, 64, 16, [100, 90, 17, 64]),
    "prefill-d64-page7": (4, 2, 70, 64, 7, [200, 150, 80, 120]),
    "prefill-d128-page64": (2, 2, 130, 128, 64, [300, 520, 130, 260]),
    "prefill-d64-page256": (4, 1, 100, 64, 256, [700, 600, 300, 512]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_keys_on_a_missing_page_are_masked_on_the_gpu(torch, rng, backend, need_backend, shape, causal):
    need_backend(backend)
    hq, hkv, nq, d, page_size, lengths = SHAPES[shape]
    q, k, v, table, lens, _ = _paged_problem(rng, batch_lengths=lengths, hq=hq, hkv=hkv, nq=nq, d=d,
                                             page_size=page_size)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, block_table=table, causal=causal)
    assert np.isneginf(ref_lse[2]).all() and np.isfinite(ref_lse[[0, 1, 3]]).all()
    dq, dk, dv = (_cuda(torch, x) for x in (q, k, v))
    for splits in (1, 3):
        out, lse = cutlassfa.forward(dq, dk, dv, cache_seqlens=_cuda(torch, lens), block_table=_cuda(torch, table),
                                     causal=causal, num_splits=splits, backend=backend, return_lse=True)
        assert_matches_reference(backend, "float16", out, lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("nq", [1, 40])
def test_keys_appended_into_a_missing_page_are_dropped_on_the_gpu(torch, rng, backend, need_backend, nq):
    need_backend(backend)
    q, k, v, table, lens, (k_new, v_new) = _paged_problem(rng, batch_lengths=[30, 60, 10, 45], hq=4, hkv=2, nq=nq,
                                                          d=64, page_size=16, n_new=20)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new,
                                     causal=True)
    dk, dv = _cuda(torch, k), _cuda(torch, v)
    out, lse = cutlassfa.forward(_cuda(torch, q), dk, dv, cache_seqlens=_cuda(torch, lens),
                                 block_table=_cuda(torch, table), k_new=_cuda(torch, k_new), v_new=_cuda(torch, v_new),
                                 causal=True, backend=backend, return_lse=True)
    assert_matches_reference(backend, "float16", out, lse, ref, ref_lse)
    for cache, new, after in ((k, k_new, host64(dk)), (v, v_new, host64(dv))):
        np.testing.assert_array_equal(after, _appended(cache, new, lens, table).astype(np.float64))


def _appended(cache, new, lens, table):
    """The cache with each entry's new keys written where its page exists, the others dropped."""
    expected = cache.copy()
    num_pages, page_size = cache.shape[0], cache.shape[2]
    for b in range(new.shape[0]):
        for j in range(new.shape[2]):
            p = int(lens[b]) + j
            page = table[b, p // page_size]
            if 0 <= page < num_pages:
                expected[page, :, p % page_size] = new[b, :, j]
    return expected


@pytest.mark.parametrize("shape", ["decode-d64-page16", "prefill-d64-page7", "prefill-d64-page256"], ids=str)
@pytest.mark.parametrize("splits", [1, 3])
def test_keys_on_a_missing_page_are_masked_on_the_cpu(rng, shape, splits):
    hq, hkv, nq, d, page_size, lengths = SHAPES[shape]
    q, k, v, table, lens, _ = _paged_problem(rng, batch_lengths=lengths, hq=hq, hkv=hkv, nq=nq, d=d,
                                             page_size=page_size)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, block_table=table, causal=True)
    out, lse = kvcache_forward_cpu(q, k, v, cache_seqlens=lens, block_table=table, causal=True, num_splits=splits,
                                   return_lse=True)
    bound = bound_for("cpu", "float16")
    assert np.isfinite(out).all()
    assert rel_l2(out, ref) <= bound.rel_l2
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    assert (out[2] == 0).all() and np.isneginf(ref_lse[2]).all()
    seen = np.isfinite(ref_lse)
    assert np.abs(lse[seen] - ref_lse[seen]).max() <= bound.lse


def test_keys_appended_into_a_missing_page_are_dropped_on_the_cpu(rng):
    q, k, v, table, lens, (k_new, v_new) = _paged_problem(rng, batch_lengths=[30, 60, 10, 45], hq=4, hkv=2, nq=3,
                                                          d=64, page_size=16, n_new=20)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new,
                                     causal=True)
    k_before, v_before = k.copy(), v.copy()
    out, lse = kvcache_forward_cpu(q, k, v, cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new,
                                   causal=True, return_lse=True)
    np.testing.assert_array_equal(k, _appended(k_before, k_new, lens, table))
    np.testing.assert_array_equal(v, _appended(v_before, v_new, lens, table))
    assert rel_l2(out, ref) <= bound_for("cpu", "float16").rel_l2
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))


def test_the_reference_masks_exactly_the_keys_on_missing_pages(rng):
    """kvcache_reference with unchecked pages equals the dense reference over the keys that exist, with a
    mask written here pair by pair (query i sees key j iff j <= i + L - Nq and j's page exists)."""
    q, k, v, table, lens, _ = _paged_problem(rng, batch_lengths=[40, 33, 20, 50], hq=2, hkv=1, nq=5, d=16,
                                             page_size=8, dtype=np.float64)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, block_table=table, causal=True)
    for b, n in enumerate(lens):
        for h in range(2):
            for i in range(5):
                keys = [j for j in range(n) if j <= i + n - 5 and 0 <= table[b, j // 8] < k.shape[0]]
                if not keys:
                    assert np.isneginf(ref_lse[b, h, i]) and (ref[b, h, i] == 0).all()
                    continue
                kk = np.stack([k[table[b, j // 8], 0, j % 8] for j in keys])
                vv = np.stack([v[table[b, j // 8], 0, j % 8] for j in keys])
                s = kk @ q[b, h, i] / 4.0
                p = np.exp(s - s.max())
                np.testing.assert_allclose(ref[b, h, i], p @ vv / p.sum(), rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(ref_lse[b, h, i], s.max() + np.log(p.sum()), rtol=1e-12)
