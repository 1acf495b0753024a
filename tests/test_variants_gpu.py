"""The variants on CUDA arrays through the extension, on every GPU backend, against the float64
reference: host index values (copied to the device) beside device ones, left padding, split counts
from 1 to many on windowed and capped dense calls (equal up to rounding), varlen with and without
max_seqlen, and the refusals of bad device arguments naming the argument. Skips cleanly without a GPU
or PyTorch with CUDA."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2, varlen_reference
from gpu_results import assert_matches_reference, host64

GPU_BACKENDS = ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"]
pytestmark = pytest.mark.gpu


def _cuda(torch, x):
    if x.dtype.kind in "iu":
        return torch.from_numpy(x.astype(np.int32)).cuda()
    return torch.from_numpy(x.astype(np.float32)).to("cuda", getattr(torch, x.dtype.name))


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("window,causal,softcap", [((-1, -1), False, 0.0), ((-1, 0), True, 0.0),
                                                   ((100, 0), True, 20.0), ((30, 50), False, 5.0)], ids=str)
def test_split_counts_change_only_the_rounding(torch, rng, backend, need_backend, window, causal, softcap):
    need_backend(backend)
    q, k, v = (rng.standard_normal(s).astype(np.float16) for s in ((2, 8, 3, 64), (2, 2, 1000, 64), (2, 2, 1000, 64)))
    ref, ref_lse = attention_reference(q, k, v, causal=causal, window=window, softcap=softcap)
    results = []
    for splits in (None, 1, 2, 5, 8, 64):
        out, lse = cutlassfa.forward(*(_cuda(torch, x) for x in (q, k, v)), causal=causal, window=window,
                                     softcap=softcap, num_splits=splits, backend=backend, return_lse=True)
        assert_matches_reference(backend, "float16", out, lse, ref, ref_lse)
        results.append(host64(out))
    for other in results[1:]:
        assert rel_l2(other, results[0]) <= 2 * bound_for(backend, "float16").rel_l2


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("page_size", [None, 1, 7, 16, 256], ids=lambda p: f"page{p}" if p else "contiguous")
def test_host_index_values_and_leftpad(torch, rng, backend, need_backend, page_size):
    need_backend(backend)
    lengths, leftpad = [0, 5, 300, 613], [0, 2, 100, 0]
    q = rng.standard_normal((4, 8, 2, 64)).astype(np.float16)
    if page_size is None:
        k, v = (rng.standard_normal((4, 2, 620, 64)).astype(np.float16) for _ in range(2))
        table = None
    else:
        per_entry = [-(-(n + 2) // page_size) for n in lengths]
        num_pages = sum(per_entry) + 3
        order = rng.permutation(num_pages)
        table = np.zeros((4, max(per_entry)), np.int32)
        at = 0
        for i, n in enumerate(per_entry):
            table[i, :n] = order[at : at + n]
            at += n
        k, v = (rng.standard_normal((num_pages, 2, page_size, 64)).astype(np.float16) for _ in range(2))
    k_new, v_new = (rng.standard_normal((4, 2, 2, 64)).astype(np.float16) for _ in range(2))
    kw = dict(cache_seqlens=np.array(lengths, np.int32), cache_leftpad=np.array(leftpad, np.int32),
              block_table=table, k_new=k_new, v_new=v_new, causal=True)
    ref, ref_lse = kvcache_reference(q, k, v, **kw)
    dk, dv = _cuda(torch, k), _cuda(torch, v)
    out, lse = cutlassfa.forward(_cuda(torch, q), dk, dv, cache_seqlens=lengths, cache_leftpad=tuple(leftpad),
                                 block_table=table, k_new=_cuda(torch, k_new), v_new=_cuda(torch, v_new),
                                 causal=True, backend=backend, return_lse=True)
    assert_matches_reference(backend, "float16", out, lse, ref, ref_lse)
    k_after = host64(dk)
    for i, n in enumerate(lengths):
        for j in range(2):
            p = n + j
            got = k_after[i, :, p] if table is None else k_after[table[i, p // page_size], :, p % page_size]
            np.testing.assert_array_equal(got, k_new[i, :, j].astype(np.float64))


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_appends_past_the_capacity_are_dropped(torch, rng, backend, need_backend):
    """Device lengths are not checked (a sync): keys past the capacity are dropped, and reading stops
    at the capacity."""
    need_backend(backend)
    q = rng.standard_normal((2, 2, 1, 64)).astype(np.float16)
    k, v = (rng.standard_normal((2, 2, 16, 64)).astype(np.float16) for _ in range(2))
    new = rng.standard_normal((2, 2, 4, 64)).astype(np.float16)
    dk = _cuda(torch, k)
    out = cutlassfa.forward(_cuda(torch, q), dk, _cuda(torch, v), cache_seqlens=_cuda(torch, np.array([14, 3])),
                            k_new=_cuda(torch, new), v_new=_cuda(torch, new), backend=backend)
    torch.cuda.synchronize()
    after = host64(dk)
    np.testing.assert_array_equal(after[0, :, 14:16], new[0, :, :2].astype(np.float64))
    np.testing.assert_array_equal(after[0, :, :14], k[0, :, :14].astype(np.float64))
    assert np.isfinite(host64(out)).all()


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("host_cu,max_given", [(False, True), (False, False), (True, False)], ids=str)
def test_varlen_index_sources(torch, rng, backend, need_backend, host_cu, max_given):
    need_backend(backend)
    lens_q, lens_k = [0, 70, 1, 129], [10, 70, 200, 0]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]), 4, 64)).astype(np.float16)
    k, v = (rng.standard_normal((int(cu_k[-1]), 1, 64)).astype(np.float16) for _ in range(2))
    cu = (list(cu_q), list(cu_k)) if host_cu else (_cuda(torch, cu_q), _cuda(torch, cu_k))
    extra = dict(max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k)) if max_given else {}
    out, lse = cutlassfa.varlen_forward(*(_cuda(torch, x) for x in (q, k, v)), *cu, causal=True, softcap=10.0,
                                        backend=backend, return_lse=True, **extra)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, softcap=10.0)
    assert_matches_reference(backend, "float16", out.transpose(0, 1), lse, ref.transpose(1, 0, 2), ref_lse)


def test_bad_device_arguments_name_the_argument(torch, rng):
    q, k, v = (torch.randn(2, 2, 1, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    with pytest.raises(TypeError, match="cache_seqlens must be an int32"):
        cutlassfa.forward(q, k, v, cache_seqlens=torch.zeros(2, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="cache_seqlens must have shape"):
        cutlassfa.forward(q, k, v, cache_seqlens=torch.zeros(3, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="block_table must be 2-D"):
        cutlassfa.forward(q, k, v, cache_seqlens=torch.zeros(2, dtype=torch.int32, device="cuda"),
                          block_table=torch.zeros(2, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="k_new must have shape"):
        cutlassfa.forward(q, k, v, cache_seqlens=[0, 0], k_new=q[:, :1], v_new=q[:, :1])
    with pytest.raises(ValueError, match="k_new must be on the device of q"):
        cutlassfa.forward(q, k, v, cache_seqlens=[0, 0], k_new=q.cpu(), v_new=q)
    with pytest.raises(TypeError, match="k_new must have the cache's dtype"):
        cutlassfa.forward(q, k, v, cache_seqlens=[0, 0], k_new=q.float(), v_new=q.float())
    with pytest.raises(ValueError, match="cache_seqlens\\[1\\]"):
        cutlassfa.forward(q, k, v, cache_seqlens=[0, 2])
