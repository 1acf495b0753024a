"""The decode path of the tensor-core backends (a few query rows per K/V head: Nq x Hq/Hkv <= 128, in
chunks of 32 a CTA past 32) against the float64 reference: d 64 and 128, fp16 and bf16, GQA ratios 1 / 4 /
8 / 64, ragged cache lengths with 0 among them, causal and a right window bound, strided (B, N, H, d)
caches, split counts from 1 to many (equal up to rounding), a stale NaN past the cache lengths that must
not leak, paged caches (page sizes 1 to 256, shuffled pages) against the contiguous cache (bit for bit
where the decode kernel takes the pages), num_splits=1 on a plain call running the keys in one pass, and
the row chunks with ALiBi and sinks.
Skips cleanly without a GPU or PyTorch with CUDA."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2
from gpu_results import assert_matches_reference, host64, kernel_names

pytestmark = pytest.mark.gpu
BACKENDS = ["tensorcore", "tensorcore_sm80"]


def _cuda(torch, x, dtype):
    return torch.from_numpy(x.astype(np.float32)).to("cuda", getattr(torch, dtype))


def _rounded(x, dtype, torch):
    return host64(_cuda(torch, x, dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
# Rows a K/V head: 1, 16, 16, 8, 16, 20, 32; then in chunks of 32: 72 (3, the last of 8), 128 (4), 64 (one
# query of 64 heads on one: the packed tile).
@pytest.mark.parametrize("heads,nq", [((8, 8), 1), ((8, 2), 4), ((16, 2), 2), ((8, 1), 1), ((4, 4), 16),
                                     ((8, 2), 5), ((8, 1), 4), ((16, 2), 9), ((8, 1), 16), ((64, 1), 1)], ids=str)
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
                                   (2, 32, 4, 4, 3000), (2, 16, 2, 8, 3000), (1, 8, 1, 13, 999)], ids=str)
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("fp8", [False, True], ids=["cache", "fp8-cache"])
def test_rising_row_maxima(torch, rng, backend, need_backend, dtype, d, fp8):
    """The decode kernel rescales O only when a row's max passes its reference by more than 2^8
    (common/online_softmax.h): keys whose scores climb along the cache (the max grows a little at every
    step, past the threshold only over many steps), a late key far above the rest (one jump), and rows that
    see their largest keys first; one split (every step in one pass) and the default."""
    need_backend(backend)
    b, hq, hkv, n = 3, 8, 2, 3000
    q = rng.standard_normal((b, hq, 1, d))
    k, v = rng.standard_normal((b, hkv, n, d)), rng.standard_normal((b, hkv, n, d))
    climb = np.linspace(0.2, 6.0, n)[:, None]  # score spread x30 from the first key to the last
    k[0] *= climb
    k[1] *= climb[::-1]  # the largest first
    k[2, :, n - 40] = 25 * np.sign(q[2, :: hq // hkv, 0])  # one key far above the rest, late
    dq = _cuda(torch, q, dtype)
    if fp8:
        scale = np.abs(np.concatenate([k, v])).max() / 448
        dk, dv = (torch.from_numpy((x / scale).astype(np.float32)).cuda().to(torch.float8_e4m3fn) for x in (k, v))
        k_r, v_r = (dx.double().cpu().numpy() * scale for dx in (dk, dv))
        extra = dict(k_descale=float(scale), v_descale=float(scale))
    else:
        dk, dv = _cuda(torch, k, dtype), _cuda(torch, v, dtype)
        k_r, v_r = host64(dk), host64(dv)
        extra = {}
    ref, ref_lse = attention_reference(host64(dq), k_r, v_r)
    extra["cache_seqlens"] = torch.full((b,), n, dtype=torch.int32, device="cuda")  # (fp8 takes caches only)
    for splits in (None, 1):
        out = torch.full(dq.shape, float("nan"), dtype=dq.dtype, device="cuda")  # poisoned
        _, lse = cutlassfa.forward(dq, dk, dv, num_splits=splits, out=out, backend=backend, return_lse=True,
                                   **extra)
        assert_matches_reference(backend, dtype, out, lse, ref, ref_lse)
    names = kernel_names(torch, lambda: cutlassfa.forward(dq, dk, dv, num_splits=1, backend=backend, **extra))
    assert any("decode_kernel" in name for name in names), names


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_split_is_one_pass(torch, rng, backend, need_backend):
    """A plain call of one query splits its keys by itself (a split combine follows the decode kernel);
    num_splits=1 asks for one pass: no combine, and the result still matches the reference."""
    need_backend(backend)
    q, k, v = (rng.standard_normal(s) for s in ((1, 32, 1, 128), (1, 8, 8192, 128), (1, 8, 8192, 128)))
    ref, ref_lse = attention_reference(*(_rounded(x, "bfloat16", torch) for x in (q, k, v)))
    dq, dk, dv = (_cuda(torch, x, "bfloat16") for x in (q, k, v))
    split = kernel_names(torch, lambda: cutlassfa.forward(dq, dk, dv, backend=backend))
    assert any("combine" in name for name in split), split
    one_pass = kernel_names(torch, lambda: cutlassfa.forward(dq, dk, dv, num_splits=1, backend=backend))
    assert one_pass and not any("combine" in name for name in one_pass), one_pass
    out, lse = cutlassfa.forward(dq, dk, dv, num_splits=1, backend=backend, return_lse=True)
    assert_matches_reference(backend, dtype="bfloat16", out=out, lse=lse, ref=ref, ref_lse=ref_lse)


def _paged(torch, cache, lengths, page_size, rng):
    """cache (B, Hkv, N, d) on the GPU as shuffled pages (num_pages, Hkv, page_size, d) and a block table;
    the pages past each length, and two pages nobody uses, hold NaN."""
    b, hkv, n, d = cache.shape
    per_entry = -(-n // page_size)
    order = rng.permutation(b * per_entry + 2)
    table = order[: b * per_entry].reshape(b, per_entry).astype(np.int32)
    pages = torch.full((b * per_entry + 2, hkv, page_size, d), float("nan"), dtype=cache.dtype, device="cuda")
    for i, length in enumerate(lengths):
        for j in range(-(-length // page_size)):
            rows = cache[i, :, j * page_size : min((j + 1) * page_size, length)]
            pages[int(table[i, j]), :, : rows.shape[1]] = rows
    return pages, torch.from_numpy(table).cuda()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("page_size", [1, 7, 8, 16, 32, 64, 256])
@pytest.mark.parametrize("heads,nq", [((8, 2), 1), ((8, 1), 4)], ids=str)
def test_paged_caches_equal_the_contiguous_cache(torch, rng, backend, need_backend, dtype, d, page_size, heads, nq):
    """A paged cache (shuffled pages, NaN in the pages past every length) matches the reference and, where
    the decode kernel takes the pages (power-of-two sizes), gives the contiguous cache's result bit for
    bit at the same split count; other sizes run on the tile kernels, equal up to rounding."""
    need_backend(backend)
    hq, hkv = heads
    lengths = [0, 1, 77, 1000, 2049]
    q = _cuda(torch, rng.standard_normal((len(lengths), hq, nq, d)), dtype)
    k, v = (_cuda(torch, rng.standard_normal((len(lengths), hkv, 2100, d)), dtype) for _ in range(2))
    (k_pages, table), (v_pages, _) = (_paged(torch, x, lengths, page_size, np.random.default_rng(7)) for x in (k, v))
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    ref, ref_lse = kvcache_reference(host64(q), host64(k), host64(v), cache_seqlens=np.array(lengths, np.int32),
                                     causal=True)
    for splits in (1, 3, 40):
        kw = dict(cache_seqlens=lens, causal=True, num_splits=splits, backend=backend, return_lse=True)
        out, lse = cutlassfa.forward(q, k, v, **kw)
        out_paged, lse_paged = cutlassfa.forward(q, k_pages, v_pages, block_table=table, **kw)
        assert_matches_reference(backend, dtype, out_paged, lse_paged, ref, ref_lse)
        if page_size & (page_size - 1) == 0:
            assert torch.equal(out_paged, out) and torch.equal(lse_paged, lse)
        else:
            assert rel_l2(host64(out_paged), host64(out)) <= 2 * bound_for(backend, dtype).rel_l2


@pytest.mark.parametrize("backend", BACKENDS)
def test_page_indices_out_of_range_read_inside_the_cache(torch, rng, backend, need_backend):
    """A device block table is not checked (a sync): keys behind entries past the pages, or negative, are
    masked and never read, so the call reads only the cache (compute-sanitizer runs this file) and stays
    finite (tests/test_bad_page_index.py checks the values)."""
    need_backend(backend)
    q = _cuda(torch, rng.standard_normal((2, 8, 1, 128)), "bfloat16")
    k, v = (_cuda(torch, rng.standard_normal((6, 2, 16, 128)), "bfloat16") for _ in range(2))
    table = torch.tensor([[0, 1, 1000, -5], [5, 4, 3, 2**30]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([64, 64], dtype=torch.int32, device="cuda")
    out = cutlassfa.forward(q, k, v, cache_seqlens=lens, block_table=table, num_splits=2, backend=backend)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads,nq", [((16, 2), 5), ((8, 1), 16)], ids=str)
@pytest.mark.parametrize("page_size", [None, 16])
def test_row_chunks_take_every_term(torch, rng, backend, need_backend, heads, nq, page_size):
    """More than 32 rows a K/V head (40: chunks of 32 and 8; 128: four) on the decode kernel with what it
    takes per row (ALiBi slopes and sinks per query head, the causal diagonal per query), ragged lengths,
    paged or not, several split counts: the reference, and one launch of the decode kernel."""
    need_backend(backend)
    hq, hkv = heads
    lengths, d = [0, 5, 700, 2049], 128
    q = _cuda(torch, rng.standard_normal((len(lengths), hq, nq, d)), "bfloat16")
    k, v = (_cuda(torch, rng.standard_normal((len(lengths), hkv, 2100, d)), "bfloat16") for _ in range(2))
    sinks = rng.normal(0, 1, hq).astype(np.float32)
    slopes = rng.uniform(0.001, 0.05, hq).astype(np.float32)
    ref, ref_lse = kvcache_reference(host64(q), host64(k), host64(v), cache_seqlens=np.array(lengths, np.int32),
                                     causal=True, sinks=sinks, alibi_slopes=slopes)
    cache = dict(cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device="cuda"))
    if page_size:
        (k, table), (v, _) = (_paged(torch, x, lengths, page_size, np.random.default_rng(3)) for x in (k, v))
        cache["block_table"] = table
    terms = dict(causal=True, sinks=torch.from_numpy(sinks).cuda(), alibi_slopes=torch.from_numpy(slopes).cuda())
    for splits in (None, 1, 7):
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")  # poisoned
        _, lse = cutlassfa.forward(q, k, v, **cache, **terms, num_splits=splits, out=out, backend=backend,
                                   return_lse=True)
        assert_matches_reference(backend, "bfloat16", out, lse, ref, ref_lse)
    names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, **cache, **terms, num_splits=1, backend=backend))
    assert [n for n in names if "decode_kernel" in n] and not [n for n in names if "flash_fwd" in n], names


# (window, leftpad, softcap, score terms): the general instantiation's modes, alone and together.
GENERAL_MODES = {
    "leftpad": (None, True, 0.0, False),
    "window": ((40, 0), False, 0.0, False),
    "window-leftpad": ((300, 0), True, 0.0, False),
    "softcap": (None, False, 5.0, False),
    "all": ((300, 0), True, 5.0, True),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", list(GENERAL_MODES))
@pytest.mark.parametrize("heads,nq,page_size", [((8, 2), 1, None), ((16, 2), 5, 16), ((8, 8), 3, 64)], ids=str)
def test_general_modes_on_the_decode_kernel(torch, rng, backend, need_backend, dtype, d, mode, heads, nq, page_size):
    """Left padding (NaN in every padded key: those rows must be zero-filled, not weighted by zero), a left
    window bound and softcap run on the decode kernel: the reference at several split counts, one launch
    of the decode kernel and no tile kernel."""
    need_backend(backend)
    _decode_kernel_matches_reference(torch, rng, backend, dtype, d, GENERAL_MODES[mode], heads, nq, page_size)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["plain"] + list(GENERAL_MODES))
# Rows a K/V head, at most 16 at d = 256: 4 (two queries of Gemma-2's 16 on 8), 16 (8 queries), 8 (4 of 32 on
# 16), 16 (2 of 8 on 1). (One query runs there with a left window bound only: the "window" modes.)
@pytest.mark.parametrize("heads,nq,page_size", [((16, 8), 2, None), ((16, 8), 8, 16), ((32, 16), 4, 64),
                                                ((8, 1), 2, None)], ids=str)
def test_head_dim_256_on_the_decode_kernel(torch, rng, backend, need_backend, dtype, mode, heads, nq, page_size):
    """d = 256 (Gemma-2's heads: one 16-row slab a CTA, two warps) on the decode kernel, plain and in every
    general mode: the reference at several split counts, one launch of the decode kernel and no tile kernel."""
    need_backend(backend)
    modes = dict(GENERAL_MODES, plain=(None, False, 0.0, False))
    _decode_kernel_matches_reference(torch, rng, backend, dtype, 256, modes[mode], heads, nq, page_size)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["window", "window-leftpad", "all"])
@pytest.mark.parametrize("page_size", [None, 16])
def test_head_dim_256_one_query_with_a_window(torch, rng, backend, need_backend, mode, page_size):
    """One query at d = 256 runs on the decode kernel when a left window bound limits its keys (Gemma-2's
    sliding layers)."""
    need_backend(backend)
    _decode_kernel_matches_reference(torch, rng, backend, "bfloat16", 256, GENERAL_MODES[mode], (16, 8), 1, page_size)


def _decode_kernel_matches_reference(torch, rng, backend, dtype, d, mode, heads, nq, page_size):
    window, leftpad, softcap, terms = mode
    hq, hkv = heads
    lengths, capacity = [0, 9, 700, 2049], 2100
    pads = np.array([0, 4, 650, 100], np.int32) if leftpad else None
    q = rng.standard_normal((len(lengths), hq, nq, d))
    k, v = (rng.standard_normal((len(lengths), hkv, capacity, d)) for _ in range(2))
    for b, n in enumerate(lengths):  # NaN past every length and in every padded key
        k[b, :, n:], v[b, :, n:] = np.nan, np.nan
        if pads is not None:
            k[b, :, : pads[b]], v[b, :, : pads[b]] = np.nan, np.nan
    dq, dk, dv = (_cuda(torch, x, dtype) for x in (q, k, v))
    options = dict(window=window, softcap=softcap, causal=window is None)
    if terms:
        options["sinks"] = rng.normal(0, 1, hq).astype(np.float32)
        options["alibi_slopes"] = rng.uniform(0.001, 0.05, hq).astype(np.float32)
    ref, ref_lse = kvcache_reference(*(np.nan_to_num(_rounded(x, dtype, torch)) for x in (q, k, v)),
                                     cache_seqlens=np.array(lengths, np.int32), cache_leftpad=pads, **options)
    cache = dict(cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device="cuda"))
    if pads is not None:
        cache["cache_leftpad"] = torch.from_numpy(pads).cuda()
    if page_size:
        (dk, table), (dv, _) = (_paged(torch, x, lengths, page_size, np.random.default_rng(5)) for x in (dk, dv))
        cache["block_table"] = table  # (the pages hold the padded keys' NaN too)
    device_options = {name: torch.from_numpy(x).cuda() if isinstance(x, np.ndarray) else x
                      for name, x in options.items()}
    for splits in (None, 1, 5):
        out = torch.full(dq.shape, float("nan"), dtype=dq.dtype, device="cuda")  # poisoned
        _, lse = cutlassfa.forward(dq, dk, dv, **cache, **device_options, num_splits=splits, out=out, backend=backend,
                                   return_lse=True)
        assert_matches_reference(backend, dtype, out, lse, ref, ref_lse)
    names = kernel_names(torch, lambda: cutlassfa.forward(dq, dk, dv, **cache, **device_options, num_splits=1,
                                                          backend=backend))
    assert [n for n in names if "decode_kernel" in n] and not [n for n in names if "flash_fwd" in n], names
