"""The "cutlassfa" attention implementation of transformers, on small random-initialised models:
logits within 2x SDPA's deviation from eager (plus one unit roundoff), greedy generation equal to
eager's, and every mask either computed exactly or refused. On the CPU (float32, bfloat16) with the
`cpu` backend, so that the answer is the same on any machine; under the `gpu` marker on CUDA, float32
with a CUDA-core backend (the tensor-core kernels round fp32 inputs to fp16 pieces, far beyond SDPA's
fp32 deviation) and bfloat16 with `auto`.

Tests that need a forward argument cutlassfa does not have yet (window=, softcap=, cache_seqlens=,
cache_leftpad=) skip with the argument's name and run once it lands; until then the adapter must refuse
those layers, which other tests check."""

import copy
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import cutlassfa  # noqa: E402
from cutlassfa.integrations import transformers as cutlassfa_hf  # noqa: E402
from cutlassfa.integrations._mask_plan import MaskRows, plan, rows_of_visible  # noqa: E402

from transformers import (AutoModelForCausalLM, AutoModelForMaskedLM, BertConfig, Gemma2Config,  # noqa: E402
                          GptOssConfig, LlamaConfig, MistralConfig, masking_utils)

cutlassfa_hf.register()  # "cutlassfa": backend auto
cutlassfa_hf.register("cutlassfa_cpu", backend="cpu")
cutlassfa_hf.register("cutlassfa_large_tile", backend="large_tile")
_OURS = "cutlassfa_cpu"


def _exact_attention(module, query, key, value, attention_mask, scaling=None, softcap=None, **kwargs):
    """Attention in float64 (GQA, scaling, softcap, a boolean mask), rounded once to the input dtype:
    the baseline for models without SDPA (Gemma 2's softcap)."""
    q, k, v = (x.double() for x in (query, key, value))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(2, 3) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, -torch.inf)
    weights = torch.softmax(scores, -1).nan_to_num(0.0)  # rows that see no key: 0
    return (weights @ v).to(query.dtype).transpose(1, 2).contiguous(), None


def _boolean_mask(*args, allow_is_causal_skip=None, **kwargs):
    return masking_utils.sdpa_mask(*args, allow_is_causal_skip=False, **kwargs)  # always a mask, never None


transformers.AttentionInterface.register("exact_float64", _exact_attention)
masking_utils.AttentionMaskInterface.register("exact_float64", _boolean_mask)

_UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}
_VOCAB = 96


def _llama(**overrides):
    return LlamaConfig(vocab_size=_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       initializer_range=0.1, pad_token_id=0, **overrides)  # GQA 4/2, head dim 32


def _mistral(window=8):
    return MistralConfig(vocab_size=_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=window,
                         max_position_embeddings=256, initializer_range=0.1, pad_token_id=0)


def _gemma2(softcap=2.0, window=8):
    # A small softcap against scores of a few units, so that capping changes the result.
    return Gemma2Config(vocab_size=_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32,
                        sliding_window=window, attn_logit_softcapping=softcap, final_logit_softcapping=None,
                        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256,
                        initializer_range=0.1, pad_token_id=0)


def _gpt_oss():
    # Eager experts: the grouped-GEMM ones take no float64 (the reference runs the model in float64). Every
    # token takes every expert: a top-k choice among fewer would flip with rounding (a discontinuity that
    # moved a bfloat16 run's logits 8x more than attention's own error, seed 1000148184).
    return GptOssConfig(vocab_size=_VOCAB, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=2,
                        num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                        max_position_embeddings=256, initializer_range=0.1, pad_token_id=0,
                        experts_implementation="eager")


def _expect_close_to_float64_eager(rng, config, ids, dtype, ours, device="cpu"):
    """gpt-oss's check: the logits of `ours` in `dtype` deviate from the float64 eager model's at most 2x
    as much as the eager model's in `dtype` do (plus one unit roundoff). The learned sinks are drawn
    around the scores' scale (the initializer leaves them near 0); with them removed the float64 logits
    must move far more than the float32 bound (what the test would miss if the adapter ignored s_aux)."""
    torch.manual_seed(int(rng.integers(2**31)))
    base = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager")
    sink_params = [m.sinks for m in base.modules() if isinstance(getattr(m, "sinks", None), torch.nn.Parameter)]
    assert sink_params, "the model has no attention sinks"
    with torch.no_grad():
        for sinks in sink_params:
            sinks.normal_(1.0, 2.0)

    def logits(name, run_dtype, state=None):
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=name)
        model.load_state_dict(state or base.state_dict())
        return _logits(model.to(device, run_dtype).eval(), ids)

    reference = logits("eager", torch.float64)
    real = torch.ones(ids.shape, dtype=torch.bool)
    allowed = _deviation(logits("eager", dtype), reference, real)
    deviation = _deviation(logits(ours, dtype), reference, real)
    bound = 2 * allowed + _UNIT_ROUNDOFF[dtype]
    assert deviation <= bound, f"cutlassfa {deviation:.3g} vs eager {dtype} {allowed:.3g}"
    if dtype == torch.float32:  # bfloat16's own deviation is too wide to tell
        without = {name: (torch.full_like(value, -torch.inf) if name.endswith(".sinks") else value)
                   for name, value in base.state_dict().items()}
        assert _deviation(logits("eager", torch.float64, without), reference, real) > 10 * bound


def _bert():
    return BertConfig(vocab_size=_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=64, initializer_range=0.1, pad_token_id=0)


def _models(rng, config, implementations, dtype=torch.float32, device="cpu"):
    """One random model per attention implementation, all with the same weights."""
    auto = AutoModelForMaskedLM if isinstance(config, BertConfig) else AutoModelForCausalLM
    torch.manual_seed(int(rng.integers(2**31)))
    base = auto.from_config(copy.deepcopy(config), attn_implementation="eager")
    models = {}
    for name in implementations:
        model = auto.from_config(copy.deepcopy(config), attn_implementation=name)
        model.load_state_dict(base.state_dict())
        models[name] = model.to(device, dtype).eval()
    return models


def _logits(model, ids, mask=None):
    with torch.no_grad():
        mask = None if mask is None else mask.to(model.device)
        return model(ids.to(model.device), attention_mask=mask).logits.double().cpu()


def _deviation(logits, reference, real):
    """rel-L2 of logits against reference over the real (not padding) positions."""
    return float((logits[real] - reference[real]).norm() / reference[real].norm())


def _inputs(rng, batch, length, left_pad=(), right_pad=()):
    ids = torch.from_numpy(rng.integers(1, _VOCAB, (batch, length)))
    mask = torch.ones(batch, length, dtype=torch.long)
    for row, pad in enumerate(left_pad):
        mask[row, :pad], ids[row, :pad] = 0, 0
    for row, pad in enumerate(right_pad):
        if pad:
            mask[row, -pad:], ids[row, -pad:] = 0, 0
    return ids, mask


def _expect_logits_close(rng, config, ids, mask=None, dtype=torch.float32, baseline="sdpa", must_differ=None,
                         ours=_OURS, device="cpu"):
    """The logits of implementation `ours` deviate from eager's at most 2x as much as `baseline`'s do,
    plus one unit roundoff, over the real (not padding) positions. baseline "exact_float64" (attention
    in float64) for models without SDPA. `must_differ`: a config whose eager logits must be farther
    than that bound (what the test would miss if the adapter ignored the feature)."""
    real = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
    models = _models(rng, config, ["eager", ours, baseline], dtype, device)
    eager, ours = _logits(models["eager"], ids, mask), _logits(models[ours], ids, mask)
    deviation, allowed = _deviation(ours, eager, real), _deviation(_logits(models[baseline], ids, mask), eager, real)
    bound = 2 * allowed + _UNIT_ROUNDOFF[dtype]
    assert deviation <= bound, f"cutlassfa {deviation:.3g} vs {baseline} {allowed:.3g}"
    if must_differ is not None:
        other = _models(rng, must_differ, ["eager"], dtype, device)["eager"]
        other.load_state_dict(models["eager"].state_dict())
        assert _deviation(_logits(other, ids, mask), eager, real) > 10 * bound


def _expect_same_generation(rng, config, ids, mask=None, new_tokens=8, ours=_OURS, device="cpu",
                            grad_mode=torch.no_grad, compiled=False, **options):
    """Greedy generation (under `grad_mode`) picks eager's tokens; a difference is only allowed where
    eager's two best logits are closer than the logits' deviation (a tie). `options` go to generate.
    compiled: `ours` generates as transformers does on a GPU with a static cache (masks built ahead of each
    step, the step compiled whole: fullgraph), and compiled once if compiled == "once"."""
    models = _models(rng, config, ["eager", ours], device=device)
    ids, mask = ids.to(device), None if mask is None else mask.to(device)
    with grad_mode():
        kwargs = dict(attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **options)
        expected = models["eager"].generate(ids, **kwargs).cpu()
        if compiled:
            compile_config = transformers.CompileConfig(backend="aot_eager", mode=None, fullgraph=True)
            compile_config._compile_all_devices = True  # transformers compiles on accelerators only
            kwargs.update(cache_implementation="static", compile_config=compile_config)
            torch._dynamo.reset()
        with torch._dynamo.config.patch(error_on_recompile=compiled == "once"):
            got = models[ours].generate(ids, **kwargs).cpu()
    if torch.equal(got, expected):
        return
    step = int((got != expected).any(0).nonzero()[0])
    prefix = expected[:, :step]
    prefix_mask = None if mask is None else torch.nn.functional.pad(mask.cpu(), (0, step - mask.shape[1]), value=1)
    last = _logits(models["eager"], prefix, prefix_mask)[:, -1]
    row = int((got[:, step] != expected[:, step]).nonzero()[0])
    gap = float(last[row, expected[row, step]] - last[row, got[row, step]])
    assert gap <= 1e-5 * float(last[row].abs().max()), f"generation differs at step {step} (logit gap {gap:.3g})"


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_gqa_logits(rng, dtype):
    ids, _ = _inputs(rng, 2, 40)
    _expect_logits_close(rng, _llama(), ids, dtype=dtype)


def test_llama_right_padding_logits(rng):
    # Causal and right-padded: real queries never see the padding keys, one dense call is exact.
    ids, mask = _inputs(rng, 3, 33, right_pad=(0, 5, 11))
    _expect_logits_close(rng, _llama(), ids, mask)


def test_llama_greedy_generation(rng):
    ids, _ = _inputs(rng, 2, 12)
    _expect_same_generation(rng, _llama(), ids)


def test_llama_generation_with_a_static_cache(rng):
    # The keys are the whole static cache: each step sees only its filled part (a decode step planned
    # without a read, from the padding).
    ids, mask = _inputs(rng, 3, 12, left_pad=(0, 2, 5))
    _expect_same_generation(rng, _llama(), ids, mask, cache_implementation="static")


def test_static_cache_decode_step_refuses_a_mask_with_a_hole(rng):
    """A static cache's decode step is planned without a read as causal over left-padded entries; a 2-D mask
    with a hole inside an entry stops it with the plan's assertion instead of another answer."""
    config = _llama()
    model = AutoModelForCausalLM.from_config(config, attn_implementation=_OURS).eval()
    ids, mask = _inputs(rng, 2, 6)
    cache = transformers.StaticCache(config=config, max_cache_len=16)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, past_key_values=cache, cache_position=torch.arange(6))
        holed = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        holed[1, 2] = 0
        with pytest.raises(RuntimeError, match="left-padded entries only"):
            model(input_ids=ids[:, :1], attention_mask=holed, past_key_values=cache, cache_position=torch.tensor([6]))


def test_llama_left_padding_logits_and_generation(rng):
    ids, mask = _inputs(rng, 3, 30, left_pad=(0, 4, 13))
    _expect_logits_close(rng, _llama(), ids, mask)
    _expect_same_generation(rng, _llama(), ids, mask)


@pytest.mark.parametrize("config", [_llama, _mistral], ids=["llama", "mistral_window"])
def test_packed_sequences_from_position_ids(rng, config):
    """Sequences packed in each row, told apart by position_ids (no cache, no 2-D mask): one varlen call
    over every row's sequences, logits as eager's block-diagonal mask gives them."""
    lengths = [[5, 12, 7], [24], [3, 21]]
    ids, _ = _inputs(rng, 3, 24)
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])
    models = _models(rng, config(), ["eager", _OURS, "sdpa"])
    with torch.no_grad():
        logits = {name: model(ids, position_ids=positions, use_cache=False).logits.double()
                  for name, model in models.items()}
    real = torch.ones(ids.shape, dtype=torch.bool)
    allowed = _deviation(logits["sdpa"], logits["eager"], real)
    assert _deviation(logits[_OURS], logits["eager"], real) <= 2 * allowed + _UNIT_ROUNDOFF[torch.float32]
    with torch.no_grad():  # the packing matters: one sequence per row gives other logits
        whole = models["eager"](ids, use_cache=False).logits.double()
    assert _deviation(whole, logits["eager"], real) > 100 * (2 * allowed + _UNIT_ROUNDOFF[torch.float32])


def test_llama_generation_under_inference_mode(rng):
    # Inference tensors carry no version counter; the adapter's plan cache must not ask them for one.
    ids, mask = _inputs(rng, 3, 20, left_pad=(0, 3, 9))
    _expect_same_generation(rng, _llama(), ids, mask, grad_mode=torch.inference_mode)


def test_static_cache_decode_step_compiles_whole(rng):
    """A static cache's decode step under torch.compile (fullgraph: no graph break, the mask planned on the
    device) gives eager's logits; a mask the compiled plan cannot express (a hole in an entry's keys) stops
    the step with the plan's assertion instead of an answer to another mask."""
    config = _llama()
    model = AutoModelForCausalLM.from_config(config, attn_implementation=_OURS).eval()
    ids, mask = _inputs(rng, 2, 6, left_pad=(0, 2))

    def step(cache, token, step_mask, position):
        return model(input_ids=token, attention_mask=step_mask, past_key_values=cache, use_cache=True,
                     cache_position=position).logits

    def prefilled():  # a cache counts its updates: each run gets its own
        cache = transformers.StaticCache(config=config, max_cache_len=16)
        return cache, step(cache, ids, mask, torch.arange(6))[:, -1:].argmax(-1)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    step_mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    position = torch.tensor([6])
    with torch.no_grad():
        eager = step(*prefilled(), step_mask, position)
        torch.testing.assert_close(compiled(*prefilled(), step_mask, position), eager, rtol=1e-5, atol=1e-5)
        holed = step_mask.clone()
        holed[0, 3] = 0
        with pytest.raises(RuntimeError, match="left-padded entries only"):
            compiled(*prefilled(), holed, position)


# transformers' sliding static cache recompiles the step as it fills (its guard on the filled length).
@pytest.mark.parametrize("config, compiled", [(_llama, "once"), (lambda: _mistral(window=8), True)],
                         ids=["llama", "mistral_window"])
def test_static_cache_generate_compiled(rng, config, compiled):
    """generate with a static cache, compiled as transformers compiles it (the masks built before each step
    with a tensor offset, not read; every layer plans its mask on the device): eager's tokens, left padding
    and a window that hides keys included."""
    ids, mask = _inputs(rng, 3, 14, left_pad=(0, 3, 6))
    _expect_same_generation(rng, config(), ids, mask, new_tokens=10, compiled=compiled)


def test_bert_bidirectional_logits(rng):
    ids, _ = _inputs(rng, 2, 24)
    _expect_logits_close(rng, _bert(), ids)


def test_bert_right_padding_logits(rng):
    ids, mask = _inputs(rng, 3, 24, right_pad=(0, 6, 15))
    _expect_logits_close(rng, _bert(), ids, mask)


def test_llama_padding_on_both_sides(rng):
    # Real tokens in the middle: the padding queries at the end would see the real keys, so the real
    # rows and keys of each entry are packed for varlen_forward.
    ids, mask = _inputs(rng, 3, 20, left_pad=(0, 3, 6), right_pad=(4, 0, 2))
    _expect_logits_close(rng, _llama(), ids, mask)


def test_mistral_window_wider_than_the_sequence(rng):
    # Every key lies inside the window: no window argument is needed.
    ids, _ = _inputs(rng, 2, 16)
    _expect_logits_close(rng, _mistral(window=16), ids)


def test_mistral_sliding_window(rng):
    ids, _ = _inputs(rng, 2, 40)
    _expect_logits_close(rng, _mistral(window=8), ids, must_differ=_mistral(window=64))
    _expect_same_generation(rng, _mistral(window=8), ids[:, :12], new_tokens=10)


def test_mistral_sliding_window_left_padding(rng):
    ids, mask = _inputs(rng, 2, 30, left_pad=(0, 7))
    _expect_logits_close(rng, _mistral(window=8), ids, mask)
    _expect_same_generation(rng, _mistral(window=8), ids, mask)


def test_gemma2_softcap_and_sliding_window(rng):
    ids, _ = _inputs(rng, 2, 40)
    _expect_logits_close(rng, _gemma2(), ids, baseline="exact_float64", must_differ=_gemma2(softcap=None))
    _expect_same_generation(rng, _gemma2(), ids[:, :12], new_tokens=10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpt_oss_sinks_logits(rng, dtype):
    _expect_close_to_float64_eager(rng, _gpt_oss(), _inputs(rng, 2, 40)[0], dtype, _OURS)


def test_gemma2_left_padding(rng):
    ids, mask = _inputs(rng, 2, 30, left_pad=(5, 0))
    _expect_logits_close(rng, _gemma2(), ids, mask, baseline="exact_float64")


# --------------------------------------------------------------------------------------------------
# On a GPU
# --------------------------------------------------------------------------------------------------

_GPU = [(torch.float32, "cutlassfa_large_tile"), (torch.bfloat16, "cutlassfa")]


def _need_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to PyTorch")
    for backend in ("large_tile", "tensorcore"):
        if not cutlassfa.backends()[backend].available:
            pytest.skip(f"{backend}: {cutlassfa.backends()[backend].reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, ours", _GPU)
def test_gpu_llama_logits(rng, dtype, ours):
    _need_gpu()
    ids, mask = _inputs(rng, 3, 64, right_pad=(0, 9, 30))
    _expect_logits_close(rng, _llama(), ids, dtype=dtype, ours=ours, device="cuda")
    _expect_logits_close(rng, _llama(), ids, mask, dtype=dtype, ours=ours, device="cuda")


@pytest.mark.gpu
def test_gpu_llama_generation(rng):
    _need_gpu()
    _expect_same_generation(rng, _llama(), _inputs(rng, 2, 16)[0], ours="cutlassfa_large_tile", device="cuda")


@pytest.mark.gpu
def test_gpu_static_cache_generation_compiled(rng):
    """On CUDA, generate compiles a static cache's decode steps itself (inductor, CUDA graphs): the plan
    made in the mask interface, handed to the compiled step as a tensor, gives eager's tokens."""
    _need_gpu()
    from torch._dynamo.utils import counters

    ids, mask = _inputs(rng, 3, 16, left_pad=(0, 3, 7))
    counters.clear()
    _expect_same_generation(rng, _llama(), ids, mask, new_tokens=12, ours="cutlassfa_large_tile", device="cuda",
                            cache_implementation="static")
    assert not counters["graph_break"], dict(counters["graph_break"])  # the steps compiled whole
    assert counters["stats"]["unique_graphs"] >= 2  # both models' steps were compiled


_SYNCHRONIZING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


@pytest.mark.gpu
@pytest.mark.parametrize("config", [_llama, _mistral], ids=["llama", "mistral_sliding_cache"])
def test_gpu_decode_step_attention_never_synchronizes(rng, config):
    """A decode step of a left-padded batch (Mistral: past its sliding window, a cache that drops keys): no
    host synchronization inside the layers' attention calls, whoever makes it (torch, the extension): the
    CUDA runtime calls the profiler records within each call's range."""
    _need_gpu()
    ids, mask = _inputs(rng, 3, 24, left_pad=(0, 5, 11))
    ids, mask = ids.cuda(), mask.cuda()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(), attn_implementation="cutlassfa")
    model = model.to("cuda", torch.bfloat16).eval()

    def traced(*args, **kwargs):
        with torch.profiler.record_function("cutlassfa_layer"):
            return cutlassfa_hf.attention_forward(*args, **kwargs)

    transformers.AttentionInterface.register("cutlassfa_traced", traced)
    masking_utils.AttentionMaskInterface.register("cutlassfa_traced", cutlassfa_hf.attention_mask)
    model.set_attn_implementation("cutlassfa_traced")
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        cache, step = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(2):  # the second step is profiled (the first initialises what is lazy)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as profile:
                out = model(input_ids=step, attention_mask=mask, past_key_values=cache, use_cache=True)
                torch.cuda.synchronize()
            cache, step = out.past_key_values, out.logits[:, -1:].argmax(-1)
    events = profile.events()
    layers = [e.time_range for e in events
              if e.name == "cutlassfa_layer" and e.device_type == torch.autograd.DeviceType.CPU]
    assert len(layers) == model.config.num_hidden_layers
    inside = [e.name for e in events if e.name.startswith(_SYNCHRONIZING)
              and any(r.start <= e.time_range.start <= r.end for r in layers)]
    assert inside == []
    assert any(e.name.startswith("cudaLaunchKernel") or "Launch" in e.name for e in events
               if any(r.start <= e.time_range.start <= r.end for r in layers))  # the runtime calls are recorded


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, ours", _GPU)
def test_gpu_llama_left_padding(rng, dtype, ours):
    _need_gpu()
    ids, mask = _inputs(rng, 3, 40, left_pad=(0, 6, 17))
    _expect_logits_close(rng, _llama(), ids, mask, dtype=dtype, ours=ours, device="cuda")
    if dtype == torch.float32:
        _expect_same_generation(rng, _llama(), ids, mask, ours=ours, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, ours", _GPU)
def test_gpu_mistral_sliding_window(rng, dtype, ours):
    _need_gpu()
    ids, _ = _inputs(rng, 2, 64)
    _expect_logits_close(rng, _mistral(window=16), ids, dtype=dtype, ours=ours, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, ours", _GPU)
def test_gpu_gemma2_softcap_and_sliding_window(rng, dtype, ours):
    _need_gpu()
    ids, _ = _inputs(rng, 2, 64)
    _expect_logits_close(rng, _gemma2(window=16), ids, dtype=dtype, baseline="exact_float64", ours=ours,
                         device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, ours", _GPU)
@pytest.mark.parametrize("pad", ["right_pad", "left_pad"])
def test_gpu_sliding_window_models_with_padding(rng, dtype, ours, pad):
    # Mistral and Gemma 2 (window 16 under sequences of 64) with padded rows: logits, and greedy
    # generation in fp32 (decode steps attend through the KV cache path). Generating after right
    # padding leaves pad keys between a row's prompt and its new tokens, a key set that is not one
    # range: refused, never computed differently.
    _need_gpu()
    ids, mask = _inputs(rng, 3, 64, **{pad: (0, 9, 30)})
    _expect_logits_close(rng, _mistral(window=16), ids, mask, dtype=dtype, ours=ours, device="cuda")
    _expect_logits_close(rng, _gemma2(window=16), ids, mask, dtype=dtype, baseline="exact_float64", ours=ours,
                         device="cuda")
    if dtype != torch.float32:
        return
    for config in (_mistral(window=16), _gemma2(window=16)):
        if pad == "left_pad":
            _expect_same_generation(rng, config, ids, mask, ours=ours, device="cuda")
        else:
            with pytest.raises(NotImplementedError, match="contiguous range"):
                _expect_same_generation(rng, config, ids, mask, ours=ours, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, ours", _GPU)
def test_gpu_gpt_oss_sinks_logits(rng, dtype, ours):
    _need_gpu()
    _expect_close_to_float64_eager(rng, _gpt_oss(), _inputs(rng, 3, 96)[0], dtype, ours, device="cuda")


# --------------------------------------------------------------------------------------------------
# Refusals: never a different answer
# --------------------------------------------------------------------------------------------------

def _run(rng, config, ids, mask=None):
    with torch.no_grad():
        return _models(rng, config, [_OURS])[_OURS](ids, attention_mask=mask)


def test_mask_with_a_hole_refused(rng):
    ids, mask = _inputs(rng, 2, 20)
    mask[0, 7] = 0  # a padding token in the middle: keys of one query in two ranges
    with pytest.raises(NotImplementedError, match="contiguous"):
        _run(rng, _llama(), ids, mask)


def test_decode_step_with_a_hole_refused(rng):
    """A decode step whose entry's keys are not one run (right-padded prompts, then generated tokens): its
    one-query plan reads that and the mask is planned whole, which refuses it."""
    ids, mask = _inputs(rng, 2, 12, right_pad=(3, 0))
    model = _models(rng, _llama(), [_OURS])[_OURS]
    with torch.no_grad():
        cache = transformers.DynamicCache(config=model.config)
        model(ids, attention_mask=mask, past_key_values=cache)
        step_mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        with pytest.raises(NotImplementedError, match="contiguous"):
            model(ids[:, :1], attention_mask=step_mask, past_key_values=cache)


def test_a_decode_steps_plan_serves_only_its_layers():
    """An eager decode step's plan travels without its mask: a layer it does not fit (a window), or the
    plan sliced by model code (which drops it), is refused instead of planned from an empty mask."""
    padding = _padding([3, 0], [0, 0], 10)
    given = cutlassfa_hf.attention_mask(2, 1, 10, q_offset=9, mask_function=_CAUSAL, attention_mask=padding)
    assert cutlassfa_hf._plan_for(given, 2, 1, 10, True, None, 0).kind == "cache"
    with pytest.raises(NotImplementedError, match="planned this decode step"):
        cutlassfa_hf._plan_for(given, 2, 1, 10, True, 3, 0)
    with pytest.raises(NotImplementedError, match="sliced"):
        cutlassfa_hf._plan_for(given[:, :, :, :10], 2, 1, 10, True, None, 0)


def test_four_dimensional_masks(rng):
    """A 4-D mask a caller built (transformers passes it through): a causal one, boolean or additive, is
    computed and matches eager's; one with a bias is refused."""
    ids, _ = _inputs(rng, 2, 20)
    allowed = torch.ones(20, 20, dtype=torch.bool).tril()[None, None].expand(2, 1, 20, 20)
    additive = torch.zeros(2, 1, 20, 20).masked_fill(~allowed, torch.finfo(torch.float32).min)
    models = _models(rng, _llama(), ["eager", _OURS])
    real = torch.ones(ids.shape, dtype=torch.bool)
    eager = _logits(models["eager"], ids, additive)  # eager adds the mask to the scores
    for mask in (allowed, additive):
        assert _deviation(_logits(models[_OURS], ids, mask), eager, real) < 1e-5
    with pytest.raises(NotImplementedError, match="bias"):
        _logits(models[_OURS], ids, additive + 0.5 * allowed)


# --------------------------------------------------------------------------------------------------
# The mask -> call plans, against forward's documented semantics
# --------------------------------------------------------------------------------------------------

def _visible_by_plan(layout, batch, nq, nk):
    """The keys each query sees under `layout`, from forward's and varlen_forward's documented
    semantics (written independently of the planner): within the key range of an entry, query t of Lq
    sits on key start + t + Lk - Lq (bottom-right); causal hides later keys, window=(left, right) keys
    farther than left before / right after (-1 unbounded)."""
    left, right = layout.window if layout.window is not None else (-1, -1)
    visible = np.zeros((batch, nq, nk), dtype=bool)
    if layout.kind == "packed":  # varlen over the B x N rows: sequence [s, e) is rows s.. of entry s // N
        bounds = layout.cu_seqlens.tolist()
        for s, e in zip(bounds[:-1], bounds[1:]):
            b, first = divmod(s, nq)
            assert (e - 1) // nq == b, "a sequence crosses entries"
            for t in range(e - s):
                for u in range(e - s):
                    hidden = (layout.causal and u > t) or (left >= 0 and u < t - left) or (right >= 0 and u > t + right)
                    visible[b, first + t, first + u] = not hidden
        return visible
    for b in range(batch):
        start, end = (0, nk) if layout.kind == "dense" else (int(layout.key_start[b]), int(layout.key_end[b]))
        rows = range(nq) if layout.kind != "varlen" else range(int(layout.query_start[b]), int(layout.query_end[b]))
        for t, i in enumerate(rows):
            diagonal = start + t + (end - start) - len(rows)
            for j in range(start, end):
                hidden = (layout.causal and j > diagonal) or (left >= 0 and j < diagonal - left) or \
                    (right >= 0 and j > diagonal + right)
                visible[b, i, j] = not hidden
    return visible


def _padding(lefts, rights, length):
    mask = torch.ones(len(lefts), length, dtype=torch.bool)
    for row, (left, right) in enumerate(zip(lefts, rights)):
        mask[row, :left] = False
        if right:
            mask[row, length - right:] = False
    return mask


_CAUSAL, _FULL = masking_utils.causal_mask_function, masking_utils.bidirectional_mask_function
_SLIDING = masking_utils.sliding_window_causal_mask_function
_SLIDING_FULL = masking_utils.sliding_window_bidirectional_mask_function
_CASES = {  # name: (mask function, causal, layer window, Nq, Nk, q_offset, kv_offset, 2-D padding, form)
    "causal": (_CAUSAL, True, None, 9, 9, 0, 0, None, "dense"),
    "causal, right padding": (_CAUSAL, True, None, 9, 9, 0, 0, _padding([0, 0], [3, 0], 9), "dense"),
    "causal, left padding": (_CAUSAL, True, None, 9, 9, 0, 0, _padding([2, 0, 5], [0, 0, 0], 9), "cache"),
    "causal, both sides": (_CAUSAL, True, None, 9, 9, 0, 0, _padding([2, 0], [3, 1], 9), "varlen"),
    "decode, left padding": (_CAUSAL, True, None, 1, 10, 9, 0, _padding([4, 0], [0, 0], 10), "cache"),
    "decode": (_CAUSAL, True, None, 1, 10, 9, 0, None, "dense"),
    "decode, no padding": (_CAUSAL, True, None, 1, 10, 9, 0, _padding([0, 0], [0, 0], 10), "dense"),
    "decode, left padding, empty slots": (_CAUSAL, True, None, 1, 12, 9, 0, _padding([4, 0], [0, 0], 10), "cache"),
    "chunk after a cache": (_CAUSAL, True, None, 3, 10, 7, 0, _padding([4, 0], [0, 0], 10), "cache"),
    "static cache, 5 of 12 slots": (_CAUSAL, True, None, 2, 12, 3, 0, _padding([1, 0], [0, 0], 5), "cache"),
    "sliding window": (_SLIDING(4), True, 3, 9, 9, 0, 0, None, "dense"),
    "sliding window wider than N": (_SLIDING(12), True, 11, 9, 9, 0, 0, None, "dense"),
    "sliding window, left padding": (_SLIDING(4), True, 3, 9, 9, 0, 0, _padding([3, 0], [0, 0], 9), "cache"),
    "sliding cache, decode": (_SLIDING(4), True, 3, 1, 4, 20, 17, None, "dense"),
    # transformers' 2-D mask is indexed by position: the layer's keys are positions 17-20
    "sliding cache, decode, left padding": (_SLIDING(4), True, 3, 1, 4, 20, 17, _padding([3, 0], [0, 0], 21), "dense"),
    "sliding cache, decode, padding in it": (_SLIDING(4), True, 3, 1, 4, 20, 17, _padding([19, 0], [0, 0], 21),
                                             "cache"),
    "chunked attention (Llama-4)": (masking_utils.chunked_causal_mask_function(3, torch.zeros(1, dtype=torch.long)),
                                    True, None, 9, 9, 0, 0, None, "packed"),
    "packed sequences": (masking_utils.and_masks(_CAUSAL, masking_utils.packed_sequence_mask_function(
        torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2], [0] * 9]))), True, None, 9, 9, 0, 0, None, "packed"),
    "packed sequences, sliding window": (masking_utils.and_masks(_SLIDING(3), masking_utils.packed_sequence_mask_function(
        torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1, 1, 1]]))), True, 2, 9, 9, 0, 0, None, "packed"),
    "bidirectional, right padding": (_FULL, False, None, 9, 9, 0, 0, _padding([0, 0], [4, 0], 9), "cache"),
    "bidirectional sliding window": (_SLIDING_FULL(2), False, 2, 9, 9, 0, 0, None, "dense"),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_plan_computes_exactly_the_mask(case):
    """Both planners against the mask transformers would build: `plan` on the mask's rows (the form the
    case names), and what a layer gets from the adapter's mask interface (`_plan_for`: the padded-causal
    plan where the mask is causal over each entry's last keys, else `plan`)."""
    function, causal, window, nq, nk, q_offset, kv_offset, padding, form = _CASES[case]
    batch = 1 if padding is None else padding.shape[0]
    local_size = window + 1 if causal and window is not None else None  # transformers' sliding window
    given = cutlassfa_hf.attention_mask(batch, nq, nk, q_offset=q_offset, kv_offset=kv_offset, mask_function=function,
                                        attention_mask=padding, local_size=local_size)
    dense = masking_utils.sdpa_mask(batch, nq, nk, q_offset=q_offset, kv_offset=kv_offset, mask_function=function,
                                    attention_mask=padding, allow_is_causal_skip=False)[:, 0]
    matters = cutlassfa_hf._real_queries(masking_utils.prepare_padding_mask(padding, nk, kv_offset), batch, nq,
                                         q_offset, "cpu")
    left, right = (None, None) if window is None else ((window, 0) if causal else (window, window))
    layout = plan(rows_of_visible(dense, matters), nq, nk, causal, left, right)
    assert layout.kind == form
    assert matters.sum() > 0
    rows = matters.numpy()
    np.testing.assert_array_equal(_visible_by_plan(layout, batch, nq, nk)[rows], dense.numpy()[rows])
    fast = getattr(given, "cutlassfa_padded_causal", None)
    assert (fast is not None) == (causal and form != "packed")  # the causal cases pad each entry at its ends
    layer = cutlassfa_hf._plan_for(given, batch, nq, nk, causal, left, right)
    assert fast is None or layer is fast.plan
    np.testing.assert_array_equal(_visible_by_plan(layer, batch, nq, nk)[rows], dense.numpy()[rows])


@pytest.mark.parametrize("case", [name for name, (_, causal, *_, form) in _CASES.items()
                                  if causal and form != "packed"])
def test_causal_skip_only_where_the_mask_is_the_layers_own(case):
    """With transformers' `allow_is_causal_skip` (which it passes with its causal and sliding-window masks),
    the mask interface returns None (no mask: every layer runs its own causal pattern, planned without a
    read) only where the mask is that pattern, bottom-right: a subset of where transformers lets SDPA skip
    it (not its static-cache case, which is top-left)."""
    function, causal, window, nq, nk, q_offset, kv_offset, padding, _ = _CASES[case]
    batch = 1 if padding is None else padding.shape[0]
    local_size = window + 1 if causal and window is not None else None
    given = cutlassfa_hf.attention_mask(batch, nq, nk, q_offset=q_offset, kv_offset=kv_offset, mask_function=function,
                                        attention_mask=padding, local_size=local_size, allow_is_causal_skip=True)
    sdpa = masking_utils.sdpa_mask(batch, nq, nk, q_offset=q_offset, kv_offset=kv_offset, mask_function=function,
                                   attention_mask=padding, local_size=local_size, allow_is_causal_skip=True)
    if given is not None:
        return  # planned from the mask, as without the skip (test_plan_computes_exactly_the_mask)
    assert sdpa is None
    dense = masking_utils.sdpa_mask(batch, nq, nk, q_offset=q_offset, kv_offset=kv_offset, mask_function=function,
                                    attention_mask=padding, allow_is_causal_skip=False)[:, 0]
    left = None if window is None else window
    layer = cutlassfa_hf._plan_for(None, batch, nq, nk, causal, left, 0)
    assert layer.kind == "dense"
    np.testing.assert_array_equal(_visible_by_plan(layer, batch, nq, nk), dense.numpy())


def test_causal_skip_cases():
    """The skip fires for a plain prefill, a decode step and a window wider than the keys; not with padding,
    a window that hides keys, or an empty static cache's slots."""
    def skipped(nq, nk, q_offset=0, kv_offset=0, padding=None, local_size=None):
        return cutlassfa_hf.attention_mask(1 if padding is None else padding.shape[0], nq, nk, q_offset=q_offset,
                                           kv_offset=kv_offset, attention_mask=padding, local_size=local_size,
                                           allow_is_causal_skip=True) is None
    assert skipped(9, 9) and skipped(1, 10, q_offset=9) and skipped(9, 9, local_size=12)
    assert skipped(1, 4, q_offset=20, kv_offset=17, padding=_padding([3, 0], [0, 0], 21))  # padding before the keys
    assert not skipped(9, 9, padding=_padding([2, 0], [0, 0], 9))
    assert not skipped(1, 4, q_offset=20, kv_offset=17, padding=_padding([3, 0], [0, 0], 21), local_size=4)
    assert not skipped(3, 12, padding=_padding([0], [0], 3))  # static cache: 3 prompt tokens, 12 slots
    assert not skipped(3, 9, q_offset=6)  # a chunk after a cache: transformers' mask, planned


@pytest.mark.parametrize("nq, nk, causal, left, right, window", [
    (1, 10, True, None, 0, None), (1, 10, True, 3, 0, (3, 0)), (1, 10, True, 9, 0, None), (9, 9, True, 8, 0, None),
    (9, 9, True, 7, 0, (7, 0)), (9, 9, False, 2, 2, (2, 2)), (9, 9, False, None, 8, None),
    (9, 9, False, None, 7, (-1, 7)),
    (1, 10, False, 9, 0, None), (1, 10, False, 8, 0, (8, -1)), (3, 10, False, None, 2, None)])
def test_plan_without_a_mask_keeps_the_windows_that_hide_keys(nq, nk, causal, left, right, window):
    layout = plan(None, nq, nk, causal, left, right)
    assert (layout.kind, layout.causal, layout.window) == ("dense", causal, window)
    full = _visible_by_plan(dataclasses.replace(layout, window=None), 1, nq, nk)
    left_edge = np.arange(nq)[:, None] + nk - nq - (nk if left is None else left)
    right_edge = np.arange(nq)[:, None] + nk - nq + (0 if causal else nk if right is None else right)
    key = np.arange(nk)[None]
    expected = (key >= left_edge) & (key <= right_edge)
    np.testing.assert_array_equal(_visible_by_plan(layout, 1, nq, nk)[0], expected)
    assert (window is None) == bool((full[0] == expected).all())


def test_plan_refuses_masks_it_cannot_express():
    # Image tokens 2-4 of 9 see each other both ways, text tokens causally (Gemma-3 style): no form
    # cutlassfa computes (a bidirectional block inside a causal mask).
    image = masking_utils.or_masks(_CAUSAL, masking_utils.blockwise_overlay(torch.tensor([[-1, -1, 0, 0, 0] + [-1] * 4])))
    big = 1 << 13  # Nq x Nk past the adapter's one-block size: the mask comes packed as rows
    blocks = torch.tensor([[-1, -1, 0, 0, 0] + [-1] * (big - 5)])
    mask = cutlassfa_hf.attention_mask(1, big, big, mask_function=masking_utils.or_masks(
        _CAUSAL, masking_utils.blockwise_overlay(blocks)))
    with pytest.raises(NotImplementedError, match="not one cutlassfa can express"):
        plan(MaskRows.unpack(mask, big), big, big, True)
    mask = cutlassfa_hf.attention_mask(1, 9, 9, mask_function=image)  # one block: not the padded-causal plan
    assert getattr(mask, "cutlassfa_padded_causal", None) is None
    with pytest.raises(NotImplementedError, match="not one cutlassfa can express"):
        cutlassfa_hf._plan_for(mask, 1, 9, 9, True, None, 0)
    mask = cutlassfa_hf.attention_mask(1, 9, 9, mask_function=_SLIDING(4))  # no local_size: not recognised
    with pytest.raises(NotImplementedError, match="sliding window|not one cutlassfa"):
        cutlassfa_hf._plan_for(mask, 1, 9, 9, True, None, 0)  # the layer claims no window
    # A packed mask of rows for 9 keys given to a layer of 12 (checked on the device, with the rest)
    rows = MaskRows.unpack(cutlassfa_hf.attention_mask(1, big, big), 12)
    with pytest.raises(NotImplementedError, match="another number of keys"):
        plan(rows, big, 12, True)
