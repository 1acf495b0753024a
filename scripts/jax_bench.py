"""jax.jit of cutlassfa on JAX's (B, N, H, d) layout against jax.nn.dot_product_attention(implementation=
"cudnn"), and the same kernels through PyTorch on (B, H, N, d) views of (B, N, H, d) tensors, in one run.

Each contender is a chain of attention calls (each call's output is the next call's query). JAX's run
inside jitted functions timed on the host around block_until_ready: a chain of `calls` and one of
2 x `calls`, the time of a call being their difference over `calls` (XLA's fixed cost of launching an
executable cancels). PyTorch's are captured in a CUDA graph of `calls` calls, timed with CUDA events:
q, k, v (B, H, N, d) views of (B, N, H, d) tensors, the output written into a (B, N, H, d) buffer (`out=`),
as the JAX call reads and writes them. Rounds interleave the contenders; the figure is the median per call
over rounds. A case whose cutlassfa / cuDNN ratio is
below 1.0 is measured again once in the same run (both figures kept).

    python scripts/jax_bench.py --out results.json [--rounds 10] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import cutlassfa
import cutlassfa.jax as cfa_jax

# (B, N, Hq, Hkv, d, causal)
GRID = [
    (4, 4096, 16, 16, 128, True), (4, 4096, 16, 16, 128, False),
    (2, 8192, 32, 8, 128, False), (2, 8192, 32, 8, 128, True),
    (4, 4096, 16, 16, 256, False), (4, 4096, 16, 16, 256, True),
    (64, 512, 16, 16, 64, True), (64, 512, 16, 16, 64, False),
    (8, 2048, 16, 16, 64, True), (1, 16384, 16, 16, 128, True),
]
QUICK = [GRID[0], GRID[2], GRID[4], GRID[6]]


def _jax_chain(attention, calls):
    def chain(q, k, v):
        for _ in range(calls):
            q = attention(q, k, v)
        return q
    return jax.jit(chain)


def _contenders(case, calls):
    b, n, hq, hkv, d, causal = case
    attention = {
        "cutlassfa_jax": lambda q, k, v: cfa_jax.dot_product_attention(q, k, v, is_causal=causal),
        "cudnn_jax": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn"),
        # the pre-layout path: (B, H, N, d) transposes around the call
        "cutlassfa_jax_transposed": lambda q, k, v: cfa_jax.forward(*(x.swapaxes(1, 2) for x in (q, k, v)),
                                                                    causal=causal).swapaxes(1, 2),
    }
    return {name: (_jax_chain(fn, calls), _jax_chain(fn, 2 * calls)) for name, fn in attention.items()}


def _time_jax(fn, args):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _torch_graph(torch, q, k, v, causal, calls):
    """A CUDA graph of `calls` chained cutlassfa.forward calls on (B, H, N, d) views of (B, N, H, d) tensors,
    each writing into a (B, N, H, d) buffer (two, in turn)."""
    buffers = [q.clone(), torch.empty_like(q)]

    def run():
        for i in range(calls):
            x, y = buffers[i % 2], buffers[1 - i % 2]
            cutlassfa.forward(x.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                              out=y.transpose(1, 2))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph


def _time_torch(torch, graph):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3


def measure(case, rounds, torch):
    b, n, hq, hkv, d, causal = case
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(s).astype(np.float32) for s in ((b, n, hq, d), (b, n, hkv, d), (b, n, hkv, d))]
    args = [jnp.asarray(x, jnp.bfloat16) for x in host]
    probe = _jax_chain(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                    implementation="cudnn"), 1)
    jax.block_until_ready(probe(*args))
    one = min(_time_jax(probe, args) for _ in range(3))
    calls = int(min(50, max(10, np.ceil(5e-3 / one))))  # a chain of >= ~5 ms: dispatch amortized
    fns = _contenders(case, calls)
    for pair in fns.values():
        for fn in pair:
            jax.block_until_ready(fn(*args))  # compile and warm up
    graph = None
    if torch is not None:
        tq, tk, tv = (torch.tensor(x, device="cuda").to(torch.bfloat16) for x in host)
        graph = _torch_graph(torch, tq, tk, tv, causal, calls)
        graph.replay()
        torch.cuda.synchronize()
    times = {name: [] for name in list(fns) + (["cutlassfa_torch"] if graph is not None else [])}
    for _ in range(rounds):
        for name, (single, double) in fns.items():
            times[name].append((_time_jax(double, args) - _time_jax(single, args)) / calls)
        if graph is not None:
            times["cutlassfa_torch"].append(_time_torch(torch, graph) / calls)
    pairs = b * hq * (n * (n + 1) // 2 if causal else n * n)
    result = {"case": dict(B=b, N=n, Hq=hq, Hkv=hkv, d=d, causal=causal), "calls": calls,
              "ms": {name: statistics.median(t) * 1e3 for name, t in times.items()}}
    result["tflops"] = {name: 4 * pairs * d / (ms * 1e-3) / 1e12 for name, ms in result["ms"].items()}
    ms = result["ms"]
    result["cudnn_over_ours"] = ms["cudnn_jax"] / ms["cutlassfa_jax"]
    if "cutlassfa_torch" in ms:
        result["torch_over_jax"] = ms["cutlassfa_torch"] / ms["cutlassfa_jax"]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cases", help="indices into GRID, comma-separated")
    args = parser.parse_args()
    try:
        import torch
        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None
    rows = []
    cases = QUICK if args.quick else GRID
    if args.cases:
        cases = [GRID[int(i)] for i in args.cases.split(",")]
    for case in cases:
        row = measure(case, args.rounds, torch)
        if row["cudnn_over_ours"] < 1.0:
            row["again"] = measure(case, args.rounds, torch)
        rows.append(row)
        again = f" (again {row['again']['cudnn_over_ours']:.3f})" if "again" in row else ""
        print(case, {k: round(v, 4) for k, v in row["ms"].items()},
              f"cudnn/ours {row['cudnn_over_ours']:.3f}{again}",
              f"torch/jax {row.get('torch_over_jax', float('nan')):.3f}", flush=True)
    from cutlassfa._provenance import provenance

    meta = {"jax": jax.__version__, **provenance()}  # commit, GPU and clocks, torch / cuDNN versions
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    ratios = [r["cudnn_over_ours"] for r in rows]
    print("geomean cudnn/ours", float(np.exp(np.mean(np.log(ratios)))), "min", min(ratios))


if __name__ == "__main__":
    main()
