"""Where a transformers decode step's time goes with attn_implementation="cutlassfa" against "sdpa": one
Llama-like model of `cutlassfa bench --e2e` (8 layers, hidden 2048, GQA 16/4, d 128, bf16, random weights),
a left-padded batch prefilled, then decode steps timed on the host:

- the step's wall time (synchronized before and after), median of `--steps`;
- the host time spent in the adapter's functions during a step (mask interface, planning, the layer
  call), summed per step;
- the device synchronizations in a step (torch.cuda.set_sync_debug_mode("warn")), by the Python line
  that asked for them.

    python scripts/e2e_decode_profile.py --out profile.json [--batch 8 --prompt 1024 --steps 20]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import time
import warnings

import torch

from cutlassfa.bench import e2e
from cutlassfa.integrations import transformers as cutlassfa_hf

_WRAPPED = ("attention_mask", "_plan_for", "attention_forward")
host_seconds: collections.Counter = collections.Counter()


def _timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            host_seconds[name] += time.perf_counter() - start
    return wrapper


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    for name in _WRAPPED:  # before register(): transformers keeps references to these
        setattr(cutlassfa_hf, name, _timed(name, getattr(cutlassfa_hf, name)))
    from transformers import AutoModelForCausalLM

    cutlassfa_hf.register()
    torch.manual_seed(0)
    config = e2e._config("llama", "gpu")
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to("cuda", torch.bfloat16).eval()
    work = e2e.Workload("llama", args.batch, args.prompt, 1)
    ids, mask = e2e._inputs(torch, work, config.vocab_size, "cuda")
    report = {"batch": args.batch, "prompt": args.prompt, "steps": args.steps, "implementations": {}}
    for impl in ("sdpa", "cutlassfa", "sdpa", "cutlassfa"):  # the second pass is reported (warm)
        model.set_attn_implementation(impl)
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
            cache, token, step_mask = out.past_key_values, out.logits[:, -1:].argmax(-1), mask
            walls, syncs = [], collections.Counter()
            host_seconds.clear()
            for step in range(args.steps):
                step_mask = torch.cat([step_mask, step_mask.new_ones(args.batch, 1)], 1)
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("warn")
                start = time.perf_counter()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    out = model(input_ids=token, attention_mask=step_mask, past_key_values=cache, use_cache=True)
                torch.cuda.set_sync_debug_mode("default")
                torch.cuda.synchronize()
                walls.append(time.perf_counter() - start)
                for w in caught:  # where in Python each synchronizing operation was called
                    if "synchroniz" in str(w.message):
                        syncs[f"{'/'.join(w.filename.split('/')[-2:])}:{w.lineno}"] += 1
                token = out.logits[:, -1:].argmax(-1)
        report["implementations"][impl] = {
            "step_ms": statistics.median(walls) * 1e3,
            "adapter_host_ms_per_step": {k: v / args.steps * 1e3 for k, v in host_seconds.items()},
            "synchronizations_per_step": {k: v / args.steps for k, v in syncs.items()},
        }
        print(impl, json.dumps(report["implementations"][impl], indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
