"""How `forward` and `varlen_forward` take the variant arguments (window, softcap, KV caches,
num_splits, varlen): one path for every call; values checked by the extension's validator on every
backend before anything runs or is written; values that ask for nothing give the plain call's result;
host arrays (numpy, PyTorch CPU tensors, JAX arrays on the CPU) run where plain ones do (a GPU backend
when one is usable, else the cpu backend); `supports` answers the same in advance. Results against the
float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import cutlassfa
from cutlassfa import _api
from cutlassfa import cpu
from cutlassfa.check import bound_for
from cutlassfa.merge import merged_float32
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2, varlen_reference

GPU_BACKENDS = ["tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive"]
needs_extension = pytest.mark.skipif(_api._C is None, reason="the plain path needs the extension (not built)")
# One value of each variant argument that asks for more than the plain path, on (1, 2, 8, 32) q/k/v.
VARIANTS = {
    "window": dict(window=(2, 0), causal=True),
    "softcap": dict(softcap=5.0),
    "num_splits": dict(num_splits=2),
    "cache_seqlens": dict(cache_seqlens=np.array([5], np.int32)),
    "cache_leftpad": dict(cache_leftpad=np.array([3], np.int32)),
    # k and v read as a pool of one page of 8 keys per K/V head
    "block_table": dict(block_table=np.array([[0]], np.int32), cache_seqlens=np.array([6], np.int32)),
}


def _qkv(rng, b=1, hq=2, hkv=2, nq=8, nk=8, d=32, dtype=np.float32):
    return tuple(rng.standard_normal(shape).astype(dtype) for shape in
                 ((b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)))


def _expect_close(out, lse, ref, ref_lse, dtype="float32", backend="cpu"):
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    assert rel_l2(out, ref) <= bound_for(backend, dtype).rel_l2
    seen = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isneginf(lse), ~seen)
    assert np.abs(lse[seen] - ref_lse[seen]).max(initial=0) <= bound_for(backend, dtype).lse


# ---- the plain path -------------------------------------------------------------------------------


@needs_extension
def test_values_that_ask_for_nothing_give_the_plain_result(rng):
    q, k, v = _qkv(rng)
    plain = cutlassfa.forward(q, k, v, causal=True)
    same = cutlassfa.forward(q, k, v, causal=True, window=(-1, -1), softcap=0.0)
    np.testing.assert_array_equal(same, plain)
    assert not np.array_equal(cutlassfa.forward(q, k, v, causal=True, window=(3, -1)), plain)


@needs_extension
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_backends_get_plain_calls_with_explicit_defaults(rng, backend):
    """window=(-1, -1) / softcap=0 ask for nothing: a GPU backend answers exactly as to the plain call."""
    q, k, v = _qkv(rng)
    try:
        expected = cutlassfa.forward(q, k, v, backend=backend)
    except RuntimeError as error:  # no GPU here: the same refusal
        with pytest.raises(RuntimeError, match="not available"):
            cutlassfa.forward(q, k, v, backend=backend, window=(-1, -1), softcap=0.0)
        assert "not available" in str(error)
        return
    np.testing.assert_array_equal(cutlassfa.forward(q, k, v, backend=backend, window=(-1, -1), softcap=0.0),
                                  expected)


def test_every_call_needs_the_extension(rng, monkeypatch):
    """One path: the extension validates every call, so without it every call says so."""
    monkeypatch.setattr(_api, "_C", None)
    monkeypatch.setattr(_api, "_EXTENSION_ERROR", "the cutlassfa extension is not built")
    q, k, v = _qkv(rng)
    for options in ({}, dict(window=(3, 1)), dict(softcap=2.0), dict(cache_seqlens=[4])):
        with pytest.raises(RuntimeError, match="extension"):
            cutlassfa.forward(q, k, v, **options)
    with pytest.raises(RuntimeError, match="extension"):
        cutlassfa.varlen_forward(q[0], k[0], v[0], [0, 2], [0, 2])


# ---- refusals ---------------------------------------------------------------------------------------


@needs_extension
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_gpu_backends_take_host_arrays_with_every_option(rng, backend, name):
    """A GPU backend asked for by name runs a host call with an option where it runs the plain call: on
    the GPU when one is usable (the result against the reference), else with the plain call's refusal,
    before anything is written."""
    q, k, v = _qkv(rng)
    out = np.full(q.shape, 7.0, np.float32)
    status = cutlassfa.backends()[backend]
    if not status.available:
        with pytest.raises(RuntimeError, match="not available"):
            cutlassfa.forward(q, k, v, backend=backend, out=out, **VARIANTS[name])
        assert (out == 7.0).all()
    else:
        options = dict(VARIANTS[name])
        result = cutlassfa.forward(q, k, v, backend=backend, out=out, **options)
        options.pop("num_splits", None)
        if name.startswith("cache") or name == "block_table":
            ref, _ = kvcache_reference(q, k, v, **options)
        else:
            ref, _ = attention_reference(q, k, v, **options)
        assert result is out and rel_l2(out, ref) <= bound_for(backend, "float32").rel_l2
    assert cutlassfa.supports(backend, "float32", 32, **_mode_of(name)) == cutlassfa.supports(backend, "float32", 32)


@needs_extension
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_backends_take_host_varlen(rng, backend):
    q = rng.standard_normal((9, 2, 32)).astype(np.float32)
    cu = np.array([0, 4, 9], np.int32)
    if not cutlassfa.backends()[backend].available:
        with pytest.raises(RuntimeError, match="not available"):
            cutlassfa.varlen_forward(q, q, q, cu, cu, backend=backend)
        return
    out = cutlassfa.varlen_forward(q, q, q, cu, cu, backend=backend, causal=True)
    ref, _ = varlen_reference(q, q, q, cu, cu, causal=True)
    assert rel_l2(out, ref) <= bound_for(backend, "float32").rel_l2


@pytest.mark.parametrize("backend", GPU_BACKENDS + ["cpu", "auto"])
@pytest.mark.parametrize("kw,error,name", [
    (dict(window=(-2, 0)), ValueError, "window"), (dict(window=(3, 2), causal=True), ValueError, "window"),
    (dict(window=5), TypeError, "window"), (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(softcap="1"), TypeError, "softcap"), (dict(num_splits=0), ValueError, "num_splits"),
    (dict(num_splits=2.0), TypeError, "num_splits"), (dict(cache_seqlens=np.array([9], np.int32)), ValueError,
                                                        "cache_seqlens"),
    (dict(cache_seqlens="5"), TypeError, "cache_seqlens"), (dict(k_new=np.zeros((1, 2, 1, 32), np.float32)),
                                                            ValueError, "v_new"),
], ids=str)
def test_bad_values_are_refused_before_the_backend_is_asked(rng, backend, kw, error, name):
    q, k, v = _qkv(rng)
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(error, match=name):
        cutlassfa.forward(q, k, v, backend=backend, out=out, **kw)
    assert (out == 7.0).all()


@pytest.mark.parametrize("kw,error,match", [
    (dict(out=np.zeros((1, 2, 8, 32), np.float16)), TypeError, "out must have dtype"),
    (dict(out=np.zeros((1, 2, 8, 16), np.float32)), ValueError, "out must have shape"),
    (dict(k=np.zeros((1, 2, 8, 32), np.float16)), TypeError, "same dtype"),
    (dict(v=np.zeros((1, 2, 9, 32), np.float32)), ValueError, "same sequence length"),
    (dict(q=np.zeros((1, 3, 8, 32), np.float32)), ValueError, "multiple of the heads"),
    (dict(q=np.zeros((1, 2, 8, 12), np.float32), k=np.zeros((1, 2, 8, 12), np.float32),
          v=np.zeros((1, 2, 8, 12), np.float32)), ValueError, "head dim"),
    (dict(q=np.zeros((1, 2, 8, 264), np.float32), k=np.zeros((1, 2, 8, 264), np.float32),
          v=np.zeros((1, 2, 8, 264), np.float32)), ValueError, "head dim"),
    (dict(q=[[1.0]]), TypeError, "q must be"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_arrays_are_refused(rng, kw, error, match):
    q, k, v = _qkv(rng)
    args = {**dict(q=q, k=k, v=v), **kw}
    with pytest.raises(error, match=match):
        cutlassfa.forward(args.pop("q"), args.pop("k"), args.pop("v"), softcap=2.0, **args)


def test_bad_block_table_leaves_cache_and_out_untouched(rng):
    q, _, _ = _qkv(rng, nq=1)
    k, v = (rng.standard_normal((4, 2, 4, 32)).astype(np.float32) for _ in range(2))
    table = np.array([[0, 1, 9]], np.int32)  # page 9 of 4
    new = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    out, before = np.full(q.shape, 7.0, np.float32), k.copy()
    with pytest.raises(ValueError, match="block_table"):
        cutlassfa.forward(q, k, v, cache_seqlens=[8], block_table=table, k_new=new, v_new=new, out=out)
    np.testing.assert_array_equal(k, before)
    assert (out == 7.0).all()


# ---- supports ----------------------------------------------------------------------------------------


def _mode_of(name):
    """The supports() mode of one entry of VARIANTS."""
    kw = VARIANTS[name]
    if name.startswith("cache"):
        return {"kv_cache": True}
    if name == "block_table":
        return {"kv_cache": True, "paged": True}
    return {key: value for key, value in kw.items()}


@pytest.mark.parametrize("name", list(VARIANTS) + ["paged", "varlen"])
def test_supports_the_variants_on_cpu_for_every_head_dim(name):
    mode = {name: True} if name in ("paged", "varlen") else _mode_of(name)
    for d in range(8, 257, 8):
        assert cutlassfa.supports("cpu", "bfloat16", d, **mode), d
    for d in (4, 12, 100, 264):
        answer = cutlassfa.supports("cpu", "float16", d, **mode)
        assert not answer and "head dim" in answer.reason
    for backend in GPU_BACKENDS:  # every GPU backend takes every mode where it takes the plain call
        assert cutlassfa.supports(backend, "float16", 64, **mode) == cutlassfa.supports(backend, "float16", 64)
        assert not cutlassfa.supports(backend, "float16", 12, **mode)


@pytest.mark.skipif(_api._C is None or not _api._C.has_cuda, reason="needs the extension built with its kernels")
def test_head_dim_refusals_follow_the_compiled_lists():
    """What each backend runs, from the lists the kernels are compiled from (no GPU needed): every multiple
    of 8 up to a family's widest kernel (zero-padded), naive any; the documented limits (small_tile's 48
    KB tiles, tensor-core fp32's split tiles) say so with the limit prefix, and a size outside the API's
    range is refused by every backend."""
    C = _api._C
    assert C.LIMIT_PREFIX == _api.LIMIT_PREFIX

    def refusal(backend, d, dtype="float16"):
        return C.head_dim_refusal(getattr(C.Backend, backend), d, dtype)

    widest = {"small_tile": max(C.head_dims["small_tile"]), "large_tile": max(C.head_dims["large_tile"]),
              "tensorcore": max(C.head_dims["sm80"]), "tensorcore_sm80": max(C.head_dims["sm80"]), "naive": 256}
    for backend, top in widest.items():
        for dtype in ("float32", "float16", "bfloat16"):
            for d in range(8, 257, 8):
                reason = refusal(backend, d, dtype)
                fp32_limited = backend.startswith("tensorcore") and dtype == "float32" and d > 128
                if d <= top and not fp32_limited:
                    assert reason == "", (backend, dtype, d, reason)
                else:
                    assert reason.startswith(_api.LIMIT_PREFIX), (backend, dtype, d, reason)
                    assert str(d) in reason
        for d in (0, 4, 12, 264):
            assert refusal(backend, d) and not refusal(backend, d).startswith(_api.LIMIT_PREFIX)
    assert widest["small_tile"] == 192 and widest["large_tile"] == 256
    assert "48 KB" in refusal("small_tile", 256)
    with pytest.raises(ValueError, match="dtype"):
        C.head_dim_refusal(C.Backend.naive, 64, "int8")


def test_supports_reads_the_values():
    assert not cutlassfa.supports("cpu", "float32", 64, window=(-2, 0))
    assert "causal" in cutlassfa.supports("cpu", "float32", 64, window=(4, 1), causal=True).reason
    assert not cutlassfa.supports("cpu", "float32", 64, softcap=float("nan"))
    assert not cutlassfa.supports("cpu", "float32", 64, num_splits=0)
    assert not cutlassfa.supports("cpu", "float32", 64, paged="yes")
    assert "not implemented" in cutlassfa.supports("cpu", "float32", 64, fp8=True).reason
    assert not cutlassfa.supports("cpu", "float32", 64, alibi="yes")
    # Values that ask for nothing are the plain case, on every backend.
    for backend in cutlassfa.BACKENDS:
        plain = cutlassfa.supports(backend, "float16", 64, causal=True)
        assert cutlassfa.supports(backend, "float16", 64, causal=True, window=(-1, -1), softcap=0.0, num_splits=1,
                                  kv_cache=False, paged=False, varlen=False) == plain


# ---- results on the cpu backend ---------------------------------------------------------------------


@pytest.mark.parametrize("window,causal,softcap", [((4, 2), False, 0.0), ((6, 0), True, 3.0), (None, False, 3.0),
                                                  ((0, 0), False, 0.0)], ids=str)
def test_three_d_inputs_and_out(rng, window, causal, softcap):
    q, k, v = (x[:, 0] for x in _qkv(rng, b=3, hq=1, hkv=1, nq=30, nk=45))
    out = np.empty((3, 45, 30, 32), np.float32).transpose(0, 2, 1, 3)[:, :, 5]  # strided (3, 30, 32)
    result, lse = cutlassfa.forward(q, k, v, window=window, causal=causal, softcap=softcap, out=out, return_lse=True)
    assert result is out and lse.shape == (3, 30)
    backend = cutlassfa.select_backend(q, k, v)  # a GPU one where usable: host arrays run where plain ones do
    _expect_close(out, lse, *attention_reference(q, k, v, window=window, causal=causal, softcap=softcap),
                  backend=backend)


@pytest.mark.parametrize("window,causal", [(None, False), ((40, 0), True), ((100, 30), False)], ids=str)
def test_num_splits_changes_only_the_rounding(rng, monkeypatch, window, causal):
    merges = []
    monkeypatch.setattr(cpu, "merged_float32", lambda *a, **kw: merges.append(len(a[0])) or merged_float32(*a, **kw))
    q, k, v = _qkv(rng, b=2, hq=4, hkv=2, nq=70, nk=600)
    ref, ref_lse = attention_reference(q, k, v, window=window, causal=causal)
    one = cutlassfa.forward(q, k, v, window=window, causal=causal, num_splits=1, softcap=0.5, backend="cpu")
    for splits in (2, 3, 5, 40):
        out, lse = cutlassfa.forward(q, k, v, window=window, causal=causal, num_splits=splits, return_lse=True,
                                     backend="cpu")
        _expect_close(out, lse, ref, ref_lse)
        capped = cutlassfa.forward(q, k, v, window=window, causal=causal, num_splits=splits, softcap=0.5,
                                   backend="cpu")
        assert rel_l2(capped, one) <= 1e-6
    assert set(merges) == {2, 3, 5, 40}  # the parts were computed apart and merged by lse


def test_kvcache_num_splits_and_new_keys(rng):
    q = rng.standard_normal((3, 8, 2, 64)).astype(np.float16)
    k, v = (rng.standard_normal((3, 2, 500, 64)).astype(np.float16) for _ in range(2))
    new_k, new_v = (rng.standard_normal((3, 2, 2, 64)).astype(np.float16) for _ in range(2))
    lengths = np.array([0, 130, 498], np.int32)
    ref, ref_lse = kvcache_reference(q, k, v, cache_seqlens=lengths, k_new=new_k, v_new=new_v, causal=True,
                                     window=(64, 0))
    out, lse = cutlassfa.forward(q, k, v, cache_seqlens=lengths, k_new=new_k, v_new=new_v, causal=True,
                                 window=(64, 0), num_splits=3, return_lse=True)
    _expect_close(out, lse, ref, ref_lse, "float16")
    np.testing.assert_array_equal(k[1, :, 130:132], new_k[1])
    np.testing.assert_array_equal(lengths, [0, 130, 498])


# ---- frameworks -------------------------------------------------------------------------------------


def test_torch_cpu_tensors(rng):
    torch = pytest.importorskip("torch", reason="optional package torch")
    q, k, v = _qkv(rng, hq=4, nq=20, nk=33)
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    out = torch.empty(1, 20, 4, 32, dtype=torch.bfloat16).transpose(1, 2)
    result, lse = cutlassfa.forward(tq, tk, tv, window=(5, 0), causal=True, softcap=4.0, out=out, return_lse=True)
    assert result is out and isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    ref = attention_reference(*(x.float().numpy() for x in (tq, tk, tv)), window=(5, 0), causal=True, softcap=4.0)
    _expect_close(out.float().numpy(), lse.numpy(), *ref, "bfloat16")

    # A KV cache of torch tensors: the new keys are written into it; the index may be a tensor too.
    cache_k, cache_v = (torch.zeros(1, 2, 40, 32) for _ in range(2))
    new = torch.ones(1, 2, 3, 32)
    cutlassfa.forward(torch.from_numpy(q[:, :, :3]), cache_k, cache_v, k_new=new, v_new=new,
                      cache_seqlens=torch.tensor([10], dtype=torch.int32))
    assert bool((cache_k[0, :, 10:13] == 1).all()) and bool((cache_k[0, :, 13:] == 0).all())

    with pytest.raises(TypeError, match="framework"):
        cutlassfa.forward(tq.float(), k, tv.float(), softcap=1.0)


def test_torch_autograd_goes_through_the_operator(rng):
    torch = pytest.importorskip("torch", reason="optional package torch")
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in _qkv(rng))
    out = cutlassfa.forward(q, k, v, window=(2, 0), causal=True)
    assert out.grad_fn is not None  # recorded, so that backward raises instead of dropping the gradient
    with pytest.raises(NotImplementedError, match="backward"):
        out.sum().backward()
    with pytest.raises(NotImplementedError, match="no backward pass"):  # an append writes its caches: refused first
        cutlassfa.forward(q, k, v, cache_seqlens=torch.tensor([4], dtype=torch.int32), k_new=k[:, :, :1],
                          v_new=v[:, :, :1])
    out = cutlassfa.forward(q, k, v, num_splits=2, block_table=None)
    assert out.grad_fn is not None
    out = cutlassfa.varlen_forward(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), [0, 8], [0, 8])
    assert out.grad_fn is not None
    with pytest.raises(NotImplementedError, match="backward"):
        out.sum().backward()


@needs_extension  # the JAX integration picks the backend with the extension's validator
def test_jax_arrays(rng):
    jax = pytest.importorskip("jax", reason="optional package jax")
    cpu = jax.devices("cpu")[0]  # JAX's default device is a GPU where one is present

    def host(x):
        return jax.device_put(x, cpu)

    q, k, v = _qkv(rng, nq=12, nk=20)
    out, lse = cutlassfa.forward(*(host(x) for x in (q, k, v)), window=(3, 3), softcap=2.0, return_lse=True)
    _expect_close(np.asarray(out), np.asarray(lse), *attention_reference(q, k, v, window=(3, 3), softcap=2.0))
    with pytest.raises(TypeError, match="immutable"):
        cutlassfa.forward(*(host(x) for x in (q, k, v)), cache_seqlens=[4], k_new=host(k[:, :, :1]),
                          v_new=host(v[:, :, :1]))
    if not cutlassfa.backends()["naive"].available:  # host arrays run where plain ones do
        with pytest.raises(RuntimeError, match="not available"):
            cutlassfa.forward(*(host(x) for x in (q, k, v)), softcap=2.0, backend="naive")
    # varlen_forward takes JAX arrays (cutlassfa.jax.varlen_forward): (total, H, d), host prefix sums
    qv, kv, vv = (np.ascontiguousarray(x[0].swapaxes(0, 1)) for x in (q, k, v))
    cu_q, cu_k = np.array([0, 5, 12], np.int32), np.array([0, 8, 20], np.int32)
    out, lse = cutlassfa.varlen_forward(host(qv), host(kv), host(vv), cu_q, cu_k, causal=True, return_lse=True)
    _expect_close(out, lse, *varlen_reference(qv, kv, vv, cu_q, cu_k, causal=True))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "tensorcore", "small_tile"])
def test_jax_gpu_arrays(rng, backend):
    """Concrete JAX arrays on a GPU take the variants in place (window, softcap, a paged KV cache with
    device lengths), and come back as JAX arrays on that GPU."""
    jax = pytest.importorskip("jax", reason="optional package jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("optional package: this jax has no GPU support")
    status = cutlassfa.backends().get("tensorcore" if backend == "auto" else backend)
    if not status.available:
        pytest.skip(f"{backend}: {status.reason}")
    q, k, v = _qkv(rng, nq=12, nk=20)
    q, k, v = (x.astype(np.float16) for x in (q, k, v))
    jq, jk, jv = (jax.device_put(x, gpu) for x in (q, k, v))
    bound = bound_for("tensorcore" if backend == "auto" else backend, "float16")
    out, lse = cutlassfa.forward(jq, jk, jv, window=(3, 3), softcap=2.0, backend=backend, return_lse=True)
    assert isinstance(out, jax.Array) and out.devices() == {gpu} and lse.dtype == np.float32
    ref, ref_lse = attention_reference(q, k, v, window=(3, 3), softcap=2.0)
    assert rel_l2(np.asarray(out, np.float64), ref) <= bound.rel_l2
    assert np.abs(np.asarray(lse, np.float64) - ref_lse).max() <= bound.lse
    # A paged cache: page size 4, pages in reverse order, lengths on the device.
    b, h, n, d = k.shape
    pages = k.reshape(b * h, n // 4, 4, d).transpose(1, 0, 2, 3)[::-1].reshape(n // 4, h, 4, d)  # b = 1
    vpages = v.reshape(b * h, n // 4, 4, d).transpose(1, 0, 2, 3)[::-1].reshape(n // 4, h, 4, d)
    table = np.arange(n // 4, dtype=np.int32)[::-1].copy()[None]
    lengths = np.array([15], np.int32)
    out = cutlassfa.forward(jq, jax.device_put(np.ascontiguousarray(pages), gpu),
                            jax.device_put(np.ascontiguousarray(vpages), gpu), cache_seqlens=jax.device_put(lengths, gpu),
                            block_table=jax.device_put(table, gpu), backend=backend)
    ref, _ = kvcache_reference(q, k, v, cache_seqlens=lengths)
    assert rel_l2(np.asarray(out, np.float64), ref) <= bound.rel_l2


# ---- varlen_forward ---------------------------------------------------------------------------------


def test_varlen_torch_tensors_and_out(rng):
    torch = pytest.importorskip("torch", reason="optional package torch")
    lens_q, lens_k = [3, 0, 40], [7, 5, 40]
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lens_q, lens_k))
    q = rng.standard_normal((43, 4, 16)).astype(np.float32)
    k, v = (rng.standard_normal((52, 1, 16)).astype(np.float32) for _ in range(2))
    out = torch.full((43, 4, 16), 7.0)
    result, lse = cutlassfa.varlen_forward(*(torch.from_numpy(x) for x in (q, k, v)), torch.from_numpy(cu_q),
                                           torch.from_numpy(cu_k), causal=True, softcap=3.0, out=out,
                                           return_lse=True, backend="cpu")
    assert result is out and tuple(lse.shape) == (4, 43)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True, softcap=3.0)
    _expect_close(out.numpy().transpose(1, 0, 2), lse.numpy(), ref.transpose(1, 0, 2), ref_lse)


def test_varlen_refusals(rng):
    q = rng.standard_normal((9, 2, 32)).astype(np.float32)
    cu = np.array([0, 4, 9], np.int32)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        cutlassfa.varlen_forward(q, q, q, cu, cu, max_seqlen_q=3)
    with pytest.raises(ValueError, match="window"):
        cutlassfa.varlen_forward(q, q, q, cu, cu, window=(-3, 0), backend="naive")
    with pytest.raises(TypeError, match="cu_seqlens_k"):
        cutlassfa.varlen_forward(q, q, q, cu, "0 4 9")
    with pytest.raises(TypeError, match="out must have dtype"):
        cutlassfa.varlen_forward(q, q, q, cu, cu, out=np.zeros(q.shape, np.float16))


def test_merge_is_exported():
    from cutlassfa import merge

    assert cutlassfa.merge_attention is merge.merge_attention
    assert cutlassfa.merge_attention_into is merge.merge_attention_into


@pytest.mark.gpu
def test_cuda_tensors_run_the_variants(rng):
    torch = pytest.importorskip("torch", reason="optional package torch")
    if not torch.cuda.is_available():
        pytest.skip("optional package torch: no CUDA device visible to PyTorch")
    q, k, v = (torch.from_numpy(x).cuda() for x in _qkv(rng))
    out = cutlassfa.forward(q, k, v, window=(2, 0))
    assert out.device == q.device
    ref, _ = attention_reference(*(x.cpu().numpy() for x in (q, k, v)), window=(2, 0))
    assert rel_l2(out.cpu().numpy(), ref) <= bound_for(cutlassfa.select_backend(q, k, v), "float32").rel_l2
    with pytest.raises(ValueError, match="backend 'cpu' needs host"):
        cutlassfa.forward(q, k, v, window=(2, 0), backend="cpu")
    cu = torch.tensor([0, 8], dtype=torch.int32, device="cuda")
    out = cutlassfa.varlen_forward(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu)
    ref, _ = attention_reference(*(x.cpu().numpy() for x in (q, k, v)))
    assert rel_l2(out.transpose(0, 1)[None].cpu().numpy(), ref) <= bound_for("tensorcore", "float32").rel_l2
