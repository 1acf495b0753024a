"""masks.py, the one mask definition: row ranges and the kernels' tile trip counts against the formula
written out (attention_oracle.visible) and brute force over tiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_oracle import visible
from cutlassfa import masks
from cutlassfa.masks import CAUSAL, FULL, Window

SIDES = st.one_of(st.just(-1), st.integers(0, 40))


def brute_tiles(vis: np.ndarray, r0: int, r1: int, block_n: int) -> tuple[list[int], list[int]]:
    """Tiles of block_n keys some row of [r0, r1) sees, and those every row sees entirely."""
    nk = vis.shape[1]
    seen, full = [], []
    for n in range(-(-nk // block_n)):
        part = vis[r0:r1, n * block_n : (n + 1) * block_n]
        if part.any():
            seen.append(n)
        if (n + 1) * block_n <= nk and part.all():
            full.append(n)
    return seen, full


@settings(max_examples=250, deadline=None)
@given(nq=st.integers(1, 48), nk=st.integers(0, 48), left=SIDES, right=SIDES, data=st.data())
def test_row_ranges_and_mask_follow_the_formula(nq, nk, left, right, data):
    leftpad = data.draw(st.integers(0, nk))
    w = Window(left, right)
    want = visible(nq, nk, left, right, leftpad)
    np.testing.assert_array_equal(masks.dense_mask(nq, nk, w, leftpad), want)
    lo, hi = masks.row_ranges(np.arange(nq), nq, nk, w, leftpad)
    for i in range(nq):
        assert masks.row_range(i, nq, nk, w, leftpad) == (lo[i], hi[i])
        cols = np.flatnonzero(want[i])
        # One contiguous range per row; an empty one has lo == hi.
        assert (hi[i] - lo[i]) == cols.size and (cols.size == 0 or (cols[0], cols[-1] + 1) == (lo[i], hi[i]))
    # Non-decreasing in the row: the trip counts depend on it.
    assert (np.diff(lo) >= 0).all() and (np.diff(hi) >= 0).all()
    assert masks.visible_pairs(nq, nk, w, leftpad) == want.sum()


@settings(max_examples=250, deadline=None)
@given(nq=st.integers(1, 48), nk=st.integers(0, 48), left=SIDES, right=SIDES, block_m=st.integers(1, 20),
       block_n=st.integers(1, 20), data=st.data())
def test_tile_trips_are_exact(nq, nk, left, right, block_m, block_n, data):
    leftpad = data.draw(st.integers(0, nk))
    w = Window(left, right)
    vis = visible(nq, nk, left, right, leftpad)
    visited = masked = 0
    for r0 in range(0, nq, block_m):
        r1 = min(nq, r0 + block_m)
        trips = masks.tile_trips(r0, r1, nq, nk, w, block_n, leftpad)
        seen, full = brute_tiles(vis, r0, r1, block_n)
        assert list(range(trips.first, trips.last)) == seen
        assert trips.first <= trips.unmasked_begin <= trips.unmasked_end <= trips.last
        assert [n for n in seen if not trips.is_masked(n)] == full
        visited += trips.count
        masked += trips.masked_count
    assert masks.tile_counts(nq, nk, w, block_m, block_n, leftpad) == (visited, masked)


@settings(max_examples=100, deadline=None)
@given(nq=st.integers(1, 40), nk=st.integers(1, 40), left=SIDES, right=SIDES, data=st.data())
def test_leftpad_is_dropping_the_keys_before_it(nq, nk, left, right, data):
    # A left-padded cache is the same problem on keys [leftpad, Nk): the alignment does not move.
    leftpad = data.draw(st.integers(0, nk))
    w = Window(left, right)
    padded = masks.dense_mask(nq, nk, w, leftpad)
    assert not padded[:, :leftpad].any()
    np.testing.assert_array_equal(padded[:, leftpad:], masks.dense_mask(nq, nk - leftpad, w))


def test_pictures_of_the_docstring():
    def draw(mask):
        return ["".join("x" if c else "." for c in row) for row in mask]

    assert draw(masks.dense_mask(6, 6, Window(1, 1))) == ["xx....", "xxx...", ".xxx..", "..xxx.", "...xxx", "....xx"]
    assert draw(masks.dense_mask(6, 6, masks.resolve_window(True, (2, -1)))) == [
        "x.....", "xx....", "xxx...", ".xxx..", "..xxx.", "...xxx"]
    assert draw(masks.dense_mask(3, 6, CAUSAL)) == ["xxxx..", "xxxxx.", "xxxxxx"]
    # Nq > Nk: the first Nq - Nk rows see nothing.
    assert draw(masks.dense_mask(4, 2, CAUSAL)) == ["..", "..", "x.", "xx"]


@pytest.mark.parametrize("causal,window,want", [
    (False, None, FULL), (True, None, CAUSAL), (False, (3, 2), Window(3, 2)), (True, (3, 0), Window(3, 0)),
    (True, (3, -1), Window(3, 0)), (True, (-1, -1), CAUSAL), (False, Window(0, 0), Window(0, 0)),
])
def test_resolve_window(causal, window, want):
    assert masks.resolve_window(causal, window) == want


def test_resolve_window_refuses_causal_with_a_right_bound():
    with pytest.raises(ValueError, match="window"):
        masks.resolve_window(True, (4, 1))
    with pytest.raises(ValueError, match="window"):
        Window(-2, 0)


def test_visible_pairs_closed_forms():
    n = 1000
    assert masks.visible_pairs(n, n, FULL) == n * n
    assert masks.visible_pairs(n, n, CAUSAL) == n * (n + 1) // 2
    # window (w, 0): row i sees min(i, w) + 1 keys.
    assert masks.visible_pairs(n, n, Window(100, 0)) == sum(min(i, 100) + 1 for i in range(n))
    assert masks.visible_pairs(n, n, Window(0, 0)) == n
    assert masks.visible_pairs(0, 5, FULL) == masks.visible_pairs(5, 0, FULL) == 0


def test_the_issue_window_ratio():
    # N = 32768, window (1024, 0): visible pairs / causal pairs ~ 0.0616 (the figure the bench uses).
    n = 32768
    ratio = masks.visible_pairs(n, n, Window(1024, 0)) / masks.visible_pairs(n, n, CAUSAL)
    assert ratio == pytest.approx(0.0616, abs=5e-5)


def test_window_cost_grows_with_the_window_not_n():
    # Tiles visited per row tile stay bounded by the window as N grows; causal grows with N.
    bm = bn = 64
    for n in (1024, 4096, 16384):
        visited, masked = masks.tile_counts(n, n, Window(128, 0), bm, bn)
        row_tiles = n // bm
        assert visited <= row_tiles * (-(-(128 + bm) // bn) + 1)
        assert masked <= 2 * row_tiles
        causal_visited, causal_masked = masks.tile_counts(n, n, CAUSAL, bm, bn)
        assert causal_visited == row_tiles * (row_tiles + 1) // 2 and causal_masked == row_tiles


def test_full_and_causal_trips_match_the_sm80_kernel():
    # The sm80 mask: n_block_max = ceil(last visible col / bn), unmasked_end = min(Nk // bn, ...).
    for nq, nk in ((128, 128), (100, 300), (300, 100), (77, 257)):
        for m0 in range(0, nq, 64):
            m1 = min(nq, m0 + 64)
            full = masks.tile_trips(m0, m1, nq, nk, FULL, 32)
            assert (full.first, full.unmasked_begin, full.unmasked_end, full.last) == (0, 0, nk // 32, -(-nk // 32))
            causal = masks.tile_trips(m0, m1, nq, nk, CAUSAL, 32)
            last_col = m1 - 1 + nk - nq
            want_last = 0 if last_col < 0 else min(-(-nk // 32), last_col // 32 + 1)
            first_col_end = m0 + nk - nq + 1
            want_unmasked = 0 if first_col_end <= 0 else min(nk // 32, first_col_end // 32)
            assert causal.last == want_last
            if want_last:
                assert causal.first == 0 and causal.unmasked_end == min(want_unmasked, want_last)
