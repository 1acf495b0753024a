"""cutlassfa.plan: the kernel, key splits and tile a call would run, launching nothing. Planned here for GPUs
that are not present (a compute capability and a multiprocessor count), so the planner's routing is tested
on the CPU: which calls the decode kernel takes (up to 32 query rows a K/V head, or 128 of at most 16
queries; left padding, windows and softcap), GQA packing for the tile kernels only, the Hopper kernels on
sm_90 and mma.sync below it, fp8 caches the decode kernel does not take run on a dequantized copy, and the
calls with no kernel (cpu, fill). Needs an extension built with CUDA for sm_90a (the CI build); the GPU tests
(tests/test_plan_gpu.py) check that calls launch what their plan says."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import cutlassfa
from cutlassfa import _api

H100 = (90, 132)
A100 = (80, 108)
T4 = (75, 40)


def _architectures() -> list[str]:
    try:
        return importlib.import_module("cutlassfa._build_config").ARCHITECTURES.split(",")
    except ImportError:
        return []


pytestmark = pytest.mark.skipif(not hasattr(_api._C, "plan") or "90a" not in _architectures(),
                                reason="needs an extension built with CUDA for sm_90a (as CI builds it)")


def _arrays(b, hq, hkv, nq, nk, d, dtype=np.float16):
    return (np.zeros((b, hq, nq, d), dtype), np.zeros((b, hkv, nk, d), dtype), np.zeros((b, hkv, nk, d), dtype))


def _cache(b, nk):
    return {"cache_seqlens": np.full(b, nk, np.int32)}


@pytest.mark.parametrize("heads,nq,rows_a_cta", [((64, 8), 8, 32), ((32, 8), 16, 32), ((64, 8), 16, 32),
                                                 ((32, 8), 2, 16), ((32, 8), 1, 16), ((64, 1), 1, 32)], ids=str)
def test_decode_steps_run_the_decode_kernel(heads, nq, rows_a_cta):
    hq, hkv = heads
    q, k, v = _arrays(8, hq, hkv, nq, 32768, 128)
    p = cutlassfa.plan(q, k, v, causal=True, device=H100, **_cache(8, 32768))
    assert p["backend"] == "tensorcore" and p["kernel"] == "sm90decode", p
    assert p["tile"] == (rows_a_cta, 64) and p["kernel_head_dim"] == 128 and not p["gqa_packed"]
    assert not p["fp8_dequantized"]


def test_the_decode_kernel_splits_long_caches_to_fill_the_device():
    q, k, v = _arrays(1, 32, 8, 1, 131072, 128)
    assert cutlassfa.plan(q, k, v, device=H100, **_cache(1, 131072))["num_splits"] > 1
    assert cutlassfa.plan(q, k, v, device=H100, num_splits=1, **_cache(1, 131072))["num_splits"] == 1


@pytest.mark.parametrize("heads,nq", [((64, 8), 17), ((8, 8), 40), ((16, 1), 32)], ids=str)
def test_more_rows_run_the_tile_kernels(heads, nq):
    """Past 128 rows, or 17 queries and more past 32 rows: a tile kernel (the general wgmma kernel for a
    cache)."""
    hq, hkv = heads
    q, k, v = _arrays(2, hq, hkv, nq, 4096, 128)
    assert cutlassfa.plan(q, k, v, causal=True, device=H100, **_cache(2, 4096))["kernel"] == "sm90"


@pytest.mark.parametrize("mode", [{"cache_leftpad": np.array([0, 100], np.int32)}, {"window": (4096, 0)},
                                  {"softcap": 30.0}], ids=["leftpad", "window", "softcap"])
def test_left_padding_windows_and_softcap_run_the_decode_kernel(mode):
    q, k, v = _arrays(2, 32, 8, 1, 8192, 128)
    causal = "window" not in mode
    assert cutlassfa.plan(q, k, v, causal=causal, device=H100, **_cache(2, 8192), **mode)["kernel"] == "sm90decode"


def test_gqa_packing_is_for_the_tile_kernels():
    """One query of grouped heads: the decode kernel at its head dims, unpacked; a head dim it does not
    have (96) runs the packed tile."""
    q, k, v = _arrays(2, 32, 4, 1, 4096, 96)
    p = cutlassfa.plan(q, k, v, device=H100, **_cache(2, 4096))
    assert (p["kernel"], p["gqa_packed"], p["kernel_head_dim"]) == ("sm90", True, 96), p


def test_prefill_and_devices():
    q, k, v = _arrays(1, 8, 8, 4096, 4096, 128)
    p = cutlassfa.plan(q, k, v, causal=True, device=H100)
    assert (p["backend"], p["kernel"], p["num_splits"], p["gqa_packed"]) == ("tensorcore", "sm90ws", 1, False), p
    if "80" in _architectures():  # no wgmma and no decode kernel below sm_90
        assert cutlassfa.plan(q, k, v, device=A100)["kernel"] == "sm80"
        d1 = cutlassfa.plan(*_arrays(8, 32, 8, 1, 8192, 128), device=A100, **_cache(8, 8192))
        assert d1["kernel"] == "sm80" and d1["gqa_packed"]
    assert cutlassfa.plan(q, k, v, backend="tensorcore_sm80", device=H100)["kernel"] == "sm80"
    assert cutlassfa.plan(q, k, v, backend="large_tile", device=H100)["kernel"] == "large_tile"
    if "75" in _architectures():  # a Turing GPU (T4): CUDA cores only, small_tile's shared memory
        old = cutlassfa.plan(q, k, v, device=T4)
        assert (old["backend"], old["kernel"], old["tile"], old["kernel_head_dim"]) == (
            "small_tile", "small_tile", None, None)
        with pytest.raises(RuntimeError, match="tensorcore"):
            cutlassfa.plan(q, k, v, backend="tensorcore", device=T4)
    with pytest.raises(RuntimeError, match="sm_37"):  # no kernel of this build runs there
        cutlassfa.plan(q, k, v, device=(37, 13))


def _bfloat16():
    return pytest.importorskip("ml_dtypes").bfloat16


ALIBI = {"alibi_slopes": np.geomspace(0.5, 2**-8, 8).astype(np.float32)}


@pytest.mark.parametrize("terms,head_dims", [({"softcap": 30.0}, (128, 256)), (ALIBI, (64, 96, 128, 256)),
                                             ({"softcap": 30.0, **ALIBI}, ())], ids=["softcap", "alibi", "both"])
def test_softcap_and_alibi_prefill_run_the_warp_specialized_kernel_at_their_head_dims(terms, head_dims):
    """Dense prefill with softcap or ALiBi: the warp-specialized kernel's instantiation of that term at its head
    dims (ALiBi 64, 96, 128, 256; softcap 128, 256 by default); other head dims, calls with both and varlen
    batches on the wgmma kernel's general instantiation."""
    for d in (64, 96, 128, 192, 256):
        for dtype in (np.float16, _bfloat16()):
            q, k, v = _arrays(2, 8, 8, 1024, 1024, d, dtype)
            p = cutlassfa.plan(q, k, v, causal=True, device=H100, **terms)
            expected = "sm90ws" if d in head_dims else "sm90"
            assert (p["kernel"], p["num_splits"], p["kernel_head_dim"]) == (expected, 1, d), (d, dtype, p)
    q, k, v = (np.zeros((2048, 8, 128), np.float16) for _ in range(3))
    cu = np.array([0, 1024, 2048], np.int32)
    p = cutlassfa.plan(q, k, v, causal=True, device=H100, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1024,
                       max_seqlen_k=1024, **terms)
    assert p["kernel"] == "sm90", p


def test_fp8_caches_the_decode_kernel_does_not_take_run_dequantized():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for d, expected in ((128, ("sm90decode", False)), (96, ("sm90", True))):
        q = np.zeros((2, 8, 1, d), np.float16)
        k = np.zeros((2, 2, 256, d), ml_dtypes.float8_e4m3fn)
        p = cutlassfa.plan(q, k, k, device=H100, k_descale=0.5, **_cache(2, 256))
        assert (p["kernel"], p["fp8_dequantized"]) == expected, p


@pytest.mark.parametrize("heads,nq,window,decode_kernel", [
    ((16, 8), 1, (4096, 0), True), ((16, 8), 8, (4096, 0), True), ((16, 8), 2, None, True), ((32, 16), 4, None, True),
    ((16, 8), 1, None, False), ((16, 8), 9, (4096, 0), False), ((32, 4), 4, None, False)], ids=str)
def test_head_dim_256_decode_takes_one_slab(heads, nq, window, decode_kernel):
    """d = 256 on the decode kernel: up to 16 query rows a K/V head (one slab, 16 x 32 keys a step, softcap
    included), where the tile kernels trail it: a left window bound or more than one query (Gemma-2's
    sliding layers, speculative steps). One query against a whole cache, and more rows, run on the tile
    kernels. Its CTAs have two warps: the splits fill two a multiprocessor."""
    hq, hkv = heads
    q, k, v = _arrays(8, hq, hkv, nq, 32768, 256)
    p = cutlassfa.plan(q, k, v, causal=True, window=window, softcap=50.0, device=H100, **_cache(8, 32768))
    assert (p["kernel"] == "sm90decode") == decode_kernel, p
    if decode_kernel:
        assert p["tile"] == (16, 32) and p["kernel_head_dim"] == 256 and not p["fp8_dequantized"], p
        assert p["num_splits"] == 2 * H100[1] // (8 * hkv), p


def test_head_dim_256_fp8_caches_run_on_a_dequantized_copy():
    """The decode kernel reads no fp8 at d = 256: the call runs on the copy in q's dtype (which the decode
    kernel takes, more than one query here)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q = np.zeros((2, 16, 2, 256), np.float16)
    k = np.zeros((2, 8, 256, 256), ml_dtypes.float8_e4m3fn)
    p = cutlassfa.plan(q, k, k, causal=True, device=H100, k_descale=0.5, **_cache(2, 256))
    assert (p["kernel"], p["fp8_dequantized"]) == ("sm90decode", True), p


def test_calls_without_a_kernel():
    q, k, v = _arrays(1, 4, 4, 8, 0, 64)
    assert cutlassfa.plan(q, k, v, device=H100)["kernel"] == "fill"  # no key: the outputs are filled
    q, k, v = _arrays(1, 4, 4, 8, 8, 64)
    assert cutlassfa.plan(q, k, v, backend="cpu")["kernel"] == "cpu"
    with pytest.raises(ValueError, match="cpu"):
        cutlassfa.plan(q, k, v, backend="cpu", device=H100)


def test_bad_arguments():
    q, k, v = _arrays(1, 4, 4, 8, 8, 64)
    for device in ((90,), (90, 0), [90, 132], (9.0, 132)):
        with pytest.raises(ValueError, match="device"):
            cutlassfa.plan(q, k, v, device=device)
    with pytest.raises(TypeError, match="nonsense"):
        cutlassfa.plan(q, k, v, device=H100, nonsense=1)
    with pytest.raises(ValueError):  # as forward: k's head dim differs
        cutlassfa.plan(q, k[..., :32], v, device=H100)
