"""Packed documents (varlen_forward's layout) split across the ranks of a process group.

Layout ("document zigzag"): every document is cut into 2W chunks (the first of them one longer where
the length does not divide) and rank r holds chunks r and 2W-1-r of every document, so that under a
causal mask every rank does the same work on every document. A rank's rows are its first chunks of all
documents in document order, then its second chunks: two halves, each a packed batch of its own.
`shard_varlen` / `unshard_varlen` make and undo it; `shard_varlen_rows` says which global rows a rank holds
(for position ids).

The attention is one `varlen_forward` over 2B entries, one for each local chunk: the chunk of document
b whose queries sit at rows [a, a + m) of the document sees the document's keys [0, E), E = a + m + Nk_b -
Nq_b under a mask that sees nothing past the diagonal (all Nk_b keys otherwise): an entry whose
bottom-right alignment is the document's. The keys of the entries, one after another, are what one
all_gather of every rank's K/V rows and one indexing copy make (with grouped heads the K/V is a fraction
of Q; the copy holds about (2W+1)/2W of the keys, as the entries of a document's two chunks share its
first keys).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from . import _context_parallel
from ._context_parallel import DTYPES, check_local, window_bounds
from ._api import varlen_forward
from ._options import softmax_scale as softmax_scale_of
from ._ring_layout import split_sizes

__all__ = ["ring_varlen_forward", "shard_varlen", "shard_varlen_rows", "unshard_varlen"]


def _lengths(cu_seqlens: Any, name: str) -> np.ndarray:
    """A host (B+1,) prefix sum, checked, as int64 lengths (B,)."""
    if hasattr(cu_seqlens, "detach"):
        cu_seqlens = cu_seqlens.detach().cpu().numpy()
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.size < 1 or not np.issubdtype(cu.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D integer prefix sum (B+1,), got {cu.shape} {cu.dtype}")
    lengths = np.diff(cu.astype(np.int64))
    if cu[0] != 0 or np.any(lengths < 0):
        raise ValueError(f"{name} must start at 0 and never decrease, got {cu.tolist()}")
    return lengths


def _chunks(lengths: np.ndarray, world: int) -> np.ndarray:
    """(B, 2W) chunk lengths of every document."""
    return np.array([split_sizes(int(n), 2 * world) for n in lengths], dtype=np.int64).reshape(len(lengths), 2 * world)


def _half_rows(lengths: np.ndarray, rank: int, world: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each half (chunk r, then chunk 2W-1-r): (first row in the document, length) per document."""
    chunks = _chunks(lengths, world)
    starts = np.cumsum(chunks, axis=1) - chunks
    return [(starts[:, c], chunks[:, c]) for c in (rank, 2 * world - 1 - rank)]


def shard_varlen_rows(cu_seqlens: Any, rank: int, world: int) -> np.ndarray:
    """The global rows (int64) that rank `rank` of `world` holds, in its local order."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    return _rows(_lengths(cu_seqlens, "cu_seqlens"), rank, world)


def _rows(lengths: np.ndarray, rank: int, world: int) -> np.ndarray:
    doc_starts = np.cumsum(lengths) - lengths
    rows = [np.arange(s, s + n) + d for first, n_all in _half_rows(lengths, rank, world)
            for d, s, n in zip(doc_starts, first, n_all)]
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)


def _take_rows(x: Any, rows: np.ndarray, dim: int) -> Any:
    if type(x).__module__.startswith("torch"):
        import torch

        return x.index_select(dim, torch.as_tensor(rows, device=x.device))
    return np.take(x, rows, axis=dim) if isinstance(x, np.ndarray) else x.take(rows, axis=dim)


def shard_varlen(x: Any, cu_seqlens: Any, rank: int, world: int, *, dim: int = 0) -> Any:
    """The rows of a packed batch `x` ((total, H, d) by default, rows along `dim`) that rank `rank` of
    `world` holds (a copy). numpy, PyTorch and CuPy arrays."""
    return _take_rows(x, shard_varlen_rows(cu_seqlens, rank, world), dim)


def unshard_varlen(chunks: Sequence[Any], cu_seqlens: Any, *, dim: int = 0) -> Any:
    """The packed batch from every rank's rows (in rank order): the inverse of `shard_varlen`. For an lse
    of varlen's (H, total) layout, pass dim=1."""
    chunks = list(chunks)
    world = len(chunks)
    rows = np.concatenate([shard_varlen_rows(cu_seqlens, r, world) for r in range(world)])
    inverse = np.argsort(rows, kind="stable")
    if type(chunks[0]).__module__.startswith("torch"):
        import torch

        return torch.cat(chunks, dim).index_select(dim, torch.as_tensor(inverse, device=chunks[0].device))
    xp = np if isinstance(chunks[0], np.ndarray) else __import__("cupy")
    return xp.take(xp.concatenate(chunks, axis=dim), inverse, axis=dim)


# --------------------------------------------------------------------------------------------------
# The attention
# --------------------------------------------------------------------------------------------------

_FIELDS = ("rows q", "rows k", "documents", "total q", "total k", "cu_seqlens_q sum",
           "cu_seqlens_k sum", "Hq", "Hkv", "d", "dtype", "causal", "window left", "window right", "softmax_scale",
           "softcap", "sinks", "alibi_slopes")
_LOCAL_FIELDS = 2


def ring_varlen_forward(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *, group: Any = None,
                        causal: bool = False, softmax_scale: float | None = None,
                        window: tuple[int | None, int | None] | None = None, softcap: float = 0.0, sinks: Any = None,
                        alibi_slopes: Any = None, backend: str = "auto", return_lse: bool = False) -> Any:
    """`varlen_forward` of a packed batch of documents whose rows are split across the ranks of a
    torch.distributed process group, in the layout of `shard_varlen` (this module's docstring).

    Args:
        q: this rank's rows (total_q_local, Hq, d), `shard_varlen(q_packed, cu_seqlens_q, rank, W)`; k, v
            (total_k_local, Hkv, d) likewise with cu_seqlens_k; torch tensors, CUDA (NCCL) or CPU (gloo),
            dtypes and head dims as `varlen_forward`.
        cu_seqlens_q, cu_seqlens_k: the whole batch's (B+1,) prefix sums (host integers, numpy arrays or
            CPU tensors), the same on every rank.
        causal, window, softcap, sinks, alibi_slopes, softmax_scale, backend: as `varlen_forward`, on each
            document's global positions (bottom-right aligned within the document). A window must see
            nothing past the diagonal (causal, or a right bound of 0) or be absent; ALiBi needs such a mask.
        return_lse: also return the float32 lse (Hq, total_q_local).

    Every rank holds the whole batch's K/V during the call (gathered, about (2W+1)/2W of it in the order
    the entries read it, and the received copy).

    Returns:
        out (total_q_local, Hq, d) in q's dtype, or (out, lse). Every rank of the group must call it with
        the same sizes and settings; ranks that disagree or pass invalid arguments all raise.
    """
    import torch
    import torch.distributed as dist

    _context_parallel.require_group("ring_varlen_forward")
    rank, world = dist.get_rank(group), dist.get_world_size(group)

    def local() -> list[float]:
        nq, nk = _lengths(cu_seqlens_q, "cu_seqlens_q"), _lengths(cu_seqlens_k, "cu_seqlens_k")
        if len(nq) != len(nk):
            raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe as many documents, got {len(nq)} and "
                             f"{len(nk)}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                raise ValueError(f"{name} must be a 3-D torch tensor (total_local, H, d), got "
                                 f"{getattr(t, 'shape', type(t).__name__)}")
        per_document = alibi_slopes is not None and getattr(alibi_slopes, "dim", lambda: 1)() == 2
        if per_document and alibi_slopes.shape[0] != len(nq):
            raise ValueError(f"alibi_slopes must have shape ({q.shape[1]},) or ({len(nq)}, {q.shape[1]}), one per "
                             f"query head (and document), got {tuple(alibi_slopes.shape)}")
        check_local(q[None].transpose(1, 2), k[None].transpose(1, 2), v[None].transpose(1, 2), sinks=sinks,
                    alibi_slopes=alibi_slopes[:1] if per_document else alibi_slopes, softcap=softcap)
        for name, lengths, t in (("q", nq, q), ("k", nk, k)):
            expected = int(sum(int(c.sum()) for _, c in _half_rows(lengths, rank, world)))
            if t.shape[0] != expected:
                raise ValueError(f"{name} holds {t.shape[0]} rows; shard_varlen gives rank {rank} of {world} "
                                 f"{expected} rows of this batch")
        left, right = window_bounds(window)
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        scale = softmax_scale_of(q.shape[-1], softmax_scale)
        cu_q, cu_k = np.concatenate([[0], np.cumsum(nq)]), np.concatenate([[0], np.cumsum(nk)])
        return [q.shape[0], k.shape[0], len(nq), cu_q[-1], cu_k[-1], float(cu_q.sum()),
                float(cu_k.sum()), q.shape[1], k.shape[1], q.shape[2], DTYPES.index(str(q.dtype)),
                int(causal), -1 if left is None else left, -1 if right is None else right, scale, float(softcap),
                int(sinks is not None), int(alibi_slopes is not None)]

    table = _context_parallel.agree(group, _context_parallel.device_of(q), _FIELDS, local, _FIELDS[_LOCAL_FIELDS:])
    agreed = dict(zip(_FIELDS, table[0].tolist()))
    left = None if agreed["window left"] < 0 else int(agreed["window left"])
    right = None if agreed["window right"] < 0 else int(agreed["window right"])
    sees_past_diagonal = not causal and right != 0
    if sees_past_diagonal and (left is not None or right is not None):
        raise NotImplementedError("ring_varlen_forward takes windows that see nothing past the diagonal (causal, "
                                  "or a right bound of 0)")
    if sees_past_diagonal and alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes in ring_varlen_forward needs causal=True or a right window bound of 0")

    plan = _plan(rank, world, tuple(_lengths(cu_seqlens_q, "cu_seqlens_q").tolist()),
                 tuple(_lengths(cu_seqlens_k, "cu_seqlens_k").tolist()), sees_past_diagonal)
    options = {} if left is None and right is None else dict(window=(-1 if left is None else left, 0))
    if agreed["softcap"] > 0:
        options["softcap"] = agreed["softcap"]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    if alibi_slopes is not None and alibi_slopes.dim() == 2:  # (B, Hq): one row per entry, chunk by chunk
        alibi_slopes = torch.cat([alibi_slopes, alibi_slopes])
    per_kv_head = q.shape[1] // k.shape[1]
    for kv_heads, (k_entries, v_entries) in _context_parallel.gather_rows_by_heads([k, v], plan.key_rows, 0, 1, group):
        heads = slice(kv_heads.start * per_kv_head, kv_heads.stop * per_kv_head)
        cu_q, cu_k = plan.cu_seqlens(q.device)
        _, part_lse = varlen_forward(q[:, heads], k_entries, v_entries, cu_q, cu_k, max_seqlen_q=plan.max_q,
                                     max_seqlen_k=plan.max_k, causal=causal, softmax_scale=agreed["softmax_scale"],
                                     sinks=None if sinks is None else sinks[heads],
                                     alibi_slopes=None if alibi_slopes is None else alibi_slopes[..., heads],
                                     backend=backend, return_lse=True, out=out[:, heads], **options)
        lse[heads] = part_lse
    return (out, lse) if return_lse else out


@dataclass(frozen=True)
class _Plan:
    """This rank's one varlen call: which gathered key rows its entries read, in order, and the entries'
    prefix sums (int32; on each device once: host ones would be checked and copied every call)."""

    key_rows: _context_parallel.RowOrder
    cu_q: np.ndarray
    cu_k: np.ndarray
    max_q: int
    max_k: int
    on_device: dict = field(default_factory=dict, compare=False)

    def cu_seqlens(self, device: Any) -> tuple[Any, Any]:
        import torch

        if device not in self.on_device:
            self.on_device[device] = tuple(torch.as_tensor(cu, device=device) for cu in (self.cu_q, self.cu_k))
        return self.on_device[device]


@functools.lru_cache(maxsize=32)
def _plan(rank: int, world: int, nq: tuple[int, ...], nk: tuple[int, ...], sees_past_diagonal: bool) -> _Plan:
    """The plan of a batch of these lengths; kept for the next call of the batch."""
    nq_a, nk_a = np.array(nq, dtype=np.int64), np.array(nk, dtype=np.int64)
    k_rows = [_rows(nk_a, r, world) for r in range(world)]
    source = np.zeros((int(nk_a.sum()), 2), dtype=np.int64)  # (rank, local row) of each global key
    for r, rows in enumerate(k_rows):
        source[rows, 0], source[rows, 1] = r, np.arange(len(rows))
    k_starts = np.cumsum(nk_a) - nk_a
    entries_q, entries_k, picked = [], [], []
    for first, m in _half_rows(nq_a, rank, world):
        # E: the document's keys up to this chunk's last diagonal (all of them when the mask sees past it).
        ends = nk_a if sees_past_diagonal else np.clip(first + m + nk_a - nq_a, 0, nk_a)
        entries_q.append(m)
        entries_k.append(ends)
        picked += [np.arange(start, start + end) for start, end in zip(k_starts, ends)]
    entries_q, entries_k = np.concatenate(entries_q), np.concatenate(entries_k)
    rows = np.concatenate(picked).astype(np.int64) if picked else np.zeros(0, dtype=np.int64)
    key_rows = _context_parallel.RowOrder(source[rows], [len(r) for r in k_rows])
    return _Plan(key_rows, np.concatenate([[0], np.cumsum(entries_q)]).astype(np.int32),
                 np.concatenate([[0], np.cumsum(entries_k)]).astype(np.int32), max(int(entries_q.max(initial=0)), 1),
                 max(int(entries_k.max(initial=0)), 1))
