"""The debug switch `cutlassfa.check_device_values` (CUTLASSFA_CHECK_DEVICE_VALUES=1): device index
arrays are read back once and checked as host values are, with the same ValueError; off (the default)
their values are never read and the kernels clamp them. The GPU tests skip cleanly without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa.reference import kvcache_reference, rel_l2

needs_extension = pytest.mark.skipif(cutlassfa._api._C is None,
                                     reason="optional package: the cutlassfa extension is not built")


@pytest.fixture
def checking():
    """The switch on for one test, restored after."""
    previous = cutlassfa.check_device_values(True)
    yield
    cutlassfa.check_device_values(previous)


@needs_extension
def test_switch_is_off_by_default_and_returns_the_previous_setting():
    assert cutlassfa.check_device_values(True) is False
    assert cutlassfa.check_device_values(False) is True
    with pytest.raises(TypeError, match="enabled"):
        cutlassfa.check_device_values("yes")


@needs_extension
def test_host_values_are_checked_either_way(rng, checking):
    q = rng.standard_normal((2, 2, 1, 32)).astype(np.float32)
    k = rng.standard_normal((2, 2, 16, 32)).astype(np.float32)
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 17 exceeds the cache length 16"):
        cutlassfa.forward(q, k, k, cache_seqlens=[3, 17])
    out = cutlassfa.forward(q, k, k, cache_seqlens=[3, 16])
    ref, _ = kvcache_reference(q, k, k, cache_seqlens=[3, 16])
    assert rel_l2(out, ref) <= 1e-3


def _kv(torch, rng, pages=None):
    q = torch.from_numpy(rng.standard_normal((2, 4, 1, 64)).astype(np.float16)).cuda()
    shape = (2, 2, 32, 64) if pages is None else (pages, 2, 16, 64)
    k = torch.from_numpy(rng.standard_normal(shape).astype(np.float16)).cuda()
    return q, k


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["tensorcore", "small_tile"])
def test_bad_device_values_raise_only_when_checked(torch, rng, need_backend, backend):
    need_backend(backend)
    q, k = _kv(torch, rng)
    lengths = torch.tensor([5, 40], dtype=torch.int32, device="cuda")  # 40 > the 32 keys an entry holds
    out = cutlassfa.forward(q, k, k, cache_seqlens=lengths, backend=backend)  # unchecked: clamped to 32
    torch.cuda.synchronize()
    ref, _ = kvcache_reference(*(x.cpu().numpy() for x in (q, k, k)), cache_seqlens=[5, 32])
    assert rel_l2(out.float().cpu().numpy(), ref) <= 1e-2
    previous = cutlassfa.check_device_values(True)
    try:
        with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 40 exceeds the cache length 32"):
            cutlassfa.forward(q, k, k, cache_seqlens=lengths, backend=backend)
        leftpad = torch.tensor([0, 9], dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match=r"cache_leftpad\[1\] = 9 is outside"):
            cutlassfa.forward(q, k, k, cache_seqlens=torch.tensor([5, 8], dtype=torch.int32, device="cuda"),
                              cache_leftpad=leftpad, backend=backend)
        # Paged: a page index past the pool in a slot the keys use.
        q, pool = _kv(torch, rng, pages=4)
        table = torch.tensor([[0, 1], [2, 7]], dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match=r"block_table\[1\] holds page indices outside \[0, 4\)"):
            cutlassfa.forward(q, pool, pool, block_table=table,
                              cache_seqlens=torch.tensor([20, 20], dtype=torch.int32, device="cuda"), backend=backend)
        # Good device values still run, and give the reference.
        good = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
        out = cutlassfa.forward(q, pool, pool, block_table=good,
                                cache_seqlens=torch.tensor([20, 17], dtype=torch.int32, device="cuda"), backend=backend)
        ref, _ = kvcache_reference(*(x.cpu().numpy() for x in (q, pool, pool)), block_table=good.cpu().numpy(),
                                   cache_seqlens=[20, 17])
        assert rel_l2(out.float().cpu().numpy(), ref) <= 1e-2
        # Varlen: cu_seqlens that do not start at 0.
        x = torch.from_numpy(rng.standard_normal((9, 2, 64)).astype(np.float16)).cuda()
        cu = torch.tensor([1, 4, 9], dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
            cutlassfa.varlen_forward(x, x, x, cu, torch.tensor([0, 4, 9], dtype=torch.int32, device="cuda"),
                                     backend=backend)
    finally:
        cutlassfa.check_device_values(previous)
