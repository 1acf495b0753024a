"""How one sequence is laid over the ranks of a ring: which global positions each rank's local chunk holds.

Two layouts, named by the `layout=` argument of `ring_forward`, `shard` and `unshard`:

* ``contiguous``: rank r holds one run of positions, ranks in order. Lengths may be anything
  (`shard` cuts N into W runs, the first N mod W of them one longer).
* ``zigzag``: the sequence is cut into 2W chunks (the first N mod 2W of them one longer) and rank r
  holds chunks r and 2W-1-r, in that order. Under a causal mask every rank then does the same work:
  a late chunk, which sees many keys, is paired with an early one, which sees few.

Either way a rank's local positions increase with the local index, which is what lets every ring step
be cut into a few rectangular, causal or banded pieces (`_ring_plan`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._arrays import framework_of

LAYOUTS = ("contiguous", "zigzag")

Segments = list[tuple[int, int]]  # (first global position, length) of each run, in local order


def split_sizes(n: int, parts: int) -> list[int]:
    """n cut into `parts` lengths, the first n mod parts of them one longer."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def check_layout(layout: Any) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    return layout


def segments(layout: str, lengths: Sequence[int]) -> list[Segments]:
    """The global runs each rank holds, given every rank's local length (in rank order).

    Raises ValueError when the lengths cannot come from the layout (zigzag needs the cut of `shard`).
    """
    world = len(lengths)
    if check_layout(layout) == "contiguous":
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int)
        return [[(int(s), int(n))] for s, n in zip(starts, lengths)]
    chunks = split_sizes(int(sum(lengths)), 2 * world)
    chunk_starts = np.concatenate([[0], np.cumsum(chunks)[:-1]]).astype(int)
    expected = [chunks[r] + chunks[2 * world - 1 - r] for r in range(world)]
    if list(lengths) != expected:
        raise ValueError(f"layout 'zigzag' over {world} ranks of a sequence of {sum(lengths)} needs local "
                         f"lengths {expected} (as `shard` cuts it), got {list(lengths)}")
    return [[(int(chunk_starts[c]), chunks[c]) for c in (r, 2 * world - 1 - r)] for r in range(world)]


def positions(runs: Segments) -> np.ndarray:
    """The global position of every local row, int64."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(start, start + n, dtype=np.int64) for start, n in runs])


def global_order(runs: list[Segments]) -> np.ndarray:
    """(total, 2) int64: the (rank, local row) that holds each global position, given every rank's runs."""
    total = sum(n for rank_runs in runs for _, n in rank_runs)
    order = np.zeros((total, 2), dtype=np.int64)
    for rank, rank_runs in enumerate(runs):
        offset = 0
        for start, n in rank_runs:
            order[start:start + n, 0] = rank
            order[start:start + n, 1] = np.arange(offset, offset + n)
            offset += n
    return order


def _take(x: Any, dim: int, start: int, stop: int) -> Any:
    index = [slice(None)] * len(x.shape)
    index[dim] = slice(start, stop)
    return x[tuple(index)]


def _concatenate(parts: list[Any], dim: int) -> Any:
    if len(parts) == 1:
        return parts[0]
    framework = framework_of(parts[0])
    if framework == "torch":
        import torch

        return torch.cat(parts, dim=dim)
    if framework == "cupy":
        import cupy

        return cupy.concatenate(parts, axis=dim)
    if framework == "jax":
        import jax.numpy as jnp

        return jnp.concatenate(parts, axis=dim)
    return np.concatenate(parts, axis=dim)


def shard(x: Any, rank: int, world: int, layout: str = "contiguous", *, dim: int = 2) -> Any:
    """The local chunk rank `rank` of `world` holds of the full sequence `x` (cut along `dim`, the N of
    (B, H, N, d) by default; lse arrays (B, H, N) use the same dim).

    contiguous: run `rank` of W near-equal runs (a view). zigzag: chunks rank and 2W-1-rank of 2W
    (a copy). numpy, PyTorch, CuPy and JAX arrays.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    n = x.shape[dim]
    if check_layout(layout) == "contiguous":
        lengths = split_sizes(n, world)
    else:
        chunks = split_sizes(n, 2 * world)
        lengths = [chunks[r] + chunks[2 * world - 1 - r] for r in range(world)]
    parts = [_take(x, dim, start, start + length) for start, length in segments(layout, lengths)[rank]]
    return _concatenate(parts, dim)


def unshard(chunks: Sequence[Any], layout: str = "contiguous", *, dim: int = 2) -> Any:
    """The full sequence from every rank's local chunk (in rank order): the inverse of `shard` (for
    contiguous, of any cut into runs)."""
    chunks = list(chunks)
    lengths = [c.shape[dim] for c in chunks]
    pieces = []  # (global start, array)
    for chunk, runs in zip(chunks, segments(layout, lengths)):
        offset = 0
        for start, length in runs:
            pieces.append((start, _take(chunk, dim, offset, offset + length)))
            offset += length
    pieces.sort(key=lambda piece: piece[0])
    return _concatenate([array for _, array in pieces], dim)
