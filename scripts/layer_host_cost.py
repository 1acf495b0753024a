"""Host time of one attention layer call in a decode step, cutlassfa's against transformers' SDPA path: per
call, the host's share (calls issued back to back, before the synchronize) and the wall time, for
`cutlassfa.forward` plain / with `out=` / with cache_seqlens, the transformers adapter's layer call (a
left-padded batch's padded-causal plan, or no mask), transformers' `sdpa_attention_forward`, and PyTorch's
own one-op floor (`q.add(1)`); 16/4 heads, d 128, bf16, one query, under torch.inference_mode.

    python scripts/layer_host_cost.py
"""

from __future__ import annotations

import time
import types

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import cutlassfa
from cutlassfa.integrations import transformers as cutlassfa_hf


def per_call_us(call, calls: int = 300) -> tuple[float, float]:
    """(host, wall) microseconds a call over `calls` back-to-back calls after a warm-up."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return round(host, 1), round((time.perf_counter() - start) / calls * 1e6, 1)


def main() -> None:
    layer = types.SimpleNamespace(is_causal=True, sliding_window=None, training=False, num_key_value_groups=4,
                                  config=types.SimpleNamespace(attn_logit_softcapping=None))
    for batch, keys in ((8, 1100), (1, 8300)):
        q = torch.randn(batch, 16, 1, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, 4, keys, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        padding = torch.ones(batch, keys, dtype=torch.long, device="cuda")
        if batch > 1:
            padding[1, :100] = 0  # one entry left-padded
        mask = None if batch == 1 else cutlassfa_hf.attention_mask(batch, 1, keys, q_offset=keys - 1, kv_offset=0,
                                                                   attention_mask=padding, device="cuda")
        out = torch.empty(batch, 1, 16, 128, device="cuda", dtype=torch.bfloat16)
        lengths = torch.full((batch,), keys, device="cuda", dtype=torch.int32)
        with torch.inference_mode():
            row = {
                "forward": per_call_us(lambda: cutlassfa.forward(q, k, v, causal=True)),
                "forward out=": per_call_us(lambda: cutlassfa.forward(q, k, v, causal=True, out=out.transpose(1, 2))),
                "forward cache_seqlens": per_call_us(lambda: cutlassfa.forward(q, k, v, causal=True,
                                                                               cache_seqlens=lengths)),
                "adapter layer": per_call_us(lambda: cutlassfa_hf.attention_forward(layer, q, k, v, mask,
                                                                                    scaling=0.088)),
                "sdpa layer": per_call_us(lambda: sdpa_attention_forward(layer, q, k, v, None, scaling=0.088,
                                                                         is_causal=False)),
                "q.add(1)": per_call_us(lambda: q.add(1)),
            }
        print(f"B {batch}, {keys} keys, (host, wall) us a call: {row}", flush=True)


if __name__ == "__main__":
    main()
