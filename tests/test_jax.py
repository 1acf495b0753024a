"""cutlassfa on JAX arrays: eager = jax.jit = jax.vmap against the fp64 reference, jax.grad refused,
validation at trace time, the CUDA lowering (an XLA FFI custom call, checked by exporting for CUDA on
any machine), the FFI handler itself run on XLA's CPU platform, and under the `gpu` marker the same on a
GPU with no host synchronisation inside jit."""

import functools
import time
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import cutlassfa  # noqa: E402
from cutlassfa.check import bound_for  # noqa: E402
from cutlassfa.integrations import jax as cutlassfa_jax  # noqa: E402
from cutlassfa.reference import attention_reference, rel_l2  # noqa: E402

_DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}
_ROOT = Path(__file__).resolve().parents[1]


def _qkv(rng, b, hq, hk, nq, nk, d, dtype="float32", device=None):
    """Standard-normal q, k, v on `device` (default: JAX's CPU, also on a machine with a GPU)."""
    device = device or jax.devices("cpu")[0]

    def array(shape):
        return jax.device_put(jnp.asarray(rng.standard_normal(shape), _DTYPES[dtype]), device)

    return array((b, hq, nq, d)), array((b, hk, nk, d)), array((b, hk, nk, d))


def _expect_close(out, lse, q, k, v, causal, backend, dtype, scale=None):
    host = [np.asarray(x, np.float32) for x in (q, k, v)]
    ref, lse_ref = attention_reference(*host, causal=causal, softmax_scale=scale)
    bound = bound_for(backend, dtype)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_l2(np.asarray(out, np.float32), ref) <= bound.rel_l2
    if lse is not None:
        assert lse.dtype == jnp.float32 and lse.shape == q.shape[:-1]
        seen = np.isfinite(lse_ref)
        assert np.all(np.asarray(lse)[~seen] == -np.inf)
        assert np.max(np.abs(np.asarray(lse)[seen] - lse_ref[seen]), initial=0.0) <= bound.lse


# --------------------------------------------------------------------------------------------------
# CPU: eager, jit, vmap
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_eager_and_jit_match_reference(rng, dtype, causal):
    q, k, v = _qkv(rng, 2, 4, 2, 37, 50, 64, dtype)  # GQA, Nq != Nk
    eager, lse = cutlassfa_jax.forward(q, k, v, causal=causal, return_lse=True)
    jitted, jitted_lse = jax.jit(functools.partial(cutlassfa_jax.forward, causal=causal, return_lse=True))(q, k, v)
    _expect_close(eager, lse, q, k, v, causal, "cpu", dtype)
    assert np.array_equal(np.asarray(eager), np.asarray(jitted))
    assert np.array_equal(np.asarray(lse), np.asarray(jitted_lse))


def test_three_dim_inputs_and_scale(rng):
    q, k, v = (x[:, 0] for x in _qkv(rng, 3, 1, 1, 20, 31, 32))
    out, lse = jax.jit(lambda q, k, v: cutlassfa_jax.forward(q, k, v, softmax_scale=0.2, return_lse=True))(q, k, v)
    _expect_close(out, lse, q, k, v, False, "cpu", "float32", scale=0.2)


def test_vmap_over_a_leading_axis(rng):
    q, k, v = _qkv(rng, 2, 4, 2, 17, 23, 32)
    qs = jnp.stack([q, 2 * q, -q])
    mapped = jax.vmap(lambda q: cutlassfa_jax.forward(q, k, v, causal=True))(qs)  # k, v not mapped
    for i in range(3):
        _expect_close(mapped[i], None, qs[i], k, v, True, "cpu", "float32")
    ks, vs = jnp.stack([k, k[::-1]]), jnp.stack([v, 0.5 * v])
    inner = jax.vmap(cutlassfa_jax.forward, in_axes=(0, None, None))  # over q
    nested = jax.jit(jax.vmap(inner, in_axes=(None, 0, 0)))(qs, ks, vs)  # over k and v
    assert nested.shape == (2, 3) + q.shape
    for i in range(2):
        for j in range(3):
            _expect_close(nested[i, j], None, qs[j], ks[i], vs[i], False, "cpu", "float32")


def test_vmap_of_jit_equals_eager(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 9, 9, 64, "bfloat16")
    qs, ks, vs = (jnp.stack([x, x * 0.5]) for x in (q, k, v))
    mapped = jax.vmap(jax.jit(cutlassfa_jax.forward))(qs, ks, vs)
    for i in range(2):
        assert np.array_equal(np.asarray(mapped[i]), np.asarray(cutlassfa_jax.forward(qs[i], ks[i], vs[i])))


def test_grad_raises_clear_error(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 8, 8, 32)
    with pytest.raises(NotImplementedError, match="has no backward pass"):
        jax.grad(lambda q: cutlassfa_jax.forward(q, k, v).sum())(q)
    with pytest.raises(NotImplementedError, match="has no backward pass"):
        jax.jvp(lambda v: cutlassfa_jax.forward(q, k, v), (v,), (v,))
    # Not differentiated through the attention (stop_gradient): fine.
    grad = jax.grad(lambda x: (x * jax.lax.stop_gradient(cutlassfa_jax.forward(q, k, v))).sum())(q)
    assert np.array_equal(np.asarray(grad), np.asarray(cutlassfa_jax.forward(q, k, v)))


def test_empty_problems(rng):
    q, k, v = _qkv(rng, 2, 2, 2, 5, 0, 32)
    out, lse = jax.jit(lambda q, k, v: cutlassfa_jax.forward(q, k, v, return_lse=True))(q, k, v)
    assert np.all(np.asarray(out) == 0) and np.all(np.asarray(lse) == -np.inf)
    q, k, v = _qkv(rng, 0, 2, 2, 5, 7, 32)
    assert cutlassfa_jax.forward(q, k, v).shape == (0, 2, 5, 32)


def test_invalid_arguments_refused_at_trace_time(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 8, 8, 32)
    traced = jax.jit(lambda q, k, v: cutlassfa_jax.forward(q, k, v))
    with pytest.raises(ValueError, match="head dim"):
        traced(q, k[..., :16], v[..., :16])
    with pytest.raises(ValueError, match="multiple"):
        traced(q[:, :1].repeat(3, axis=1), k, v)
    with pytest.raises(TypeError, match="out is not supported"):
        cutlassfa_jax.forward(q, k, v, out=q)
    with pytest.raises(TypeError, match="unexpected keyword argument 'not_an_option'"):
        cutlassfa_jax.forward(q, k, v, not_an_option=1)
    with pytest.raises(ValueError, match="unknown backend"):
        cutlassfa_jax.forward(q, k, v, backend="nope")


def test_cutlassfa_forward_routes_jax_arrays(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 8, 8, 32)
    try:
        jax.jit(cutlassfa.forward)(q, k, v)
    except (TypeError, RuntimeError) as error:
        pytest.skip(f"cutlassfa.forward does not hand JAX arrays to integrations.jax yet ({error})")
    out = jax.jit(functools.partial(cutlassfa.forward, causal=True))(q, k, v)
    assert np.array_equal(np.asarray(out), np.asarray(cutlassfa_jax.forward(q, k, v, causal=True)))


# --------------------------------------------------------------------------------------------------
# The CUDA lowering and the FFI handler, on any machine
# --------------------------------------------------------------------------------------------------

def _export_for_cuda(fn, *shapes):
    no_guarantee = [jax.export.DisabledSafetyCheck.custom_call(cutlassfa_jax.FFI_TARGET)]
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16) for shape in shapes]
    return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=no_guarantee)(*args).mlir_module()


def test_cuda_lowering_is_one_ffi_custom_call():
    call = cutlassfa_jax._Call(True, 0.125, "cpu", "tensorcore", 3)
    text = _export_for_cuda(lambda q, k, v: cutlassfa_jax._attention_impl(call, q, k, v),
                            (2, 4, 33, 64), (2, 2, 50, 64), (2, 2, 50, 64))
    lines = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert len(lines) == 1 and "@cutlassfa_forward(" in lines[0]
    for attribute in ("backend = 3 : i32", "causal = true", "softmax_scale = 1.250000e-01 : f64"):
        assert attribute in lines[0]
    assert "(tensor<2x4x33x64xbf16>, tensor<2x4x33xf32>)" in lines[0]  # out, lse
    assert "callback" not in text


def test_cuda_lowering_under_vmap_folds_into_the_batch():
    call = cutlassfa_jax._Call(False, 0.5, "cpu", "small_tile", 1)
    mapped = jax.vmap(lambda q, k, v: cutlassfa_jax._attention_impl(call, q, k, v), in_axes=(0, None, None))
    text = _export_for_cuda(mapped, (3, 2, 4, 33, 64), (2, 2, 50, 64), (2, 2, 50, 64))
    line = next(line for line in text.splitlines() if "stablehlo.custom_call" in line)
    assert "(tensor<3x2x4x33x64xbf16>, tensor<3x2x2x50x64xbf16>, tensor<3x2x2x50x64xbf16>)" in line


def test_ffi_handler_on_xla_cpu(rng, ffi_harness):
    q, k, v = _qkv(rng, 2, 4, 2, 33, 50, 64)
    call = cutlassfa_jax._Call(True, 0.3, "cpu", "tensorcore", 3)
    out, lse = jax.jit(lambda q, k, v: cutlassfa_jax._on_device(call, q, k, v))(q, k, v)
    _expect_close(out, lse, q, k, v, True, "naive", "float32", scale=0.3)
    params = ffi_harness.last_params()
    expected = dict(backend=3, batch=2, heads_q=4, heads_kv=2, heads_ratio=2, seqlen_q=33, seqlen_k=50, head_dim=64,
                    q_strides=(4 * 33 * 64, 33 * 64, 64), k_strides=(2 * 50 * 64, 50 * 64, 64),
                    o_strides=(4 * 33 * 64, 33 * 64, 64), causal=True, dtype=0)
    assert {key: params[key] for key in expected} == expected
    assert params["softmax_scale"] == np.float32(0.3)
    assert params["softmax_scale_log2"] == np.float32(0.3 * np.log2(np.e))

    qs = jnp.stack([q, 2 * q, -q])
    mapped = jax.jit(jax.vmap(lambda q: cutlassfa_jax._on_device(call, q, k, v)))(qs)[0]
    assert ffi_harness.last_params()["batch"] == 6  # 3 mapped x 2
    for i in range(3):
        _expect_close(mapped[i], None, qs[i], k, v, True, "naive", "float32", scale=0.3)

    with pytest.raises(Exception, match="same head dim"):
        broken = jax.jit(lambda q, k, v: cutlassfa_jax._on_device(call, q, k, v))
        broken(q, k[..., :32], v[..., :32])[0].block_until_ready()


# --------------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------------

def _gpu():
    try:
        device = jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("JAX has no CUDA device here")
    if not cutlassfa.backends()["small_tile"].available:
        pytest.skip(f"no cutlassfa GPU backend: {cutlassfa.backends()['small_tile'].reason}")
    if not cutlassfa_jax.ffi_registered():
        pytest.skip("the extension was built without the JAX FFI handler (see cpp/jax/jax.cmake)")
    return device


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_eager_jit_vmap_match_reference(rng, dtype, causal):
    device = _gpu()
    q, k, v = _qkv(rng, 2, 4, 2, 77, 130, 64, dtype, device)
    backend = cutlassfa.select_backend(*(np.asarray(x) for x in (q, k, v)))
    eager, lse = cutlassfa_jax.forward(q, k, v, causal=causal, return_lse=True)
    assert eager.devices() == {device}
    _expect_close(eager, lse, q, k, v, causal, backend, dtype)
    jitted = jax.jit(functools.partial(cutlassfa_jax.forward, causal=causal))(q, k, v)
    assert np.array_equal(np.asarray(jitted), np.asarray(eager))
    qs = jnp.stack([q, -q])
    mapped = jax.jit(jax.vmap(lambda q: cutlassfa_jax.forward(q, k, v, causal=causal)))(qs)
    for i in range(2):
        _expect_close(mapped[i], None, qs[i], k, v, causal, backend, dtype)


@pytest.mark.gpu
def test_gpu_host_callback_without_ffi(rng):
    """The path an extension built without the FFI handler takes on CUDA: a host callback."""
    device = _gpu()
    q, k, v = _qkv(rng, 2, 4, 2, 40, 60, 64, "float16", device)
    call = cutlassfa_jax._Call(True, 0.125, "cpu", "small_tile", None)
    out, lse = jax.jit(lambda q, k, v: cutlassfa_jax._attention_impl(call, q, k, v))(q, k, v)
    _expect_close(out, lse, q, k, v, True, "small_tile", "float16", scale=0.125)


@pytest.mark.gpu
def test_gpu_jit_has_no_host_callback():
    _gpu()
    q = jax.ShapeDtypeStruct((1, 2, 64, 64), jnp.float16)
    text = jax.jit(cutlassfa_jax.forward).lower(q, q, q).as_text()
    assert "cutlassfa_forward" in text and "callback" not in text


def _median_seconds(fn, *args, repeats=30):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


@pytest.mark.gpu
@pytest.mark.exclusive  # wall time
def test_gpu_no_host_sync_inside_jit(rng):
    """100 chained calls in one jitted function cost no more per call than 1.2x one kernel (a host
    synchronisation or a host round trip per call would add tens of microseconds each)."""
    device = _gpu()
    q, k, v = _qkv(rng, 4, 16, 16, 1024, 1024, 64, "float16", device)  # ~45 us per kernel on an H100

    def chain(q, k, v, calls):
        for _ in range(calls):
            q = cutlassfa_jax.forward(q, k, v)
        return q

    one = jax.jit(functools.partial(chain, calls=1))
    hundred = jax.jit(functools.partial(chain, calls=100))
    # The dispatch of a jitted call, around a kernel of next to no GPU time (a kernel the size of q would
    # take its own ~5 us off `kernel` below and make the bound tighter than it says).
    baseline = jax.jit(lambda q, k, v: q[:1, :1, :1] + 1)
    kernel = _median_seconds(one, q, k, v) - _median_seconds(baseline, q, k, v)
    per_call = _median_seconds(hundred, q, k, v, repeats=10) / 100
    assert per_call <= 1.2 * kernel, f"{per_call * 1e6:.1f} us per chained call vs {kernel * 1e6:.1f} us per kernel"
