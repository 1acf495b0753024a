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
