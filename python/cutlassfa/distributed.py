"""Context-parallel (ring) attention over torch.distributed.

The sequence is split across the ranks of a process group; each rank holds its queries and its block of
keys/values. The K/V blocks travel around the ring (rank r sends to r + 1 and receives from r - 1) while
each rank attends its queries to the block it holds; the partial results are merged by their lse in
float32 (`cutlassfa.merge`). After W steps every rank has attended to every block:

    step s: rank r holds the block of rank (r - s) mod W
            posts: send that block to r + 1, receive the block of rank (r - s - 1) mod W from r - 1
            attends its queries to the block it holds (overlapping the exchange), merges the result
            waits for the exchange

The exchange is one `torch.distributed.batch_isend_irecv` per step (NCCL between GPUs, gloo on CPU),
issued from a side CUDA stream for CUDA tensors, so it runs beside the attention kernels. Only the K/V
heads travel (GQA). Masks are those of the global sequence (see `_ring_plan`): a step whose block no
query of any rank may see is skipped, and the ring stops after the last step any rank needs.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _ring_layout, _ring_plan
from ._api import forward, select_backend
from ._arrays import stand_in
from ._ring_layout import LAYOUTS, shard, unshard
from ._ring_plan import Mask, Piece
from .merge import merge_attention, merge_attention_into

__all__ = ["LAYOUTS", "ring_forward", "shard", "unshard"]

_DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16")
# Pieces whose mask is a band (sliding windows) need `forward(..., window=(left, right))`.
_FORWARD_TAKES_WINDOW = "window" in inspect.signature(forward).parameters


def ring_forward(q: Any, k: Any, v: Any, *, group: Any = None, causal: bool = False,
                 softmax_scale: float | None = None, return_lse: bool = False, layout: str = "contiguous",
                 backend: str = "auto", window: tuple[int | None, int | None] | None = None,
                 sinks: Any = None) -> Any:
    """Attention over a sequence split across the ranks of a torch.distributed process group.

    Every rank of `group` (default: the whole world) calls this with its local chunk:

    Args:
        q: (B, Hq, Nq_local, d) torch tensor; k, v: (B, Hkv, Nk_local, d), Hq a multiple of Hkv; float32,
            float16 or bfloat16; d in (32, 64, 128); CUDA tensors (NCCL) or CPU tensors (gloo); the last
            dim contiguous. Local lengths may differ between ranks (and from one another); every other
            size, the dtype and every keyword must be the same on all ranks.
        layout: which global positions the local chunks hold (`LAYOUTS`). "contiguous": rank r holds the
            r-th run of positions, of any lengths. "zigzag": the sequence is cut into 2W chunks and rank r
            holds chunks r and 2W-1-r, as `shard(x, r, W, "zigzag")` makes them; this balances the work
            of a causal mask.
        causal: bottom-right aligned over the global sequence: query i sees key j iff
            j <= i + Nk - Nq (Nq, Nk the totals over all ranks).
        window: (left, right), a sliding window over the global sequence, bottom-right aligned: query i
            sees keys [i + Nk - Nq - left, i + Nk - Nq + right]; None or -1 leaves a side unbounded;
            causal forces right = 0. Steps wholly outside the window are skipped.
        sinks: optional (Hq,) attention-sink logits (a torch tensor on q's device, the same on every
            rank), as `forward(..., sinks=)` of the global sequence: merged once, after the last step.
        softmax_scale: defaults to 1/sqrt(d). backend: as for `forward`, for the local attention.
        return_lse: also return the float32 (B, Hq, Nq_local) lse of the global softmax (natural log).

    Returns:
        The local (B, Hq, Nq_local, d) output in q's dtype, or (out, lse). A row that sees no key gives
        0 and lse -inf. Forward only (no autograd).

    Raises:
        ValueError / TypeError on every rank alike when the ranks disagree or an argument is invalid;
        NotImplementedError for a window that cuts blocks into bands while `forward` has no window.
    """
    import torch

    ring = _setup(q, k, v, group=group, causal=causal, softmax_scale=softmax_scale, layout=layout,
                  backend=backend, window=window, sinks=sinks)
    acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # normalized partial output
    acc_lse = torch.full(q.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
    block = (k.contiguous(), v.contiguous())  # sent as is: point-to-point ops need contiguous tensors
    for step in range(ring.steps):
        exchange = _Exchange(ring, step, block) if step + 1 < ring.steps else None
        _attend(ring, step, q, block, acc, acc_lse)
        if exchange is not None:
            block = exchange.wait()
    if sinks is not None:  # one more part with no value, once (merge.py)
        acc, acc_lse = merge_attention([acc], [acc_lse], sinks=sinks)
    out = acc.to(q.dtype)
    return (out, acc_lse) if return_lse else out


# --------------------------------------------------------------------------------------------------
# Setup: what every rank holds, agreed by one all_gather
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Ring:
    """Everything a rank needs to run the ring; identical on all ranks except `rank` and `own_plans`."""

    group: Any
    rank: int
    world: int
    next_peer: int  # global ranks, as point-to-point ops name them
    prev_peer: int
    k_lengths: tuple[int, ...]  # every rank's Nk_local
    steps: int  # ring steps run: 1 + the last step any rank needs
    own_plans: tuple[tuple[Piece, ...], ...]  # this rank's pieces at each step
    scale: float
    backend: str

    def source(self, step: int) -> int:
        """The rank whose K/V block this rank holds at `step`."""
        return (self.rank - step) % self.world


def _check_local(q: Any, k: Any, v: Any, sinks: Any = None) -> None:
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N_local, d), got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype or str(q.dtype) not in _DTYPES:
        raise TypeError(f"q, k, v must share one dtype of float32, float16, bfloat16; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    (b, hq, _, d), (bk, hkv, _, dk) = q.shape, k.shape
    if b != bk or d != dk:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head dim")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"the heads of q ({hq}) must be a multiple of the heads of k and v ({hkv})")
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.device != q.device):
        raise ValueError(f"sinks must be a torch tensor on q's device ({q.device}), got "
                         f"{getattr(sinks, 'device', type(sinks).__name__)}")
    # The head dim, dtype and sinks as forward's validator judges them (which backend runs a block is
    # forward's question, asked on each block).
    select_backend(stand_in(q), stand_in(k), stand_in(v), sinks=stand_in(sinks))


def _window_bounds(window: Any) -> tuple[int | None, int | None]:
    """(left, right) with None for an unbounded side (given as None or -1)."""
    if window is None:
        return None, None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a (left, right) pair, got {window!r}")
    bounds = []
    for side in window:
        if side is None or side == -1:
            bounds.append(None)
        elif isinstance(side, (int, np.integer)) and not isinstance(side, bool) and side >= 0:
            bounds.append(int(side))
        else:
            raise ValueError(f"window sides must be integers >= 0, or -1 / None for unbounded; got {window!r}")
    return bounds[0], bounds[1]


# What each rank reports: its local lengths, then what all ranks must agree on.
_FIELDS = ("Nq_local", "Nk_local", "B", "Hq", "Hkv", "d", "dtype", "causal", "layout", "window left",
           "window right", "softmax_scale")


def _local_settings(q: Any, k: Any, v: Any, causal: Any, softmax_scale: Any, layout: Any, window: Any,
                    sinks: Any = None) -> list[float]:
    """This rank's row of _FIELDS (-1 for an unbounded window side); raises for invalid arguments."""
    _check_local(q, k, v, sinks)
    _ring_layout.check_layout(layout)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    left, right = _window_bounds(window)
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    return [q.shape[2], k.shape[2], q.shape[0], q.shape[1], k.shape[1], d, _DTYPES.index(str(q.dtype)),
            int(causal), LAYOUTS.index(layout), -1 if left is None else left, -1 if right is None else right,
            scale]


def _setup(q: Any, k: Any, v: Any, *, group: Any, causal: bool, softmax_scale: float | None, layout: str,
           backend: str, window: Any, sinks: Any = None) -> _Ring:
    """Validates the local arguments, gathers every rank's sizes and settings and plans the steps.

    The one all_gather comes before any check can raise, so that a mistake on one rank (or ranks that
    disagree) raises on every rank instead of leaving the others waiting in the ring."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_forward needs an initialized torch.distributed process group")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    try:
        mine, error = _local_settings(q, k, v, causal, softmax_scale, layout, window, sinks), None
    except (TypeError, ValueError) as invalid:
        mine, error = [math.nan] * len(_FIELDS), invalid  # NaN marks a rank with invalid arguments
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    local = torch.tensor(mine, dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local, group=group)
    table = np.array([t.cpu().numpy() for t in gathered])  # (world, fields)
    if error is not None:
        raise error
    invalid_ranks = np.flatnonzero(np.isnan(table).any(axis=1)).tolist()
    if invalid_ranks:
        raise ValueError(f"ranks {invalid_ranks} of the group passed invalid arguments (their error says which)")
    for column, name in enumerate(_FIELDS[2:], start=2):
        if np.any(table[:, column] != table[0, column]):
            raise ValueError(f"every rank must pass the same {name}; got {table[:, column].tolist()} by rank")
    agreed = dict(zip(_FIELDS, table[0].tolist()))
    left, right = (None if agreed[side] < 0 else int(agreed[side]) for side in ("window left", "window right"))
    scale = agreed["softmax_scale"]
    q_lengths, k_lengths = table[:, 0].astype(int).tolist(), table[:, 1].astype(int).tolist()
    q_runs = _ring_layout.segments(layout, q_lengths)
    k_runs = _ring_layout.segments(layout, k_lengths)
    mask = Mask(sum(k_lengths) - sum(q_lengths), causal, left, right)

    def plans(r: int, steps: int) -> tuple[tuple[Piece, ...], ...]:
        q_pos = _ring_layout.positions(q_runs[r])
        return tuple(tuple(_ring_plan.plan(q_pos, _ring_layout.positions(k_runs[(r - s) % world]), mask))
                     for s in range(steps))

    steps = _ring_plan.steps_needed(q_runs, k_runs, mask)
    if left is not None and not _FORWARD_TAKES_WINDOW:
        # Decided from every rank's plans, so that all ranks raise together.
        if any(p.window is not None for r in range(world) for step in plans(r, steps) for p in step):
            raise NotImplementedError("this window cuts ring steps into bands, which needs forward(window=...)")

    peer = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    return _Ring(group, rank, world, peer((rank + 1) % world), peer((rank - 1) % world), tuple(k_lengths),
                 steps, plans(rank, steps), scale, backend)


# --------------------------------------------------------------------------------------------------
# One step: the exchange and the local attention
# --------------------------------------------------------------------------------------------------

class _Exchange:
    """Sends the block this rank holds at `step` to the next rank and receives the previous rank's, in
    the background: posted before the step's attention, waited for after it."""

    def __init__(self, ring: _Ring, step: int, block: tuple[Any, Any]) -> None:
        import torch
        import torch.distributed as dist

        k, v = block
        b, hkv, _, d = k.shape
        incoming = ring.k_lengths[ring.source(step + 1)]
        self.received = tuple(torch.empty((b, hkv, incoming, d), dtype=k.dtype, device=k.device) for _ in range(2))
        # An empty block travels as nothing: sender and receiver both know its length.
        ops = []
        if k.shape[2] > 0:
            ops += [dist.P2POp(dist.isend, t, ring.next_peer, ring.group) for t in (k, v)]
        if incoming > 0:
            ops += [dist.P2POp(dist.irecv, t, ring.prev_peer, ring.group) for t in self.received]
        self.device = k.device
        self.stream = None
        if k.is_cuda:
            # The side stream starts once the block is ready on the compute stream; NCCL then runs
            # beside the attention kernels that follow on the compute stream.
            self.stream = torch.cuda.Stream(device=k.device)
            self.stream.wait_stream(torch.cuda.current_stream(k.device))
        with self._on_side_stream():
            self.works = dist.batch_isend_irecv(ops) if ops else []

    def _on_side_stream(self) -> Any:
        import torch

        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def wait(self) -> tuple[Any, Any]:
        """The received (k, v) block, ready for the compute stream."""
        import torch

        with self._on_side_stream():
            for work in self.works:
                work.wait()
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return self.received


def _attend(ring: _Ring, step: int, q: Any, block: tuple[Any, Any], acc: Any, acc_lse: Any) -> None:
    """Attends q to the block held at `step`, piece by piece, merging each result into (acc, acc_lse)."""
    k, v = block
    for piece in ring.own_plans[step]:
        rows, keys = slice(*piece.rows), slice(*piece.keys)
        part, part_lse = _forward_piece(q[:, :, rows], k[:, :, keys], v[:, :, keys], piece, ring)
        merge_attention_into(acc[:, :, rows], acc_lse[:, :, rows], part, part_lse)


def _forward_piece(q: Any, k: Any, v: Any, piece: Piece, ring: _Ring) -> tuple[Any, Any]:
    """One `forward` call with the piece's own mask (bottom-right aligned on the slices)."""
    window = {} if piece.window is None else {"window": piece.window}
    return forward(q, k, v, causal=piece.causal, softmax_scale=ring.scale, backend=ring.backend, return_lse=True,
               **window)
