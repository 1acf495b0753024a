"""The backends under test: plain callables (so tests can inject a broken one), each with what it
advertises; and which of cutlassfa's backends a run gates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .._diagnostics import gpu_required
from .._inputs import Case, gpu_framework
from .support import Advertised, supports

BACKEND_ORDER = ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive", "cpu")
# fn(q, k, v, *, causal, softmax_scale, **variant) -> (out, lse) or out. Plain cases pass causal and
# softmax_scale only; variant cases add forward's keyword arguments (window, softcap, num_splits,
# cache_seqlens, cache_leftpad, block_table, k_new, v_new) or, for varlen, cu_seqlens_q, cu_seqlens_k,
# max_seqlen_q and max_seqlen_k (varlen_forward's).
ForwardFn = Callable[..., Any]


def advertises_everything(case: Case) -> Advertised:
    return Advertised(True)


@dataclass
class Backend:
    """A backend under test. `fn(q, k, v, *, causal, softmax_scale, **variant)` returns (out, lse) or
    out; `framework` is the array type it is fed ("numpy", "torch", "cupy"); `advertises(case)` says
    whether it claims to take the case (only those are run, and each must pass)."""

    name: str
    fn: ForwardFn
    framework: str = "numpy"
    advertises: Callable[[Case], Advertised] = field(default=advertises_everything)


def public_backend(name: str, framework: str) -> Backend:
    """A backend that goes through the public :func:`cutlassfa.forward`, advertising what
    `cutlassfa.supports` says."""

    def fn(q: Any, k: Any, v: Any, *, causal: bool, softmax_scale: float | None, cu_seqlens_q: Any = None,
           cu_seqlens_k: Any = None, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
           **variant: Any) -> Any:
        import cutlassfa

        if cu_seqlens_q is not None:
            return cutlassfa.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                            max_seqlen_k=max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
                                            backend=name, return_lse=True, **variant)
        return cutlassfa.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=name,
                                 return_lse=True, **variant)

    def advertises(case: Case) -> Advertised:
        return supports(name, case.q_dtype, case.d, **case.mode)

    return Backend(name, fn, framework, advertises)


@dataclass
class Plan:
    """What a run gates: `backends` to run; `unavailable` backends reported and not run; `required`
    backends that cannot run although they must (each a failure of the gate, with its reason)."""

    backends: list[Backend]
    unavailable: dict[str, str]
    required: dict[str, str]


class UsageError(Exception):
    """A request the gate cannot make sense of (exit status 2)."""


def _framework_problem(framework: str) -> str:
    """Why CUDA arrays of `framework` cannot be made here ("" when they can)."""
    try:
        if framework == "torch":
            import torch

            return "" if torch.cuda.is_available() else "this PyTorch has no usable CUDA device"
        if framework == "cupy":
            import cupy

            return "" if cupy.cuda.runtime.getDeviceCount() > 0 else "CuPy sees no CUDA device"
    except ImportError as error:
        return f"{framework} is not installed ({error})"
    except Exception as error:  # noqa: BLE001 - e.g. CuPy without a driver
        return f"{framework} cannot reach a GPU ({error})"
    return ""


def plan(names: Sequence[str] | None, inputs: str = "auto") -> Plan:
    """The named backends (each must be available, unless CUTLASSFA_REQUIRE_GPU makes its absence a
    failure) or every available one. With CUTLASSFA_REQUIRE_GPU=1 every unavailable GPU backend is
    `required`."""
    import cutlassfa

    table = cutlassfa.backends()
    order = [n for n in BACKEND_ORDER if n in table] + [n for n in table if n not in BACKEND_ORDER]
    unavailable = {n: table[n].reason for n in order if not table[n].available}
    unknown = [n for n in names or () if n not in table]
    if unknown:
        raise UsageError(f"unknown backend(s) {', '.join(unknown)}; expected some of {', '.join(order)}")
    wanted = list(dict.fromkeys(names)) if names else order
    required: dict[str, str] = {}
    if gpu_required():
        required = {n: why for n, why in unavailable.items() if n in wanted and n != "cpu"}
    elif names:
        missing = [n for n in wanted if n in unavailable]
        if missing:
            raise UsageError("backend not available (" + "; ".join(f"{n}: {unavailable[n]}" for n in missing) + ")")
    gpu = gpu_framework() if inputs == "auto" else inputs
    runnable = [n for n in wanted if n not in unavailable]
    if gpu != "numpy" and any(n != "cpu" for n in runnable):
        why = _framework_problem(gpu)
        if why:
            raise UsageError(f"--inputs {gpu}: {why}")
    backends = [public_backend(n, "numpy" if n == "cpu" else gpu) for n in runnable]
    return Plan(backends, {n: why for n, why in unavailable.items() if n not in required}, required)
