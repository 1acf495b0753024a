"""GPU time of `cutlassfa.forward` / `varlen_forward` on a set of cases, with one timer whatever the build:
run it once per install (PYTHONPATH pointing at each), alternating, and compare the medians with --compare.
A bench's own before / after comparison runs each build's bench; this script keeps the timing and the
inputs the same for both builds (only the public API is called).

Cases: --shape B,H,N,d,causal|full,dtype (dense); --cache B,Hq:Hkv,Nq,Nk,d,dtype[,page=P][,window=L]
[,softcap=C][,leftpad=F] (causal queries against full caches, contiguous or in shuffled pages of P keys; a
left window bound L; softcap C; left padding of a fraction F of each entry's keys), whose --read twin times
one integer sum over the keys and values the call must read (the bandwidth ceiling, in the same process);
or --cases-from a `cutlassfa bench --json` document (its tensorcore rows: dense, KV caches contiguous or
paged, varlen). --layout: dense arrays (B, H, N, d)
contiguous (`bhnd`, the bench's) or (B, N, H, d) views (`bnhd`). --graph: time a CUDA graph of the calls
(decode: no host cost). CUDA events around --calls calls, median of --repeats; one JSON line per case.
    PYTHONPATH=/tmp/site_before python3 scripts/ab_time.py --tag before --cases-from after-1.json >> ab.jsonl
    python3 scripts/ab_time.py --compare ab.jsonl before after"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from collections import defaultdict

from cuda_graphs import graph_of


def _dense_case(text: str) -> dict:
    b, h, n, d, mask, dtype = text.split(",")
    return {"dtype": dtype, "B": int(b), "H": int(h), "Hk": int(h), "Nq": int(n), "Nk": int(n), "d": int(d),
            "causal": mask == "causal", "window": None, "mode": "dense", "page_size": None}


def _cache_case(text: str) -> dict:
    b, heads, nq, nk, d, dtype, *extras = text.split(",")
    h, hk = (int(x) for x in heads.split(":"))
    options = dict(x.split("=") for x in extras)
    page = int(options.get("page", 0)) or None
    return {"dtype": dtype, "B": int(b), "H": h, "Hk": hk, "Nq": int(nq), "Nk": int(nk), "d": int(d), "causal": True,
            "window": (int(options["window"]), 0) if "window" in options else None,
            "mode": "paged" if page else "kvcache", "page_size": page, "softcap": float(options.get("softcap", 0)),
            "leftpad": float(options.get("leftpad", 0))}


def _visible_keys(case: dict) -> tuple[int, int]:
    """The keys [first, Nk) of an entry (all full) that some causal query of a --cache case sees."""
    nk, nq = case["Nk"], case["Nq"]
    first = int(case.get("leftpad", 0) * nk)
    if case.get("window"):
        first = max(first, nk - nq - case["window"][0])
    return first, nk


def _cases_from(path: str) -> list[dict]:
    with open(path) as f:
        rows = json.load(f)["rows"]
    return [r for r in rows if r.get("backend") == "tensorcore" and r.get("status") == "ok"
            and r.get("mode") in ("dense", "kvcache", "paged", "varlen")]


def _key(case: dict) -> str:
    return " ".join(str(case.get(k)) for k in ("dtype", "B", "H", "Hk", "Nq", "Nk", "d", "causal", "window", "mode",
                                                "page_size", "softcap", "leftpad", "read") if k in case)


def _call(torch, cutlassfa, case: dict, layout: str):
    """A no-argument callable running the case, on inputs made here (seeded)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    dtype = getattr(torch, case["dtype"])
    b, h, hk, nq, nk, d = (case[k] for k in ("B", "H", "Hk", "Nq", "Nk", "d"))
    options = {"causal": bool(case["causal"])}
    if case.get("window"):
        options["window"] = tuple(case["window"])
    randn = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)  # noqa: E731
    mode = case["mode"]
    if mode == "varlen":
        lq, lk = case["seqlens_q"], case["seqlens_k"]
        cu = lambda lens: torch.tensor([0, *itertools.accumulate(lens)], device="cuda", dtype=torch.int32)  # noqa: E731
        q, k, v = randn(sum(lq), h, d), randn(sum(lk), hk, d), randn(sum(lk), hk, d)
        args = (q, k, v, cu(lq), cu(lk))
        return lambda: cutlassfa.varlen_forward(*args, max_seqlen_q=max(lq), max_seqlen_k=max(lk), **options)
    if mode == "dense":
        if layout == "bnhd":
            q, k, v = (randn(b, n, heads, d).transpose(1, 2) for n, heads in ((nq, h), (nk, hk), (nk, hk)))
        else:
            q, k, v = randn(b, h, nq, d), randn(b, hk, nk, d), randn(b, hk, nk, d)
        return lambda: cutlassfa.forward(q, k, v, **options)
    lengths = torch.tensor(case.get("seqlens_k") or [nk] * b, device="cuda", dtype=torch.int32)
    q = randn(b, h, nq, d)
    if case.get("softcap"):
        options["softcap"] = case["softcap"]
    if case.get("leftpad"):
        options["cache_leftpad"] = torch.full((b,), int(case["leftpad"] * nk), device="cuda", dtype=torch.int32)
    if mode == "kvcache":
        k, v = randn(b, hk, nk, d), randn(b, hk, nk, d)
        if case.get("read"):  # the bytes the call must read, summed as integers
            first, last = _visible_keys(case)
            words = [x[:, :, first:last].contiguous().view(torch.int64) for x in (k, v)]  # (copied outside the timing)
            return lambda: [w.sum() for w in words]
        return lambda: cutlassfa.forward(q, k, v, cache_seqlens=lengths, **options)
    page = case["page_size"]
    slots = -(-nk // page)
    table = torch.randperm(b * slots, device="cuda", generator=gen).to(torch.int32).reshape(b, slots)
    k, v = randn(b * slots, hk, page, d), randn(b * slots, hk, page, d)
    return lambda: cutlassfa.forward(q, k, v, cache_seqlens=lengths, block_table=table, **options)


def _time(torch, call, calls: int, repeats: int, graph: bool) -> list[float]:
    for _ in range(3):
        call()
    run = graph_of(torch, call, calls).replay if graph else call
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph:
            run()
        else:
            for _ in range(calls):
                run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls)
    return times


def _compare(path: str, before: str, after: str) -> None:
    """after / before speed per case (median over rounds of each tag's medians), the geomean, the lowest."""
    ms: dict[tuple[str, str], list[float]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                row = json.loads(line)
                ms[(row["tag"].rstrip("0123456789"), row["case"])].append(row["ms"])
    cases = sorted({case for tag, case in ms if tag == after and (before, case) in ms})
    ratios = [(statistics.median(ms[(before, c)]) / statistics.median(ms[(after, c)]), c) for c in cases]
    if not ratios:
        print("no case timed by both")
        return
    geomean = math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios))
    print(f"{len(ratios)} cases, {after} / {before} speed geomean {geomean:.4f}, min {min(ratios)[0]:.4f}")
    for r, c in sorted(ratios)[:10]:
        print(f"  {r:.4f}  {c}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", default=[], help="B,H,N,d,causal|full,dtype")
    parser.add_argument("--cache", action="append", default=[],
                        help="B,Hq:Hkv,Nq,Nk,d,dtype[,page=P][,window=L][,softcap=C][,leftpad=F]")
    parser.add_argument("--read", action="store_true", help="also time each --cache case's read of its bytes")
    parser.add_argument("--cases-from", help="a `cutlassfa bench --json` document: its tensorcore rows")
    parser.add_argument("--layout", choices=("bhnd", "bnhd"), default="bhnd")
    parser.add_argument("--graph", action="store_true")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tag", default="")
    parser.add_argument("--compare", nargs=3, metavar=("JSONL", "BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        _compare(*args.compare)
        return 0
    import torch

    import cutlassfa

    cache_cases = [_cache_case(s) for s in args.cache]
    cases = [_dense_case(s) for s in args.shape] + cache_cases
    cases += _cases_from(args.cases_from) if args.cases_from else []
    if args.read:
        cases += [dict(c, read=True) for c in cache_cases if c["mode"] == "kvcache"]
    for case in cases:
        times = _time(torch, _call(torch, cutlassfa, case, args.layout), args.calls, args.repeats, args.graph)
        print(json.dumps({"tag": args.tag, "case": _key(case), "layout": args.layout, "ms": statistics.median(times),
                          "min_ms": min(times)}), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
