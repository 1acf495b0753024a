"""Where the per-call time of a tiny call goes: wall time per call, back to back, of the pieces of
`cutlassfa.forward` one at a time (the extension called directly, with and without an output given, each
option alone and together, the kernel each plan picks), next to PyTorch's own floor (an allocation, one
small kernel, SDPA FLASH). Differences between rows are the cost of what differs.
    python scripts/overhead_probe.py [--calls 3000] [--rounds 5] [--json FILE]
Needs PyTorch with CUDA."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import cutlassfa
from cutlassfa import _C, _api


def per_call_us(call, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()

    b, h, n, d = 1, 1, 16, 64
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    lengths = torch.tensor([n], device="cuda", dtype=torch.int32)
    tc = _api._BACKEND_CODES["tensorcore"]
    opts = dict(causal=True, window=(8, 0), softcap=30.0, cache_seqlens=lengths)

    def c_forward(*options, out=None, causal=False):
        return lambda: _C.forward(q, k, v, out, causal, None, tc, False, None, -1, False, *options)

    none = (None,) * 10
    rows = {
        "torch.empty_like": lambda: torch.empty_like(q),
        "torch q.add(1) (alloc + one kernel)": lambda: q.add(1),
        "torch out.copy_(q) (one kernel)": lambda: out.copy_(q),
        "sdpa_flash": None,
        "forward plain": lambda: cutlassfa.forward(q, k, v),
        "forward plain out=": lambda: cutlassfa.forward(q, k, v, out=out),
        "forward plain tensorcore_sm80": lambda: cutlassfa.forward(q, k, v, backend="tensorcore_sm80"),
        "_C.forward plain": c_forward(),
        "_C.forward plain out=": c_forward(out=out),
        "forward causal": lambda: cutlassfa.forward(q, k, v, causal=True),
        "forward window": lambda: cutlassfa.forward(q, k, v, window=(8, 0)),
        "forward softcap": lambda: cutlassfa.forward(q, k, v, softcap=30.0),
        "forward cache_seqlens": lambda: cutlassfa.forward(q, k, v, cache_seqlens=lengths),
        "forward cache_seqlens num_splits=1": lambda: cutlassfa.forward(q, k, v, cache_seqlens=lengths, num_splits=1),
        "forward window+softcap+cache_seqlens": lambda: cutlassfa.forward(q, k, v, **opts),
        "forward window+softcap+cache_seqlens out=": lambda: cutlassfa.forward(q, k, v, out=out, **opts),
        "forward window+softcap+cache_seqlens sm80": lambda: cutlassfa.forward(q, k, v, backend="tensorcore_sm80",
                                                                                **opts),
        "_C.forward window+softcap+cache_seqlens": c_forward((8, 0), 30.0, lengths, *none, causal=True),
    }
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = sdpa_kernel([SDPBackend.FLASH_ATTENTION])
        ctx.__enter__()
        rows["sdpa_flash"] = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    except Exception as error:  # noqa: BLE001 - a probe: report and go on
        print(f"sdpa_flash unavailable: {error}")
        del rows["sdpa_flash"]
    for call in rows.values():  # warm-up: caches, allocator pools, module loads
        for _ in range(200):
            call()
    plans = {"plain": cutlassfa.select_backend(q, k, v), "options": cutlassfa.select_backend(q, k, v, **opts)}
    times: dict[str, list[float]] = {name: [] for name in rows}
    names = list(rows)
    for r in range(args.rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            times[name].append(per_call_us(rows[name], args.calls))
    print(f"{torch.cuda.get_device_name()}, backends: {plans}")
    result = {}
    for name in names:
        med = statistics.median(times[name])
        result[name] = {"median_us": med, "min_us": min(times[name])}
        print(f"{name:48s} {med:7.2f} us (min {min(times[name]):.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "backends": plans, "rows": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
