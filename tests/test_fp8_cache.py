"""FP8 KV caches (k and v float8_e4m3fn with k_descale / v_descale, q fp16 / bf16): the result is attention(q,
k * k_descale, v * v_descale) in q's dtype. The validator's rules on the CPU (every build); the decode kernel on
the GPU against the float64 reference of the dequantized cache (contiguous and paged caches, GQA, causal,
split keys, every descale form, sinks, ALiBi, appended keys, host arrays, extreme q magnitudes), and the
calls it does not take (and the other backends) on a dequantized copy. compute-sanitizer runs this file on
the GPU machine."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa.reference import kvcache_reference, rel_l2
from gpu_results import assert_close_on_host, assert_matches_reference, host64, to_cuda

ml_dtypes = pytest.importorskip("ml_dtypes", reason="optional package ml_dtypes")
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)


def fp8(rng, shape, spread: float = 3.0) -> np.ndarray:
    """Standard normal values times `spread`, rounded to e4m3."""
    return (rng.standard_normal(shape) * spread).astype(E4M3)


def fp8_cache(rng, b: int, hkv: int, capacity: int, d: int, page: int | None):
    """k and v e4m3 caches (b, hkv, capacity, d), or pools of pages named by a shuffled block table."""
    if page is None:
        return fp8(rng, (b, hkv, capacity, d)), fp8(rng, (b, hkv, capacity, d)), None
    pages = b * capacity // page
    table = rng.permutation(pages).reshape(b, capacity // page).astype(np.int32)
    return fp8(rng, (pages, hkv, page, d)), fp8(rng, (pages, hkv, page, d)), table


def descales(rng, form: str, b: int, hkv: int):
    """(k_descale, v_descale) of one form: None, one float, (Hkv,) or (B, Hkv) float32."""
    shape = {"none": None, "tensor": (), "head": (hkv,), "entry": (b, hkv)}[form]
    if shape is None:
        return None, None
    draw = lambda: rng.uniform(0.05, 0.5, shape).astype(np.float32)  # noqa: E731
    return (float(draw()), float(draw())) if shape == () else (draw(), draw())


# --------------------------------------------------------------------------------------------------
# The validator (host arrays: every build)
# --------------------------------------------------------------------------------------------------

def _call(rng, **overrides):
    b, hq, hkv, nq, cap, d = 2, 4, 2, 1, 64, 64
    args = dict(q=rng.standard_normal((b, hq, nq, d)).astype(np.float16), k=fp8(rng, (b, hkv, cap, d)),
                v=fp8(rng, (b, hkv, cap, d)), cache_seqlens=np.array([10, 64], np.int32))
    args.update(overrides)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    return q, k, v, args


def test_cpu_backend_computes_the_dequantized_attention(rng):
    q, k, v, args = _call(rng)
    kd, vd = rng.uniform(0.1, 0.3, 2).astype(np.float32), np.float32(0.2)
    out, lse = cutlassfa.forward(q, k, v, **args, causal=True, k_descale=kd, v_descale=float(vd), backend="cpu",
                                 return_lse=True)
    assert out.dtype == np.float16
    ref, ref_lse = kvcache_reference(q, k, v, **args, causal=True, k_descale=kd, v_descale=vd)
    assert rel_l2(out, ref) <= 2e-3
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4)
    # The same numbers as the cache dequantized by hand in float32.
    k32, v32 = (x.astype(np.float32) * s[None, :, None, None] for x, s in ((k, kd), (v, np.full(2, vd, np.float32))))
    plain = cutlassfa.forward(q.astype(np.float32), k32, v32, **args, causal=True, backend="cpu")
    assert rel_l2(out, plain) <= 1e-3


@pytest.mark.parametrize("change, error, words", [
    (dict(v="f16"), TypeError, "k and v must have the same dtype"),
    (dict(q="f32"), TypeError, "q must be float16 or bfloat16"),
    (dict(cache_seqlens=None), TypeError, "as a KV cache only"),
    (dict(k_descale=np.ones(3, np.float32)), ValueError, "k_descale must have shape"),
    (dict(v_descale=np.ones((3, 2), np.float32)), ValueError, "v_descale must have shape"),
    (dict(k_descale=[np.inf, 1.0]), ValueError, "k_descale must be finite"),
    (dict(k_descale=np.ones(2, np.int32)), TypeError, "k_descale must be float32"),
    (dict(k_new="f16"), TypeError, "k_new must have the cache's dtype float8_e4m3fn"),
])
def test_bad_fp8_calls_raise_naming_the_argument(rng, change, error, words):
    q, k, v, args = _call(rng)
    casts = {"e4m3": lambda x: x.astype(E4M3), "f16": lambda x: x.astype(np.float16),
             "f32": lambda x: x.astype(np.float32)}
    if change.get("q") in casts:
        q = casts[change.pop("q")](q)
    if change.get("v") in casts:
        v = casts[change.pop("v")](v)
    if change.get("k_new") == "f16":
        change.pop("k_new")
        args.update(k_new=np.zeros((2, 2, 1, 64), np.float16), v_new=np.zeros((2, 2, 1, 64), np.float16))
    args.update(change)
    args = {key: value for key, value in args.items() if value is not None}
    with pytest.raises(error, match=words):
        cutlassfa.forward(q, k, v, **args, backend="cpu")


def test_descales_need_an_fp8_cache(rng):
    q, k, v, args = _call(rng, k=np.zeros((2, 2, 64, 64), np.float16), v=np.zeros((2, 2, 64, 64), np.float16))
    with pytest.raises(ValueError, match="k_descale scales float8_e4m3fn k and v"):
        cutlassfa.forward(q, k, v, **args, k_descale=1.0, backend="cpu")


def test_other_fp8_formats_are_refused(rng):
    q, k, v, args = _call(rng)
    e5m2 = np.dtype(ml_dtypes.float8_e5m2)
    with pytest.raises(TypeError, match="k has dtype float8_e5m2"):
        cutlassfa.forward(q, k.astype(np.float32).astype(e5m2), v.astype(np.float32).astype(e5m2), **args,
                          backend="cpu")


def test_torch_operator_and_jax_take_fp8_caches(rng):
    """PyTorch CPU tensors (eager and torch.compile, through the operator) and JAX arrays (under jax.jit)
    reach the cpu backend with the same result."""
    torch = pytest.importorskip("torch", reason="optional package torch")
    q, k, v, args = _call(rng)
    lens = args["cache_seqlens"]
    vd = np.array([0.1, 0.2], np.float32)
    ref, _ = kvcache_reference(q, k, v, cache_seqlens=lens, k_descale=0.3, v_descale=vd)
    tq, tk, tv = torch.from_numpy(q), *(torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn) for x in (k, v))

    def call(q, k, v, lens):
        return cutlassfa.forward(q, k, v, cache_seqlens=lens, k_descale=0.3, v_descale=torch.from_numpy(vd))

    for run in (call, torch.compile(call, fullgraph=True)):
        assert rel_l2(run(tq, tk, tv, torch.from_numpy(lens)).float().numpy(), ref) <= 2e-3
    jax = pytest.importorskip("jax", reason="optional package jax")
    traced = jax.jit(lambda q, k, v, lens: cutlassfa.forward(q, k, v, cache_seqlens=lens, k_descale=0.3, v_descale=vd))
    out = traced(*(jax.numpy.asarray(x) for x in (q, k, v, lens)))
    assert rel_l2(np.asarray(out, np.float64), ref) <= 2e-3


def test_supports_says_where_fp8_caches_run():
    assert cutlassfa.supports("cpu", "bfloat16", 128, kv_cache=True, fp8_cache=True, softcap=3.0)
    refused = cutlassfa.supports("cpu", "float32", 128, kv_cache=True, fp8_cache=True)
    assert not refused and "float16 / bfloat16" in refused.reason


# --------------------------------------------------------------------------------------------------
# The decode kernel on the GPU
# --------------------------------------------------------------------------------------------------

# (b, hq, hkv, nq, capacity, d, causal): one query and GQA 4 (a packed tile), MQA 8/1, several queries, and
# 72 rows a K/V head (chunks of 32, 32 and 8 rows).
DECODE_SHAPES = {
    "d128-gqa4": (3, 32, 8, 1, 1024, 128, False),
    "d128-mqa": (2, 8, 1, 1, 768, 128, True),
    "d64-gqa4-4q": (2, 8, 2, 4, 640, 64, True),
    "d128-gqa8-9q": (2, 16, 2, 9, 704, 128, True),
}


def _q(rng, shape, dtype: str, magnitude: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * magnitude).astype(np.float16 if dtype == "float16" else BF16)


def _cuda_q(torch, q: np.ndarray):
    if q.dtype == BF16:
        return torch.from_numpy(q.astype(np.float32)).cuda().bfloat16()
    return to_cuda(torch, q)


def _lengths(rng, b: int, capacity: int) -> np.ndarray:
    lens = rng.integers(1, capacity + 1, b).astype(np.int32)
    lens[0] = capacity  # a full entry
    return lens


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", list(DECODE_SHAPES))
@pytest.mark.parametrize("page", [None, 16, 64])
@pytest.mark.parametrize("form", ["none", "tensor", "head", "entry"])
def test_gpu_decode_matches_reference(torch, rng, need_backend, dtype, shape, page, form):
    need_backend("tensorcore")
    b, hq, hkv, nq, cap, d, causal = DECODE_SHAPES[shape]
    q = _q(rng, (b, hq, nq, d), dtype)
    k, v, table = fp8_cache(rng, b, hkv, cap, d, page)
    lens = _lengths(rng, b, cap)
    kd, vd = descales(rng, form, b, hkv)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, block_table=table, causal=causal, k_descale=kd,
                                     v_descale=vd)
    scales = {name: (s if s is None or isinstance(s, float) else to_cuda(torch, s))
              for name, s in (("k_descale", kd), ("v_descale", vd))}
    dk, dv = (torch.from_numpy(x.view(np.uint8)).cuda().view(torch.float8_e4m3fn) for x in (k, v))
    for splits in (None, 1, 3):
        out = torch.full(q.shape, float("nan"), dtype=getattr(torch, dtype), device="cuda")  # poisoned
        result, lse = cutlassfa.forward(_cuda_q(torch, q), dk, dv, cache_seqlens=to_cuda(torch, lens),
                                        block_table=None if table is None else to_cuda(torch, table), causal=causal,
                                        num_splits=splits, out=out, return_lse=True, **scales)
        assert result is out
        assert_matches_reference("tensorcore", dtype, out, lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_decode_runs_the_decode_kernel(torch, need_backend, dtype):
    from gpu_results import kernel_names

    need_backend("tensorcore")
    q = torch.randn(2, 8, 1, 128, device="cuda", dtype=getattr(torch, dtype))
    k = torch.randn(2, 2, 4096, 128, device="cuda").to(torch.float8_e4m3fn)
    lens = torch.full((2,), 4096, dtype=torch.int32, device="cuda")
    names = kernel_names(torch, lambda: cutlassfa.forward(q, k, k, cache_seqlens=lens, k_descale=0.5))
    assert any("decode_kernel" in name for name in names), names


@pytest.mark.gpu
@pytest.mark.parametrize("magnitude", [1e-5, 1.0, 3e4])
def test_gpu_bf16_queries_of_any_magnitude(torch, rng, need_backend, magnitude):
    """A bf16 Q tile is scaled by a power of two into fp16's range: tiny and huge queries stay exact."""
    need_backend("tensorcore")
    b, hq, hkv, nq, cap, d = 2, 16, 2, 2, 512, 128
    q = _q(rng, (b, hq, nq, d), "bfloat16", magnitude)
    k, v, _ = fp8_cache(rng, b, hkv, cap, d, None)
    scale = 1.0 / (magnitude * np.sqrt(d))  # scores of the order of one whatever the magnitude
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=np.full(b, cap), softmax_scale=scale, k_descale=0.25)
    dk, dv = (torch.from_numpy(x.view(np.uint8)).cuda().view(torch.float8_e4m3fn) for x in (k, v))
    out, lse = cutlassfa.forward(_cuda_q(torch, q), dk, dv, cache_seqlens=np.full(b, cap, np.int32),
                                 softmax_scale=scale, k_descale=0.25, return_lse=True)
    assert_matches_reference("tensorcore", "bfloat16", out, lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("nq", [2, 12])  # 8 and 48 rows a K/V head (chunks of 32 and 16)
def test_gpu_sinks_alibi_and_appended_keys(torch, rng, need_backend, nq):
    need_backend("tensorcore")
    b, hq, hkv, cap, d, n_new = 3, 16, 4, 512, 128, 2
    q = _q(rng, (b, hq, nq, d), "bfloat16")
    k, v, table = fp8_cache(rng, b, hkv, cap, d, 64)
    lens = np.array([0, 100, cap - n_new], np.int32)
    k_new, v_new = fp8(rng, (b, hkv, n_new, d)), fp8(rng, (b, hkv, n_new, d))
    sinks = rng.normal(0, 1, hq).astype(np.float32)
    slopes = rng.uniform(0.01, 0.1, hq).astype(np.float32)
    kd, vd = descales(rng, "entry", b, hkv)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new,
                                     causal=True, sinks=sinks, alibi_slopes=slopes, k_descale=kd, v_descale=vd)
    as_fp8 = lambda x: torch.from_numpy(x.view(np.uint8)).cuda().view(torch.float8_e4m3fn)  # noqa: E731
    dk, dv = as_fp8(k), as_fp8(v)
    out, lse = cutlassfa.forward(_cuda_q(torch, q), dk, dv, cache_seqlens=to_cuda(torch, lens),
                                 block_table=to_cuda(torch, table), k_new=as_fp8(k_new), v_new=as_fp8(v_new),
                                 causal=True, sinks=to_cuda(torch, sinks), alibi_slopes=to_cuda(torch, slopes),
                                 k_descale=to_cuda(torch, kd), v_descale=to_cuda(torch, vd), return_lse=True)
    assert_matches_reference("tensorcore", "bfloat16", out, lse, ref, ref_lse)
    # The new keys landed bit for bit at cache_seqlens[b] of each entry.
    pages = dk.view(torch.uint8).cpu().numpy()
    for i in range(b):
        for j in range(n_new):
            position = lens[i] + j
            page, row = table[i, position // 64], position % 64
            np.testing.assert_array_equal(pages[page, :, row], k_new[i, :, j].view(np.uint8))


@pytest.mark.gpu
def test_gpu_host_arrays(need_backend, rng):
    """numpy fp8 caches go through the GPU (host in, host out), the appended keys copied back."""
    need_backend("tensorcore")
    b, hq, hkv, cap, d = 2, 8, 2, 256, 64
    q = _q(rng, (b, hq, 1, d), "float16")
    k, v, _ = fp8_cache(rng, b, hkv, cap, d, None)
    k_new, v_new = fp8(rng, (b, hkv, 1, d)), fp8(rng, (b, hkv, 1, d))
    lens = np.array([3, 200], np.int32)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, k_new=k_new, v_new=v_new, k_descale=0.3)
    out, lse = cutlassfa.forward(q, k, v, cache_seqlens=lens, k_new=k_new, v_new=v_new, k_descale=0.3,
                                 return_lse=True)
    assert cutlassfa.select_backend(q, k, v, cache_seqlens=lens) == "tensorcore"
    assert_close_on_host("tensorcore", "float16", out.astype(np.float64), lse, ref, ref_lse)
    np.testing.assert_array_equal(k[1, :, 200].view(np.uint8), k_new[1, :, 0].view(np.uint8))


# The decode kernel's general instantiation (left padding, a left window bound, softcap) on fp8 caches.
GENERAL_CASES = ("leftpad", "window", "softcap", "paged_softcap")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["tensorcore", "large_tile"])
@pytest.mark.parametrize("case", [*GENERAL_CASES, "rows", "head_dim", "unaligned_rows", "page", "paged_unaligned_rows"])
def test_gpu_calls_past_the_plain_decode_kernel(torch, rng, need_backend, backend, case):
    """On tensorcore, left padding, a left window bound and softcap run on the decode kernel's general
    instantiation (the exact dequantized math, and no tile kernel). What the decode kernel does not take
    (more than 128 rows per K/V head, head dim 96, head dim 40: fp8 rows of 40 bytes, not 16-byte aligned,
    a page size of 7) and the other backends run the cache dequantized into q's dtype, keys appended into the
    fp8 cache first: the attention of that copy (k * k_descale rounded to bf16: the one rounding this path
    adds, against the decode kernel's exact fp32 descale)."""
    from cutlassfa._inputs import round_to

    from gpu_results import kernel_names

    need_backend(backend)
    b, hq, hkv, nq, cap, d, page = 3, 8, 2, 1, 112, 64, None
    options = {}
    if case == "leftpad":
        options["cache_leftpad"] = np.array([0, 5, 30], np.int32)
    elif case == "window":
        options["window"] = (20, 0)
    elif case in ("softcap", "paged_softcap"):
        options["softcap"] = 3.0
    if case == "rows":
        nq = 40
    if case == "head_dim":
        d = 96
    if case in ("unaligned_rows", "paged_unaligned_rows"):
        d = 40
    if case in ("page", "paged_softcap", "paged_unaligned_rows"):
        page = 7 if case == "page" else 16
    q = _q(rng, (b, hq, nq, d), "bfloat16")
    k, v, table = fp8_cache(rng, b, hkv, cap, d, page)
    k_new, v_new = fp8(rng, (b, hkv, 2, d)), fp8(rng, (b, hkv, 2, d))
    lens = np.array([40, 70, cap - 2], np.int32)
    kd, vd = descales(rng, "head", b, hkv)
    on_decode_kernel = backend == "tensorcore" and case in GENERAL_CASES
    if on_decode_kernel:
        ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lens, block_table=table, k_new=k_new, v_new=v_new,
                                         causal=True, k_descale=kd, v_descale=vd, **options)
    else:
        copy = lambda x, s: round_to(x.astype(np.float32) * s[None, :, None, None], "bfloat16")  # noqa: E731
        ref, ref_lse = kvcache_reference(q, copy(k, kd), copy(v, vd), cache_seqlens=lens, block_table=table,
                                         k_new=copy(k_new, kd), v_new=copy(v_new, vd), causal=True, **options)
    as_fp8 = lambda x: torch.from_numpy(x.view(np.uint8)).cuda().view(torch.float8_e4m3fn)  # noqa: E731
    dk = as_fp8(k)
    call = lambda k_new, v_new: cutlassfa.forward(  # noqa: E731
        _cuda_q(torch, q), dk, as_fp8(v), cache_seqlens=to_cuda(torch, lens),
        block_table=None if table is None else to_cuda(torch, table), k_new=k_new, v_new=v_new, causal=True,
        k_descale=to_cuda(torch, kd), v_descale=to_cuda(torch, vd), backend=backend, return_lse=True,
        **{name: to_cuda(torch, x) if isinstance(x, np.ndarray) else x for name, x in options.items()})
    out, lse = call(as_fp8(k_new), as_fp8(v_new))
    assert_matches_reference(backend, "bfloat16", out, lse, ref, ref_lse)
    names = kernel_names(torch, lambda: call(None, None))
    assert any("decode_kernel" in n for n in names) == on_decode_kernel, names
    if table is None:  # the appended keys are in the fp8 cache itself
        np.testing.assert_array_equal(dk.view(torch.uint8).cpu().numpy()[1, :, 70:72], k_new[1].view(np.uint8))


@pytest.mark.gpu
def test_gpu_quantization_error_against_the_bf16_cache(torch, rng, need_backend):
    """What users pay: an fp8 cache quantized with per-head amax / 448 scales against the bf16 cache it came
    from, relative L2 of the outputs (a few per cent for standard normal data; bench/NOTES-variants.md)."""
    need_backend("tensorcore")
    b, hq, hkv, cap, d = 4, 32, 8, 2048, 128
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, cap, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scales = [x.float().abs().amax(dim=(0, 2, 3)) / 448 for x in (k, v)]  # per K/V head
    k8, v8 = ((x.float() / s[None, :, None, None]).to(torch.float8_e4m3fn) for x, s in zip((k, v), scales))
    lens = torch.full((b,), cap, dtype=torch.int32, device="cuda")
    exact = cutlassfa.forward(q, k, v, cache_seqlens=lens)
    quantized = cutlassfa.forward(q, k8, v8, cache_seqlens=lens, k_descale=scales[0], v_descale=scales[1])
    error = rel_l2(host64(quantized), host64(exact))
    assert error < 0.08, error
