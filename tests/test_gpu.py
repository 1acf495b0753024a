"""Every GPU backend against the fp64 reference over the test matrix (dtype x head dim x causal x ragged
N x Nq != Nk x GQA), through numpy (host in/out) and through PyTorch / CuPy / JAX device arrays, in
three memory layouts with strided `out=`; the four full HW4 shapes under the HW4 rule. Bounds (rel-L2
and lse) are the gate's table. Skipped, with the reason, where no GPU backend can run (a failure under
CUTLASSFA_REQUIRE_GPU=1)."""

import math

import numpy as np
import pytest

import cutlassfa
from cutlassfa import hw4
from cutlassfa.check import bound_for
from cutlassfa.check.hw4_rule import max_abs_error
from cutlassfa.reference import attention_reference, rel_l2
from gpu_results import kernel_names
from strided_matrix import layout_failures

GPU_BACKENDS = ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"]
_status = cutlassfa.backends()
pytestmark = pytest.mark.gpu


def _need(backend):
    if not _status[backend].available:
        pytest.skip(f"{backend}: {_status[backend].reason}")


def _bound(backend, dtype):
    """The accuracy gate's per-(backend, dtype) rel-L2 bound: one table, cutlassfa.check.bounds."""
    return bound_for(backend, dtype).rel_l2


def _assert_lse(lse, ref_lse, backend, dtype):
    """lse within the gate's bound on rows that see a key; -inf on the others."""
    lse = np.asarray(lse, dtype=np.float64)
    seen = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[seen], ref_lse[seen], rtol=0, atol=bound_for(backend, dtype).lse)
    assert np.all(lse[~seen] == -np.inf)


def _np_dtype(dtype):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _inputs(rng, b, hq, hk, nq, nk, d, dtype, scale=1.0):
    t = _np_dtype(dtype)
    q = (rng.standard_normal((b, hq, nq, d)) * scale).astype(t)
    k = (rng.standard_normal((b, hk, nk, d)) * scale).astype(t)
    v = rng.standard_normal((b, hk, nk, d)).astype(t)
    return q, k, v


SHAPES = [  # (B, Hq, Hkv, Nq, Nk)
    (2, 2, 2, 128, 128),
    (1, 2, 2, 1, 1),
    (2, 3, 3, 77, 77),
    (1, 2, 2, 257, 129),   # Nq > Nk: causal rows with no visible key
    (1, 2, 2, 65, 300),    # Nq < Nk
    (2, 4, 2, 200, 200),   # GQA
    (1, 8, 1, 130, 513),   # MQA
]


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_matrix_host_arrays(rng, backend, dtype, d, causal):
    _need(backend)
    for b, hq, hk, nq, nk in SHAPES:
        q, k, v = _inputs(rng, b, hq, hk, nq, nk, d, dtype)
        out, lse = cutlassfa.forward(q, k, v, causal=causal, backend=backend, return_lse=True)
        ref, ref_lse = attention_reference(q, k, v, causal=causal)
        assert out.dtype == q.dtype and out.shape == q.shape
        err = rel_l2(out.astype(np.float64), ref)
        assert err <= _bound(backend, dtype), (backend, dtype, d, causal, (b, hq, hk, nq, nk), err)
        seen = np.isfinite(ref_lse)
        assert np.all(out.astype(np.float64)[~seen] == 0), "rows that see no key must be 0"
        _assert_lse(lse, ref_lse, backend, dtype)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("d", [32, 64])
def test_hw4_criterion(rng, backend, d):
    """The HW4 rule: fp32 inputs in [-3, 3], every output within 5e-3 of the exact answer."""
    _need(backend)
    q, k, v = (rng.uniform(-3, 3, (4, 1, 1024, d)).astype(np.float32) for _ in range(3))
    out = cutlassfa.forward(q[:, 0], k[:, 0], v[:, 0], backend=backend)
    ref, _ = attention_reference(q[:, 0], k[:, 0], v[:, 0])
    assert np.max(np.abs(out - ref)) <= hw4.MAX_ABS_ERROR


@pytest.mark.exclusive  # naive's 4 x 32768^2 fp32 scores (17 GB) and the fp64 reference: OOM beside other parts
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("shape", hw4.FULL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_hw4_rule_on_the_full_shapes(backend, shape, seed):
    """The four full HW4 shapes, every output within 5e-3 (a single fp16 rounding of q and k in the fp32
    tensor-core path gives 5-6e-3 on the first two: see test_fp32_regression.py). The float64 reference
    of up to 66 M outputs is computed on the GPU with PyTorch."""
    _need(backend)
    torch = _torch()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.rand(shape, generator=gen, device="cuda") * 6 - 3 for _ in range(3))
    out = cutlassfa.forward(q, k, v, backend=backend)
    error = max_abs_error(q, k, v, out)
    print(f"{backend} {shape}: max abs error {error:.3e}")
    assert error <= hw4.MAX_ABS_ERROR, (backend, shape, error)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_large_fp32_inputs_stay_finite(rng, backend):
    _need(backend)
    q, k, v = (rng.uniform(-1e4, 1e4, (1, 2, 70, 64)).astype(np.float32) for _ in range(3))
    out = cutlassfa.forward(q, k, v, backend=backend)
    ref, _ = attention_reference(q, k, v)
    assert np.all(np.isfinite(out))
    assert rel_l2(out, ref) <= 2e-2


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_nan_stays_in_its_row(rng, backend):
    _need(backend)
    q, k, v = _inputs(rng, 1, 1, 1, 64, 64, 64, "float16")
    q[0, 0, 5, 3] = np.nan
    out = cutlassfa.forward(q, k, v, backend=backend)
    assert np.all(np.isnan(out[0, 0, 5]))
    rows = np.delete(out[0, 0].astype(np.float32), 5, axis=0)
    assert np.all(np.isfinite(rows))


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("scale", [1e-8, 1e3])
def test_extreme_scales(rng, backend, scale):
    _need(backend)
    q, k, v = _inputs(rng, 1, 2, 2, 100, 100, 64, "float32")
    out = cutlassfa.forward(q, k, v, backend=backend, softmax_scale=scale)
    ref, _ = attention_reference(q, k, v, softmax_scale=scale)
    # fp32 scores carry an absolute rounding error of about scale * u * sqrt(d) * rms(q) * rms(k) (u = 2^-24,
    # a sum of d products whose errors differ in sign), and the softmax passes a score error at most about
    # twice into the output's relative error. At scale 1e3 that (9.5e-4 here), not the gate's bound, is
    # what fp32 arithmetic promises: exactly rounded sequential fp32 products and sums exceed 1e-4 on
    # about 2% of seeds of this shape (bench/NOTES.md, "fp32 at extreme scales").
    u = 2.0**-24
    score_error = scale * u * np.sqrt(q.shape[-1]) * np.sqrt(np.mean(q**2) * np.mean(k**2))
    assert rel_l2(out, ref) <= max(_bound(backend, "float32") * 10, 2 * score_error)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("trend", ["rising", "falling", "sawtooth"])
def test_row_max_jumping_between_key_tiles(rng, backend, dtype, d, trend):
    """Scores that climb along the keys (falling: along the kernels' high-to-low key order) move the
    running max of every row by far more than 2^8 in P from one key tile to the next, so O and l are
    rescaled at every step; rising and sawtooth keep or move the reference in turn. 1000 keys: 8+ tiles."""
    _need(backend)
    nk = 1000
    t = np.linspace(0.0, 8.0, nk)
    t = {"rising": t, "falling": t[::-1], "sawtooth": (t * 4) % 8.0}[trend]
    # q . k_j = d * t_j (+ noise), so the scores s_j = sqrt(d) t_j span up to ~90 (natural-log units)
    q = 1.0 + 0.1 * rng.standard_normal((1, 2, 130, d))
    k = t[None, None, :, None] + 0.1 * rng.standard_normal((1, 2, nk, d))
    v = rng.standard_normal((1, 2, nk, d))
    q, k, v = (x.astype(_np_dtype(dtype)) for x in (q, k, v))
    out, lse = cutlassfa.forward(q, k, v, backend=backend, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v)
    assert rel_l2(out, ref) <= _bound(backend, dtype)
    _assert_lse(lse, ref_lse, backend, dtype)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_bitwise_deterministic(rng, backend):
    _need(backend)
    q, k, v = _inputs(rng, 2, 4, 2, 300, 300, 64, "float16")
    first = cutlassfa.forward(q, k, v, backend=backend, causal=True)
    for _ in range(3):
        np.testing.assert_array_equal(cutlassfa.forward(q, k, v, backend=backend, causal=True), first)


def test_auto_picks_tensorcore_on_sm80(rng):
    _need("tensorcore")
    q, k, v = _inputs(rng, 1, 1, 1, 8, 8, 64, "float16")
    assert cutlassfa.select_backend(q, k, v) == "tensorcore"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tensorcore_families_agree_on_long_ragged_sequences(rng, dtype, d, causal):
    """`tensorcore` (the wgmma kernel on sm_90) and `tensorcore_sm80` (mma.sync) on many K/V tiles
    with a ragged end and GQA: each within its bound of the reference, and close to each other."""
    _need("tensorcore")
    _need("tensorcore_sm80")
    q, k, v = _inputs(rng, 1, 4, 2, 1000, 1537, d, dtype)
    ref, ref_lse = attention_reference(q, k, v, causal=causal)
    outs = {}
    for backend in ("tensorcore", "tensorcore_sm80"):
        out, lse = cutlassfa.forward(q, k, v, causal=causal, backend=backend, return_lse=True)
        out = out.astype(np.float64)
        assert rel_l2(out, ref) <= _bound(backend, dtype), backend
        _assert_lse(lse, ref_lse, backend, dtype)
        outs[backend] = out
    assert rel_l2(outs["tensorcore"], outs["tensorcore_sm80"]) <= 2 * _bound("tensorcore", dtype)


def test_device_info_names_the_tensorcore_kernel_family():
    _need("tensorcore")
    info = cutlassfa.device_info()
    expected = ("wgmma (sm_90a)" if tuple(info["compute_capability"]) == (9, 0)
                and "90a" in info["wgmma_architectures"] else "mma.sync (sm_80)")
    assert info["tensorcore_kernel"] == expected


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_fp32_runs_on_the_kernel_of_the_half_types(rng, d, causal):
    """Where an fp16 call runs the warp-specialized kernel (sm_90a builds), an fp32 call at d = 64 / 128
    (the default build's CUTLASSFA_SM90WS_FP32_HEAD_DIMS) runs the split pre-pass and that same kernel,
    not the wgmma kernel, and matches the fp64 reference; its O is fp32."""
    _need("tensorcore")
    torch = _torch()
    q, k, v = _inputs(rng, 2, 4, 2, 300, 517, d, "float32")
    half = [torch.from_numpy(x.astype(np.float16)).cuda() for x in (q, k, v)]
    if not any("flash_fwd_ws_kernel" in n for n in kernel_names(torch, lambda: cutlassfa.forward(*half))):
        pytest.skip("machine: the warp-specialized kernel needs an sm_90 GPU and an sm_90a build")
    cq, ck, cv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    names = kernel_names(torch, lambda: cutlassfa.forward(cq, ck, cv, causal=causal, backend="tensorcore"))
    assert any("split_fp32" in n for n in names) and any("flash_fwd_ws_kernel" in n for n in names), names
    assert not any("sm90::flash_fwd_kernel" in n for n in names), names
    out, lse = cutlassfa.forward(cq, ck, cv, causal=causal, backend="tensorcore", return_lse=True)
    assert out.dtype == torch.float32
    ref, ref_lse = attention_reference(q, k, v, causal=causal)
    assert rel_l2(out.cpu().numpy().astype(np.float64), ref) <= _bound("tensorcore", "float32")
    _assert_lse(lse.cpu().numpy(), ref_lse, "tensorcore", "float32")


# ---- device arrays of each framework ------------------------------------------------------------

def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("optional package: this torch has no CUDA")
    return torch


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_layout_matrix_on_device_arrays(rng, backend, dtype):
    """q, k, v and out as CUDA tensors in three layouts (compact BHND, BNHD transposed view, padded
    window with NaN around it) x head dim x causal x ragged N x GQA: the kernels read and write through
    the strides (host arrays are compacted before launch, so only device arrays test this)."""
    _need(backend)
    _torch()

    def forward(q, k, v, **kwargs):
        return cutlassfa.forward(q, k, v, backend=backend, **kwargs)

    runs, failures = layout_failures(forward, "torch", backend, rng, dtypes=[dtype], head_dims=[32, 64, 128])
    assert runs == 3 * 2 * 4 * 3
    assert not failures, failures


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_layout_matrix_on_cupy_arrays(rng, backend):
    _need(backend)
    pytest.importorskip("cupy")
    runs, failures = layout_failures(lambda q, k, v, **kw: cutlassfa.forward(q, k, v, backend=backend, **kw),
                                     "cupy", backend, rng, dtypes=["float32", "float16"], head_dims=[64])
    assert runs and not failures, failures


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_torch_bnhd_view_zero_copy(rng, backend, dtype):
    """A (B, N, H, d) torch tensor transposed to (B, H, N, d), on torch's current stream."""
    _need(backend)
    torch = _torch()
    tdtype = getattr(torch, dtype)
    q = torch.randn(2, 130, 8, 64, device="cuda", dtype=tdtype).transpose(1, 2)
    k = torch.randn(2, 200, 2, 64, device="cuda", dtype=tdtype).transpose(1, 2)
    v = torch.randn(2, 200, 2, 64, device="cuda", dtype=tdtype).transpose(1, 2)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out, lse = cutlassfa.forward(q, k, v, causal=True, backend=backend, return_lse=True)
    stream.synchronize()
    assert isinstance(out, torch.Tensor) and out.device == q.device and out.dtype == q.dtype
    ref, ref_lse = attention_reference(*(t.float().cpu().numpy() for t in (q, k, v)), causal=True)
    assert rel_l2(out.float().cpu().numpy(), ref) <= _bound(backend, dtype)
    _assert_lse(lse.cpu().numpy(), ref_lse, backend, dtype)


def test_torch_out_and_misaligned_view_fall_back(rng):
    _need("small_tile")
    torch = _torch()
    storage = torch.randn(1, 2, 100, 64 + 1, device="cuda", dtype=torch.float16)
    q = storage[..., 1:]  # 2-byte offset, odd row stride: not 16-byte aligned
    assert cutlassfa.select_backend(q, q, q) != "tensorcore"
    out = torch.full_like(q.contiguous(), float("nan"))
    result = cutlassfa.forward(q, q, q, out=out)
    assert result is out
    ref, _ = attention_reference(*(q.float().cpu().numpy(),) * 3)
    assert rel_l2(out.float().cpu().numpy(), ref) <= _bound(cutlassfa.select_backend(q, q, q), "float16")


def test_cupy_arrays(rng):
    _need("small_tile")
    cupy = pytest.importorskip("cupy")
    q, k, v = _inputs(rng, 2, 2, 2, 99, 99, 64, "float16")
    cq, ck, cv = cupy.asarray(q), cupy.asarray(k), cupy.asarray(v)
    out = cutlassfa.forward(cq, ck, cv, causal=True)
    assert isinstance(out, cupy.ndarray)
    ref, _ = attention_reference(q, k, v, causal=True)
    assert rel_l2(cupy.asnumpy(out).astype(np.float64), ref) <= _bound(cutlassfa.select_backend(cq, ck, cv), "float16")


def test_jax_arrays(rng):
    _need("small_tile")
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("optional package: this jax has no GPU support")
    q, k, v = _inputs(rng, 2, 2, 2, 99, 99, 64, "float32")
    jq, jk, jv = (jax.device_put(a, gpus[0]) for a in (q, k, v))
    backend = cutlassfa.select_backend(jq, jk, jv)
    out, lse = cutlassfa.forward(jq, jk, jv, return_lse=True)
    assert isinstance(out, jax.Array)
    ref, ref_lse = attention_reference(q, k, v)
    assert rel_l2(np.asarray(out), ref) <= _bound(backend, "float32")
    _assert_lse(np.asarray(lse), ref_lse, backend, "float32")


def test_memory_error_is_an_exception_and_gpu_stays_usable(rng):
    _need("small_tile")
    from cutlassfa import _C

    free, total = _C.memory_info(0)
    with pytest.raises(MemoryError, match="bytes"):
        _C.DeviceBuffer(total * 4, 0)
    q, k, v = _inputs(rng, 1, 1, 1, 64, 64, 64, "float32")
    ref, _ = attention_reference(q, k, v)
    assert rel_l2(cutlassfa.forward(q, k, v), ref) <= _bound(cutlassfa.select_backend(q, k, v), "float32")


def test_naive_workspace_beyond_memory_is_a_memory_error(rng):
    """naive materializes B*H*Nq*Nk floats: 1 TiB here. The failure is a Python exception and the GPU
    stays usable."""
    _need("naive")
    torch = _torch()
    q = torch.randn(1, 64, 65536, 32, device="cuda", dtype=torch.float16)
    with pytest.raises(MemoryError, match="out of memory"):
        cutlassfa.forward(q, q, q, backend="naive")
    small = q[:, :2, :100]
    ref, _ = attention_reference(*(small.float().cpu().numpy(),) * 3)
    out = cutlassfa.forward(small, small, small, backend="naive")
    assert rel_l2(out.float().cpu().numpy(), ref) <= _bound("naive", "float16")


def test_mixed_host_and_device_inputs_are_refused(rng):
    _need("small_tile")
    torch = _torch()
    q = torch.randn(1, 2, 50, 64, device="cuda")
    with pytest.raises(ValueError, match="same device"):
        cutlassfa.forward(q, q.cpu().numpy(), q)
    with pytest.raises(TypeError, match="out must be a torch array"):
        cutlassfa.forward(q, q, q, out=np.zeros((1, 2, 50, 64), np.float32))
    with pytest.raises(TypeError, match="out must have dtype"):
        cutlassfa.forward(q, q, q, out=torch.zeros(1, 2, 50, 64, device="cuda", dtype=torch.float16))


@pytest.mark.parametrize("shape", [(0, 2, 5, 64), (2, 0, 5, 64), (2, 2, 0, 64)])
def test_empty_device_problems(shape):
    _need("small_tile")
    torch = _torch()
    q = torch.randn(*shape, device="cuda", dtype=torch.float16)
    k = torch.randn(shape[0], shape[1], 7, 64, device="cuda", dtype=torch.float16)
    out, lse = cutlassfa.forward(q, k, k, return_lse=True)
    assert out.shape == shape and lse.shape == shape[:-1] and out.device == q.device


def test_device_problem_without_keys(rng):
    _need("small_tile")
    torch = _torch()
    q = torch.randn(2, 2, 5, 64, device="cuda")
    k = torch.zeros(2, 2, 0, 64, device="cuda")
    out, lse = cutlassfa.forward(q, k, k, return_lse=True)
    assert bool((out == 0).all()) and bool((lse == -math.inf).all())
