"""What a backend advertises: the one adapter between the gate and `cutlassfa.supports`.

`cutlassfa.supports(backend, dtype, head_dim, *, device=0, **mode)` says in advance whether `forward`
on that backend accepts a case (GPU backends without a usable GPU say no, with the reason). The gate
checks every case a backend advertises, and a refusal of one of them is a failure. Where that query
does not exist yet, FALLBACK is the promise: every backend that `cutlassfa.backends()` marks available
takes float32 / float16 / bfloat16, every head dim of `cutlassfa.HEAD_DIMS`, causal or not.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .._inputs import DTYPES

FALLBACK_MODES = frozenset({"causal"})


class Advertised(NamedTuple):
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:  # a NamedTuple of two fields is always truthy otherwise
        return self.ok


def supports(backend: str, dtype: str, head_dim: int, **mode: Any) -> Advertised:
    """Whether `backend` advertises (dtype, head_dim, mode), and why not."""
    import cutlassfa

    query = getattr(cutlassfa, "supports", None)
    if query is None:
        return _fallback(backend, dtype, head_dim, **mode)
    answer = query(backend, dtype, head_dim, **mode)
    return Advertised(bool(answer), str(getattr(answer, "reason", "")))


def _fallback(backend: str, dtype: str, head_dim: int, **mode: Any) -> Advertised:
    import cutlassfa

    unknown = sorted(set(mode) - FALLBACK_MODES)
    if unknown:
        return Advertised(False, f"unknown mode {', '.join(unknown)}")
    status = cutlassfa.backends().get(backend)
    if status is None:
        return Advertised(False, f"unknown backend {backend!r}")
    if not status.available:
        return Advertised(False, status.reason)
    if dtype not in DTYPES:
        return Advertised(False, f"dtype {dtype} is not one of {', '.join(DTYPES)}")
    if head_dim not in cutlassfa.HEAD_DIMS:
        return Advertised(False, f"head dim {head_dim} is not one of {cutlassfa.HEAD_DIMS}")
    return Advertised(True)
