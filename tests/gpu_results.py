"""Checking a GPU backend's output and lse (PyTorch CUDA tensors) against the float64 reference, within
that backend's bounds (cutlassfa.check.bound_for), and which kernels a call launched: shared by the GPU
tests."""

from __future__ import annotations

import numpy as np

from cutlassfa.check import bound_for
from cutlassfa.reference import rel_l2


def host64(x) -> np.ndarray:
    """A PyTorch tensor as a float64 numpy array."""
    return x.float().cpu().numpy().astype(np.float64)


def assert_matches_reference(backend: str, dtype: str, out, lse, ref: np.ndarray, ref_lse: np.ndarray) -> None:
    """out within the backend's rel-L2 bound and finite; rows that see no key: O = 0 and lse = -inf,
    exactly where the reference says so; every other lse within the lse bound."""
    out, lse = host64(out), host64(lse)
    bound = bound_for(backend, dtype)
    assert np.isfinite(out).all()
    assert rel_l2(out, ref) <= bound.rel_l2
    seen = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isneginf(lse), ~seen)
    assert (out[~seen] == 0).all()
    assert np.abs(lse[seen] - ref_lse[seen]).max(initial=0) <= bound.lse


def kernel_names(torch, call) -> list[str]:
    """The names of the CUDA kernels `call()` launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def assert_close_on_host(backend: str, dtype: str, out, lse, ref: np.ndarray, ref_lse: np.ndarray) -> None:
    """As assert_matches_reference, for host arrays of any layout (out and lse as the reference's)."""
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    bound = bound_for(backend, dtype)
    assert np.isfinite(out).all()
    assert rel_l2(out, ref) <= bound.rel_l2, rel_l2(out, ref)
    seen = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isneginf(lse), ~seen)
    assert np.abs(lse[seen] - ref_lse[seen]).max(initial=0) <= bound.lse


def random_qkv(rng: np.random.Generator, b: int, hq: int, hkv: int, nq: int, nk: int, d: int, dtype=np.float16):
    """q (b, hq, nq, d), k and v (b, hkv, nk, d), standard normal in `dtype`."""
    return (rng.standard_normal((b, hq, nq, d)).astype(dtype), rng.standard_normal((b, hkv, nk, d)).astype(dtype),
            rng.standard_normal((b, hkv, nk, d)).astype(dtype))


def to_cuda(torch, x: np.ndarray):
    """A numpy array as a CUDA tensor (integer arrays as int32, the index arrays' dtype)."""
    if x.dtype.kind in "iu":
        return torch.from_numpy(x.astype(np.int32)).cuda()
    return torch.from_numpy(x).cuda()


# Dense shapes of the score-term tests (b, hq, hkv, nq, nk, d, options): the tile kernels (prefill,
# Nq != Nk both ways, GQA, windows with softcap, a zero-padded head dim) and the decode kernel (a few
# queries per K/V head), split or not by the caller.
SCORE_TERM_SHAPES = {
    "prefill-d64-causal-gqa": (2, 8, 2, 300, 520, 64, dict(causal=True)),
    "prefill-d128-full": (1, 4, 4, 200, 130, 128, {}),
    "prefill-d128-window-softcap": (2, 4, 2, 257, 400, 128, dict(window=(100, 3), softcap=20.0)),
    "prefill-d80-padded-nq-gt-nk": (2, 4, 1, 90, 40, 80, dict(causal=True)),
    "decode-d128-gqa": (4, 32, 4, 1, 2000, 128, {}),
    "decode-d64-gqa-4q": (2, 16, 2, 4, 700, 64, dict(causal=True)),
}


def random_cache(rng: np.random.Generator, b: int, hkv: int, capacity: int, d: int, page: int, paged: bool,
                 dtype=np.float16):
    """k and v caches of `capacity` keys an entry, and the block table: (b, hkv, capacity, d) and None, or
    pools of pages (b * capacity / page, hkv, page, d) that a shuffled (b, capacity / page) table names."""
    if not paged:
        k, v = (rng.standard_normal((b, hkv, capacity, d)).astype(dtype) for _ in range(2))
        return k, v, None
    pages = b * capacity // page
    k, v = (rng.standard_normal((pages, hkv, page, d)).astype(dtype) for _ in range(2))
    return k, v, rng.permutation(pages).reshape(b, capacity // page).astype(np.int32)


def check_dense_on_gpu(torch, rng: np.random.Generator, backend: str, shape: str, splits, **term) -> None:
    """One SCORE_TERM_SHAPES case in fp16 with a score term (sinks=..., alibi_slopes=...) on CUDA tensors,
    into a poisoned `out`, against the float64 reference."""
    from cutlassfa import forward
    from cutlassfa.reference import attention_reference

    b, hq, hkv, nq, nk, d, options = SCORE_TERM_SHAPES[shape]
    q, k, v = random_qkv(rng, b, hq, hkv, nq, nk, d, np.float16)
    term = {name: value(rng, b, hq) for name, value in term.items()}  # each term: drawn for the shape
    ref, ref_lse = attention_reference(q, k, v, **term, **options)
    out = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")  # poisoned
    result, lse = forward(*(to_cuda(torch, x) for x in (q, k, v)), out=out, num_splits=splits, backend=backend,
                          return_lse=True, **{name: to_cuda(torch, x) for name, x in term.items()}, **options)
    assert result is out
    assert_matches_reference(backend, "float16", out, lse, ref, ref_lse)
