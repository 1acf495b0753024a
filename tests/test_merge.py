"""`cutlassfa.merge`: partial attention results over disjoint key sets, merged by lse, equal attention
over the whole key set (single `forward` and the fp64 reference), on numpy, PyTorch (CPU; CUDA with the
`gpu` marker) and JAX arrays; rows no part sees give 0 and lse -inf, never NaN."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.merge import merge_attention, merge_attention_into
from cutlassfa.reference import attention_reference, rel_l2


def _split_points(rng: np.random.Generator, nk: int, parts: int) -> list[tuple[int, int]]:
    """`parts` consecutive key ranges covering [0, nk), some possibly empty."""
    cuts = np.sort(rng.integers(0, nk + 1, parts - 1))
    bounds = [0, *cuts.tolist(), nk]
    return list(zip(bounds[:-1], bounds[1:]))


def _partials(q, k, v, ranges, causal):
    """forward over each key range, keeping the mask of the whole problem (query i sees key j iff
    j <= i + Nk - Nq when causal): the parts a split-KV kernel would hand over, in q's dtype."""
    outs, lses = [], []
    nq, nk = q.shape[-2], k.shape[-2]
    for a, b in ranges:
        offset = nk - nq - a if causal else b  # within [a, b): query i sees j' <= i + offset
        o, lse = _offset_causal(q, k[..., a:b, :], v[..., a:b, :], offset)
        outs.append(o)
        lses.append(lse)
    return outs, lses


def _offset_causal(q, k, v, offset):
    """Attention where query i sees key j iff j <= i + offset (any offset), through forward, with the
    ring's diagonal-block arithmetic: rows that see every key take one unmasked call, the rows before
    them one bottom-right causal call on a key prefix whose Nk - Nq equals the offset."""
    nq, nk = q.shape[-2], k.shape[-2]
    out = np.zeros(q.shape, dtype=q.dtype)
    lse = np.full(q.shape[:-1], -np.inf, dtype=np.float32)
    first_seeing = min(nq, max(0, -offset))  # rows i < -offset see nothing
    full_from = min(nq, max(first_seeing, nk - offset))  # rows i >= nk - offset see every key
    if full_from > first_seeing:
        rows, keys = slice(first_seeing, full_from), full_from + offset
        # bottom-right on (rows, keys): row i'' = i - first_seeing sees j <= i'' + keys - rows = i + offset
        o, l_ = cutlassfa.forward(q[..., rows, :], k[..., :keys, :], v[..., :keys, :], causal=True,
                                  backend="cpu", return_lse=True)
        out[..., rows, :], lse[..., rows] = o, l_
    if nq > full_from and nk > 0:
        o, l_ = cutlassfa.forward(q[..., full_from:, :], k, v, backend="cpu", return_lse=True)
        out[..., full_from:, :], lse[..., full_from:] = o, l_
    return out, lse


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("parts", [1, 2, 5])
def test_merge_equals_whole_key_set(rng, make_qkv, resolve_dtype, dtype, causal, parts):
    nq, nk = (40, 97) if causal else (33, 70)
    q, k, v = make_qkv(2, 4, 2, nq, nk, 32, resolve_dtype(dtype))
    outs, lses = _partials(q, k, v, _split_points(rng, nk, parts), causal)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no divide-by-zero / invalid warnings from unseen rows
        out, lse = merge_attention(outs, lses)
    ref, ref_lse = attention_reference(q, k, v, causal=causal)
    single, single_lse = cutlassfa.forward(q, k, v, causal=causal, backend="cpu", return_lse=True)
    bound = bound_for("cpu", dtype)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.dtype == np.float32 and lse.shape == q.shape[:-1]
    assert rel_l2(out.astype(np.float64), ref) <= bound.rel_l2
    assert rel_l2(out.astype(np.float64), single.astype(np.float64)) <= bound.rel_l2
    np.testing.assert_allclose(lse, ref_lse, atol=bound.lse, rtol=0)
    np.testing.assert_allclose(lse, single_lse, atol=bound.lse, rtol=0)


def test_rows_no_part_sees_are_zero_not_nan(make_qkv):
    """Nq > Nk, causal: the first Nq - Nk rows see no key in any part."""
    q, k, v = make_qkv(1, 2, 2, 50, 12, 32)
    outs, lses = _partials(q, k, v, [(0, 5), (5, 5), (5, 12)], causal=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = merge_attention(outs, lses)
    ref, ref_lse = attention_reference(q, k, v, causal=True)
    unseen = ~np.isfinite(ref_lse)
    assert unseen.sum() == 2 * 38
    assert np.all(out[unseen] == 0) and np.all(lse[unseen] == -np.inf)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert rel_l2(out, ref) <= 1e-5
    np.testing.assert_allclose(lse[~unseen], ref_lse[~unseen], atol=1e-5)


def test_extreme_lse_does_not_overflow(rng):
    """Weights are exp(lse_p - max lse): lse values far beyond float32's exp range merge exactly."""
    outs = [rng.standard_normal((3, 5, 8)).astype(np.float32) for _ in range(3)]
    lses = [np.full((3, 5), 1e4, np.float32), np.full((3, 5), 1e4 - 1, np.float32),
            np.full((3, 5), -1e4, np.float32)]
    lses[2][0, 0] = 2e4  # one row where the third part dominates
    out, lse = merge_attention(outs, lses)
    l64 = np.stack(lses).astype(np.float64)
    ref_lse = np.logaddexp.reduce(l64, axis=0)
    w = np.exp(l64 - ref_lse)[..., None]
    ref = (w * np.stack(outs)).sum(axis=0)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[0, 0], outs[2][0, 0], rtol=1e-6)


def test_nan_propagates_to_its_row(rng):
    outs = [rng.standard_normal((1, 4, 8)).astype(np.float32) for _ in range(2)]
    lses = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(2)]
    lses[1][0, 2] = np.nan
    out, lse = merge_attention(outs, lses)
    assert np.isnan(lse[0, 2]) and np.isnan(out[0, 2]).all()
    assert np.isfinite(np.delete(out[0], 2, axis=0)).all()


def test_merge_is_order_free_and_associative(rng):
    outs = [rng.standard_normal((2, 3, 6, 32)).astype(np.float32) for _ in range(4)]
    lses = [rng.standard_normal((2, 3, 6)).astype(np.float32) * 3 for _ in range(4)]
    lses[1][0, 0, :] = -np.inf  # a part in which some rows saw nothing
    out, lse = merge_attention(outs, lses)
    out_r, lse_r = merge_attention(outs[::-1], lses[::-1])
    left = merge_attention(outs[:2], lses[:2])
    right = merge_attention(outs[2:], lses[2:])
    out_t, lse_t = merge_attention([left[0], right[0]], [left[1], right[1]])
    for o, l_ in ((out_r, lse_r), (out_t, lse_t)):
        np.testing.assert_allclose(o, out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(l_, lse, rtol=1e-6, atol=1e-6)
    single, single_lse = merge_attention(outs[:1], lses[:1])
    np.testing.assert_allclose(single, outs[0], rtol=1e-6)
    np.testing.assert_array_equal(single_lse, lses[0])


def test_three_dim_arrays_as_forward_returns_them(make_qkv):
    q, k, v = (x[:, 0] for x in make_qkv(2, 1, 1, 20, 45, 64))
    parts = [cutlassfa.forward(q, k[:, a:b], v[:, a:b], backend="cpu", return_lse=True) for a, b in ((0, 30), (30, 45))]
    out, lse = merge_attention([p[0] for p in parts], [p[1] for p in parts])
    ref, ref_lse = attention_reference(q, k, v)
    assert out.shape == (2, 20, 64) and lse.shape == (2, 20)
    assert rel_l2(out, ref) <= 1e-5
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5)


def test_out_argument(rng, bf16):
    outs = [rng.standard_normal((2, 5, 32)).astype(bf16) for _ in range(2)]
    lses = [rng.standard_normal((2, 5)).astype(np.float32) for _ in range(2)]
    expected, expected_lse = merge_attention(outs, lses)
    target = np.full((2, 5, 32), np.nan, dtype=np.float32)  # float32 out keeps the unrounded merge
    result, lse = merge_attention(outs, lses, out=target)
    assert result is target
    np.testing.assert_allclose(target.astype(bf16).astype(np.float32), expected.astype(np.float32))
    np.testing.assert_array_equal(lse, expected_lse)
    w = np.exp(np.stack(lses) - expected_lse)[..., None]
    np.testing.assert_allclose(target, (w * np.stack(outs).astype(np.float32)).sum(0), rtol=1e-5, atol=1e-6)


def test_invalid_arguments(rng):
    o = np.zeros((2, 4, 32), np.float32)
    lse = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="non-empty"):
        merge_attention([], [])
    with pytest.raises(ValueError, match="same length"):
        merge_attention([o, o], [lse])
    with pytest.raises(ValueError, match="outs\\[1\\] has shape"):
        merge_attention([o, o[:, :3]], [lse, lse[:, :3]])
    with pytest.raises(ValueError, match="lses\\[0\\] must have shape"):
        merge_attention([o], [lse[:, :3]])
    with pytest.raises(TypeError, match="one dtype"):
        merge_attention([o, o.astype(np.float16)], [lse, lse])
    with pytest.raises(TypeError, match="one framework"):
        merge_attention([o, [[0.0]]], [lse, lse])
    with pytest.raises(ValueError, match="out must have shape"):
        merge_attention([o], [lse], out=np.zeros((2, 4, 16), np.float32))
    read_only = np.zeros_like(o)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        merge_attention([o], [lse], out=read_only)
    with pytest.raises(TypeError, match="float32"):
        merge_attention_into(o.astype(np.float16), lse, o, lse)


def test_merge_into_running_fold_on_row_views(rng, make_qkv, bf16):
    """The ring's use: fold parts one by one into float32 (acc, lse) views of a block of rows."""
    q, k, v = make_qkv(1, 2, 1, 30, 64, 32, bf16)
    acc = np.zeros(q.shape, np.float32)
    acc_lse = np.full(q.shape[:-1], -np.inf, np.float32)
    rows = slice(10, 30)  # rows 0..9 see no part at all
    for a, b in _split_points(rng, 64, 4):
        o, l_ = cutlassfa.forward(q[:, :, rows], k[:, :, a:b], v[:, :, a:b], backend="cpu", return_lse=True)
        merge_attention_into(acc[:, :, rows], acc_lse[:, :, rows], o, l_)
    ref, ref_lse = attention_reference(q[:, :, rows], k, v)
    assert rel_l2(acc[:, :, rows], ref) <= bound_for("cpu", "bfloat16").rel_l2
    np.testing.assert_allclose(acc_lse[:, :, rows], ref_lse, atol=1e-4)
    assert np.all(acc[:, :, :10] == 0) and np.all(acc_lse[:, :, :10] == -np.inf)


# --------------------------------------------------------------------------------------------------
# Other frameworks
# --------------------------------------------------------------------------------------------------

def _torch_parts(torch, q, k, v, ranges, dtype, device):
    outs, lses = [], []
    for a, b in ranges:
        o, l_ = cutlassfa.forward(q, k[:, :, a:b], v[:, :, a:b], backend="cpu", return_lse=True)
        outs.append(torch.from_numpy(o).to(device=device, dtype=dtype))
        lses.append(torch.from_numpy(l_).to(device))
    return outs, lses


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_cpu_tensors_stay_torch(rng, make_qkv, dtype):
    torch = pytest.importorskip("torch")
    torch_dtype = getattr(torch, dtype)
    q, k, v = make_qkv(2, 2, 2, 25, 60, 32)
    outs, lses = _torch_parts(torch, q, k, v, _split_points(rng, 60, 3), torch_dtype, "cpu")
    out, lse = merge_attention(outs, lses)
    assert isinstance(out, torch.Tensor) and out.dtype == torch_dtype and lse.dtype == torch.float32
    ref, ref_lse = attention_reference(q, k, v)
    assert rel_l2(out.float().numpy(), ref) <= bound_for("cpu", dtype).rel_l2
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=1e-4)
    acc, acc_lse = torch.zeros(q.shape), torch.full(q.shape[:-1], -math.inf)
    for o, l_ in zip(outs, lses):
        merge_attention_into(acc, acc_lse, o, l_)
    torch.testing.assert_close(acc.to(torch_dtype), out)
    torch.testing.assert_close(acc_lse, lse)


def test_torch_never_goes_through_numpy():
    """On the meta device (shapes only) any conversion to numpy would fail: the merge is torch ops."""
    torch = pytest.importorskip("torch")
    outs = [torch.empty(2, 3, 7, 64, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    lses = [torch.empty(2, 3, 7, device="meta") for _ in range(3)]
    out, lse = merge_attention(outs, lses)
    assert out.device.type == "meta" and out.shape == (2, 3, 7, 64) and out.dtype == torch.bfloat16
    assert lse.device.type == "meta" and lse.shape == (2, 3, 7) and lse.dtype == torch.float32
    merge_attention_into(torch.empty(2, 3, 7, 64, device="meta"), torch.empty(2, 3, 7, device="meta"),
                         outs[0], lses[0])


def test_jax_arrays(rng, make_qkv):
    jnp = pytest.importorskip("jax.numpy")
    q, k, v = make_qkv(1, 2, 2, 16, 40, 32)
    parts = [cutlassfa.forward(q, k[:, :, a:b], v[:, :, a:b], backend="cpu", return_lse=True) for a, b in ((0, 13), (13, 40))]
    out, lse = merge_attention([jnp.asarray(p[0]) for p in parts], [jnp.asarray(p[1]) for p in parts])
    assert type(out).__module__.split(".")[0] in ("jax", "jaxlib")
    ref, ref_lse = attention_reference(q, k, v)
    assert rel_l2(np.asarray(out), ref) <= 1e-5
    np.testing.assert_allclose(np.asarray(lse), ref_lse, atol=1e-5)
    with pytest.raises(TypeError, match="immutable"):
        merge_attention([jnp.asarray(p[0]) for p in parts], [jnp.asarray(p[1]) for p in parts],
                        out=jnp.zeros(q.shape))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_cuda_parts_from_forward(rng, make_qkv, dtype):
    """Split-KV on the GPU: forward on key ranges of CUDA tensors, merged on the device."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    status = cutlassfa.backends()["tensorcore"]
    if not status.available:
        pytest.skip(f"tensorcore: {status.reason}")
    q, k, v = make_qkv(2, 8, 2, 300, 1000, 128)
    tq, tk, tv = (torch.from_numpy(x).to("cuda", getattr(torch, dtype)) for x in (q, k, v))
    outs, lses = [], []
    for a, b in _split_points(rng, 1000, 4):
        o, l_ = cutlassfa.forward(tq, tk[:, :, a:b], tv[:, :, a:b], return_lse=True)
        outs.append(o)
        lses.append(l_)
    out, lse = merge_attention(outs, lses)
    assert out.device.type == "cuda" and out.dtype == tq.dtype
    ref, ref_lse = attention_reference(tq.float().cpu().numpy(), tk.float().cpu().numpy(), tv.float().cpu().numpy())
    assert rel_l2(out.float().cpu().numpy(), ref) <= bound_for("tensorcore", dtype).rel_l2
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=1e-3)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_stacked_merge_equals_the_list_merge(rng, framework, with_sinks):
    """merged_stacked_float32 (the combine of a sharded decode step: parts stacked on a first axis; torch
    has its own shorter path) gives merge_attention's result, rows that no part sees included."""
    from cutlassfa.merge import merged_stacked_float32

    parts, heads = 3, 4
    outs = rng.standard_normal((parts, 2, heads, 5, 16)).astype(np.float32)
    lses = rng.normal(0, 3, (parts, 2, heads, 5)).astype(np.float32)
    lses[:, 0, 1, 2] = -np.inf  # a row no part sees
    lses[1, 1, 0, :] = -np.inf  # a part that sees nothing of some rows
    sinks = np.array([-np.inf, 0.5, 2.0, -1.0], np.float32) if with_sinks else None
    expect, expect_lse = merge_attention(list(outs), list(lses), sinks=sinks)
    if framework == "torch":
        torch = pytest.importorskip("torch")
        got, got_lse = merged_stacked_float32(torch.from_numpy(outs), torch.from_numpy(lses),
                                              None if sinks is None else torch.from_numpy(sinks))
        got, got_lse = got.numpy(), got_lse.numpy()
    else:
        got, got_lse = merged_stacked_float32(outs, lses, sinks)
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_lse, expect_lse, rtol=1e-5, atol=1e-5)
    unseen = np.isneginf(expect_lse)
    assert unseen.any() == (not with_sinks)  # with sinks, the unseen row's head has a finite sink
    assert np.all(got[unseen] == 0) and np.all(np.isneginf(got_lse[unseen]))
