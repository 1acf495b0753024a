"""Which attention calls one ring step makes: a rank's queries against one block of keys, cut into
pieces that `forward` computes exactly with its own masks.

The mask is that of the global sequence. Query at global position i sees key j iff

    i + D - left <= j <= i + D + right,    D = Nk - Nq (bottom-right alignment, totals over all ranks)

with right = 0 under `causal`, and left / right unbounded without a window. Local positions increase
with the local index (`_ring_layout`), so the keys that local query row r sees in the block are one
local range [lo(r), hi(r)), and lo and hi never decrease from one row to the next.

Cut the rows into runs in which lo and hi each stay constant or grow by exactly one per row. A run of
rows [r0, r1) is one `forward` call on the slice q[r0:r1] x k[lo(r0):hi(r1 - 1)]: Nq'' = r1 - r0 rows,
Nk'' keys, r'' = r - r0 and j'' = j - lo(r0) the slice's own indices, delta = Nk'' - Nq''. The slice's
bottom-right mask is exactly the run's:

    lo const, hi const   every key of the slice                                causal=False
    lo const, hi grows   last key hi(r) - 1 = r + hi(r1 - 1) - r1, i.e.
                         j'' <= r'' + Nk'' - Nq'': the slice's causal mask      causal=True
    lo grows, hi grows   j'' in [r'', r'' + delta] (a band)                    window=(delta, 0)
    lo grows, hi const   j'' in [r'', Nk'')                                    window=(delta, Nq'' - 1)

Rows that see no key of the block are left out (nothing is merged into them at this step). A causal
ring step thus becomes "everything", "nothing" or "the diagonal block with an offset", and the diagonal
block is one bottom-right causal call on a slice whose Nk'' - Nq'' equals that offset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._ring_layout import Segments


@dataclass(frozen=True)
class Mask:
    """The global mask: bottom-right offset D = Nk - Nq and the window bounds (None: unbounded)."""

    offset: int
    causal: bool
    left: int | None = None
    right: int | None = None

    @property
    def upper(self) -> float:
        """How far past i + D a query sees (0 when causal)."""
        right = math.inf if self.right is None else self.right
        return min(right, 0) if self.causal else right

    @property
    def lower(self) -> float:
        """How far before i + D a query sees."""
        return math.inf if self.left is None else self.left


@dataclass(frozen=True)
class Piece:
    """One `forward` call: local query rows [rows[0], rows[1]) against local keys [keys[0], keys[1]),
    with the slice's own bottom-right causal mask or window (left, right), or neither."""

    rows: tuple[int, int]
    keys: tuple[int, int]
    causal: bool = False
    window: tuple[int, int] | None = None


def visible_ranges(q_pos: np.ndarray, k_pos: np.ndarray, mask: Mask) -> tuple[np.ndarray, np.ndarray]:
    """For each query row, the local key range [lo, hi) it sees (hi <= lo: none). Positions ascending."""
    first = q_pos + mask.offset - mask.lower if math.isfinite(mask.lower) else np.full(q_pos.shape, -np.inf)
    last = q_pos + mask.offset + mask.upper if math.isfinite(mask.upper) else np.full(q_pos.shape, np.inf)
    lo = np.searchsorted(k_pos, first, side="left")
    hi = np.searchsorted(k_pos, last, side="right")
    return lo.astype(np.int64), np.maximum(hi, lo).astype(np.int64)


def plan(q_pos: np.ndarray, k_pos: np.ndarray, mask: Mask) -> list[Piece]:
    """The pieces of one step: disjoint row ranges that together give every row exactly the keys the
    global mask lets it see among k_pos."""
    if len(q_pos) == 0 or len(k_pos) == 0:
        return []
    lo, hi = visible_ranges(q_pos, k_pos, mask)
    dlo, dhi = np.diff(lo), np.diff(hi)
    # step[r] describes rows r and r + 1: 2*dlo + dhi when both grow by 0 or 1, else -1 (no common piece).
    step = np.where((dlo <= 1) & (dhi <= 1), 2 * dlo + dhi, -1)
    # Runs of equal `step`: [bounds[i], bounds[i + 1]).
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(step)) + 1, [len(step)]])
    pieces: list[Piece] = []
    start = 0  # first row not yet in a piece
    for a, b in zip(bounds[:-1], bounds[1:]):
        kind = int(step[a]) if b > a else 0
        if kind < 0:  # rows [start, b) each stand alone; row b may join the next run
            for r in range(start, b):
                pieces += _piece(lo, hi, r, r + 1, 0)
            start = b
        elif start <= b:  # rows [max(start, a), b] link with one another
            pieces += _piece(lo, hi, max(start, a), b + 1, kind)
            start = b + 1
    for r in range(start, len(q_pos)):  # a last row that no run took
        pieces += _piece(lo, hi, r, r + 1, 0)
    return pieces


def plan_runs(q_runs: Segments, nk: int, mask: Mask) -> list[Piece]:
    """The pieces of the local queries against all nk keys in global order (the allgather mode), planned
    one run of consecutive query positions at a time; rows of different pieces never overlap. Under a
    mask that sees no key past the diagonal (mask.upper <= 0), each piece's last row sees up to its
    diagonal, so the slice's bottom-right alignment is the global one and the distance between a query
    and a key is that of their slice indices (which ALiBi's bias reads)."""
    k_pos = np.arange(nk, dtype=np.int64)
    pieces: list[Piece] = []
    offset = 0
    for start, n in q_runs:
        for p in plan(np.arange(start, start + n, dtype=np.int64), k_pos, mask):
            pieces.append(Piece((p.rows[0] + offset, p.rows[1] + offset), p.keys, p.causal, p.window))
        offset += n
    return pieces


def _piece(lo: np.ndarray, hi: np.ndarray, r0: int, r1: int, kind: int) -> list[Piece]:
    """The call for rows [r0, r1) whose lo / hi grow as `kind` (2*dlo + dhi) says, trimmed of rows that
    see nothing (the width hi - lo changes by at most one per row, so they sit at the ends)."""
    r0, r1 = int(r0), int(r1)
    width = hi[r0:r1] - lo[r0:r1]
    seen = np.flatnonzero(width > 0)
    if len(seen) == 0:
        return []
    r0, r1 = r0 + int(seen[0]), r0 + int(seen[-1]) + 1
    if r1 - r0 == 1:
        kind = 0  # one row: its range, unmasked
    k0, k1 = int(lo[r0]), int(hi[r1 - 1])  # the keys of the first row start, those of the last end
    delta = (k1 - k0) - (r1 - r0)  # the slice's Nk'' - Nq''
    if kind == 0:
        return [Piece((r0, r1), (k0, k1))]
    if kind == 1:
        return [Piece((r0, r1), (k0, k1), causal=True)]
    if kind == 3:
        return [Piece((r0, r1), (k0, k1), window=(delta, 0))]
    return [Piece((r0, r1), (k0, k1), window=(delta, r1 - r0 - 1))]


def sees_any(q_runs: Segments, k_runs: Segments, mask: Mask) -> bool:
    """Whether any query of q_runs sees any key of k_runs (the queries of a run [a, a + n) together see
    the key interval [a + D - left, a + n - 1 + D + right], as each sees a window at least one wide)."""
    for qa, qn in q_runs:
        if qn == 0:
            continue
        first, last = qa + mask.offset - mask.lower, qa + qn - 1 + mask.offset + mask.upper
        for ka, kn in k_runs:
            if kn > 0 and ka <= last and ka + kn - 1 >= first:
                return True
    return False


def steps_needed(q_runs: list[Segments], k_runs: list[Segments], mask: Mask) -> int:
    """How many ring steps to run, given every rank's runs: 1 + the last step s at which some rank r sees
    the block of rank (r - s) mod W (0 when no query sees any key). Steps in between that no rank needs
    still run, to pass the blocks on."""
    world = len(q_runs)
    needed = [s for s in range(world)
              if any(sees_any(q_runs[r], k_runs[(r - s) % world], mask) for r in range(world))]
    return needed[-1] + 1 if needed else 0
