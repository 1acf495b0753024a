"""Where the cpu backend's K/V tiles come from: dense arrays or paged caches; and appending new keys
into a cache. A key source hands out tiles [j0, j1) of its keys, converted to the compute dtype, and
the largest magnitudes of the keys it holds (which pick that dtype).

Quantized caches (float8_e4m3fn, FlashAttention-3's convention): a source may hold per-head dequantization
scales ("descales") for its keys and values; its tiles and magnitudes are then those of k * k_scale and
v * v_scale, scaled after the conversion to the compute dtype."""

from __future__ import annotations

from typing import Any

import numpy as np

from .masks import page_present

__all__ = ["DenseKeys", "PagedKeys", "append_keys", "max_abs"]


class DenseKeys:
    """K and V of shape (nb, Hkv, N, d), any strides: tile j0:j1 is a slice. k_scale, v_scale: None, or
    float32 descales that broadcast to (nb, Hkv), one per entry and head."""

    def __init__(self, k: np.ndarray, v: np.ndarray, k_scale: np.ndarray | None = None,
                 v_scale: np.ndarray | None = None) -> None:
        self.k, self.v = k, v
        self.scales = (k_scale, v_scale)
        self.heads = k.shape[1]

    def tile(self, j0: int, j1: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values [j0, j1) as (nb, Hkv, j1 - j0, d) arrays of `dtype`, descaled."""
        return tuple(_descaled(x[:, :, j0:j1], scale, dtype) for x, scale in zip((self.k, self.v), self.scales))

    def max_abs(self, count: int | None = None) -> tuple[float, float]:
        """Largest magnitudes of the first `count` keys and values (all by default), descaled."""
        return tuple(max_abs(x[:, :, :count], scale) for x, scale in zip((self.k, self.v), self.scales))

    def absent(self, j0: int, j1: int) -> None:
        """Dense keys are all there."""
        return None


class PagedKeys:
    """Keys [start, stop) of one entry of paged caches (num_pages, Hkv, page_size, d): key position p
    is row p % page_size of page pages[p // page_size]. Tiles are gathered row by row, so a page size
    that does not divide the tile is as correct as one that does. A key on a missing page
    (masks.page_present) gathers as zeros, is never read, and is listed by :meth:`absent`. k_scale,
    v_scale: None, or the entry's float32 descales, (Hkv,) or anything that broadcasts to it."""

    def __init__(self, k_pages: np.ndarray, v_pages: np.ndarray, pages: np.ndarray, page_size: int,
                 start: int, stop: int, k_scale: np.ndarray | None = None,
                 v_scale: np.ndarray | None = None) -> None:
        self.k_pages, self.v_pages, self.pages, self.page_size = k_pages, v_pages, pages, page_size
        self.start, self.stop = start, stop
        self.scales = (k_scale, v_scale)
        self.heads = k_pages.shape[1]

    def tile(self, j0: int, j1: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values [j0, j1) (counted from start) as (1, Hkv, j1 - j0, d) arrays of `dtype`,
        descaled."""
        return tuple(_descaled(x, scale, dtype) for x, scale in zip(self._gather(j0, j1), self.scales))

    def max_abs(self, count: int | None = None) -> tuple[float, float]:
        """Largest magnitudes of the first `count` keys and values (all by default), descaled, gathered
        row by row so that the unused rows of the pages are not read."""
        count = self.stop - self.start if count is None else count
        return tuple(max_abs(x, scale) for x, scale in zip(self._gather(0, count), self.scales))

    def absent(self, j0: int, j1: int) -> np.ndarray | None:
        """Which keys of [j0, j1) (counted from start) lie on a missing page; None when none does."""
        present = page_present(self._pages(j0, j1), self.k_pages.shape[0])
        return None if present.all() else ~present

    def _pages(self, j0: int, j1: int) -> np.ndarray:
        return self.pages[(self.start + np.arange(j0, j1)) // self.page_size]

    def _gather(self, j0: int, j1: int) -> tuple[np.ndarray, np.ndarray]:
        pages, rows = self._pages(j0, j1), (self.start + np.arange(j0, j1)) % self.page_size
        present = page_present(pages, self.k_pages.shape[0])
        out = []
        for x in (self.k_pages, self.v_pages):
            if present.all():
                # Advanced indices around a slice put the gathered axis first: (j1 - j0, Hkv, d).
                rows_hd = x[pages, :, rows]
            else:  # a missing page's keys are zeros, not read
                rows_hd = np.zeros((len(pages), x.shape[1], x.shape[3]), dtype=x.dtype)
                rows_hd[present] = x[pages[present], :, rows[present]]
            out.append(rows_hd.transpose(1, 0, 2)[None])
        return tuple(out)


def append_keys(cache: np.ndarray, new: np.ndarray, args: Any) -> None:
    """Write new (B, Hkv, Nnew, d) into the cache at positions [cache_seqlens[b], + Nnew) of entry b; rows
    outside the cache (KVCacheArgs.appended) or whose page is missing (masks.page_present: unchecked
    tables) are dropped."""
    for i in range(new.shape[0]):
        start, count = int(args.cache_seqlens[i]), args.appended(i)
        if not args.paged:
            cache[i, :, start : start + count] = new[i, :, :count]
            continue
        positions = start + np.arange(count)
        pages = args.block_table[i, positions // args.page_size]
        kept = page_present(pages, cache.shape[0])
        rows = new[i, :, :count].transpose(1, 0, 2)  # (count, Hkv, d)
        cache[pages[kept], :, (positions % args.page_size)[kept]] = rows[kept]


def max_abs(x: np.ndarray, scale: np.ndarray | None = None) -> float:
    """Largest magnitude in x (0 for an empty array; NaN when x holds one, without a warning). scale:
    None, or per-head descales that broadcast to x.shape[:-2]: then the largest of |x * scale|."""
    if x.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        if scale is None:
            return float(np.abs(x).max())
        # A head's largest magnitude times its |scale|, in float64 (a float8 maximum has no headroom).
        head_max = np.abs(x).max(axis=(-2, -1)).astype(np.float64)
        return float((head_max * np.abs(np.asarray(scale, np.float64))).max())


def _descaled(x: np.ndarray, scale: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """x (..., Hkv, n, d) in `dtype`, times its per-head scale when there is one. Without one, no copy
    is made when x already has `dtype`."""
    if scale is None:
        return x.astype(dtype, copy=False)
    out = x.astype(dtype)  # a copy: scaled in place without touching the cache
    out *= np.asarray(scale, dtype)[..., None, None]
    return out
