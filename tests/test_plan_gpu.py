"""Which kernel the planner (cpp/src/dispatch.cpp, make_plan) runs for representative calls on an sm_90
GPU with an sm_90a build, seen through the kernels a call launches (torch.profiler): the decode kernel
for a few query rows per K/V head, mma.sync for tiny problems, the warp-specialized kernel for dense and
varlen one-pass calls at its head dims, the wgmma tile kernel for the rest (paged caches of other page
sizes, softcap, split keys), mma.sync for fp32 paged calls and for tensorcore_sm80; and the split counts
where a kernel's grid shows them (a split is sized and clamped by the chosen kernel's tile)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cutlassfa
from gpu_results import kernel_names

pytestmark = pytest.mark.gpu

WS, SM90, SM80 = "flash_fwd_ws_kernel", "sm90::flash_fwd_kernel", "sm80::flash_fwd_kernel"
DECODE, COMBINE, SPLIT_FP32 = "decode_kernel", "split_combine_kernel", "split_fp32_kernel"
FAMILIES = (WS, SM90, SM80, DECODE)
TC = "tensorcore"


def _cuda(torch, rng, shape, dtype="float16"):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to("cuda", getattr(torch, dtype))


def _family(names):
    """The one attention kernel family among the launched kernels."""
    found = {f for f in FAMILIES for n in names if f in n}
    assert len(found) == 1, names
    return found.pop()


def _grids(torch, call, tmp_path):
    """{kernel name: grid x} of the kernels `call()` launches (the profiler's trace)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return {e["name"]: e.get("args", {}).get("grid", [None])[0] for e in events if e.get("cat") == "kernel"}


def _paged(torch, rng, b, hkv, n, d, page_size):
    """A paged cache of n keys an entry: pages (num_pages, Hkv, page_size, d) and a shuffled block table."""
    per_entry = -(-n // page_size)
    table = rng.permutation(b * per_entry).reshape(b, per_entry).astype(np.int32)
    k, v = (_cuda(torch, rng, (b * per_entry, hkv, page_size, d)) for _ in range(2))
    return k, v, torch.from_numpy(table).cuda(), torch.full((b,), n, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("backend", ["tensorcore", "tensorcore_sm80"])
def test_gqa_decode_runs_the_decode_kernel_split(hopper, rng, backend):
    torch = hopper
    q, (k, v) = _cuda(torch, rng, (1, 32, 1, 128)), (_cuda(torch, rng, (1, 8, 8192, 128)) for _ in range(2))
    names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, backend=backend))
    assert _family(names) == DECODE and any(COMBINE in n for n in names), names
    names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, num_splits=1, backend=backend))
    assert _family(names) == DECODE and not any(COMBINE in n for n in names), names


@pytest.mark.parametrize("shape,expected", [((1, 2, 64, 64), SM80), ((1, 8, 128, 64), SM80),
                                            ((2, 8, 1024, 128), WS), ((1, 4, 300, 256), WS),
                                            ((1, 4, 300, 32), SM80)], ids=str)
def test_dense_calls(hopper, rng, shape, expected):
    """Tiny problems (at most 8 heads x batch, 128 queries and keys) and d <= 32 on mma.sync; dense calls
    of the warp-specialized kernel's head dims on it, in one pass."""
    torch = hopper
    q, k, v = (_cuda(torch, rng, shape) for _ in range(3))
    names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, causal=True, backend=TC))
    assert _family(names) == expected and not any(COMBINE in n for n in names), names


def test_calls_the_warp_specialized_kernel_does_not_cover_run_on_wgmma(hopper, rng):
    torch = hopper
    q, k, v = (_cuda(torch, rng, (2, 8, 512, 192)) for _ in range(3))  # no scored instantiation at d = 192
    names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, softcap=30.0, backend=TC))
    assert _family(names) == SM90, names
    q, k, v = (_cuda(torch, rng, (2, 8, 512, 128)) for _ in range(3))
    names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, num_splits=3, backend=TC))  # split keys
    assert _family(names) == SM90 and any(COMBINE in n for n in names), names


def test_softcap_or_alibi_run_the_warp_specialized_kernel(hopper, rng):
    """Its instantiation of that term, in one pass; both in one call on the wgmma kernel (the values:
    tests/test_alibi.py and the variant tests)."""
    torch = hopper
    q, k, v = (_cuda(torch, rng, (2, 8, 512, 128)) for _ in range(3))
    slopes = torch.full((8,), 0.125, device="cuda", dtype=torch.float32)
    for terms, expected in (({"softcap": 30.0}, WS), ({"alibi_slopes": slopes}, WS),
                            ({"softcap": 30.0, "alibi_slopes": slopes}, SM90)):
        names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, causal=True, backend=TC, **terms))
        assert _family(names) == expected and not any(COMBINE in n for n in names), (terms, names)


def test_plain_call_of_one_query_tile_splits(hopper, rng):
    """kDefaultSplits: at most 64 fp16 queries split as num_splits=None would (here on the wgmma kernel,
    the warp-specialized one runs one pass); 65 run in one pass."""
    torch = hopper
    k, v = (_cuda(torch, rng, (1, 8, 16384, 128)) for _ in range(2))
    for nq, expected, split in ((64, SM90, True), (65, WS, False)):
        q = _cuda(torch, rng, (1, 8, nq, 128))
        names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, backend=TC))
        assert _family(names) == expected and any(COMBINE in n for n in names) == split, (nq, names)


@pytest.mark.parametrize("page_size,nq,expected", [(16, 1, DECODE), (16, 16, DECODE), (7, 1, SM90), (16, 17, SM90),
                                                    (16, 40, SM90)], ids=str)
def test_paged_calls(hopper, rng, page_size, nq, expected):
    """Power-of-two pages and at most 32 query rows a K/V head, or 128 of at most 16 queries (here 4 query
    heads a K/V head): the decode kernel; other page sizes, 17 queries (68 rows) or more rows: the wgmma
    kernel's general instantiation."""
    torch = hopper
    k, v, table, lens = _paged(torch, rng, 2, 2, 600, 128, page_size)
    q = _cuda(torch, rng, (2, 8, nq, 128))
    names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, cache_seqlens=lens, block_table=table,
                                                          causal=True, num_splits=1, backend=TC))
    assert _family(names) == expected, names


@pytest.mark.parametrize("d,expected", [(128, WS), (96, SM90)])
def test_varlen_calls(hopper, rng, d, expected):
    """Varlen batches at the warp-specialized kernel's varlen head dims (64, 128) run on it, others on wgmma."""
    torch = hopper
    cu = torch.tensor([0, 300, 300, 1000], dtype=torch.int32, device="cuda")
    q, k, v = (_cuda(torch, rng, (1000, 4, d)) for _ in range(3))
    names = kernel_names(torch, lambda: cutlassfa.varlen_forward(q, k, v, cu, cu, max_seqlen_q=700,
                                                                 max_seqlen_k=700, causal=True, backend=TC))
    assert _family(names) == expected, names


@pytest.mark.parametrize("d,paged,expected", [(64, False, WS), (96, False, SM90), (64, True, SM80)], ids=str)
def test_fp32_calls(hopper, rng, d, paged, expected):
    """fp32: the warp-specialized kernel at its fp32 head dims (64, 128), the wgmma kernel at its other
    listed ones (both after the split pre-pass), mma.sync for paged caches (it splits in its kernel)."""
    torch = hopper
    q = _cuda(torch, rng, (1, 4, 200, d), "float32")
    if paged:
        k, v, table, lens = _paged(torch, rng, 1, 4, 600, d, 16)
        k, v = k.float(), v.float()
        call = lambda: cutlassfa.forward(q, k, v, cache_seqlens=lens, block_table=table, backend=TC)  # noqa: E731
    else:
        k, v = (_cuda(torch, rng, (1, 4, 600, d), "float32") for _ in range(2))
        call = lambda: cutlassfa.forward(q, k, v, backend=TC)  # noqa: E731
    names = kernel_names(torch, call)
    assert _family(names) == expected and not any(COMBINE in n for n in names), names
    assert any(SPLIT_FP32 in n for n in names) == (expected != SM80), names


def test_tensorcore_sm80_runs_mma_sync(hopper, rng):
    torch = hopper
    q, k, v = (_cuda(torch, rng, (2, 8, 1024, 128)) for _ in range(3))
    names = kernel_names(torch, lambda: cutlassfa.forward(q, k, v, backend="tensorcore_sm80"))
    assert _family(names) == SM80, names


@pytest.mark.parametrize("d,keys_a_step", [(64, 128), (128, 64)])
def test_decode_splits_are_clamped_to_its_key_steps(hopper, rng, d, keys_a_step, tmp_path):
    """A num_splits past the key steps of the chosen kernel runs one split per step (the decode kernel:
    4 warps x 2048 / d keys): grid = batch x K/V heads x splits."""
    torch = hopper
    q, (k, v) = _cuda(torch, rng, (2, 8, 1, d)), (_cuda(torch, rng, (2, 2, 640, d)) for _ in range(2))
    grids = _grids(torch, lambda: cutlassfa.forward(q, k, v, num_splits=1000, backend=TC), tmp_path)
    decode = [g for name, g in grids.items() if DECODE in name]
    assert decode == [2 * 2 * 640 // keys_a_step], grids


@pytest.mark.parametrize("d,block_n", [(128, 128), (256, 64)])
def test_tile_splits_are_clamped_to_the_chosen_tile(hopper, rng, d, block_n, tmp_path):
    """The same on the wgmma kernel, whose tile is 64 x 128 at d = 128 and 64 x 64 at d = 256: grid =
    query tiles x heads x batch x splits."""
    torch = hopper
    q, k, v = (_cuda(torch, rng, (1, 2, 64, d)), *(_cuda(torch, rng, (1, 2, 640, d)) for _ in range(2)))
    grids = _grids(torch, lambda: cutlassfa.forward(q, k, v, num_splits=1000, backend=TC), tmp_path)
    tiles = [g for name, g in grids.items() if SM90 in name]
    assert tiles == [2 * 640 // block_n], grids
