"""`torch.ops.cutlassfa.forward`, `forward_append` (KV-cache appends, which write the caches) and
`varlen_forward`: registered, right fake shapes, torch.compile(fullgraph=True) equal to eager, a clear error
from autograd, and the routing that keeps eager calls off the operators. CPU tensors here (CI); the same on
CUDA tensors, plus CUDA-graph replay, under the `gpu` marker."""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
# inductor itself warns about torch.jit.script_method while compiling; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

import cutlassfa  # noqa: E402
from cutlassfa.check import bound_for  # noqa: E402
from cutlassfa.integrations import torch as cutlassfa_torch  # noqa: E402
from cutlassfa.reference import attention_reference, rel_l2, varlen_reference  # noqa: E402

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _qkv(rng, b, hq, hk, nq, nk, d, dtype="float32", device="cpu"):
    def tensor(shape):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(device, _DTYPES[dtype])

    return tensor((b, hq, nq, d)), tensor((b, hk, nk, d)), tensor((b, hk, nk, d))


def _host(t):
    """float32 numpy copy of a tensor's values (bfloat16 and float16 values are exact in float32)."""
    return t.detach().float().cpu().numpy()


def _expect_close(out, q, k, v, causal, dtype):
    """`out` against the fp64 reference, within the bound of the backend the call ran on."""
    qn, kn, vn = _host(q), _host(k), _host(v)
    ref, _ = attention_reference(qn, kn, vn, causal=causal)
    backend = cutlassfa.select_backend(qn, kn, vn, causal=causal) if q.device.type == "cpu" else \
        cutlassfa.select_backend(q, k, v, causal=causal)
    assert rel_l2(_host(out), ref) <= bound_for(backend, dtype).rel_l2


def _routes_cutlassfa_forward():
    """Whether cutlassfa.forward itself hands torch tensors to the operator while tracing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(1, 1, 4, 32)
        try:
            return isinstance(cutlassfa.forward(q, q, q), torch.Tensor)
        except (TypeError, ValueError, RuntimeError):
            return False


# --------------------------------------------------------------------------------------------------
# Registration and routing
# --------------------------------------------------------------------------------------------------

def test_import_cutlassfa_loads_no_framework():
    code = "import sys, cutlassfa; print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.stdout.strip() == "[]"


def test_operator_is_registered():
    schema = str(torch.ops.cutlassfa.forward.default._schema)
    for argument in ("Tensor q", "Tensor k", "Tensor v", "bool causal", "float? softmax_scale", "str backend",
                     "int[]? window", "float softcap", "Tensor? cache_seqlens", "Tensor? cache_leftpad"):
        assert argument in schema
    assert schema.endswith("-> (Tensor out, Tensor lse)")


def test_eager_calls_stay_off_the_operator(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 8, 8, 32)
    assert cutlassfa_torch.maybe_route(q, k, v) is None
    with torch.no_grad():
        assert cutlassfa_torch.maybe_route(q.requires_grad_(), k, v) is None
    routed = cutlassfa_torch.maybe_route(q, k, v, causal=True)  # q requires grad: autograd must see it
    assert routed is not None and routed.grad_fn is not None


# --------------------------------------------------------------------------------------------------
# Values on CPU tensors
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_eager_and_operator_match_reference(rng, dtype, causal):
    q, k, v = _qkv(rng, 2, 4, 2, 37, 50, 64, dtype)  # GQA, Nq != Nk
    eager = cutlassfa_torch.forward(q, k, v, causal=causal)
    through_op, lse = cutlassfa_torch.op_forward(q, k, v, causal=causal, return_lse=True)
    assert eager.dtype == through_op.dtype == q.dtype and eager.shape == q.shape
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    _expect_close(eager, q, k, v, causal, dtype)
    assert torch.equal(eager, through_op)


def test_operator_takes_3d_inputs_scale_and_out(rng):
    q, k, v = (t[:, 0] for t in _qkv(rng, 2, 1, 1, 20, 30, 32))
    out = torch.full_like(q, 7.0)
    result = cutlassfa_torch.op_forward(q, k, v, softmax_scale=0.3, out=out)
    assert result is out
    ref, _ = attention_reference(_host(q), _host(k), _host(v), softmax_scale=0.3)
    backend = cutlassfa.select_backend(q, k, v)  # host tensors run on the GPU when there is one
    assert rel_l2(_host(out), ref) <= bound_for(backend, "float32").rel_l2
    with pytest.raises(ValueError, match="out must have shape"):
        cutlassfa_torch.op_forward(q, k, v, out=torch.empty(2, 20, 64))


def test_operator_refuses_unknown_keyword(rng):
    q, k, v = _qkv(rng, 1, 1, 1, 4, 4, 32)
    with pytest.raises(NotImplementedError, match="'bogus' is not supported"):
        cutlassfa_torch.op_forward(q, k, v, bogus=1)
    with pytest.raises(ValueError, match="k_new and v_new must be given together"):
        cutlassfa_torch.op_forward(q, k, v, k_new=k[:, :, :1])


# --------------------------------------------------------------------------------------------------
# Appends to KV caches: forward_append writes its caches
# --------------------------------------------------------------------------------------------------

def _decode_step(rng, b=2, hq=4, hk=2, capacity=24, d=32):
    """q of one new token, k_new / v_new, zeroed caches (a fresh pair per call of `caches`), lengths."""
    q, k_new, v_new = _qkv(rng, b, hq, hk, 1, 1, d)
    lengths = torch.tensor([3, 11][:b], dtype=torch.int32)
    return q, k_new, v_new, lengths, lambda: (torch.zeros(b, hk, capacity, d), torch.zeros(b, hk, capacity, d))


def test_append_operator_writes_the_caches_as_eager_does(rng):
    q, k_new, v_new, lengths, caches = _decode_step(rng)
    (k1, v1), (k2, v2) = caches(), caches()
    kw = dict(k_new=k_new, v_new=v_new, cache_seqlens=lengths, causal=True, return_lse=True)
    eager, eager_lse = cutlassfa.forward(q, k1, v1, **kw)
    through_op, lse = cutlassfa_torch.op_forward(q, k2, v2, **kw)
    assert torch.equal(eager, through_op) and torch.equal(eager_lse, lse)
    assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert torch.equal(k2[1, :, 11], k_new[1, :, 0]) and torch.equal(v2[0, :, 3], v_new[0, :, 0])
    schema = str(torch.ops.cutlassfa.forward_append.default._schema)
    assert "Tensor(a!) k" in schema and "Tensor(b!) v" in schema


def test_append_compile_fullgraph_equals_eager(rng):
    """A decode step that appends its token compiles whole; the compiled step writes the caches as eager does."""
    q, k_new, v_new, lengths, caches = _decode_step(rng)

    def step(q, k_cache, v_cache, k_new, v_new, lengths):
        return cutlassfa.forward(q * 1.5, k_cache, v_cache, k_new=k_new, v_new=v_new, cache_seqlens=lengths,
                                 causal=True) + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    (k1, v1), (k2, v2) = caches(), caches()
    torch.testing.assert_close(compiled(q, k1, v1, k_new, v_new, lengths), step(q, k2, v2, k_new, v_new, lengths),
                               rtol=0, atol=0)
    assert torch.equal(k1, k2) and torch.equal(v1, v2) and k1.abs().sum() > 0
    results = torch.library.opcheck(torch.ops.cutlassfa.forward_append.default,
                                    (q, *caches(), k_new, v_new, True, None, "auto", None, 0.0, lengths))
    assert set(results.values()) == {"SUCCESS"}, results


def test_append_fake_validation_and_autograd(rng):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, cache, new = torch.empty(2, 4, 1, 64), torch.empty(2, 2, 24, 64), torch.empty(2, 2, 1, 64)
        lengths = torch.empty(2, dtype=torch.int32)
        out = cutlassfa.forward(q, cache, cache.clone(), k_new=new, v_new=new, cache_seqlens=lengths)
        assert out.shape == q.shape
        with pytest.raises(ValueError, match="k_new"):  # judged where the call is traced
            cutlassfa.forward(q, cache, cache.clone(), k_new=torch.empty(2, 2, 1, 32), v_new=new)
    q, k_new, v_new, lengths, caches = _decode_step(rng)
    with pytest.raises(NotImplementedError, match="has no backward pass"):  # before anything is written
        cutlassfa.forward(q.requires_grad_(), *caches(), k_new=k_new, v_new=v_new, cache_seqlens=lengths)


# --------------------------------------------------------------------------------------------------
# Fake tensors, torch.compile, autograd
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [
    ((2, 8, 33, 64), (2, 2, 70, 64)),  # GQA, Nq != Nk
    ((3, 17, 128), (3, 5, 128)),  # 3-D
])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fake_tensor_shapes(shapes, dtype):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    q_shape, kv_shape = shapes
    with FakeTensorMode():
        q = torch.empty(q_shape, dtype=_DTYPES[dtype])
        k = torch.empty(kv_shape, dtype=_DTYPES[dtype])
        out, lse = cutlassfa_torch.forward(q, k, k, causal=True, return_lse=True)
    assert isinstance(out, FakeTensor) and isinstance(lse, FakeTensor)
    assert out.shape == q_shape and out.dtype == _DTYPES[dtype] and out.is_contiguous()
    assert lse.shape == q_shape[:-1] and lse.dtype == torch.float32


def test_fake_tensor_refuses_mismatched_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(ValueError, match="same head dim"):
        cutlassfa_torch.forward(torch.empty(1, 1, 4, 64), torch.empty(1, 1, 4, 32), torch.empty(1, 1, 4, 32))


def _compiled_matches_eager(q, k, v, call):
    """compile(fullgraph=True) of a function around `call` equals the same function run eagerly, for
    two sequence lengths (the second may recompile with dynamic shapes)."""
    def attention_block(q, k, v):
        out, lse = call(q * 1.5, k, v, causal=True, return_lse=True)
        return out + 1.0, lse

    torch._dynamo.reset()
    compiled = torch.compile(attention_block, fullgraph=True)
    for n in (q.shape[2], q.shape[2] - 5):
        qs, ks, vs = q[:, :, :n], k[:, :, :n], v[:, :, :n]
        out, lse = compiled(qs, ks, vs)
        eager_out, eager_lse = attention_block(qs, ks, vs)
        torch.testing.assert_close(out, eager_out, rtol=0, atol=0)
        torch.testing.assert_close(lse, eager_lse, rtol=0, atol=0)
    return out


def test_compile_fullgraph_equals_eager(rng):
    q, k, v = _qkv(rng, 2, 4, 2, 40, 40, 32)
    _compiled_matches_eager(q, k, v, cutlassfa_torch.forward)


def test_compile_fullgraph_through_cutlassfa_forward(rng):
    if not _routes_cutlassfa_forward():
        pytest.skip("cutlassfa.forward does not call integrations.torch.maybe_route yet")
    q, k, v = _qkv(rng, 1, 2, 2, 24, 24, 32)
    _compiled_matches_eager(q, k, v, cutlassfa.forward)


def test_export_records_the_operator(rng):
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return cutlassfa_torch.forward(q, k, v, causal=True)

    q, k, v = _qkv(rng, 1, 2, 1, 16, 16, 32)
    exported = torch.export.export(Attention(), (q, k, v))
    targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
    assert "cutlassfa.forward.default" in targets
    assert torch.equal(exported.module()(q, k, v), cutlassfa_torch.forward(q, k, v, causal=True))


def test_autograd_raises_clear_error(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 16, 16, 32)
    k.requires_grad_()
    out = cutlassfa_torch.forward(q, k, v, causal=True)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="has no backward pass"):
        out.sum().backward()


def test_autograd_raises_clear_error_when_compiled(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 16, 16, 32)
    q.requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: cutlassfa_torch.forward(q, k, v) * 2, fullgraph=True)
    out = compiled(q, k, v)  # the forward runs: only the backward is missing
    torch.testing.assert_close(out.detach(), 2 * cutlassfa_torch.forward(q.detach(), k, v), rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="has no backward pass"):
        out.sum().backward()


# --------------------------------------------------------------------------------------------------
# varlen_forward's operator
# --------------------------------------------------------------------------------------------------

_LENGTHS = [5, 0, 17, 9, 1]  # an empty sequence and a single row among them


def _packed(rng, hq=4, hk=2, d=32, dtype="float32", lengths=_LENGTHS):
    """Packed q, k, v (total, H, d) of `lengths` and their int32 prefix sums."""
    total = sum(lengths)
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in _qkv(rng, 1, hq, hk, total, total, d, dtype))
    return q, k, v, torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)


def test_varlen_operator_is_registered():
    schema = str(torch.ops.cutlassfa.varlen_forward.default._schema)
    for argument in ("Tensor cu_seqlens_q", "Tensor cu_seqlens_k", "int? max_seqlen_q", "bool causal", "int[]? window",
                     "Tensor? sinks", "ScalarType? out_dtype"):
        assert argument in schema
    assert "cache_seqlens" not in schema and schema.endswith("-> (Tensor out, Tensor lse)")


@pytest.mark.parametrize("op", [torch.ops.cutlassfa.forward.default, torch.ops.cutlassfa.varlen_forward.default],
                         ids=["forward", "varlen_forward"])
def test_operators_pass_opcheck(rng, op):
    """torch.library.opcheck: schema, fake kernel against the real one, autograd registration, AOT dispatch."""
    q, k, v, cu = _packed(rng)
    dense = tuple(t[None].transpose(1, 2) for t in (q, k, v))  # (1, H, total, d)
    args = (q, k, v, cu, cu, 17, 17, True) if "varlen" in str(op) else (*dense, True)
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_varlen_operator_matches_eager_and_reference(rng, dtype):
    q, k, v, cu = _packed(rng, dtype=dtype)
    kw = dict(max_seqlen_q=17, max_seqlen_k=17, causal=True, window=(4, 0), return_lse=True)
    eager, eager_lse = cutlassfa.varlen_forward(q, k, v, cu, cu, **kw)
    through_op, lse = cutlassfa_torch.op_varlen_forward(q, k, v, cu, cu, **kw)
    assert through_op.shape == q.shape and through_op.dtype == q.dtype
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    assert torch.equal(eager, through_op) and torch.equal(eager_lse, lse)
    ref, _ = varlen_reference(_host(q), _host(k), _host(v), cu.numpy(), cu.numpy(), causal=True, window=(4, 0))
    assert rel_l2(_host(through_op), ref) <= bound_for("cpu", dtype).rel_l2
    hosted = cutlassfa_torch.op_varlen_forward(q, k, v, [int(x) for x in cu], cu.tolist(), causal=True)  # host ints
    assert torch.equal(hosted, cutlassfa.varlen_forward(q, k, v, cu, cu, causal=True))


def test_varlen_fake_tensor_shapes_and_validation():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        q, k, cu = torch.empty(31, 8, 64, dtype=torch.bfloat16), torch.empty(40, 2, 64, dtype=torch.bfloat16), \
            torch.empty(5, dtype=torch.int32)
        out, lse = cutlassfa.varlen_forward(q, k, k, cu, cu, max_seqlen_q=17, causal=True, return_lse=True)
        assert isinstance(out, FakeTensor) and out.shape == q.shape and out.dtype == torch.bfloat16
        assert lse.shape == (8, 31) and lse.dtype == torch.float32
        with pytest.raises(ValueError, match="head dim 32 differs"):  # judged where the call is traced
            cutlassfa.varlen_forward(q, torch.empty(40, 2, 32, dtype=torch.bfloat16),
                                     torch.empty(40, 2, 32, dtype=torch.bfloat16), cu, cu)


def test_varlen_compile_fullgraph_equals_eager(rng):
    """compile(fullgraph=True) of a block around `cutlassfa.varlen_forward` equals it run eagerly, for two
    batches of different totals."""
    def block(q, k, v, cu, longest):
        out, lse = cutlassfa.varlen_forward(q * 1.5, k, v, cu, cu, max_seqlen_q=longest, max_seqlen_k=longest,
                                            causal=True, return_lse=True)
        return out + 1.0, lse

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    for lengths in (_LENGTHS, [3, 12, 0, 7]):
        q, k, v, cu = _packed(rng, lengths=lengths)
        for got, expected in zip(compiled(q, k, v, cu, max(lengths)), block(q, k, v, cu, max(lengths))):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_varlen_autograd_raises_clear_error(rng):
    q, k, v, cu = _packed(rng)
    q.requires_grad_()
    out = cutlassfa.varlen_forward(q, k, v, cu, cu, causal=True)  # autograd must see the call: the operator
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="has no backward pass"):
        out.sum().backward()


# --------------------------------------------------------------------------------------------------
# CUDA tensors
# --------------------------------------------------------------------------------------------------

def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to PyTorch")
    status = cutlassfa.backends()["small_tile"]
    if not status.available:
        pytest.skip(f"no GPU backend: {status.reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_eager_operator_and_compile(rng, dtype, causal):
    _need_cuda()
    q, k, v = _qkv(rng, 2, 4, 2, 77, 130, 64, dtype, device="cuda")
    eager = cutlassfa_torch.forward(q, k, v, causal=causal)
    through_op = cutlassfa_torch.op_forward(q, k, v, causal=causal)
    _expect_close(eager, q, k, v, causal, dtype)
    assert eager.device == q.device and torch.equal(eager, through_op)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: cutlassfa_torch.forward(q, k, v, causal=causal), fullgraph=True)
    assert torch.equal(compiled(q, k, v), eager)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_varlen_eager_operator_and_compile(rng, dtype):
    _need_cuda()
    q, k, v, cu = (t.cuda() for t in _packed(rng, hq=8, hk=2, d=64, dtype=dtype))
    kw = dict(max_seqlen_q=17, max_seqlen_k=17, causal=True)
    eager = cutlassfa.varlen_forward(q, k, v, cu, cu, **kw)
    through_op = cutlassfa_torch.op_varlen_forward(q, k, v, cu, cu, **kw)
    assert eager.device == q.device and torch.equal(eager, through_op)
    ref, _ = varlen_reference(_host(q), _host(k), _host(v), cu.cpu().numpy(), cu.cpu().numpy(), causal=True)
    assert rel_l2(_host(eager), ref) <= bound_for(cutlassfa.select_backend(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                                           **kw), dtype).rel_l2
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, cu: cutlassfa.varlen_forward(q, k, v, cu, cu, **kw), fullgraph=True)
    assert torch.equal(compiled(q, k, v, cu), eager)


@pytest.mark.gpu
def test_cuda_append_operator_and_compile(rng):
    """forward_append on CUDA caches: the operator and a compiled step write the caches as the eager call does."""
    _need_cuda()
    q, k_new, v_new, lengths, caches = (x.cuda() if isinstance(x, torch.Tensor) else x for x in _decode_step(rng))
    kw = dict(k_new=k_new.half(), v_new=v_new.half(), cache_seqlens=lengths.cuda(), causal=True)
    (k1, v1), (k2, v2), (k3, v3) = (tuple(t.cuda().half() for t in caches()) for _ in range(3))
    eager = cutlassfa.forward(q.half(), k1, v1, **kw)
    assert torch.equal(eager, cutlassfa_torch.op_forward(q.half(), k2, v2, **kw))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: cutlassfa.forward(q, k, v, **kw), fullgraph=True)
    assert torch.equal(compiled(q.half(), k3, v3), eager)
    assert all(torch.equal(a, b) for a, b in ((k1, k2), (v1, v2), (k1, k3), (v1, v3)))


@pytest.mark.gpu
def test_cuda_fake_shapes_and_autograd(rng):
    _need_cuda()
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _qkv(rng, 1, 4, 1, 33, 65, 128, "bfloat16", device="cuda")
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out, lse = cutlassfa_torch.forward(fq, fk, fv, return_lse=True)
    assert out.shape == q.shape and out.device == q.device and lse.shape == q.shape[:-1]
    with pytest.raises(NotImplementedError, match="has no backward pass"):
        cutlassfa_torch.forward(q.requires_grad_(), k, v).sum().backward()


@pytest.mark.gpu
@pytest.mark.parametrize("through_operator", [False, True])
def test_cuda_graph_replay_equals_fresh_call(rng, through_operator):
    _need_cuda()
    call = cutlassfa_torch.op_forward if through_operator else cutlassfa_torch.forward
    q, k, v = _qkv(rng, 2, 4, 2, 200, 200, 64, "float16", device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(q, k, v, causal=True)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(q, k, v, causal=True)
    for _ in range(2):  # new inputs in the captured buffers, then replay
        fresh_q, fresh_k, fresh_v = _qkv(rng, 2, 4, 2, 200, 200, 64, "float16", device="cuda")
        q.copy_(fresh_q), k.copy_(fresh_k), v.copy_(fresh_v)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, cutlassfa_torch.forward(fresh_q, fresh_k, fresh_v, causal=True))
