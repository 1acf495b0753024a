"""Decoding against a KV cache sharded over the ranks of a process group (Flash-Decoding's combine,
across GPUs).

Every rank holds a part of every sequence's cache and the same few query tokens. It attends the queries
to its part (one `forward` call: the decode kernel, split over its keys), and one all_gather of the
partial (out, lse) rows, float32, lets every rank merge the parts by their lse: the attention of the
queries over the whole cache, on every rank. The newest positions, the queries' own, live on one rank,
the owner: it appends `k_new` / `v_new` there and applies the causal mask to its part; every key the other
ranks hold precedes the queries. Which old positions a rank holds does not matter (attention does not
depend on the order of the keys it sees in full), so a cache can grow on whichever rank has room: pass
that rank as the owner while it takes the new tokens.
"""

from __future__ import annotations

from typing import Any

from . import _context_parallel
from ._api import forward, select_backend
from ._options import softmax_scale as softmax_scale_of
from ._context_parallel import DTYPES
from .merge import merged_stacked_float32

__all__ = ["sharded_decode"]

_FIELDS = ("B", "Hq", "Nq", "d", "dtype", "Hkv", "causal", "owner", "softmax_scale", "softcap", "sinks",
           "k_new", "paged")


def sharded_decode(q: Any, k_cache: Any, v_cache: Any, *, cache_seqlens: Any, group: Any = None,
                   owner: int | None = None, k_new: Any = None, v_new: Any = None, block_table: Any = None,
                   causal: bool = True, softmax_scale: float | None = None, softcap: float = 0.0, sinks: Any = None,
                   k_descale: Any = None, v_descale: Any = None, num_splits: int | None = None,
                   backend: str = "auto", return_lse: bool = False, check_ranks: bool = True) -> Any:
    """Attention of a few query tokens over a KV cache whose keys are split across the ranks of a
    torch.distributed process group; the merged result on every rank.

    Args:
        q: (B, Hq, Nq, d) torch tensor, the same on every rank (not checked by value).
        k_cache, v_cache: this rank's part of the cache, (B, Hkv, capacity, d), or with block_table
            (B, max_pages) int32 a paged part (num_pages, Hkv, page_size, d); dtypes as `forward` (fp8
            caches with k_descale / v_descale too).
        cache_seqlens: (B,) int32 on q's device (or host ints): how many keys of each entry this rank
            holds (0 is allowed: the rank holds none of that entry).
        owner: the rank (of the group) that holds the newest positions: it appends k_new / v_new (B, Hkv,
            Nnew, d) at its cache_seqlens, as `forward` does, and the causal mask (bottom-right over its
            part, new keys included) applies there; the other ranks ignore k_new / v_new (pass them on
            every rank alike) and attend to all their keys. Default: the last rank.
        causal, softmax_scale, softcap, sinks (counted once, in the merge), num_splits, backend: as
            `forward`. Windows and ALiBi read positions, which the parts do not carry: not taken.
        return_lse: also return the float32 (B, Hq, Nq) lse over the whole cache.
        check_ranks: agree with the other ranks on sizes and settings first (one all_gather and a read of
            it on the host), so that ranks that disagree or pass invalid arguments all raise. A decode loop
            that calls with the same settings every step, or captures the call into a CUDA graph, passes
            False after a first checked call: the ranks then must agree (a mismatch can hang the collective);
            each rank's own arguments are still validated.

    Returns:
        out (B, Hq, Nq, d) in q's dtype, or (out, lse); the same on every rank. The call is one
        `forward`, two small copies, one all_gather of B x Hq x Nq x (d + 1) floats and the merge; with
        check_ranks=False it captures into a CUDA graph (the append moves no host value).
    """
    import torch
    import torch.distributed as dist

    _context_parallel.require_group("sharded_decode")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    owner_rank = world - 1 if owner is None else owner

    mine = rank == owner_rank
    options = dict(cache_seqlens=cache_seqlens, block_table=block_table, k_descale=k_descale, v_descale=v_descale,
                   num_splits=num_splits)
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap == 0):
        options["softcap"] = softcap  # judged by the validator in local(), on every rank alike
    if mine and k_new is not None:
        options.update(k_new=k_new, v_new=v_new)
    options = {name: value for name, value in options.items() if value is not None}

    def local() -> list[float]:
        if not isinstance(owner_rank, int) or isinstance(owner_rank, bool) or not 0 <= owner_rank < world:
            raise ValueError(f"owner must be a rank of the group, in [0, {world}), got {owner!r}")
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"{name} must be a 4-D torch tensor, got {getattr(t, 'shape', type(t).__name__)}")
        if sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.device != q.device):
            raise ValueError(f"sinks must be a torch tensor on q's device ({q.device})")
        # Every other rule (shapes, dtypes, index arrays, fp8, the sinks' shape) is forward's validator's,
        # run on this rank's own call before anything moves.
        select_backend(q, k_cache, v_cache, causal=causal and mine, softmax_scale=softmax_scale, backend=backend,
                       **options, **({} if sinks is None else dict(sinks=sinks)))
        scale = softmax_scale_of(q.shape[-1], softmax_scale)
        return [q.shape[0], q.shape[1], q.shape[2], q.shape[3], DTYPES.index(str(q.dtype)), k_cache.shape[1],
                int(causal), owner_rank, scale, float(softcap), int(sinks is not None), int(k_new is not None),
                int(block_table is not None)]

    if check_ranks:
        _context_parallel.agree(group, _context_parallel.device_of(q), _FIELDS, local, _FIELDS)
    else:
        local()
    part, part_lse = forward(q, k_cache, v_cache, causal=causal and mine, softmax_scale=softmax_scale,
                             backend=backend, return_lse=True, **options)
    d = q.shape[-1]
    send = torch.empty((*q.shape[:-1], d + 1), dtype=torch.float32, device=q.device)
    send[..., :d] = part
    send[..., d] = part_lse
    received = torch.empty((world * send.shape[0], *send.shape[1:]), dtype=torch.float32, device=q.device)
    _context_parallel.all_gather_tensor(received, send, group)
    received = received.view(world, *send.shape)
    out, lse = merged_stacked_float32(received[..., :d], received[..., d], sinks)
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out
