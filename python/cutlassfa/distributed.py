"""Context-parallel attention over torch.distributed: one sequence, or a batch of packed documents,
split across the ranks of a process group; and decoding against a KV cache sharded over the ranks.

`ring_forward` (one sequence, (B, H, N_local, d) chunks) runs in one of two modes:

* ``allgather``: every rank gathers every rank's K/V (one all_gather, the rows put in global order by
  one copy) and attends its queries to them: one `forward` call per run of local query positions, no
  merge. With grouped heads the K/V is a fraction of Q (32/8 heads: a quarter), and gathering it costs
  a few percent of the attention time (Llama 3's context parallelism does this).
* ``ring``: the K/V blocks travel around the ring (rank r sends to r + 1 and receives from r - 1) while
  each rank attends its queries to the block it holds; the partial results are merged by their lse in
  float32 (`cutlassfa.merge`). After W steps every rank has attended to every block:

      step s: rank r holds the block of rank (r - s) mod W
              posts: send that block to r + 1, receive the block of rank (r - s - 1) mod W from r - 1
              attends its queries to the block it holds (overlapping the exchange), merges the result
              waits for the exchange

  The exchange is one `torch.distributed.batch_isend_irecv` per step (NCCL between GPUs, gloo on CPU),
  issued from a side CUDA stream for CUDA tensors, so it runs beside the attention kernels. Memory: two
  blocks instead of the whole K/V.

Only the K/V heads travel (GQA). Masks are those of the global sequence (see `_ring_plan`): a ring step
whose block no query of any rank may see is skipped, and the ring stops after the last step any rank
needs. `ring_varlen_forward` (packed documents, `_ring_varlen`) and `sharded_decode` (`_sharded_decode`)
are re-exported here.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _context_parallel, _ring_layout, _ring_plan
from ._api import forward
from ._options import softmax_scale as softmax_scale_of
from ._context_parallel import check_local, free_bytes, gathered_bytes, window_bounds
from ._ring_layout import LAYOUTS, shard, unshard
from ._ring_plan import Mask, Piece
from ._ring_varlen import ring_varlen_forward, shard_varlen, shard_varlen_rows, unshard_varlen
from ._sharded_decode import sharded_decode
from .merge import merge_attention, merge_attention_into

__all__ = ["LAYOUTS", "MODES", "ring_forward", "ring_varlen_forward", "shard", "shard_varlen", "shard_varlen_rows",
           "sharded_decode",
           "unshard", "unshard_varlen"]

MODES = ("auto", "ring", "allgather")
# Ring mode: attend to the block at hand while the next one travels (True), or receive it first, then
# attend (False). Measured on 4 H200s (NCCL 2.28, bf16 32/8 d 128, zigzag causal): the exchange beside the
# attention kernels slowed them by more than the exchange takes (N = 262,144: 0.270 s overlapped, 0.237 s
# one after the other, 0.228 s the attention alone), so the default waits.
RING_OVERLAP = False
# `auto` gathers the K/V when the gathered copies take at most this share of every rank's free memory.
_GATHER_MEMORY_SHARE = 0.5


def ring_forward(q: Any, k: Any, v: Any, *, group: Any = None, causal: bool = False,
                 softmax_scale: float | None = None, return_lse: bool = False, layout: str = "contiguous",
                 backend: str = "auto", window: tuple[int | None, int | None] | None = None, softcap: float = 0.0,
                 sinks: Any = None, alibi_slopes: Any = None, mode: str = "auto") -> Any:
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
            causal forces right = 0. Ring steps wholly outside the window are skipped.
        softcap: c > 0 caps every score to c * tanh(s / c), as `forward`.
        sinks: optional (Hq,) attention-sink logits (a torch tensor on q's device, the same on every
            rank), as `forward(..., sinks=)` of the global sequence: counted once per row.
        alibi_slopes: optional (Hq,) or (B, Hq) ALiBi slopes (a torch tensor on q's device, the same on
            every rank), on global positions: -slope * |i + Nk - Nq - j|. Needs a mask that sees no key
            past the diagonal (causal, or window right bound 0) and runs in the allgather mode (the ring's
            partial blocks would need each piece's position offset in the kernels).
        mode: "allgather", "ring" or "auto" (the module's docstring says what each does): auto gathers
            when the gathered K/V (twice its size during the gather) fits in half of every rank's free
            device memory, or when ALiBi asks for it, and runs the ring otherwise.
        softmax_scale: defaults to 1/sqrt(d). backend: as for `forward`, for the local attention.
        return_lse: also return the float32 (B, Hq, Nq_local) lse of the global softmax (natural log).

    Returns:
        The local (B, Hq, Nq_local, d) output in q's dtype, or (out, lse). A row that sees no key gives
        0 and lse -inf (the sink's logit with sinks). Forward only (no autograd).

    Raises:
        ValueError / TypeError on every rank alike when the ranks disagree or an argument is invalid;
        NotImplementedError (every rank) for ALiBi with a mask that sees past the diagonal or mode "ring".
    """
    import torch

    ring = _setup(q, k, v, group=group, causal=causal, softmax_scale=softmax_scale, layout=layout,
                  backend=backend, window=window, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes, mode=mode)
    if ring.mode == "allgather":
        out, lse = _gathered_attention(ring, q, k, v, sinks, alibi_slopes)
        return (out, lse) if return_lse else out
    acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # normalized partial output
    acc_lse = torch.full(q.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
    block = (k.contiguous(), v.contiguous())  # sent as is: point-to-point ops need contiguous tensors
    for step in range(ring.steps):
        exchange = _Exchange(ring, step, block) if step + 1 < ring.steps else None
        received = exchange.wait() if exchange is not None and not RING_OVERLAP else None
        _attend(ring, step, q, block, acc, acc_lse)
        if exchange is not None:
            block = received if received is not None else exchange.wait()
    if sinks is not None:  # one more part with no value, once (merge.py)
        acc, acc_lse = merge_attention([acc], [acc_lse], sinks=sinks)
    out = acc.to(q.dtype)
    return (out, acc_lse) if return_lse else out


# --------------------------------------------------------------------------------------------------
# Setup: what every rank holds, agreed by one all_gather
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Ring:
    """Everything a rank needs to run the call; identical on all ranks except `rank` and the plans."""

    group: Any
    rank: int
    world: int
    next_peer: int  # global ranks, as point-to-point ops name them
    prev_peer: int
    k_lengths: tuple[int, ...]  # every rank's Nk_local
    mode: str  # "ring" or "allgather"
    steps: int  # ring steps run: 1 + the last step any rank needs (ring mode)
    own_plans: tuple[tuple[Piece, ...], ...]  # ring mode: this rank's pieces at each step
    gathered_plan: tuple[Piece, ...]  # allgather mode: this rank's pieces against the keys in global order
    key_order: _context_parallel.RowOrder | None  # allgather mode: where each global key comes from
    scale: float
    softcap: float
    backend: str

    def source(self, step: int) -> int:
        """The rank whose K/V block this rank holds at `step`."""
        return (self.rank - step) % self.world


# What each rank reports: its local lengths and its free memory, then what all ranks must agree on.
_FIELDS = ("Nq_local", "Nk_local", "free bytes", "B", "Hq", "Hkv", "d", "dtype", "causal", "layout", "window left",
           "window right", "softmax_scale", "softcap", "sinks", "alibi_slopes", "mode", "kv row bytes")
_LOCAL_FIELDS = 3


def _local_settings(q: Any, k: Any, v: Any, causal: Any, softmax_scale: Any, layout: Any, window: Any,
                    softcap: Any, sinks: Any, alibi_slopes: Any, mode: Any) -> list[float]:
    """This rank's row of _FIELDS (-1 for an unbounded window side); raises for invalid arguments."""
    check_local(q, k, v, sinks=sinks, alibi_slopes=alibi_slopes, softcap=softcap)
    _ring_layout.check_layout(layout)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    left, right = window_bounds(window)
    d = q.shape[-1]
    scale = softmax_scale_of(d, softmax_scale)
    return [q.shape[2], k.shape[2], free_bytes(q), q.shape[0], q.shape[1], k.shape[1], d,
            _context_parallel.DTYPES.index(str(q.dtype)), int(causal), LAYOUTS.index(layout),
            -1 if left is None else left, -1 if right is None else right, scale, float(softcap), int(sinks is not None),
            int(alibi_slopes is not None), MODES.index(mode), gathered_bytes(k, 1)]


def _setup(q: Any, k: Any, v: Any, *, group: Any, causal: bool, softmax_scale: float | None, layout: str,
           backend: str, window: Any, softcap: float = 0.0, sinks: Any = None, alibi_slopes: Any = None,
           mode: str = "auto") -> _Ring:
    """Validates the local arguments, agrees on every rank's sizes and settings (`_context_parallel.agree`)
    and plans the call."""
    import torch.distributed as dist

    _context_parallel.require_group("ring_forward")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    table = _context_parallel.agree(group, _context_parallel.device_of(q), _FIELDS,
                                    lambda: _local_settings(q, k, v, causal, softmax_scale, layout, window, softcap,
                                                            sinks, alibi_slopes, mode), _FIELDS[_LOCAL_FIELDS:])
    agreed = dict(zip(_FIELDS, table[0].tolist()))
    left, right = (None if agreed[side] < 0 else int(agreed[side]) for side in ("window left", "window right"))
    q_lengths, k_lengths = table[:, 0].astype(int).tolist(), table[:, 1].astype(int).tolist()
    mask = Mask(sum(k_lengths) - sum(q_lengths), causal, left, right)
    gather_fits = bool(np.all(agreed["kv row bytes"] * sum(k_lengths) <= _GATHER_MEMORY_SHARE * table[:, 2]))
    mode = _choose_mode(mode, mask, alibi=bool(agreed["alibi_slopes"]), gather_fits=gather_fits)
    plan = _plan(rank, layout, tuple(q_lengths), tuple(k_lengths), mask, mode)
    peer = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    return _Ring(group, rank, world, peer((rank + 1) % world), peer((rank - 1) % world), tuple(k_lengths), mode,
                 plan.steps, plan.own_plans, plan.gathered_plan, plan.key_order, agreed["softmax_scale"],
                 agreed["softcap"], backend)


@dataclass(frozen=True)
class _Plan:
    """The calls of one rank for one set of sizes and mask (the per-mode fields of `_Ring`)."""

    steps: int
    own_plans: tuple[tuple[Piece, ...], ...]
    gathered_plan: tuple[Piece, ...]
    key_order: _context_parallel.RowOrder | None


@functools.lru_cache(maxsize=32)
def _plan(rank: int, layout: str, q_lengths: tuple[int, ...], k_lengths: tuple[int, ...], mask: Mask,
          mode: str) -> _Plan:
    """This rank's calls, from values every rank agrees on; kept for the next call of the same sizes (the
    plans of a long sequence take milliseconds of numpy, and the gather's index a copy to the device)."""
    world = len(q_lengths)
    q_runs = _ring_layout.segments(layout, q_lengths)
    k_runs = _ring_layout.segments(layout, k_lengths)
    if mode == "ring":
        steps = _ring_plan.steps_needed(q_runs, k_runs, mask)
        q_pos = _ring_layout.positions(q_runs[rank])
        own = tuple(tuple(_ring_plan.plan(q_pos, _ring_layout.positions(k_runs[(rank - s) % world]), mask))
                    for s in range(steps))
        return _Plan(steps, own, (), None)
    order = _context_parallel.RowOrder(_ring_layout.global_order(k_runs), k_lengths)
    return _Plan(0, (), tuple(_ring_plan.plan_runs(q_runs[rank], sum(k_lengths), mask)), order)


def _choose_mode(mode: str, mask: Mask, *, alibi: bool, gather_fits: bool) -> str:
    """The mode a call runs in, from values every rank agrees on (so every rank chooses alike)."""
    if alibi and mask.upper > 0:
        raise NotImplementedError("alibi_slopes on a split sequence needs a mask that sees no key past the "
                                  "diagonal (causal, or a window whose right bound is 0)")
    if alibi and mode == "ring":
        raise NotImplementedError("alibi_slopes runs in mode 'allgather' (the ring's blocks would need the "
                                  "position offset of each piece in the kernels)")
    if mode == "auto":
        return "allgather" if gather_fits or alibi else "ring"
    return mode


# --------------------------------------------------------------------------------------------------
# The allgather mode: every rank's K/V in global order, one call per run of local queries
# --------------------------------------------------------------------------------------------------

def _gathered_attention(ring: _Ring, q: Any, k: Any, v: Any, sinks: Any, alibi_slopes: Any) -> tuple[Any, Any]:
    """(out, lse) of the local queries against every rank's keys, gathered in global order (one group of
    K/V heads at a time, `_context_parallel.gather_rows_by_heads`)."""
    import torch

    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
    if sinks is not None:  # rows that see no key: the sink alone
        lse.copy_(sinks.float()[None, :, None].expand(lse.shape))
    per_kv_head = q.shape[1] // k.shape[1]
    for kv_heads, (k_all, v_all) in _context_parallel.gather_rows_by_heads([k, v], ring.key_order, 2, 1, ring.group):
        heads = slice(kv_heads.start * per_kv_head, kv_heads.stop * per_kv_head)
        _attend_gathered(ring, q[:, heads], k_all, v_all, None if sinks is None else sinks[heads],
                         None if alibi_slopes is None else alibi_slopes[..., heads], out[:, heads], lse[:, heads])
    return out, lse


def _attend_gathered(ring: _Ring, q: Any, k_all: Any, v_all: Any, sinks: Any, alibi_slopes: Any, out: Any,
                     lse: Any) -> None:
    """One `forward` per piece of the gathered plan, each writing its own rows of out and lse."""
    for piece in ring.gathered_plan:
        rows, keys = slice(*piece.rows), slice(*piece.keys)
        _, part_lse = _forward_piece(q[:, :, rows], k_all[:, :, keys], v_all[:, :, keys], piece, ring,
                                     out=out[:, :, rows], sinks=sinks, alibi_slopes=alibi_slopes)
        lse[:, :, rows] = part_lse


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


def _forward_piece(q: Any, k: Any, v: Any, piece: Piece, ring: _Ring, **options: Any) -> tuple[Any, Any]:
    """One `forward` call with the piece's own mask (bottom-right aligned on the slices)."""
    if piece.window is not None:
        options["window"] = piece.window
    if ring.softcap > 0:
        options["softcap"] = ring.softcap
    return forward(q, k, v, causal=piece.causal, softmax_scale=ring.scale, backend=ring.backend, return_lse=True,
                   **options)
