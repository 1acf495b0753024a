"""Property tests (hypothesis): random shapes, strides (transposed and sliced views), dtypes, causal,
GQA and scales. The `cpu` backend runs in CI; the GPU backends where a GPU is present."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, rel_l2

ml_dtypes = pytest.importorskip("ml_dtypes")
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@st.composite
def problems(draw):
    b = draw(st.integers(1, 2))
    hk = draw(st.integers(1, 3))
    hq = hk * draw(st.integers(1, 3))
    nq = draw(st.integers(1, 150))
    nk = draw(st.integers(1, 150))
    d = draw(st.sampled_from([32, 64, 128]))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    layout = draw(st.sampled_from(["bhnd", "bnhd", "sliced"]))
    causal = draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.01, 0.5, 2.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    return b, hq, hk, nq, nk, d, dtype, layout, causal, scale, seed


def _make(rng, b, h, n, d, dtype, layout):
    """A (b, h, n, d) array in one of three memory layouts, all with a contiguous last dim."""
    t = DTYPES[dtype]
    if layout == "bnhd":
        return rng.standard_normal((b, n, h, d)).astype(t).transpose(0, 2, 1, 3)
    if layout == "sliced":  # every other row of a longer sequence, inside a wider head
        return rng.standard_normal((b, h, 2 * n, d + 32)).astype(t)[:, :, ::2, 16:16 + d]
    return rng.standard_normal((b, h, n, d)).astype(t)


def _check(backend, problem):
    b, hq, hk, nq, nk, d, dtype, layout, causal, scale, seed = problem
    rng = np.random.default_rng(seed)
    q = _make(rng, b, hq, nq, d, dtype, layout)
    k = _make(rng, b, hk, nk, d, dtype, layout)
    v = _make(rng, b, hk, nk, d, dtype, layout)
    out = cutlassfa.forward(q, k, v, causal=causal, softmax_scale=scale, backend=backend)
    ref, lse = attention_reference(q, k, v, causal=causal, softmax_scale=scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_l2(out.astype(np.float64), ref) <= bound_for(backend, dtype).rel_l2
    assert np.all(out.astype(np.float64)[~np.isfinite(lse)] == 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_cpu_backend_properties(problem):
    _check("cpu", problem)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"])
def test_gpu_backend_properties(backend):
    status = cutlassfa.backends()[backend]
    if not status.available:
        pytest.skip(f"{backend}: {status.reason}")

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problems())
    def run(problem):
        _check(backend, problem)

    run()
