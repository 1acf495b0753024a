"""Plain-text pieces shared by the command-line tools: markdown tables and one-line error messages."""

from __future__ import annotations

from typing import Iterable, Sequence


def format_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-markdown table with padded columns."""
    cells = [list(map(str, r)) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells])


def first_line(error: BaseException, limit: int = 120) -> str:
    """The first line of an exception's message (its type name when empty), at most `limit` characters."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."
