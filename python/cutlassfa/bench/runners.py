"""Runners: one per row name. Ours go through the public `cutlassfa.forward`; the anchors are
`torch.nn.functional.scaled_dot_product_attention` restricted to one SDPA backend at a time."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

from .._inputs import Case, Unsupported
from .frames import Frame

OUR_BACKENDS = ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive", "cpu")
# Row name -> torch.nn.attention.SDPBackend member.
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_math": "MATH",
}
ALL_BACKENDS = OUR_BACKENDS + tuple(SDPA_BACKENDS)


@dataclass
class Runner:
    """`prepare(case)` returns call(q, k, v) -> out; calls run inside `context()`. `on_gpu`: fed the
    frame's GPU arrays (else host numpy arrays)."""

    name: str
    prepare: Callable[[Case], Callable[[Any, Any, Any], Any]]
    on_gpu: bool = True
    context: Callable[[], ContextManager] = contextlib.nullcontext


def ours(name: str) -> Runner:
    def prepare(case: Case) -> Callable[[Any, Any, Any], Any]:
        import cutlassfa

        return lambda q, k, v: cutlassfa.forward(q, k, v, causal=case.causal, backend=name)

    return Runner(name, prepare, on_gpu=name != "cpu")


def sdpa(name: str) -> Runner:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    member = getattr(SDPBackend, SDPA_BACKENDS[name], None)
    if member is None:
        raise Unsupported(f"this PyTorch ({torch.__version__}) has no SDPBackend.{SDPA_BACKENDS[name]}")

    def prepare(case: Case) -> Callable[[Any, Any, Any], Any]:
        kwargs: dict[str, Any] = {}
        if case.causal and case.Nq != case.Nk:
            # PyTorch's is_causal is top-left aligned; ours is bottom-right as FlashAttention-2.
            from torch.nn.attention.bias import causal_lower_right

            kwargs["attn_mask"] = causal_lower_right(case.Nq, case.Nk)
        elif case.causal:
            kwargs["is_causal"] = True
        if case.H != case.Hk:
            kwargs["enable_gqa"] = True
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs)

    @contextlib.contextmanager
    def context() -> Any:
        with sdpa_kernel(member), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Flash attention kernel not used because ..."
            yield

    return Runner(name, prepare, on_gpu=True, context=context)


def make_runners(names: Sequence[str], frame: Frame) -> tuple[list[Runner], dict[str, str]]:
    """Runners for the requested names that can run here, and {name: why not} for the others."""
    import cutlassfa

    statuses = cutlassfa.backends()
    runners, unavailable = [], {}
    for name in names:
        if name in SDPA_BACKENDS:
            if frame.name != "torch":
                unavailable[name] = "needs PyTorch with CUDA"
                continue
            try:
                runners.append(sdpa(name))
            except (ImportError, Unsupported) as error:
                unavailable[name] = str(error)
        elif name in statuses:
            if not statuses[name].available:
                unavailable[name] = statuses[name].reason
            elif name != "cpu" and not frame.on_gpu:
                unavailable[name] = "needs PyTorch or CuPy for device arrays"
            else:
                runners.append(ours(name))
        else:
            unavailable[name] = "unknown backend"
    return runners, unavailable




def select_backends(requested: Sequence[str] | None) -> list[str]:
    """Row names of a run: all, or the requested ones ('sdpa' meaning the four sdpa_* rows)."""
    if not requested:
        return list(ALL_BACKENDS)
    names: list[str] = []
    for name in requested:
        names += list(SDPA_BACKENDS) if name == "sdpa" else [name]
    return list(dict.fromkeys(names))
