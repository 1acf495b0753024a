"""Two `cutlassfa bench --json` documents of the same grid, an earlier build's and a later one's (same GPU,
one device call): per case the later / earlier speed of each backend of ours (ms ratio, inverted, so
> 1 is faster), the geometric mean per grid, and the cases below a bound.

    python scripts/compare_bench.py BEFORE.json AFTER.json [--backends tensorcore] [--below 0.97]

Prints one line per grid and the cases below the bound; exits 0 (a report, not a gate)."""

from __future__ import annotations

import argparse
import json
import math


def _key(row: dict) -> tuple:
    return tuple(str(row.get(k)) for k in ("backend", "dtype", "B", "H", "Hk", "Nq", "Nk", "d", "causal", "window",
                                            "mode", "variant", "page_size"))


def speedups(before: dict, after: dict, backends: set[str]) -> list[tuple[tuple, float]]:
    """(case key, before ms / after ms) for every case both documents timed on one of `backends`."""
    earlier = {_key(r): r for r in before["rows"] if r.get("status") == "ok" and r.get("backend") in backends}
    pairs = []
    for row in after["rows"]:
        old = earlier.get(_key(row))
        if old is not None and row.get("status") == "ok" and row.get("ms") and old.get("ms"):
            pairs.append((_key(row), old["ms"] / row["ms"]))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--backends", default="tensorcore")
    parser.add_argument("--below", type=float, default=0.97)
    args = parser.parse_args()
    with open(args.before) as f:
        before = json.load(f)
    with open(args.after) as f:
        after = json.load(f)
    pairs = speedups(before, after, set(args.backends.split(",")))
    if not pairs:
        print(f"{args.after}: no case in common")
        return
    geomean = math.exp(sum(math.log(s) for _, s in pairs) / len(pairs))
    low = [(key, s) for key, s in pairs if s < args.below]
    print(f"{args.after}: {len(pairs)} cases, after/before speed geomean {geomean:.4f}, "
          f"min {min(s for _, s in pairs):.4f}, {len(low)} below {args.below}")
    for key, s in low:
        print(f"  {s:.4f}  {' '.join(key)}")


if __name__ == "__main__":
    main()
