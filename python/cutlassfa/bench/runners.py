"""Runners: one per row name. Ours go through the public `cutlassfa.forward`; the anchors are
`torch.nn.functional.scaled_dot_product_attention` restricted to one SDPA backend at a time, and for
sliding windows (which no SDPA backend skips: a dense mask computes all N^2 pairs) FlexAttention with a
block mask (`flex`); FlashAttention-4 (`fa4`, flash_attn.cute, when installed); cuDNN's fp8 graph
(`cudnn_e4m3`, the cudnn frontend, when installed; asked for by name). `read` is no attention: a
plain read of K and V, the same-run bandwidth ceiling of decode. Rows named `<row>_sinks` (tensorcore_sinks,
fa4_sinks, ...) make the same call with attention sinks, `<row>_alibi` with ALiBi slopes (`term_values`, one
per query head, on the device), `<row>_fp8` (ours) against an fp8 (e4m3) copy of K and V as a KV cache
(`fp8_roundtrip`: the values times FP8_SCALE, descale 1 / FP8_SCALE per K/V head), `<row>_fp8attn` (ours)
fp8 attention on e4m3 copies of q, K and V the same way, the output in the case's dtype, so that a term's
cost is timed interleaved with the plain call and the peers'.

Ours, read and fa4 are fed the case's own arrays (feeds.py): a paged case's page pools with cache_seqlens and
block_table, a varlen batch's packed arrays with cu_seqlens_q and cu_seqlens_k. The other anchors are fed the
dense equivalent: the gathered cache, or one (1, H, n, d) view a sequence, with an SDPA call per sequence;
GQA always through `enable_gqa=True`, never by repeating heads."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

import numpy as np

from .._inputs import Case, Unsupported
from .feeds import kind_of
from .frames import Frame

OUR_BACKENDS = ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive", "cpu")
# Row name -> torch.nn.attention.SDPBackend member.
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_math": "MATH",
}
FLEX = "flex"  # torch.nn.attention.flex_attention, compiled, with a block mask of the case's mask
FA4 = "fa4"  # FlashAttention-4's flash_attn.cute (dense batches as (B, N, H, d) views, varlen ones packed)
# rows with attention sinks (ours, fa4) / ALiBi / an fp8 cache (ours) / fp8 attention (ours)
SINKS, ALIBI, FP8, FP8_ATTN = "_sinks", "_alibi", "_fp8", "_fp8attn"
FP8_CACHE = "fp8_cache"  # the fp8 rows' term: not an argument of forward, K and V as an e4m3 cache
FP8_ATTENTION = "fp8_attention"  # the fp8attn rows' term: q, K and V e4m3
# row suffix -> forward's argument (or FP8_CACHE, FP8_ATTENTION)
TERMS = {SINKS: "sinks", ALIBI: "alibi_slopes", FP8: FP8_CACHE, FP8_ATTN: FP8_ATTENTION}
# The fp8 rows' cache: K and V times FP8_SCALE rounded to e4m3, k_descale = v_descale = 1 / FP8_SCALE (a power
# of two: the dequantized values are the e4m3 ones scaled exactly). The bench's values, ~N(0, 1), stay far
# inside e4m3's range (448) and mostly above its subnormals (2^-6).
FP8_SCALE = 32.0
# cuDNN's fp8 attention (its frontend's sdpa_fp8 graph, the `cudnn` package): e4m3 copies of q, K and V as
# the fp8attn rows take them; e4m3 out on Hopper, which bounds its accuracy (rules.FP8_OUT_REL_L2).
CUDNN_FP8 = "cudnn_e4m3"
ANCHORS = tuple(SDPA_BACKENDS) + (FLEX, FA4, FA4 + SINKS, CUDNN_FP8)
READ = "read"  # no attention: K and V streamed once by torch sums, the bandwidth ceiling of a decode row
ALL_BACKENDS = OUR_BACKENDS + ANCHORS + (READ,) + tuple(name + suffix for suffix in TERMS for name in OUR_BACKENDS)


def split_term(name: str) -> tuple[str, str | None]:
    """A row name as (backend, forward argument of its score term or None): "tensorcore_alibi" ->
    ("tensorcore", "alibi_slopes")."""
    for suffix, term in TERMS.items():
        if name.endswith(suffix):
            return name.removesuffix(suffix), term
    return name, None


OWN, DENSE = "own", "dense"  # what a runner is fed: the case's own arrays, or their dense equivalent


@dataclass
class Runner:
    """`prepare(case)` returns call(q, k, v, *index arrays) -> out (`feed` OWN) or call(q, k, v) on the
    dense equivalent (`feed` DENSE); calls run inside `context()`. `on_gpu`: fed the frame's GPU arrays
    (else host numpy arrays). `attention`: its out is attention's, to be checked against the reference
    (not so for `read`). `term`: the forward argument the call adds, term_values(case, term) (checked
    against the reference with it), or None."""

    name: str
    prepare: Callable[[Case], Callable[..., Any]]
    on_gpu: bool = True
    context: Callable[[], ContextManager] = contextlib.nullcontext
    attention: bool = True
    feed: str = OWN
    term: str | None = None


def sink_values(case: Case) -> np.ndarray:
    """The sink rows' (H,) float32 sinks: fixed per head count, one head without (-inf), the others from
    -1 to 3 (around the scores' log-sum-exp at the bench's sizes, so that each changes the result)."""
    values = np.linspace(-1.0, 3.0, case.H).astype(np.float32)
    values[0] = -np.inf
    return values


def term_values(case: Case, term: str) -> np.ndarray:
    """(H,) float32 values of a row's score term: the sinks, or ALiBi slopes as Bloom's (2^-8/H .. 2^-8)."""
    if term == "sinks":
        return sink_values(case)
    return (2.0 ** (-8.0 * np.arange(1, case.H + 1) / case.H)).astype(np.float32)


def _host_e4m3(x: np.ndarray) -> np.ndarray:
    """Host values as the fp8 rows' caches hold them: times FP8_SCALE, rounded to e4m3."""
    from .._arrays import numpy_dtype

    return (np.asarray(x, np.float32) * np.float32(FP8_SCALE)).astype(numpy_dtype("float8_e4m3fn"))


def fp8_roundtrip(x: np.ndarray) -> np.ndarray:
    """Host values as the fp8 rows' caches hold them, dequantized (float64): the reference of those rows."""
    return _host_e4m3(x).astype(np.float64) / FP8_SCALE


def _e4m3_copies(*arrays: Any, heads_kv: int) -> tuple[Any, ...]:
    """The arrays as the fp8 rows hold them (times FP8_SCALE, rounded to e4m3), and their (heads_kv,)
    descale, on the first one's device and framework."""
    first = arrays[0]
    if type(first).__module__.startswith("torch"):
        import torch

        descale = torch.full((heads_kv,), 1.0 / FP8_SCALE, dtype=torch.float32, device=first.device)
        return (*((x.float() * FP8_SCALE).to(torch.float8_e4m3fn) for x in arrays), descale)
    if isinstance(first, np.ndarray):
        return (*(_host_e4m3(x) for x in arrays), np.full(heads_kv, 1.0 / FP8_SCALE, np.float32))
    raise Unsupported("the fp8 rows take PyTorch tensors or numpy arrays")


def _heads_kv(case: Case, k: Any) -> int:
    """The K/V heads of `case`'s k as it is fed: (B, Hkv, N, d), a page pool (pages, Hkv, page_size, d), a
    packed varlen batch (total, Hkv, d); a 3-D (B, N, d) is one head."""
    return k.shape[1] if k.ndim == 4 or kind_of(case) == "varlen" else 1


def _device_values(case: Case, term: str, like: Any) -> Any:
    """term_values on `like`'s device and framework (made once per prepare, outside the timing)."""
    values = term_values(case, term)
    if type(like).__module__.startswith("torch"):
        import torch

        return torch.from_numpy(values).to(like.device)
    if type(like).__module__.startswith("cupy"):
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.asarray(values)
    return values


def ours(name: str, term: str | None = None) -> Runner:
    def prepare(case: Case) -> Callable[..., Any]:
        call = plain(case)
        if term is None:
            return call
        if term == FP8_CACHE:
            return with_fp8_cache(case, call)
        if term == FP8_ATTENTION:
            return with_fp8_attention(case, call)
        if kind_of(case) != "dense":
            raise Unsupported("the score-term rows run dense cases (prefill and decode grids)")
        held: list[Any] = []

        def with_term(q: Any, k: Any, v: Any) -> Any:
            if not held:
                held.append(_device_values(case, term, q))
            return call(q, k, v, **{term: held[0]})

        return with_term

    def with_fp8_cache(case: Case, call: Callable[..., Any]) -> Callable[..., Any]:
        """The call against e4m3 copies of K and V (made once per input copy, outside the timing); a dense
        case's K and V become full caches (cache_seqlens = Nk)."""
        import cutlassfa

        kind = kind_of(case)
        if kind == "varlen" or (kind == "dense" and (case.window is not None or case.softcap)):
            raise Unsupported("the fp8 rows run KV caches, and dense cases without a window or softcap")
        held: dict[int, tuple[Any, ...]] = {}

        def fp8(q: Any, k: Any, v: Any, *index: Any) -> Any:
            if id(k) not in held:
                k8, v8, descale = _e4m3_copies(k, v, heads_kv=_heads_kv(case, k))
                lengths = index or (_full_lengths(case, q),)
                held[id(k)] = (k8, v8, descale, lengths)
            k8, v8, descale, lengths = held[id(k)]
            if kind == "dense":
                return cutlassfa.forward(q, k8, v8, causal=case.causal, cache_seqlens=lengths[0], k_descale=descale,
                                         v_descale=descale, backend=name)
            return call(q, k8, v8, *lengths, k_descale=descale, v_descale=descale)

        return fp8

    def with_fp8_attention(case: Case, call: Callable[..., Any]) -> Callable[..., Any]:
        """The call on e4m3 copies of q, K and V (made once per input copy, outside the timing), descales
        1 / FP8_SCALE, the output in the case's dtype."""
        if case.softcap:
            raise Unsupported("fp8 attention takes no softcap")
        held: dict[int, tuple[Any, ...]] = {}

        def fp8(q: Any, k: Any, v: Any, *index: Any) -> Any:
            if id(q) not in held:
                held[id(q)] = _e4m3_copies(q, k, v, heads_kv=_heads_kv(case, k))
            q8, k8, v8, descale = held[id(q)]
            return call(q8, k8, v8, *index, q_descale=descale, k_descale=descale, v_descale=descale,
                        out_dtype=case.dtype)

        return fp8

    def plain(case: Case) -> Callable[..., Any]:
        import cutlassfa

        kind, options = kind_of(case), dict(call_options(case), backend=name)
        if kind in ("paged", "kvcache"):
            return lambda q, k, v, cache_seqlens, block_table=None, **kw: cutlassfa.forward(
                q, k, v, cache_seqlens=cache_seqlens, block_table=block_table, **options, **kw)
        if kind == "varlen":
            return lambda q, k, v, cu_seqlens_q, cu_seqlens_k, **kw: cutlassfa.varlen_forward(
                q, k, v, cu_seqlens_q, cu_seqlens_k, **options, **kw)
        return lambda q, k, v, **kw: cutlassfa.forward(q, k, v, **options, **kw)

    suffix = {value: key for key, value in TERMS.items()}.get(term, "")
    return Runner(name + suffix, prepare, on_gpu=name != "cpu", term=term)


def call_options(case: Case) -> dict[str, Any]:
    """The keyword arguments our rows call forward / varlen_forward with for `case`, beside the arrays and
    the index arrays: the mask, and a varlen batch's longest lengths as host ints, as a serving stack passes
    them (without them the grid covers the totals: varlen_forward's docstring)."""
    kind = kind_of(case)
    options: dict[str, Any] = {"causal": case.causal}
    if kind == "varlen":
        options.update(max_seqlen_q=max(case.variant.seqlens_q), max_seqlen_k=max(case.variant.seqlens_k))
    elif case.window is not None:
        options["window"] = case.window
    if kind != "varlen" and case.softcap:
        options["softcap"] = case.softcap
    return options


def _full_lengths(case: Case, like: Any) -> Any:
    """cache_seqlens of a dense case's K and V as full caches: (B,) int32 Nk, on q's device (made there: an
    input copy first seen inside a CUDA graph's capture may not copy from the host)."""
    if type(like).__module__.startswith("torch"):
        import torch

        return torch.full((case.B,), case.Nk, dtype=torch.int32, device=like.device)
    return np.full(case.B, case.Nk, np.int32)


def fa4(sinks: bool = False) -> Runner:
    """FlashAttention-4 (flash_attn.cute) fed our arrays: flash_attn_func on (B, N, H, d) views of a dense
    batch (its layout; no copy), returning (B, H, N, d) views of its output; flash_attn_varlen_func on a
    varlen batch's packed (total, H, d) arrays with cu_seqlens_q / cu_seqlens_k and the longest lengths as
    host ints (as ours are called). Bottom-right causal as ours, GQA natively, windows, softcap,
    `learnable_sink` for the sink row. Raises ImportError when it is not installed."""
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    def prepare(case: Case) -> Callable[..., Any]:
        kind = kind_of(case)
        if kind not in ("dense", "varlen"):
            raise Unsupported("fa4 here takes dense and varlen batches")
        left, right = case.window or (-1, -1)
        options = dict(causal=case.causal, window_size=(None if left < 0 else left, None if right < 0 else right),
                       softcap=case.softcap)
        held: list[Any] = []

        def sink_of(q: Any) -> Any:
            if sinks and not held:
                held.append(_device_values(case, "sinks", q))
            return held[0] if sinks else None

        def first(out: Any) -> Any:
            return out[0] if isinstance(out, tuple) else out

        if kind == "varlen":
            lengths = dict(max_seqlen_q=max(case.variant.seqlens_q), max_seqlen_k=max(case.variant.seqlens_k))
            return lambda q, k, v, cu_seqlens_q, cu_seqlens_k: first(flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, learnable_sink=sink_of(q), **lengths,
                **options))
        return lambda q, k, v: first(flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     learnable_sink=sink_of(q), **options)).transpose(1, 2)

    return Runner(FA4 + SINKS if sinks else FA4, prepare, on_gpu=True, term="sinks" if sinks else None)


def cudnn_fp8() -> Runner:
    """cuDNN's fp8 attention graph (`cudnn.pygraph().sdpa_fp8`) on e4m3 copies of the dense q, K and V (times
    FP8_SCALE, descales 1 / FP8_SCALE per tensor: cuDNN takes one scale a tensor), P quantized with scale 448
    (its largest value, 1, to e4m3's largest), the output e4m3 unscaled (Hopper's graph writes fp8 out). Dense
    batches; causal only with Nq = Nk (its mask is top-left aligned); the copies and the graph are made once,
    outside the timing. Raises ImportError when the `cudnn` package is not installed."""
    import cudnn
    import torch

    e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    handle = cudnn.create_handle()

    def prepare(case: Case) -> Callable[[Any, Any, Any], Any]:
        if kind_of(case) != "dense" or case.window is not None or case.softcap:
            raise Unsupported("cudnn_e4m3 here takes dense batches without a window or softcap")
        if case.causal and case.Nq != case.Nk:
            raise Unsupported("cuDNN's causal mask is top-left aligned: Nq must equal Nk")
        held: dict[int, tuple[Any, ...]] = {}
        graph_of: list[Any] = []

        def build(q8: Any, k8: Any, v8: Any, out: Any, scalars: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32,
                                  handle=handle)
            tensors = {name: graph.tensor(name=name, dim=list(x.shape), stride=list(x.stride()), data_type=e4m3)
                       for name, x in (("q", q8), ("k", k8), ("v", v8))}
            tensors.update({name: graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32)
                            for name in scalars})
            o, _, amax_s, amax_o = graph.sdpa_fp8(
                q=tensors["q"], k=tensors["k"], v=tensors["v"], descale_q=tensors["descale_q"],
                descale_k=tensors["descale_k"], descale_v=tensors["descale_v"], descale_s=tensors["descale_s"],
                scale_s=tensors["scale_s"], scale_o=tensors["scale_o"], is_inference=True,
                attn_scale=1.0 / case.d ** 0.5, use_causal_mask=case.causal)
            o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride())).set_data_type(e4m3)
            for amax in (amax_s, amax_o):
                amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans()
            return graph, {**tensors, "o": o, "amax_s": amax_s, "amax_o": amax_o}

        def call(q: Any, k: Any, v: Any) -> Any:
            if id(q) not in held:  # e4m3 copies, the scales, the output and the graph's workspace
                q8, k8, v8 = ((x.float() * FP8_SCALE).to(torch.float8_e4m3fn) for x in (q, k, v))
                one = dict(dtype=torch.float32, device=q.device)
                scalars = {name: torch.full((1, 1, 1, 1), value, **one) for name, value in
                           (("descale_q", 1 / FP8_SCALE), ("descale_k", 1 / FP8_SCALE), ("descale_v", 1 / FP8_SCALE),
                            ("descale_s", 1 / 448), ("scale_s", 448.0), ("scale_o", 1.0))}
                out = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
                if not graph_of:
                    graph_of.extend(build(q8, k8, v8, out, scalars))
                graph, tensors = graph_of
                buffers = {"q": q8, "k": k8, "v": v8, "o": out, **scalars,
                           "amax_s": torch.empty((1, 1, 1, 1), **one), "amax_o": torch.empty((1, 1, 1, 1), **one)}
                workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=q.device)
                held[id(q)] = ({tensors[name]: x for name, x in buffers.items()}, workspace, out)
            pack, workspace, out = held[id(q)]
            cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(q.device).cuda_stream)
            graph_of[0].execute(pack, workspace, handle=handle)
            return out

        return call

    return Runner(CUDNN_FP8, prepare, on_gpu=True, feed=DENSE, term=FP8_ATTENTION)


def sdpa(name: str) -> Runner:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    member = getattr(SDPBackend, SDPA_BACKENDS[name], None)
    if member is None:
        raise Unsupported(f"this PyTorch ({torch.__version__}) has no SDPBackend.{SDPA_BACKENDS[name]}")

    def options(case: Case, nq: int, nk: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if case.causal and nq != nk:
            # PyTorch's is_causal is top-left aligned; ours is bottom-right as FlashAttention-2.
            from torch.nn.attention.bias import causal_lower_right

            kwargs["attn_mask"] = causal_lower_right(nq, nk)
        elif case.causal:
            kwargs["is_causal"] = True
        if case.H != case.Hk:
            kwargs["enable_gqa"] = True
        return kwargs

    def prepare(case: Case) -> Callable[[Any, Any, Any], Any]:
        if case.window is not None:
            raise Unsupported("SDPA has no sliding-window kernel (a dense mask computes all N^2 pairs; "
                              "the anchor for windows is flex)")
        if case.softcap:
            raise Unsupported("SDPA has no softcap (the anchors for it are flex and fa4)")
        if kind_of(case) == "varlen":
            # One call per sequence, the batch timed as a whole: SDPA has no varlen entry point with GQA.
            per_sequence = [options(case, nq, nk) for nq, nk in zip(case.variant.seqlens_q, case.variant.seqlens_k)]
            return lambda qs, ks, vs: [F.scaled_dot_product_attention(q, k, v, **kwargs)
                                       for q, k, v, kwargs in zip(qs, ks, vs, per_sequence)]
        kwargs = options(case, case.Nq, case.Nk)
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs)

    @contextlib.contextmanager
    def context() -> Any:
        with sdpa_kernel(member), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Flash attention kernel not used because ..."
            yield

    return Runner(name, prepare, on_gpu=True, context=context, feed=DENSE)


_compiled_flex: list[Callable] = []


def flex(compiled: bool = True) -> Runner:
    """FlexAttention (torch.compile'd once per process) with a block mask of the case's causal mask and
    window, bottom-right aligned as ours (the kernel skips the blocks the mask empties), and softcap as a
    score_mod. compiled=False:
    the unfused eager form (materializes the scores; the CPU tests check the mask with it)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def prepare(case: Case) -> Callable[[Any, Any, Any], Any]:
        if kind_of(case) == "varlen":
            raise Unsupported("flex here takes dense batches; the varlen anchors are the sdpa rows")
        if compiled and not _compiled_flex:
            _compiled_flex.append(torch.compile(flex_attention))
        attention = _compiled_flex[0] if compiled else flex_attention
        offset = case.Nk - case.Nq
        left, right = case.window or (-1, -1)
        if case.causal:  # window (left, 0): forward refuses a causal call with right > 0
            right = 0

        def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            position = q_idx + offset
            seen = kv_idx >= 0
            if left >= 0:
                seen = seen & (kv_idx >= position - left)
            if right >= 0:
                seen = seen & (kv_idx <= position + right)
            return seen

        cap = case.softcap

        def softcap_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return cap * torch.tanh(score / cap)  # flex's score is already scaled, as ours before the cap

        blocks: list[Any] = []

        def call(q: Any, k: Any, v: Any) -> Any:
            if not blocks:  # built on the inputs' device, once
                blocks.append(create_block_mask(mask_mod, B=None, H=None, Q_LEN=case.Nq, KV_LEN=case.Nk,
                                                device=q.device))
            return attention(q, k, v, block_mask=blocks[0], enable_gqa=case.H != case.Hk,
                             score_mod=softcap_mod if cap else None)

        return call

    return Runner(FLEX, prepare, on_gpu=True, feed=DENSE)


def read() -> Runner:
    """K and V each summed as integers: one pass over the bytes a decode call must read (a reduction reads
    and writes nothing back, so it runs at the read rate of HBM), timed with the attention rows on the same
    input copies: for a paged case, the page pools our rows read. Returns the two int64 sums."""

    def prepare(case: Case) -> Callable[..., Any]:
        return lambda q, k, v, *index: (as_words(k).sum(), as_words(v).sum())

    return Runner(READ, prepare, on_gpu=True, attention=False)


def as_words(x: Any) -> Any:
    """A contiguous tensor's bytes viewed (no copy) as the widest integers their count allows, int64 when
    it can: wide loads, and an integer sum meets no NaN or inf in the bit patterns."""
    import torch

    flat = x.reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    word = next(t for t in (torch.int64, torch.int32, torch.int16, torch.uint8) if nbytes % t.itemsize == 0)
    return flat.view(word)


# The rows that take PyTorch CUDA tensors, each with its runner's maker and what the row says when the
# maker cannot import its package (or this PyTorch lacks the SDPA backend).
_TORCH_ANCHORS: dict[str, tuple[Callable[[], Runner], str]] = {
    FLEX: (lambda: flex(), "{}"),
    READ: (lambda: read(), "{}"),
    FA4: (lambda: fa4(), "FlashAttention-4 is not installed ({})"),
    FA4 + SINKS: (lambda: fa4(sinks=True), "FlashAttention-4 is not installed ({})"),
    CUDNN_FP8: (lambda: cudnn_fp8(), "cuDNN's frontend is not installed ({})"),
    **{name: ((lambda name=name: sdpa(name)), "{}") for name in SDPA_BACKENDS},
}


def make_runners(names: Sequence[str], frame: Frame) -> tuple[list[Runner], dict[str, str]]:
    """Runners for the requested names that can run here, and {name: why not} for the others."""
    import cutlassfa

    statuses = cutlassfa.backends()
    runners, unavailable = [], {}
    for name in names:
        if name in _TORCH_ANCHORS:
            make, missing = _TORCH_ANCHORS[name]
            if frame.name != "torch":
                unavailable[name] = "needs PyTorch with CUDA"
                continue
            try:
                runners.append(make())
            except (ImportError, Unsupported) as error:
                unavailable[name] = missing.format(error)
        elif split_term(name)[0] in statuses:
            backend, term = split_term(name)
            if not statuses[backend].available:
                unavailable[name] = statuses[backend].reason
            elif backend != "cpu" and not frame.on_gpu:
                unavailable[name] = "needs PyTorch or CuPy for device arrays"
            else:
                runners.append(ours(backend, term))
        else:
            unavailable[name] = "unknown backend"
    return runners, unavailable


def select_backends(requested: Sequence[str] | None, *, flex: bool = False, decode: bool = False) -> list[str]:
    """Row names of a run: the requested ones ('sdpa' meaning the four sdpa_* rows), or all of them but the
    sink rows and the fp8 anchor (cudnn_e4m3: fp8 against the case's dtype is asked for by name); flex (a
    torch.compile per shape) only when asked for, or for the runs whose anchor it is (`flex`: windows, which
    SDPA cannot express, and speculative decoding); read only when asked for, or for a decode run, paged
    ones included (a bandwidth ceiling means nothing to compute-bound prefill)."""
    if not requested:
        return [name for name in ALL_BACKENDS
                if (name != FLEX or flex) and (name != READ or decode) and name != CUDNN_FP8
                and split_term(name)[1] is None]
    names: list[str] = []
    for name in requested:
        names += list(SDPA_BACKENDS) if name == "sdpa" else [name]
    return list(dict.fromkeys(names))
