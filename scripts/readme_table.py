"""The README's results table from `cutlassfa bench --json` documents: one row per shape, TFLOP/s and
time per backend (the columns of backends that the runs measured), and `tensorcore` against cuDNN's and
FlashAttention-2's SDPA backends. Where several documents ran a backend on a shape, the first one's row
is shown (the grid first, then runs that add shapes).

    python scripts/readme_table.py bench/results/<gpu>-<commit>.json [more.json ...] > table.md
"""

import json
import sys

COLUMNS = ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient",
           "flex")
DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def cell(row):
    if row is None or row.get("status") != "ok":
        return "–"
    return f"{row['tflops']:.0f} ({row['ms']:.3g} ms)"


def ratio(a, b):
    ok = a is not None and b is not None and a.get("status") == b.get("status") == "ok"
    return f"{a['tflops'] / b['tflops']:.2f}" if ok else "–"


def table(docs):
    shapes = {}
    for doc in docs:
        for row in doc["rows"]:
            key = (row["dtype"], row["B"], row["H"], row["Hk"], row["Nq"], row["Nk"], row["d"], row["causal"],
                   tuple(row.get("window") or ()))  # a windowed row is a shape of its own
            shapes.setdefault(key, {}).setdefault(row["backend"], row)  # the first document that ran it
    measured = {backend for rows in shapes.values() for backend in rows}
    columns = [c for c in COLUMNS if c in measured]
    head = ["dtype", "B", "H", "N", "d", "causal", *columns, "tc / cuDNN", "tc / FA2"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (dtype, b, h, hk, nq, nk, d, causal, window), rows in shapes.items():
        heads = str(h) if h == hk else f"{h}:{hk}"
        n = str(nq) if nq == nk else f"{nq}×{nk}"
        tc = rows.get("tensorcore")
        mask = ("yes" if causal else "no") + (f", window ({window[0]}, {window[1]})" if window else "")
        cells = [DTYPE[dtype], str(b), heads, n, str(d), mask,
                 *(cell(rows.get(c)) for c in columns), ratio(tc, rows.get("sdpa_cudnn")), ratio(tc, rows.get("sdpa_flash"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    documents = []
    for path in sys.argv[1:]:
        with open(path) as f:
            documents.append(json.load(f))
    print(table(documents))
