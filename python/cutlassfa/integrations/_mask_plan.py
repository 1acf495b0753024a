"""From an attention mask to arguments of cutlassfa that express it exactly, or a refusal.

A mask is described row by row (`MaskRows`): for each batch entry b and query row i, the first and
last key the row sees, whether those keys form one interval, and whether the row matters (the output
of a padding query is never read). `plan` tries the forms cutlassfa can compute, in this order, and
keeps the first whose visible keys equal the mask's on every row that matters:

- ``dense``: one pattern for the whole batch, bottom-right aligned as `cutlassfa.forward` is: query i
  sees key j iff  i + (Nk - Nq) - left <= j <= i + (Nk - Nq) + right  (left/right None: unbounded;
  causal is right = 0);
- ``cache``: per-entry key ranges [leftpad_b, seqlen_b) with the queries aligned to seqlen_b (the
  ``cache_seqlens`` / ``cache_leftpad`` of forward): left-padded batches, decoding, static caches;
- ``varlen``: per-entry runs of query rows and of keys, packed (``cutlassfa.varlen_forward``):
  right-padded prefill, where padding queries would otherwise see the real keys;
- ``packed``: causal sequences packed one after another in each entry (transformers' packed
  ``position_ids``), as one ``cutlassfa.varlen_forward`` call over every entry's sequences.

Anything else raises NotImplementedError: the caller never gets an answer to a different mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MaskRows", "Plan", "PaddedCausal", "rows_of_visible", "plan", "padded_causal_plan", "packed_forward",
           "packed_sequences_forward"]


@dataclass(frozen=True)
class MaskRows:
    """Per (batch entry, query row), as (B, Nq) tensors: the visible keys of a mask of Nk keys."""

    first: torch.Tensor  # int64: first visible key; Nk where the row sees none
    last: torch.Tensor  # int64: last visible key; -1 where the row sees none
    one_range: torch.Tensor  # bool: the visible keys are one interval (or none)
    matters: torch.Tensor  # bool: the row's output is used (False for padding queries)
    kv_length: int
    packed_kv_length: torch.Tensor | None = None  # (B, Nq): the key count a packed mask was built for

    def pack(self) -> torch.Tensor:
        """As one int64 (B, 1, Nq, 4) tensor [first, last, flags, Nk]: what transformers passes through
        untouched as a prepared 4-D mask (its own masks are boolean or floating point, never int64)."""
        flags = self.one_range.long() | (self.matters.long() << 1)
        return torch.stack([self.first, self.last, flags, torch.full_like(flags, self.kv_length)], -1)[:, None]

    @staticmethod
    def unpack(packed: torch.Tensor, kv_length: int) -> MaskRows:
        """The rows of a packed mask, for a layer of `kv_length` keys (not read from the device: `plan`
        checks it against the packed value with its other checks, in its one read)."""
        rows = packed[:, 0]
        flags = rows[..., 2]
        return MaskRows(rows[..., 0], rows[..., 1], (flags & 1).bool(), (flags & 2).bool(), kv_length,
                        rows[..., 3])

    @staticmethod
    def is_packed(mask: torch.Tensor) -> bool:
        return mask.dtype == torch.int64 and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[-1] == 4


@dataclass(frozen=True)
class Plan:
    """How to compute a masked attention with cutlassfa. `window` is (left, right) in forward's
    convention (-1: unbounded), None where no bound excludes a key."""

    kind: str  # "dense", "cache", "varlen" or "packed"
    causal: bool
    window: tuple[int, int] | None = None
    key_start: torch.Tensor | None = None  # (B,) int64: cache / varlen: first key of each entry
    key_end: torch.Tensor | None = None  # (B,) int64: one past the last key of each entry
    query_start: torch.Tensor | None = None  # (B,) int64: varlen: first query row of each entry
    query_end: torch.Tensor | None = None  # (B,) int64: one past the last query row
    leftpad: bool = False  # cache: some entry's keys start past 0 (read once, with the plan)
    cu_seqlens: torch.Tensor | None = None  # packed: (S + 1,) int32 bounds of the S sequences of B x N rows
    max_seqlen: int = 0  # packed: the longest sequence

    def __post_init__(self) -> None:
        # cache_arguments: cache_seqlens (and cache_leftpad where some entry starts past key 0) of a cache plan,
        # int32, made once per plan, which every layer of a forward pass reuses (made here, not as a cached
        # property, whose lock torch.compile cannot trace on Python 3.11).
        lengths = {}
        if self.kind == "cache":
            lengths["cache_seqlens"] = self.key_end.to(torch.int32)
            if self.leftpad:
                lengths["cache_leftpad"] = self.key_start.to(torch.int32)
        object.__setattr__(self, "cache_arguments", lengths)


def rows_of_visible(visible: torch.Tensor, matters: torch.Tensor | None = None) -> MaskRows:
    """MaskRows of a (B, Nq, Nk) boolean mask, True where a query sees a key."""
    b, nq, nk = visible.shape
    count = visible.sum(-1)
    seen = count > 0
    first = torch.where(seen, visible.int().argmax(-1), nk)
    last = torch.where(seen, nk - 1 - visible.flip(-1).int().argmax(-1), -1)
    one_range = ~seen | (count == last - first + 1)
    if matters is None:
        matters = torch.ones(b, nq, dtype=torch.bool, device=visible.device)
    return MaskRows(first.long(), last.long(), one_range, matters, nk)


def concat_rows(parts: list[MaskRows]) -> MaskRows:
    """MaskRows of consecutive blocks of query rows, joined."""
    return MaskRows(*(torch.cat([getattr(p, name) for p in parts], dim=1)
                      for name in ("first", "last", "one_range", "matters")), parts[0].kv_length)


def _implied(nq: int, start: torch.Tensor, end: torch.Tensor, diagonal: torch.Tensor,
             left: int | None, right: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, last) visible key of each row for keys [start, end) and query i on key i + diagonal;
    start, end, diagonal are (B, 1). Rows that see nothing have first > last."""
    row = torch.arange(nq, device=start.device)[None]
    last = end - 1 if right is None else torch.minimum(row + diagonal + right, end - 1)
    first = start if left is None else torch.maximum(row + diagonal - left, start)
    return first.expand(-1, nq), last.expand(-1, nq)


def _agrees(rows: MaskRows, first: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """A device bool: the implied rows equal the mask's on every row that matters."""
    implied_empty = first > last
    mask_empty = rows.first > rows.last
    same = torch.where(implied_empty, mask_empty, ~mask_empty & (first == rows.first) & (last == rows.last))
    return (same | ~rows.matters).all()


def _key_ranges(rows: MaskRows) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 1) first and one-past-last key seen by any row that matters (an empty range where none)."""
    seen = rows.matters & (rows.first <= rows.last)
    start = torch.where(seen, rows.first, rows.kv_length).amin(-1, keepdim=True)
    end = torch.where(seen, rows.last + 1, 0).amax(-1, keepdim=True)
    return torch.minimum(start, end), end


def _query_runs(rows: MaskRows) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 1) first and one-past-last query row that matters (0, 0 where none)."""
    nq = rows.matters.shape[1]
    row = torch.arange(nq, device=rows.matters.device)[None]
    start = torch.where(rows.matters, row, nq).amin(-1, keepdim=True)
    end = torch.where(rows.matters, row + 1, 0).amax(-1, keepdim=True)
    return torch.minimum(start, end), end


def plan(rows: MaskRows | None, nq: int, nk: int, causal: bool, left: int | None = None,
         right: int | None = None) -> Plan:
    """The first form (dense, cache, varlen) that computes exactly the mask `rows` describes, given the
    layer's own pattern: `causal` and a window of `left` keys before and `right` after the diagonal
    (None: unbounded; causal sets right to 0). `rows` None: no mask, the layer's pattern alone. Raises
    NotImplementedError when no form matches."""
    plain = (None, 0 if causal else None)  # the layer's pattern without its window
    windowed = (left, 0 if causal else right)
    if rows is None:  # the layer's own pattern, dense: exact by construction, nothing to read
        return Plan("dense", causal, _binding_window(nq, nk, causal, left, right))
    if rows.kv_length != nk or rows.first.shape[1] != nq:
        raise NotImplementedError(f"the mask covers {rows.first.shape[1]} queries x {rows.kv_length} keys, "
                                  f"the layer has {nq} x {nk}")
    batch = rows.first.shape[0]
    zero = torch.zeros(batch, 1, dtype=torch.long, device=rows.first.device)
    key_start, key_end = _key_ranges(rows)
    query_start, query_end = _query_runs(rows)
    forms = [("dense", zero, zero + nk, zero + (nk - nq)),
             ("cache", key_start, key_end, key_end - nq),
             ("varlen", key_start, key_end, key_end - query_end)]
    # Every candidate (form, without the window first: it may bind nowhere), in order, checked on the
    # device and read back in one synchronization with the other facts planning needs.
    candidates = [(kind, start, end, diagonal, bounds) for kind, start, end, diagonal in forms
                  for bounds in dict.fromkeys([plain, windowed])]
    sequence_starts = _sequence_starts(rows) if causal and nq == nk else None
    implied = [_implied(nq, start, end, diagonal, *bounds) for _, start, end, diagonal, bounds in candidates]
    if sequence_starts is not None:
        for bounds in dict.fromkeys([plain, windowed]):
            candidates.append(("packed", None, None, None, bounds))
            implied.append(_packed_implied(sequence_starts, bounds[0]))
    packed_ok = torch.ones((), dtype=torch.bool, device=zero.device) if rows.packed_kv_length is None else \
        (rows.packed_kv_length == nk).all()
    facts = torch.stack([packed_ok, (rows.one_range | ~rows.matters).all(), (key_start > 0).any(),
                         *(_agrees(rows, first, last) for first, last in implied)]).tolist()
    kv_ok, one_range, leftpad, agreements = facts[0], facts[1], facts[2], facts[3:]
    if not kv_ok:
        raise NotImplementedError(f"the mask was built for another number of keys than the layer's {nk}")
    if not one_range:
        raise NotImplementedError("the attention mask lets a query see keys that are not one contiguous range")
    for (kind, *_, bounds), agrees in zip(candidates, agreements):
        if not agrees:
            continue
        window = None if bounds == plain else _window(*bounds)
        if kind == "dense":
            return Plan("dense", causal, window)
        if kind == "packed":
            return _packed_plan(sequence_starts, window)
        runs = {"query_start": query_start[:, 0], "query_end": query_end[:, 0]} if kind == "varlen" else {}
        # Whether any entry starts past key 0 is decided here, so that the layers that reuse the plan
        # never read the device again.
        return Plan(kind, causal, window, key_start[:, 0], key_end[:, 0], **runs, leftpad=leftpad)
    raise NotImplementedError(
        "the attention mask is not one cutlassfa can express: per batch entry it must be the layer's "
        f"{'causal' if causal else 'full'} pattern{'' if left is None else ' with its sliding window'} over one "
        "contiguous range of keys (left or right padding)")


def _sequence_starts(rows: MaskRows) -> torch.Tensor:
    """(B, N) bool: the rows that start a causal sequence (they see themselves alone, and the first row
    of each entry)."""
    row = torch.arange(rows.first.shape[1], device=rows.first.device)[None]
    starts = (rows.first == row) & (rows.last == row)
    starts[:, 0] = True
    return starts


def _packed_implied(starts: torch.Tensor, left: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, last) key of each row of causal sequences that begin at `starts` (key i is row i), with a
    window of `left` keys before the diagonal (None: none)."""
    row = torch.arange(starts.shape[1], device=starts.device)[None].expand_as(starts)
    sequence_start = torch.where(starts, row, 0).cummax(dim=1).values
    first = sequence_start if left is None else torch.maximum(sequence_start, row - left)
    return first, row


def _packed_plan(starts: torch.Tensor, window: tuple[int, int] | None) -> Plan:
    """The varlen arguments of packed sequences: every entry's sequences, entry after entry (a read of
    where they start)."""
    flat = starts.reshape(-1)
    bounds = torch.cat([flat.nonzero()[:, 0], flat.new_tensor([flat.numel()], dtype=torch.long)])
    longest = int((bounds[1:] - bounds[:-1]).max())
    return Plan("packed", True, window, cu_seqlens=bounds.to(torch.int32), max_seqlen=longest)


def packed_sequences_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Plan,
                             options: dict) -> torch.Tensor:
    """A packed plan run: q, k, v (B, H, N, d) as B x N rows of (H, d), their sequences in one
    `cutlassfa.varlen_forward` call; returns (B, N, H, d)."""
    batch, heads, n, dim = q.shape
    rows = [x.transpose(1, 2).reshape(batch * n, x.shape[1], dim) for x in (q, k, v)]
    out = _varlen_call(q, k, v)(*rows, layout.cu_seqlens, layout.cu_seqlens, max_seqlen_q=layout.max_seqlen,
                                max_seqlen_k=layout.max_seqlen, **options)
    return out.reshape(batch, n, heads, dim)


def _varlen_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    """`cutlassfa.varlen_forward` for these tensors: through its torch operator where PyTorch must see the call
    (torch.compile, autograd), else directly."""
    import cutlassfa

    from . import torch as cutlassfa_torch

    if cutlassfa_torch.must_use_op(q, k, v):
        return cutlassfa_torch.op_varlen_forward
    return lambda *args, **kwargs: cutlassfa_torch.eager_call(cutlassfa.varlen_forward, *args, **kwargs)


# Where a plan is made without a read (torch.compile; a static cache's decode step), a mask it does not
# compute stops the run with this device-side assertion.
NOT_PADDED_CAUSAL = ("cutlassfa under torch.compile or in a static cache's decode step computes causal masks over "
                     "left-padded entries only; this mask is another (run the model eagerly, with a dynamic cache)")


@dataclass(frozen=True)
class PaddedCausal:
    """A causal mask (with transformers' sliding window of `window` keys, or none) over each entry's keys
    [key_start_b, q_end), the queries the last of those positions: its plan, for layers of that pattern."""

    q_length: int
    kv_length: int
    window: int | None
    plan: Plan

    def fits(self, nq: int, nk: int, causal: bool, left: int | None) -> bool:
        """Whether a layer of `nq` x `nk`, `causal`, with a window of `left` keys before the diagonal
        (None: none) computes this mask."""
        return (nq, nk, causal, left) == (self.q_length, self.kv_length, True,
                                          None if self.window is None else self.window - 1)


def padded_causal_plan(visible: torch.Tensor, real_queries: torch.Tensor, padding: torch.Tensor | None,
                       q_end: int | torch.Tensor, window: int | None, traced: bool = False) -> PaddedCausal | None:
    """The plan of a causal mask over padded entries, in a few operations and one read (what a decode
    step's mask costs): `visible` (B, Nq, Nk) is the mask, `real_queries` (B, Nq) the rows that matter,
    `padding` (B, Nk) which of the layer's keys are real tokens (None: all), query i sits on key
    i + q_end - Nq, `window` is transformers' sliding window (query p sees keys > p - window) or None. The plan
    is a cache call (keys [first real key, q_end), leftpad where an entry starts past 0) or, with no padding
    and the queries on the last keys, a dense one; None when the mask is not that one (then `plan` decides
    from its rows).
    traced (torch.compile, where nothing may be read and q_end may be a tensor): always the cache call, with
    left padding and the window, and a mask that is not this one (or a q_end outside [Nq, Nk]) stops the run
    with a device-side assertion instead of falling back."""
    b, nq, nk = visible.shape
    q_end_known = not isinstance(q_end, torch.Tensor)
    if q_end_known and (not 0 < q_end <= nk or q_end < nq):
        return None
    device = visible.device
    key = torch.arange(nk, device=device)
    diagonal = torch.arange(nq, device=device)[:, None] + (q_end - nq)  # (Nq, 1): each query's key
    start = _first_real_key(padding, key, q_end, b)
    implied = (key >= start[:, None, None]) & (key <= diagonal)
    if window is not None:
        implied &= key > diagonal - window
    exact = ((visible == implied) | ~real_queries[:, :, None]).all()
    if traced and not q_end_known:
        exact &= q_end >= nq
    layout = _padded_causal_layout(start, exact, q_end, nk, window, traced)
    return None if layout is None else PaddedCausal(nq, nk, window, layout)


def causal_step_plan(padding: torch.Tensor | None, batch: int, nk: int, q_end: int | torch.Tensor,
                     device: torch.device | str, traced: bool = False) -> Plan | None:
    """The plan of one query on key q_end - 1 under the plain causal mask over padded entries, from the
    padding alone (`padding` (B, nk): which keys are real tokens; None: all): each entry's keys are its real
    ones before q_end, which must be one run (`_padded_causal_layout` decides, with one read or, traced,
    none)."""
    if not traced and not 0 < q_end <= nk:
        return None
    key = torch.arange(nk, device=device)
    start = _first_real_key(padding, key, q_end, batch)
    exact = None  # without padding the keys are [0, q_end): nothing to check
    if padding is not None:
        before = key < q_end
        exact = ((padding.bool() & before) == ((key >= start[:, None]) & before)).all()
    return _padded_causal_layout(start, exact, q_end, nk, None, traced)


def _first_real_key(padding: torch.Tensor | None, key: torch.Tensor, q_end: int | torch.Tensor,
                    batch: int) -> torch.Tensor:
    """(B,) int64: each entry's first real key before q_end (q_end where it has none; 0 without padding)."""
    if padding is None:
        return torch.zeros(batch, dtype=torch.long, device=key.device)
    real = padding.bool() & (key < q_end)
    return torch.where(real.any(-1), real.int().argmax(-1), q_end)


def _padded_causal_layout(start: torch.Tensor, exact: torch.Tensor | None, q_end: int | torch.Tensor, nk: int,
                          window: int | None, traced: bool) -> Plan | None:
    """The plan of a causal mask (transformers' sliding `window` of keys, or none) over each entry's keys
    [start, q_end), given `exact`, a device bool saying the mask is that one (None: no padding, so it is, and
    every start is 0). traced (torch.compile, a static cache's step): nothing is read; always the cache call
    with left padding and the window, and a mask that is not this one (or a q_end outside (0, nk]) stops the
    run with a device-side assertion. Else one read (none without padding): None where the mask is another;
    a dense call where no entry starts past key 0 and q_end is the last key; else the cache call."""
    if traced:
        if isinstance(q_end, torch.Tensor):
            in_range = (q_end > 0) & (q_end <= nk)
            exact = in_range if exact is None else exact & in_range
        if exact is not None:
            torch._assert_async(exact, NOT_PADDED_CAUSAL)
        bound = None if window is None else (window - 1, 0)
        return Plan("cache", True, bound, start, start * 0 + q_end, leftpad=True)
    leftpad = False
    if exact is not None:
        is_exact, leftpad = torch.stack([exact, (start > 0).any()]).tolist()  # planning's one read
        if not is_exact:
            return None
    bound = (window - 1, 0) if window is not None and q_end > window else None  # None: it binds nowhere
    if not leftpad and q_end == nk:
        return Plan("dense", True, bound)
    return Plan("cache", True, bound, start, torch.full_like(start, q_end), leftpad=leftpad)


def pack_cache_plan(layout: Plan) -> torch.Tensor:
    """A cache plan made without a read, as the tensor transformers hands every layer untouched: int32
    (2, 1, 1, B), each entry's first key over one past its last (transformers' masks are boolean or floating
    point, MaskRows' int64), so that it crosses into a compiled step; the layer's own window applies."""
    return torch.stack([layout.key_start, layout.key_end]).to(torch.int32)[:, None, None]


def unpack_cache_plan(mask: Any, batch: int, causal: bool, left: int | None) -> Plan | None:
    """The cache plan `pack_cache_plan` made, for a causal layer with a window of `left` keys before the
    diagonal (None: none); None if `mask` is not one."""
    if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.int32 and tuple(mask.shape) == (2, 1, 1, batch)):
        return None
    if not causal:
        raise NotImplementedError("a causal mask reached a layer that is not causal")
    bound = None if left is None else (left, 0)
    return Plan("cache", True, bound, mask[0, 0, 0], mask[1, 0, 0], leftpad=True)


def _window(left: int | None, right: int | None) -> tuple[int, int]:
    return (-1 if left is None else left, -1 if right is None else right)


def _binding_window(nq: int, nk: int, causal: bool, left: int | None, right: int | None) -> tuple[int, int] | None:
    """forward's window of a dense nq x nk call (bottom-right) bounded `left` keys before and `right` after
    the diagonal (None: unbounded; causal: right is causal's 0), or None where no bound hides a key."""
    left = None if left is None or left >= nk - 1 else left  # the last query's first key is then 0
    if not causal and right is not None and right >= nq - 1:  # the first query's last key is then Nk - 1
        right = None
    if left is None and (causal or right is None):
        return None
    return _window(left, 0 if causal else right)


def packed_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Plan, options: dict) -> torch.Tensor:
    """A varlen plan run: each entry's run of query rows against its run of keys, packed into one
    `cutlassfa.varlen_forward` call, unpacked. q, k, v (B, H, N, d); returns (B, Nq, H, d), 0 in the rows
    outside the runs."""
    batch, heads, nq, dim = q.shape
    q_rows = _in_range(nq, layout.query_start, layout.query_end)  # (B, Nq) bool
    k_rows = _in_range(k.shape[2], layout.key_start, layout.key_end)
    q_packed = q.transpose(1, 2)[q_rows]  # (total_q, Hq, d)
    k_packed, v_packed = k.transpose(1, 2)[k_rows], v.transpose(1, 2)[k_rows]
    q_lengths, k_lengths = q_rows.sum(1), k_rows.sum(1)
    packed = _varlen_call(q, k, v)(q_packed, k_packed, v_packed, _cumulative(q_lengths), _cumulative(k_lengths),
                                   max_seqlen_q=int(q_lengths.max()), max_seqlen_k=int(k_lengths.max()), **options)
    result = q.new_zeros(batch, nq, heads, dim)
    result[q_rows] = packed
    return result


def _in_range(n: int, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    index = torch.arange(n, device=start.device)[None]
    return (index >= start[:, None]) & (index < end[:, None])


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
