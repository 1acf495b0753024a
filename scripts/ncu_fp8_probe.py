"""One bf16-cache and one fp8-cache decode call (B 8, 32:8 heads, d 128, 128k keys or --keys) after warm-ups,
for ncu:
    ncu --kernel-name regex:decode_kernel --launch-skip 4 --launch-count 2 --set full python scripts/ncu_fp8_probe.py
At --keys 8192 (a 256 MB bf16 cache) a call's fixed part (entry, pipeline fill and drain, the warps' merge)
is a third of it: `--set full --import-source yes` on a -lineinfo build shows where.
"""
import argparse

import torch

import cutlassfa

parser = argparse.ArgumentParser()
parser.add_argument("--keys", type=int, default=131072)
parser.add_argument("--batch", type=int, default=8)
args = parser.parse_args()
b, hq, hkv, keys, d = args.batch, 32, 8, args.keys, 128
q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, hkv, keys, d, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
lens = torch.full((b,), keys, dtype=torch.int32, device="cuda")
for _ in range(3):
    cutlassfa.forward(q, k, v, cache_seqlens=lens)
    cutlassfa.forward(q, k8, v8, cache_seqlens=lens, k_descale=0.5)
torch.cuda.synchronize()
