"""`cutlassfa.torch.scaled_dot_product_attention` against `torch.nn.functional.scaled_dot_product_attention`:
on every argument combination it takes, its deviation from SDPA run in float64 stays within 2x SDPA's own
in the same dtype (plus the bound of the cutlassfa backend that ran it); what it cannot compute exactly is
refused. CPU tensors everywhere; CUDA tensors under the `gpu` marker."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="optional package torch")

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.bias import CausalVariant, causal_lower_right, causal_upper_left  # noqa: E402

import cutlassfa  # noqa: E402
from cutlassfa.check import bound_for  # noqa: E402
from cutlassfa.torch import scaled_dot_product_attention as ours  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _deviation(x, ref):
    x, ref = x.double().cpu(), ref.double().cpu()
    return float((x - ref).norm() / ref.norm()) if ref.norm() > 0 else float((x - ref).norm())


def _inputs(seed, lead, lq, ls, e=32, heads_k=None, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    lead_k = lead if heads_k is None else (*lead[:-1], heads_k)
    q = torch.randn(*lead, lq, e, generator=g)
    k, v = (torch.randn(*lead_k, ls, e, generator=g) for _ in range(2))
    return tuple(x.to(device, dtype) for x in (q, k, v))


def _expect_like_sdpa(q, k, v, **kwargs):
    """ours within 2x SDPA's own deviation from SDPA in float64, or within our backend's bound. SDPA is
    given a causal bias as the boolean mask it stands for; its rows that see no key (NaN in some of its
    paths) count as 0, ours' documented answer."""
    got = ours(q, k, v, **kwargs)
    assert got.shape == q.shape[:-1] + (v.shape[-1],) and got.dtype == q.dtype and got.device == q.device
    theirs = _as_boolean(kwargs, q.shape[-2], k.shape[-2], q.device)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **theirs).nan_to_num(0.0)
    same = F.scaled_dot_product_attention(q, k, v, **theirs).nan_to_num(0.0)
    backend = cutlassfa.select_backend(*(x.reshape(-1, *x.shape[-3:]) if x.dim() > 4 else x for x in (q, k, v)))
    dtype = str(q.dtype).removeprefix("torch.")
    allowed = max(2 * _deviation(same, exact), bound_for(backend, dtype).rel_l2)
    assert _deviation(got, exact) <= allowed, (_deviation(got, exact), allowed)
    return got


def _as_boolean(kwargs, lq, ls, device):
    """kwargs with a causal bias replaced by its boolean mask (upper left: j <= i; lower right:
    j <= i + ls - lq)."""
    mask = kwargs.get("attn_mask")
    if mask is None or isinstance(mask, torch.Tensor):
        return kwargs
    lower_right = mask.variant == CausalVariant.LOWER_RIGHT
    tril = torch.ones(lq, ls, dtype=torch.bool, device=device).tril(ls - lq if lower_right else 0)
    return {**kwargs, "attn_mask": tril}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("lq, ls", [(40, 40), (17, 60), (60, 17), (1, 33)], ids=str)
@pytest.mark.parametrize("causal", ["none", "is_causal", "upper_left", "lower_right"])
def test_causal_forms(dtype, lq, ls, causal):
    q, k, v = _inputs(lq * 100 + ls, (2, 4), lq, ls, dtype=DTYPES[dtype])
    kwargs = {"none": {}, "is_causal": {"is_causal": True}, "upper_left": {"attn_mask": causal_upper_left(lq, ls)},
              "lower_right": {"attn_mask": causal_lower_right(lq, ls)}}[causal]
    _expect_like_sdpa(q, k, v, **kwargs)


@pytest.mark.parametrize("lead", [(3,), (2, 4), (2, 3, 2)], ids=str)
def test_leading_dims_scale_and_gqa(lead):
    q, k, v = _inputs(1, lead, 20, 30)
    _expect_like_sdpa(q, k, v, scale=0.3, is_causal=True)
    if len(lead) >= 2:
        q, k, v = _inputs(2, (2, 8), 20, 30, heads_k=2)
        _expect_like_sdpa(q, k, v, enable_gqa=True)
        with pytest.raises(ValueError, match="enable_gqa"):
            ours(q, k, v)


def _padding(batch, length, left=(), right=()):
    keep = torch.ones(batch, length, dtype=torch.bool)
    for row, n in enumerate(left):
        keep[row, :n] = False
    for row, n in enumerate(right):
        if n:
            keep[row, length - n:] = False
    return keep


@pytest.mark.parametrize("form", ["causal", "full", "left_padding", "right_padding", "both_sides", "top_left",
                                  "block_causal"])
def test_boolean_masks(form):
    lq = ls = 24
    q, k, v = _inputs(3, (3, 4), lq, ls)
    tril = torch.ones(lq, ls, dtype=torch.bool).tril()
    if form == "causal":
        mask = tril
    elif form == "full":
        mask = torch.ones(3, 1, lq, ls, dtype=torch.bool)
    elif form == "left_padding":  # keys of the padding hidden, causal: a cache-like layout
        mask = tril & _padding(3, ls, left=(0, 5, 11))[:, None, None, :]
    elif form == "right_padding":
        mask = _padding(3, ls, right=(0, 4, 9))[:, None, None, :].expand(3, 1, lq, ls)
    elif form == "both_sides":  # queries and keys of each entry in one run: packed sequences
        keep = _padding(3, ls, left=(0, 3, 6), right=(2, 0, 5))
        mask = keep[:, None, :, None] & keep[:, None, None, :] & tril
    elif form == "block_causal":  # causal sequences packed in each entry (7 + 10 + 7, 24, 3 + 21)
        ids = torch.tensor([[0] * 7 + [1] * 10 + [2] * 7, [0] * 24, [0] * 3 + [1] * 21])
        mask = (ids[:, None, :, None] == ids[:, None, None, :]) & tril
    else:  # SDPA's top-left causal with more queries than keys
        q, k, v = _inputs(4, (3, 4), 30, 12)
        mask = torch.ones(30, 12, dtype=torch.bool).tril()
    got = _expect_like_sdpa(q, k, v, attn_mask=mask)
    if form == "both_sides":  # rows that see no key: 0, as SDPA gives
        assert (got[1, :, :3] == 0).all()


def test_refusals_are_clear():
    q, k, v = _inputs(5, (2, 4), 16, 16)
    with pytest.raises(NotImplementedError, match="dropout"):
        ours(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="boolean"):
        ours(q, k, v, attn_mask=torch.zeros(16, 16))
    with pytest.raises(NotImplementedError, match="head dim"):
        ours(q, k, v[..., :8])
    per_head = torch.ones(2, 4, 16, 16, dtype=torch.bool)
    per_head[:, 1] = torch.ones(16, 16, dtype=torch.bool).tril()
    with pytest.raises(NotImplementedError, match="differs between heads"):
        ours(q, k, v, attn_mask=per_head)
    holes = torch.ones(16, 16, dtype=torch.bool)
    holes[:, 5] = False
    with pytest.raises(NotImplementedError, match="contiguous"):
        ours(q, k, v, attn_mask=holes)
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        ours(q, k, v, attn_mask=holes, is_causal=True)
    with pytest.raises(ValueError, match="broadcast"):
        ours(q, k, v, attn_mask=torch.ones(3, 16, 16, dtype=torch.bool))


def test_compiled_with_is_causal_and_a_causal_bias():
    q, k, v = _inputs(6, (2, 4), 24, 40)
    compiled = torch.compile(lambda q, k, v: ours(q, k, v, is_causal=True), fullgraph=True)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    backend = cutlassfa.select_backend(q, k, v)
    assert _deviation(compiled(q, k, v), exact) <= bound_for(backend, "float32").rel_l2
    bias = causal_lower_right(24, 40)
    compiled = torch.compile(lambda q, k, v: ours(q, k, v, attn_mask=bias), fullgraph=True)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                           **_as_boolean({"attn_mask": bias}, 24, 40, q.device))
    assert _deviation(compiled(q, k, v), exact) <= bound_for(backend, "float32").rel_l2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_matches_sdpa(dtype):
    if not torch.cuda.is_available():
        pytest.skip("optional package torch: no CUDA device visible to PyTorch")
    tdtype = getattr(torch, dtype)
    for lq, ls in ((128, 128), (77, 300), (300, 77)):
        q, k, v = _inputs(lq + ls, (2, 8), lq, ls, e=128, heads_k=2, dtype=tdtype, device="cuda")
        for kwargs in ({}, {"is_causal": True}, {"attn_mask": causal_lower_right(lq, ls)}):
            _expect_like_sdpa(q, k, v, enable_gqa=True, **kwargs)
    q, k, v = _inputs(9, (3, 4), 64, 64, e=64, dtype=tdtype, device="cuda")
    keep = _padding(3, 64, left=(0, 7, 20)).cuda()
    _expect_like_sdpa(q, k, v, attn_mask=keep[:, None, None, :] & torch.ones(64, 64, dtype=torch.bool,
                                                                            device="cuda").tril())
    assert np.isfinite(ours(q, k, v).float().cpu().numpy()).all()
