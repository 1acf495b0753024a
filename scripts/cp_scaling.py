"""The scaling table (and a plot) of context-parallel runs from the JSON files that scripts/ring_bench.py and
scripts/cp_bench.py write.

    python scripts/cp_scaling.py bench/results/nvidia-h200x4-6e5af07-*.json --plot scaling.png

One row per timed call: case (N, causal or not, packed documents, decode B), W, mode, seconds on W GPUs
and on one, the strong-scaling efficiency T_1 / (W * T_W), and the breakdown where the run made one
(compute alone, exchange alone, the share of the exchange hidden). The plot: efficiency per case and
mode, one bar each, with the line at 1. Needs matplotlib for --plot only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def rows_of(path: Path) -> list[dict]:
    """The rows of one file as (label, W, mode, t_w, t_1, efficiency, compute, exchange, hidden)."""
    data = json.loads(path.read_text())
    out = []
    for r in data["rows"]:
        if "ring_s" in r:  # ring_bench
            label = f"N {r['N']:,} {'causal' if r['causal'] else 'non-causal'}"
            mode = r.get("resolved_mode") or r.get("mode", "ring")
            if r.get("mode") == "auto":
                mode = f"auto ({mode})"
            if r.get("ring_overlap") in ("on", "off") and r.get("mode") == "ring":
                mode += f", overlap {r['ring_overlap']}"
            if r.get("gather_groups") not in (None, 1):
                mode += f", {r['gather_groups']} head groups"
            out.append(dict(case=label, W=r["W"], mode=mode, t_w=r["ring_s"], t_1=r.get("single_s"),
                            efficiency=r.get("efficiency"), compute=r.get("compute_s"),
                            exchange=r.get("exchange_s"), hidden=r.get("exchange_hidden"), file=path.name))
        else:  # cp_bench
            if r["case"] == "packed":
                label, mode = f"packed {len(r['documents'])} documents, {r['total']:,} keys", "allgather"
                if r.get("gather_groups") not in (None, 1):
                    mode += f", {r['gather_groups']} head groups"
            else:
                label = f"decode B {r['B']}, {r['cache']:,}-key cache" + (" (paged)" if r.get("paged") else "")
                mode = "sharded"
            out.append(dict(case=label, W=r["W"], mode=mode, t_w=r["t_w_s"], t_1=r["t_1_s"],
                            efficiency=r["efficiency"], compute=r.get("compute_s"), exchange=r.get("gather_s"),
                            hidden=None, file=path.name))
    return out


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    lines = ["| case | W | mode | T_W s | T_1 s | efficiency | compute s | exchange s | hidden | file |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['W']} | {r['mode']} | {fmt(r['t_w'], '.4g')} | {fmt(r['t_1'], '.4g')} | "
                     f"{fmt(r['efficiency'], '.3f')} | {fmt(r['compute'], '.4g')} | {fmt(r['exchange'], '.4g')} | "
                     f"{fmt(r['hidden'], '.2f')} | {r['file']} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["efficiency"] is not None]
    labels = [f"{r['case']}, W {r['W']}\n{r['mode']} ({r['file'].removesuffix('.json')})" for r in shown]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(shown) + 1.5))
    ys = list(range(len(shown)))[::-1]
    ax.barh(ys, [r["efficiency"] for r in shown], color=["C0" if "allgather" in r["mode"] or r["mode"] == "sharded"
                                                          else "C1" for r in shown])
    ax.axvline(1.0, color="k", linewidth=0.8)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel("strong-scaling efficiency T_1 / (W * T_W)")
    ax.set_xlim(0, 1.1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", type=Path, nargs="+")
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    rows = [row for path in args.files for row in rows_of(path)]
    print(table(rows))
    if args.plot is not None:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
