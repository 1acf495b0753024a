"""The decode path of the tensor-core backends (a few query rows per K/V head: Nq x Hq/Hkv <= 32)
against the float64 reference: d 64 and 128, fp16 and bf16, GQA ratios 1 / 4 / 8, ragged cache
lengths with 0 among them, causal and a right window bound, strided (B, N, H, d) caches, split counts
from 1 to many (equal up to rounding), and a stale NaN past the cache lengths that must not leak.
Skips cleanly without a GPU or PyTorch with CUDA."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2
from gpu_results import assert_matches_reference, host64

pytestmark = pytest.mark.gpu
BACKENDS = ["tensorcore", "tensorcore_sm80"]


def _cuda(torch, x, dtype):
    return torch.from_numpy(x.astype(np.float32)).to("cuda", getattr(torch, dtype))


def _rounded(x, dtype, torch):
    return host64(_cuda(torch, x, dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads,nq", [((8, 8), 1), ((8, 2), 4), ((16, 2), 2), ((8, 1), 1), ((4, 4), 16),
                                     ((8, 2), 5), ((8, 1), 4)], ids=str)
@pytest.mark.parametrize("window", [None, (-1, 0), (-1, 3)], ids=str)
def test_cache_lengths_windows_and_splits(torch, rng, backend, need_backend, dtype, d, heads, nq, window):
    need_backend(backend)
    hq, hkv = heads
    lengths = [0, 1, 77, 1000, 2049]
    capacity = 2100
    q = rng.standard_normal((len(lengths), hq, nq, d))
    # Caches laid out (B, N, H, d) and seen as (B, H, N, d) through strides; a NaN past every length.
    k, v = (rng.standard_normal((len(lengths), capacity, hkv, d)) for _ in range(2))
    for b, n in enumerate(lengths):
        k[b, n:], v[b, n:] = np.nan, np.nan
    q_r = _rounded(q, dtype, torch)
    k_r, v_r = (_rounded(x, dtype, torch).transpose(0, 2, 1, 3) for x in (k, v))
    kw = dict(cache_seqlens=np.array(lengths, np.int32), window=window)
    ref, ref_lse = kvcache_reference(q_r, np.nan_to_num(k_r), np.nan_to_num(v_r), **kw)
    dq = _cuda(torch, q, dtype)
    dk, dv = (_cuda(torch, x, dtype).transpose(1, 2) for x in (k, v))
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    results = []
    for splits in (None, 1, 3, 40):
        out, lse = cutlassfa.forward(dq, dk, dv, cache_seqlens=lens, window=window, num_splits=splits,
                                     backend=backend, return_lse=True)
        assert_matches_reference(backend, dtype, out, lse, ref, ref_lse)
        results.append(host64(out))
    for other in results[1:]:
        assert rel_l2(other, results[0]) <= 2 * bound_for(backend, dtype).rel_l2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("shape", [(1, 32, 4, 1, 8192), (3, 8, 8, 2, 700), (2, 4, 1, 3, 129), (5, 6, 3, 1, 64),
                                   (2, 32, 4, 4, 3000)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_dense_decode_calls(torch, rng, backend, need_backend, dtype, d, shape, causal):
    """Plain forward calls with a few queries split the keys on their own (num_splits=None)."""
    need_backend(backend)
    b, hq, hkv, nq, nk = shape
    q, k, v = (rng.standard_normal(s) for s in ((b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)))
    ref, ref_lse = attention_reference(*(_rounded(x, dtype, torch) for x in (q, k, v)), causal=causal)
    out, lse = cutlassfa.forward(*(_cuda(torch, x, dtype) for x in (q, k, v)), causal=causal, backend=backend,
                                 return_lse=True)
    assert_matches_reference(backend, dtype, out, lse, ref, ref_lse)
