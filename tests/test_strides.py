"""The layout matrix (tests/strided_matrix.py, which the GPU tests run on device arrays) catches a kernel
that ignores strides: emulated on the CPU by a backend that reads each input's buffer as if it were
compact and writes `out` the same way, as a kernel indexing with b*H*N*d + h*N*d + i*d would. The real
cpu backend passes the same matrix, and the layouts are what they claim to be."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa._inputs import LAYOUTS, as_layout, strided
from strided_matrix import SHAPES, layout_failures


def _compact_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _as_if_compact(x: np.ndarray, writeable: bool = False) -> np.ndarray:
    """The elements a stride-blind kernel would address: `x.size` elements from x's first element."""
    return np.lib.stride_tricks.as_strided(x, x.shape, _compact_strides(x.shape, x.itemsize), writeable=writeable)


def stride_blind(q, k, v, *, causal, out, return_lse):
    q, k, v = (np.array(_as_if_compact(x)) for x in (q, k, v))
    result, lse = cutlassfa.forward(q, k, v, causal=causal, backend="cpu", return_lse=True)
    _as_if_compact(out, writeable=True)[...] = result
    return out, lse


def real_cpu(q, k, v, *, causal, out, return_lse):
    return cutlassfa.forward(q, k, v, causal=causal, out=out, return_lse=return_lse, backend="cpu")


def test_cpu_backend_passes_the_layout_matrix(rng):
    runs, failures = layout_failures(real_cpu, "numpy", "cpu", rng, dtypes=["float32", "float16", "bfloat16"],
                                     head_dims=[32, 64])
    assert runs == 3 * 2 * 2 * 4 * len(LAYOUTS)
    assert not failures, failures


def test_layout_matrix_catches_a_kernel_that_ignores_strides(rng):
    runs, failures = layout_failures(stride_blind, "numpy", "cpu", rng, dtypes=["float32", "float16"],
                                     head_dims=[32])
    assert not any(" bhnd:" in f for f in failures), "compact arrays are read correctly even stride-blind"
    # Every padded run fails; every transposed one too, except where a transposed view is compact in
    # memory (one row or one head: (B, 1, H, d) and (B, H, 1, d) hold the same bytes).
    transposed_differs = sum((hq > 1 and nq > 1) or (hk > 1 and nk > 1) for _, hq, hk, nq, nk in SHAPES)
    per_shape_runs = runs // len(SHAPES) // len(LAYOUTS)
    assert sum(" padded:" in f for f in failures) == per_shape_runs * len(SHAPES), failures
    assert sum(" bnhd:" in f for f in failures) == per_shape_runs * transposed_differs, failures


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_keep_values_and_are_what_they_say(layout, rng):
    x = rng.standard_normal((2, 3, 5, 32)).astype(np.float32)
    view, storage = strided(x, layout)
    np.testing.assert_array_equal(view, x)
    assert view.strides[-1] == x.itemsize
    if layout == "bhnd":
        assert view.flags.c_contiguous
    elif layout == "bnhd":
        assert view.strides[1] == 32 * 4 and view.strides[2] == 3 * 32 * 4
    else:
        assert not view.flags.c_contiguous and np.isnan(storage).sum() == storage.size - view.size
        offset = view.__array_interface__["data"][0] - storage.__array_interface__["data"][0]
        assert offset > 0 and offset % 16 == 0 and all(s % 16 == 0 for s in view.strides[:-1])


def test_as_layout_rounds_to_the_dtype(bf16, rng):
    x = rng.standard_normal((1, 2, 3, 32)).astype(np.float32)
    view, _ = as_layout(x, "bfloat16", "numpy", "padded")
    assert view.dtype == bf16
    np.testing.assert_array_equal(view.astype(np.float32), x.astype(bf16).astype(np.float32))
