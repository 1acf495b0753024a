"""Property tests (hypothesis): random shapes, memory layouts (compact, transposed view, padded window),
dtypes, causal, GQA and scales. The `cpu` backend runs in CI on numpy arrays; the GPU backends where a
GPU is present, on CUDA tensors when PyTorch is there (numpy inputs are compacted before launch, so only
device arrays put the layouts in front of the kernels), else on numpy arrays."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutlassfa
from cutlassfa._inputs import LAYOUTS, as_layout, gpu_framework, round_to, to_numpy64
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, rel_l2

ml_dtypes = pytest.importorskip("ml_dtypes")
DTYPES = ("float32", "float16", "bfloat16")


@st.composite
def problems(draw):
    b = draw(st.integers(1, 2))
    hk = draw(st.integers(1, 3))
    hq = hk * draw(st.integers(1, 3))
    nq = draw(st.integers(1, 150))
    nk = draw(st.integers(1, 150))
    d = draw(st.sampled_from([32, 64, 128]))
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(LAYOUTS))
    causal = draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.01, 0.5, 2.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    return b, hq, hk, nq, nk, d, dtype, layout, causal, scale, seed


def _check(backend, problem, framework="numpy"):
    b, hq, hk, nq, nk, d, dtype, layout, causal, scale, seed = problem
    rng = np.random.default_rng(seed)
    values = [round_to(rng.standard_normal(shape), dtype)
              for shape in ((b, hq, nq, d), (b, hk, nk, d), (b, hk, nk, d))]
    q, k, v = (as_layout(x, dtype, framework, layout)[0] for x in values)
    out = cutlassfa.forward(q, k, v, causal=causal, softmax_scale=scale, backend=backend)
    ref, lse = attention_reference(*values, causal=causal, softmax_scale=scale)
    assert tuple(out.shape) == tuple(q.shape) and out.dtype == q.dtype
    got = to_numpy64(out)
    assert rel_l2(got, ref) <= bound_for(backend, dtype).rel_l2
    assert np.all(got[~np.isfinite(lse)] == 0)


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

    framework = gpu_framework()  # torch CUDA tensors when PyTorch is there

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problems())
    def run(problem):
        _check(backend, problem, framework)

    run()
