"""`cutlassfa bench --e2e`: transformers models built from their configs (random weights, no download) run
with ``attn_implementation="sdpa"`` (``"eager"`` for models transformers runs on no SDPA: Gemma-2) and
``"cutlassfa"`` on the same weights and inputs, in one run.

Per workload (model, batch, prompt, new tokens): the prefill time, `generate`'s tokens/s, the time of a
decode step, attention's share of a step, and how many greedy tokens the two implementations agree on.
Method: rounds interleave the implementations (the baseline, cutlassfa, and ``none``, an attention returning
zeros whose step time leaves attention out: its speed over the baseline, the row's ceiling, is what any
attention could reach); each round times one prefill forward and one `generate` of
`new_tokens` tokens (min_new_tokens = max_new_tokens), between device synchronizations; medians over
rounds. A decode step is (generate - prefill) / (new_tokens - 1); attention's share of a step is
1 - step(none) / step(implementation). The host's speed drifts by more than the differences measured (a step
is mostly host time), so each round also gives paired ratios (the baseline's time over ours, within the
round; the order of the implementations rotates from round to round), reported as median and quartiles.
Prompts are left-padded (entry b of B by b x prompt / (4 B) tokens), as batched generation pads them; the
cache class is the one `generate` picks for the model, the same for every implementation.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Workload", "GPU_WORKLOADS", "CPU_WORKLOADS", "run_e2e", "e2e_table", "baseline_of"]

_NONE = "cutlassfa_bench_none"  # the registered name of the zero attention


@dataclass(frozen=True)
class Workload:
    model: str  # "llama", "mistral", "gemma2" (below)
    batch: int
    prompt: int
    new_tokens: int  # 0: prefill only
    size: str = "gpu"  # "gpu": the model sizes; "tiny": a CPU smoke size
    cache: str = ""  # generate's cache_implementation ("static": on a GPU transformers compiles the decode steps)

    @property
    def label(self) -> str:
        what = f"prefill {self.batch} x {self.prompt}" if not self.new_tokens else \
            f"batch {self.batch}, prompt {self.prompt}, {self.new_tokens} new"
        return f"{self.model}: {what}" + (f", {self.cache} cache" if self.cache else "")


GPU_WORKLOADS = [
    Workload("llama", 8, 1024, 128), Workload("llama", 1, 8192, 128), Workload("llama", 8, 2048, 0),
    Workload("mistral", 8, 1024, 128), Workload("gemma2", 8, 1024, 128),
    Workload("llama", 8, 1024, 128, cache="static"),
]
CPU_WORKLOADS = [Workload("llama", 2, 24, 4, "tiny"), Workload("gemma2", 2, 24, 4, "tiny")]


def _config(name: str, size: str) -> Any:
    """Llama-like (GQA 16/4, d 128), Mistral-like (sliding window 512), Gemma-2-like (softcap 50, window
    512 on every other layer, d 256); 8 layers, hidden 2048 (tiny: 2 layers, hidden 128, d 32)."""
    from transformers import Gemma2Config, LlamaConfig, MistralConfig

    tiny = size == "tiny"
    common = dict(vocab_size=512 if tiny else 32000, hidden_size=128 if tiny else 2048,
                  intermediate_size=256 if tiny else 5632, num_hidden_layers=2 if tiny else 8,
                  max_position_embeddings=16384, pad_token_id=0)
    heads = dict(num_attention_heads=4, num_key_value_heads=2) if tiny else \
        dict(num_attention_heads=16, num_key_value_heads=4)
    window = 8 if tiny else 512
    if name == "llama":
        return LlamaConfig(**common, **heads)
    if name == "mistral":
        return MistralConfig(**common, **heads, head_dim=32 if tiny else 128, sliding_window=window)
    if name == "gemma2":
        d = 32 if tiny else 256
        return Gemma2Config(**common, num_attention_heads=4 if tiny else 8, num_key_value_heads=2 if tiny else 4,
                            head_dim=d, query_pre_attn_scalar=d, sliding_window=window, attn_logit_softcapping=50.0,
                            final_logit_softcapping=30.0,
                            layer_types=["sliding_attention", "full_attention"] * (common["num_hidden_layers"] // 2))
    raise ValueError(f"unknown model {name!r}")


def baseline_of(model: str) -> str:
    """transformers' implementation to compare with: SDPA, or eager where the model has no SDPA path."""
    return "eager" if model == "gemma2" else "sdpa"


def _register() -> None:
    """cutlassfa's implementation, and the zero attention (sdpa's mask) for attention's share."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from cutlassfa.integrations import transformers as cutlassfa_hf

    cutlassfa_hf.register()

    def none(module: Any, query: torch.Tensor, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> tuple:
        return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3]), None

    AttentionInterface.register(_NONE, none)
    AttentionMaskInterface.register(_NONE, sdpa_mask)


@dataclass
class _Times:
    prefill: list[float] = field(default_factory=list)
    generate: list[float] = field(default_factory=list)
    tokens: Any = None  # the last generate's new tokens (B, new_tokens)


def _timed(torch: Any, device: str, fn: Any) -> tuple[float, Any]:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def _inputs(torch: Any, work: Workload, vocab: int, device: str) -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (work.batch, work.prompt), generator=generator)
    mask = torch.ones_like(ids)
    for b in range(work.batch):
        pad = b * work.prompt // (4 * work.batch)
        ids[b, :pad], mask[b, :pad] = 0, 0
    return ids.to(device), mask.to(device)


def measure(work: Workload, rounds: int, device: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    _register()
    config = _config(work.model, work.size)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    baseline = baseline_of(work.model)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=baseline).to(device, dtype).eval()
    ids, mask = _inputs(torch, work, config.vocab_size, device)
    names = {baseline: baseline, "cutlassfa": "cutlassfa", "none": _NONE}
    times = {impl: _Times() for impl in names}

    def run_once(impl: str) -> None:
        model.set_attn_implementation(names[impl])
        with torch.inference_mode():
            seconds, _ = _timed(torch, device, lambda: model(input_ids=ids, attention_mask=mask, use_cache=True))
            times[impl].prefill.append(seconds)
            if work.new_tokens:
                seconds, out = _timed(torch, device, lambda: model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=work.new_tokens,
                    min_new_tokens=work.new_tokens, do_sample=False, pad_token_id=0,
                    **({"cache_implementation": work.cache} if work.cache else {})))
                times[impl].generate.append(seconds)
                times[impl].tokens = out[:, ids.shape[1]:].cpu()

    for impl in names:  # warm-up (kernels, allocator)
        run_once(impl)
    for impl in times.values():
        impl.prefill.clear(), impl.generate.clear()
    order = list(names)
    for r in range(rounds):
        for impl in order[r % len(order):] + order[:r % len(order)]:
            run_once(impl)

    row: dict[str, Any] = {"workload": work.label, "model": work.model, "batch": work.batch, "prompt": work.prompt,
                           "new_tokens": work.new_tokens, "cache": work.cache or None,
                           "dtype": str(dtype).removeprefix("torch."),
                           "rounds": rounds, "baseline": baseline, "implementations": {}}
    for impl, t in times.items():
        entry: dict[str, Any] = {"prefill_ms": statistics.median(t.prefill) * 1e3}
        if work.new_tokens:
            generate = statistics.median(t.generate)
            entry["generate_s"] = generate
            entry["tokens_per_s"] = work.batch * work.new_tokens / generate
            entry["decode_step_ms"] = (generate - statistics.median(t.prefill)) / max(1, work.new_tokens - 1) * 1e3
        row["implementations"][impl] = entry
    base, ours, none = (row["implementations"][i] for i in names)
    row["prefill_speedup"] = base["prefill_ms"] / ours["prefill_ms"]
    row["prefill_speedup_rounds"] = _spread([b / o for b, o in
                                             zip(times[baseline].prefill, times["cutlassfa"].prefill)])
    row["attention_share_prefill"] = {i: 1 - none["prefill_ms"] / row["implementations"][i]["prefill_ms"]
                                      for i in (baseline, "cutlassfa")}
    # The speed over the baseline of an attention that cost nothing (none's): what any attention can reach.
    row["prefill_ceiling"] = base["prefill_ms"] / none["prefill_ms"]
    if work.new_tokens:
        row["generate_speedup"] = ours["tokens_per_s"] / base["tokens_per_s"]
        row["generate_ceiling"] = none["tokens_per_s"] / base["tokens_per_s"]
        row["decode_step_speedup"] = base["decode_step_ms"] / ours["decode_step_ms"]
        row["attention_share_decode"] = {i: 1 - none["decode_step_ms"] / row["implementations"][i]["decode_step_ms"]
                                         for i in (baseline, "cutlassfa")}
        b, o = times[baseline], times["cutlassfa"]
        row["generate_speedup_rounds"] = _spread([bg / og for bg, og in zip(b.generate, o.generate)])
        row["decode_step_speedup_rounds"] = _spread([(bg - bp) / (og - op) for bg, bp, og, op
                                                     in zip(b.generate, b.prefill, o.generate, o.prefill)])
        same = times[baseline].tokens == times["cutlassfa"].tokens
        row["greedy_token_agreement"] = float(same.float().mean())
    return row


def _spread(ratios: list[float]) -> dict[str, float]:
    """Median and quartiles of per-round ratios (one round: all three are its ratio)."""
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {"median": statistics.median(ratios), "q1": q1, "q3": q3}


def run_e2e(workloads: list[Workload], rounds: int, device: str) -> list[dict[str, Any]]:
    return [measure(work, rounds, device) for work in workloads]


def e2e_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | baseline | prefill ms base / ours (speed) "
             "| tokens/s base / ours (speed; per round: median, quartiles) | ceiling (no attention) "
             "| decode step ms base / ours | attention's share of a step base / ours "
             "| greedy tokens equal |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = r["baseline"]
        s, o = r["implementations"][base], r["implementations"]["cutlassfa"]
        prefill = f"{s['prefill_ms']:.2f} / {o['prefill_ms']:.2f} ({r['prefill_speedup']:.3f}x)"
        if r["new_tokens"]:
            paired = r["generate_speedup_rounds"]
            tokens = (f"{s['tokens_per_s']:.0f} / {o['tokens_per_s']:.0f} ({r['generate_speedup']:.3f}x; a round "
                      f"{paired['median']:.3f}x, {paired['q1']:.3f}-{paired['q3']:.3f})")
            ceiling = f"{r['generate_ceiling']:.3f}x"
            step = f"{s['decode_step_ms']:.3f} / {o['decode_step_ms']:.3f}"
            share = f"{r['attention_share_decode'][base]:.2f} / {r['attention_share_decode']['cutlassfa']:.2f}"
            agree = f"{r['greedy_token_agreement']:.3f}"
        else:
            tokens = step = agree = "-"
            ceiling = f"{r['prefill_ceiling']:.3f}x (prefill)"
            share = f"{r['attention_share_prefill'][base]:.2f} / {r['attention_share_prefill']['cutlassfa']:.2f} " \
                "(prefill)"
        lines.append(f"| {r['workload']} | {base} | {prefill} | {tokens} | {ceiling} | {step} | {share} | {agree} |")
    return "\n".join(lines)
