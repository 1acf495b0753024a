"""What every context-parallel call shares: the checks of a rank's own arguments, agreeing on them
with the other ranks before any rank can raise, and gathering every rank's rows of a tensor.

Agreement comes first in each call: one all_gather of a row of numbers per rank (its sizes and its
settings, NaN for a rank whose arguments are invalid), so that an invalid argument on one rank, or ranks
that disagree, raise on every rank together instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ._api import select_backend
from ._arrays import stand_in

DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16")


def check_local(q: Any, k: Any, v: Any, *, sinks: Any = None, alibi_slopes: Any = None, softcap: Any = 0.0) -> None:
    """The checks of one rank's (B, H, N, d) torch chunks: dtypes, devices, shapes, and the options as
    forward's validator judges them (which backend runs a piece is forward's question, asked per piece)."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N_local, d), got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype or str(q.dtype) not in DTYPES:
        raise TypeError(f"q, k, v must share one dtype of float32, float16, bfloat16; got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    (b, hq, _, d), (bk, hkv, _, dk) = q.shape, k.shape
    if b != bk or d != dk:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head dim")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"the heads of q ({hq}) must be a multiple of the heads of k and v ({hkv})")
    for name, t in (("sinks", sinks), ("alibi_slopes", alibi_slopes)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.device != q.device):
            raise ValueError(f"{name} must be a torch tensor on q's device ({q.device}), got "
                             f"{getattr(t, 'device', type(t).__name__)}")
    select_backend(stand_in(q), stand_in(k), stand_in(v), sinks=stand_in(sinks), alibi_slopes=stand_in(alibi_slopes),
                   softcap=softcap)


def window_bounds(window: Any) -> tuple[int | None, int | None]:
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


def gathered_bytes(k: Any, total_rows: int) -> int:
    """Device bytes the gathered K and V of `total_rows` keys take, twice (the received rows and the ordered
    copy). k: (B, Hkv, N, d)."""
    b, hkv, _, d = k.shape
    return 2 * 2 * k.element_size() * b * hkv * d * total_rows


def free_bytes(x: Any) -> float:
    """Free device memory where x lives (CPU tensors: unbounded)."""
    import torch

    return torch.cuda.mem_get_info(x.device)[0] if x.is_cuda else math.inf


def require_group(name: str) -> None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{name} needs an initialized torch.distributed process group")


def agree(group: Any, device: Any, fields: Sequence[str], local: Callable[[], list[float]],
          agreed: Sequence[str]) -> np.ndarray:
    """Every rank's row of `fields` (world, fields), float64, after checking that the `agreed` fields are
    the same on every rank. `local()` computes this rank's row and raises TypeError / ValueError for
    invalid arguments; that error is raised on this rank, and the others say which ranks were invalid,
    after the one all_gather every rank joins."""
    import torch
    import torch.distributed as dist

    try:
        mine, error = local(), None
    except (TypeError, ValueError) as invalid:
        mine, error = [math.nan] * len(fields), invalid  # NaN marks a rank with invalid arguments
    row = torch.tensor(mine, dtype=torch.float64, device=device)
    gathered = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, row, group=group)
    table = np.array([t.cpu().numpy() for t in gathered])
    if error is not None:
        raise error
    invalid_ranks = np.flatnonzero(np.isnan(table).any(axis=1)).tolist()
    if invalid_ranks:
        raise ValueError(f"ranks {invalid_ranks} of the group passed invalid arguments (their error says which)")
    for name in agreed:
        column = table[:, list(fields).index(name)]
        if np.any(column != column[0]):
            raise ValueError(f"every rank must pass the same {name}; got {column.tolist()} by rank")
    return table


def all_gather_tensor(output: Any, local: Any, group: Any) -> None:
    """All ranks' `local` (same shape everywhere) concatenated along dim 0 into `output`, on every rank
    (all_gather_single where this PyTorch has it, else its older name all_gather_into_tensor)."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, local, group=group)


def device_of(x: Any) -> Any:
    """Where a call's collectives run: x's device for a torch tensor, else the CPU."""
    import torch

    return x.device if isinstance(x, torch.Tensor) else torch.device("cpu")


class RowOrder:
    """Which rank's local row each global row is: order (total, 2) of (rank, local row), every rank's row
    count in `lengths`. The index into the gathered buffer (each rank's rows padded to the longest) is
    built once per device and kept, as the plans that hold this object are."""

    def __init__(self, order: np.ndarray, lengths: Sequence[int]) -> None:
        self.lengths = tuple(int(n) for n in lengths)
        self.longest = max(self.lengths, default=0)
        self.flat = order[:, 0] * self.longest + order[:, 1]
        self._index: dict[Any, Any] = {}

    def index(self, device: Any) -> Any:
        import torch

        if device not in self._index:
            self._index[device] = torch.as_tensor(self.flat, dtype=torch.int64, device=device)
        return self._index[device]


def gather_rows(parts: Sequence[Any], order: RowOrder, dim: int, group: Any) -> list[Any]:
    """Every rank's rows of each tensor in `parts`, in the global order `order` gives, on every rank.

    parts: this rank's tensors, cut along `dim` into rows, every other dim the same on all ranks. One
    all_gather moves every part at once (each rank's rows padded to the longest), one indexing copy puts
    the rows in order. Returns, per part, a tensor with `dim` holding the global rows: a view with that
    dim's stride free (the last dim contiguous).
    """
    import torch

    world, longest = len(order.lengths), order.longest
    first = parts[0]
    # The send buffer: (longest, parts, *the other dims), rows first, so that one index gathers them all.
    moved = [p.movedim(dim, 0) for p in parts]
    send = torch.empty((longest, len(parts), *moved[0].shape[1:]), dtype=first.dtype, device=first.device)
    for i, p in enumerate(moved):
        send[:p.shape[0], i] = p
    received = torch.empty((world * longest, *send.shape[1:]), dtype=send.dtype, device=send.device)
    all_gather_tensor(received, send, group)
    ordered = received.index_select(0, order.index(send.device))  # (total, parts, ...)
    return [ordered[:, i].movedim(0, dim) for i in range(len(parts))]


# How many groups of K/V heads the gathered modes gather one after another, each gathered on a side
# stream while the previous group's queries attend (1: one gather, then the attention). Measured on 4
# H200s (bf16 32/8 d 128, zigzag causal, N = 262,144): 1 group 0.226 s, 2 groups 0.233 s, 4 groups 0.237 s;
# the NCCL kernels beside the attention kernels cost them more than the gather takes alone (3.7 ms).
GATHER_HEAD_GROUPS = 1


def gather_rows_by_heads(parts: Sequence[Any], order: RowOrder, dim: int, heads_dim: int, group: Any,
                         groups: int | None = None) -> Any:
    """`gather_rows` one group of heads at a time: yields (heads slice, gathered parts) for `groups`
    near-equal groups of the heads at `heads_dim` (default GATHER_HEAD_GROUPS). On a GPU the gather of
    the next group is posted on a side stream before the caller computes on this one."""
    import torch

    first = parts[0]
    heads = first.shape[heads_dim]
    groups = max(1, min(heads, GATHER_HEAD_GROUPS if groups is None else groups))
    bounds = [heads * i // groups for i in range(groups + 1)]
    slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def gather(heads_slice: slice) -> list[Any]:
        return gather_rows([p.narrow(heads_dim, heads_slice.start, heads_slice.stop - heads_slice.start)
                            for p in parts], order, dim, group)

    if groups == 1 or not first.is_cuda:
        for heads_slice in slices:
            yield heads_slice, gather(heads_slice)
        return
    main = torch.cuda.current_stream(first.device)
    side = torch.cuda.Stream(device=first.device)
    side.wait_stream(main)  # the parts are ready

    def post(heads_slice: slice) -> tuple[list[Any], Any]:
        with torch.cuda.stream(side):
            gathered = gather(heads_slice)
            done = torch.cuda.Event()
            done.record(side)
        return gathered, done

    pending = post(slices[0])
    for i, heads_slice in enumerate(slices):
        gathered, done = pending
        if i + 1 < len(slices):
            pending = post(slices[i + 1])
        main.wait_event(done)
        for t in gathered:
            t.record_stream(main)  # made on the side stream, read and freed on the main one
        yield heads_slice, gathered
