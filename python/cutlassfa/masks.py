"""Which keys each query sees: the one mask definition of cutlassfa.

The float64 reference, the cpu backend and every CUDA kernel family follow the rules below; the
kernels' statement of them is cpp/include/cutlassfa/rules.h (the row range, the page rule) with the
trip counts of :func:`tile_trips` (integer arithmetic only).

Alignment is bottom-right, as in FlashAttention-2: with Nq queries and Nk keys, offset = Nk - Nq (per
sequence where lengths vary: varlen batches, KV caches with per-entry lengths), so the last query
lines up with the last key. A window (left, right) then lets query i see key j iff::

    i + offset - left  <=  j  <=  i + offset + right      and      leftpad <= j < Nk

where -1 means unbounded on that side and leftpad (KV caches with ``cache_leftpad``) hides the keys
before it without moving the alignment. ``causal=True`` is the window (-1, 0) and combines with a left
bound as (left, 0). Nq = Nk = 6, `x` visible::

    full (-1, -1)     causal (-1, 0)    causal, left 2    window (1, 1)     Nq=3, Nk=6, causal
      x x x x x x       x . . . . .       x . . . . .       x x . . . .       x x x x . .
      x x x x x x       x x . . . .       x x . . . .       x x x . . .       x x x x x .
      x x x x x x       x x x . . .       x x x . . .       . x x x . .       x x x x x x
      x x x x x x       x x x x . .       . x x x . .       . . x x x .
      x x x x x x       x x x x x .       . . x x x .       . . . x x x
      x x x x x x       x x x x x x       . . . x x x       . . . . x x

Each row sees one contiguous range of keys [lo, hi), possibly empty (lo == hi: the row's output is 0
and its lse -inf). Both lo and hi are non-decreasing in the row index; the tile trip counts rely on it.

Paged caches add one rule (:func:`page_present`): a key whose block-table entry is outside
[0, num_pages) counts as masked for every row (device tables are not checked on the host); a row whose
visible keys are all masked so gives 0 and lse -inf too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Window", "FULL", "CAUSAL", "resolve_window", "row_range", "row_ranges", "dense_mask",
           "TileTrips", "tile_trips", "visible_pairs", "tile_counts", "page_present", "alibi_distances"]


@dataclass(frozen=True)
class Window:
    """Keys visible around a query's aligned position: ``left`` before it, ``right`` after (-1: no
    bound on that side)."""

    left: int = -1
    right: int = -1

    def __post_init__(self) -> None:
        for side in (self.left, self.right):
            if not isinstance(side, (int, np.integer)) or isinstance(side, (bool, np.bool_)) or side < -1:
                raise ValueError(f"window sides must be integers >= -1, got ({self.left}, {self.right})")

    @property
    def is_full(self) -> bool:
        """No bound on either side: every key is visible (up to leftpad and Nk)."""
        return self.left < 0 and self.right < 0


FULL = Window(-1, -1)
CAUSAL = Window(-1, 0)


def resolve_window(causal: bool, window: Window | tuple[int, int] | None = None) -> Window:
    """The window a (causal, window) argument pair means: causal is (-1, 0), and with a window given,
    its left bound and right 0. Causal with a right bound > 0 contradicts itself: ValueError."""
    w = FULL if window is None else window if isinstance(window, Window) else Window(*window)
    if causal:
        if w.right > 0:
            raise ValueError(f"window=({w.left}, {w.right}) with causal=True: causal needs right 0 (or -1)")
        return Window(w.left, 0)
    return w


# --------------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------------

def row_range(row: int, nq: int, nk: int, window: Window, leftpad: int = 0) -> tuple[int, int]:
    """Keys [lo, hi) that query `row` sees (lo == hi when none). lo and hi never decrease with row."""
    offset = nk - nq
    lo = leftpad if window.left < 0 else max(leftpad, row + offset - window.left)
    hi = nk if window.right < 0 else min(nk, row + offset + window.right + 1)
    lo = min(lo, nk)
    return lo, max(hi, lo)


def row_ranges(rows: np.ndarray, nq: int, nk: int, window: Window, leftpad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """:func:`row_range` of every row of `rows` at once: (lo, hi) int64 arrays of rows' shape."""
    rows = np.asarray(rows, dtype=np.int64)
    offset = nk - nq
    lo = np.full(rows.shape, leftpad, np.int64) if window.left < 0 else np.maximum(leftpad, rows + offset - window.left)
    hi = np.full(rows.shape, nk, np.int64) if window.right < 0 else np.minimum(nk, rows + offset + window.right + 1)
    lo = np.minimum(lo, nk)
    return lo, np.maximum(hi, lo)


def dense_mask(nq: int, nk: int, window: Window, leftpad: int = 0, row_start: int = 0,
               row_stop: int | None = None, col_start: int = 0, col_stop: int | None = None) -> np.ndarray:
    """Boolean (rows, cols) mask, True where query row i sees key j, for rows [row_start, row_stop) and
    keys [col_start, col_stop) (default: all)."""
    row_stop = nq if row_stop is None else row_stop
    col_stop = nk if col_stop is None else col_stop
    lo, hi = row_ranges(np.arange(row_start, row_stop), nq, nk, window, leftpad)
    cols = np.arange(col_start, col_stop)[None, :]
    return (cols >= lo[:, None]) & (cols < hi[:, None])


def alibi_distances(nq: int, nk: int, row_start: int = 0, row_stop: int | None = None, col_start: int = 0,
                    col_stop: int | None = None) -> np.ndarray:
    """(rows, cols) int64 |i + offset - j| for rows [row_start, row_stop) and keys [col_start, col_stop)
    (default: all): each key's distance from the row's diagonal, what ALiBi multiplies by the slope (the
    statement of cpp/include/cutlassfa/rules.h's alibi_distance)."""
    row_stop = nq if row_stop is None else row_stop
    col_stop = nk if col_stop is None else col_stop
    return np.abs((np.arange(row_start, row_stop) + (nk - nq))[:, None] - np.arange(col_start, col_stop)[None, :])


def visible_pairs(nq: int, nk: int, window: Window, leftpad: int = 0) -> int:
    """Exact number of visible (query, key) pairs: the work a FLOP count should credit
    (4 * pairs * d FLOPs per head)."""
    if nq <= 0 or nk <= 0:
        return 0
    lo, hi = row_ranges(np.arange(nq), nq, nk, window, leftpad)
    return int((hi - lo).sum())


# --------------------------------------------------------------------------------------------------
# Tiles: the kernels' trip counts
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TileTrips:
    """The key tiles (of block_n keys; tile n holds keys [n*block_n, (n+1)*block_n) ∩ [0, Nk)) one tile
    of query rows visits::

        first <= unmasked_begin <= unmasked_end <= last

    [first, last): every tile holding a key that some row of the row tile sees (empty when first ==
    last: the rows see no key). [unmasked_begin, unmasked_end): tiles every row sees entirely, no
    element masking. [first, unmasked_begin) and [unmasked_end, last): boundary tiles, masked element
    by element (the left and right window edges, the diagonal, the ragged last tile, leftpad).
    """

    first: int
    unmasked_begin: int
    unmasked_end: int
    last: int

    @property
    def count(self) -> int:
        """Tiles visited."""
        return self.last - self.first

    @property
    def masked_count(self) -> int:
        """Tiles that need the element mask."""
        return self.count - (self.unmasked_end - self.unmasked_begin)

    def is_masked(self, n: int) -> bool:
        """Whether visited tile n needs the element mask."""
        return not self.unmasked_begin <= n < self.unmasked_end


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tile_trips(row_start: int, row_stop: int, nq: int, nk: int, window: Window, block_n: int,
               leftpad: int = 0) -> TileTrips:
    """Trip counts of the query rows [row_start, row_stop) (a row tile clipped to Nq) over key tiles of
    block_n keys.

    Exact: a tile is in [first, last) iff some row sees one of its keys, and in the unmasked range iff
    every row sees all of its keys. Why four row_range calls suffice: lo and hi never decrease with
    the row, and the ranges of consecutive rows that see a key overlap or touch (lo grows by at most 1
    per row), so the union of the rows' ranges is [lo(first row), hi(last row)), and the keys every
    row sees are [lo(last row), hi(first row)).
    """
    if row_stop <= row_start:
        return TileTrips(0, 0, 0, 0)
    lo_first, hi_first = row_range(row_start, nq, nk, window, leftpad)
    lo_last, hi_last = row_range(row_stop - 1, nq, nk, window, leftpad)
    if hi_last <= lo_first:  # every row's range is empty
        return TileTrips(0, 0, 0, 0)
    first = lo_first // block_n
    last = _ceil_div(hi_last, block_n)
    unmasked_begin = min(max(_ceil_div(lo_last, block_n), first), last)
    unmasked_end = min(max(hi_first // block_n, unmasked_begin), last)
    return TileTrips(first, unmasked_begin, unmasked_end, last)


def tile_counts(nq: int, nk: int, window: Window, block_m: int, block_n: int, leftpad: int = 0) -> tuple[int, int]:
    """(tiles visited, tiles masked) summed over the row tiles of block_m rows: the work of one
    (batch, head) of a kernel with these tile sizes."""
    visited = masked = 0
    for m0 in range(0, nq, block_m):
        trips = tile_trips(m0, min(nq, m0 + block_m), nq, nk, window, block_n, leftpad)
        visited += trips.count
        masked += trips.masked_count
    return visited, masked


def page_present(pages: np.ndarray, num_pages: int) -> np.ndarray:
    """True where a block-table entry names a page of the cache, [0, num_pages): the keys behind any
    other entry count as masked (never read), and keys appended there are dropped."""
    pages = np.asarray(pages)
    return (pages >= 0) & (pages < num_pages)
