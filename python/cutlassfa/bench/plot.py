"""`bench --plot`: grouped bars of TFLOP/s, one group per case, one bar per backend (needs matplotlib)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .._inputs import SHORT_DTYPE, Case
from .measure import Row


def write_plot(rows: Sequence[Row], path: str) -> None:
    """Grouped bars: one group per case, one bar per backend, TFLOP/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def label(c: Case) -> str:
        short = SHORT_DTYPE[c.dtype]
        n = f"{c.Nq}" if c.Nq == c.Nk else f"{c.Nq}x{c.Nk}"
        return f"{short} {c.B}x{c.H}x{n} d{c.d}" + (" causal" if c.causal else "") + \
            (f" {c.variant.name}" if c.variant else "")

    labels = list(dict.fromkeys(label(r.case) for r in rows))
    backends = list(dict.fromkeys(r.backend for r in rows if r.tflops is not None))
    values = {b: [0.0] * len(labels) for b in backends}
    for r in rows:
        if r.tflops is not None:
            values[r.backend][labels.index(label(r.case))] = r.tflops
    # Horizontal groups, one per case, on a log axis: the CUDA-core backends run at a tenth of the
    # tensor-core rate and would vanish on a linear one.
    height = 0.8 / max(len(backends), 1)
    fig, ax = plt.subplots(figsize=(11, max(4.0, 0.45 * len(labels) + 1.5)))
    ys = np.arange(len(labels))[::-1]
    for i, b in enumerate(backends):
        bars = [v if v > 0 else np.nan for v in values[b]]
        ax.barh(ys + ((len(backends) - 1) / 2 - i) * height, bars, height, label=b)
    ax.set_xscale("log")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel("TFLOP/s (4·B·H·d·(visible query-key pairs) / t; log scale)")
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

