"""`forward`, `varlen_forward`, `backends`, `supports`, `select_backend`, `device_info`: the thin public
layer over the extension. Every call takes one path: Python routes calls that a framework must see
(torch.compile, JAX tracing) to its integration, and otherwise makes one call into the extension
(`_C.forward`, cpp/bindings/), which validates every argument, picks the backend and launches; when
that backend is `cpu` the arguments come back validated and numpy computes (cutlassfa.cpu)."""

from __future__ import annotations

import functools
import os
import pathlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays

try:
    from . import _C
    _EXTENSION_ERROR = ""
except ImportError as error:  # running from a source tree, or a broken install
    _C = None
    if any(pathlib.Path(__file__).parent.glob("_C.*")):
        _EXTENSION_ERROR = f"the cutlassfa extension failed to load ({error})"
    else:
        _EXTENSION_ERROR = "the cutlassfa extension is not built (install the package: pip install .)"

# tensorcore: the fastest tensor-core kernel for the device (warpgroup MMA on sm_90 for the head dims
# it is built for, mma.sync otherwise). tensorcore_sm80: always the mma.sync kernel (comparison, tests).
GPU_BACKENDS = ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive")
BACKENDS = GPU_BACKENDS + ("cpu",)
# The extension's backend codes (its Backend enum, BACKEND_AUTO, BACKEND_CPU); `auto` takes the first of
# tensorcore, large_tile, small_tile, naive that runs the call.
_BACKEND_CODES: dict[str, int] = (
    {name: member.value for name, member in _C.Backend.__members__.items()} | {"auto": _C.BACKEND_AUTO, "cpu": _C.BACKEND_CPU}
    if _C is not None else {})
_CPU = _C.BACKEND_CPU if _C is not None else None

# CUTLASSFA_CHECK_DEVICE_VALUES=1: device index values are checked as host ones are (check_device_values).
if _C is not None and os.environ.get("CUTLASSFA_CHECK_DEVICE_VALUES") == "1":
    _C.set_check_device_values(True)

# Support reasons that are a backend's documented limit (a size its design cannot take), not a gap; the
# extension's refusals use the same prefix (`_C.LIMIT_PREFIX`).
LIMIT_PREFIX = "limit: "

# Head dims with kernels in this build (one list in CMakeLists.txt, read from the extension).
HEAD_DIMS: tuple[int, ...] = (
    tuple(sorted({d for family in ("small_tile", "large_tile", "sm80") for d in _C.head_dims[family]}))
    if _C is not None else ())


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can run on this machine, and why not when it cannot."""

    name: str
    available: bool
    reason: str = ""


@dataclass(frozen=True)
class Support:
    """Whether a backend takes a kind of case (`supports`), and why not when it does not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


# --------------------------------------------------------------------------------------------------
# Devices and backends
# --------------------------------------------------------------------------------------------------

def _require_extension() -> None:
    if _C is None:
        raise RuntimeError(_EXTENSION_ERROR)


def _unavailable_reason(name: str, device: int) -> str:
    if _C is None:
        return _EXTENSION_ERROR
    return _C.backend_unavailable_reason(getattr(_C.Backend, name), device)


def backends(device: int = 0) -> dict[str, BackendStatus]:
    """Every backend name mapped to whether it can run here (on CUDA `device` for the GPU backends) and,
    if not, why."""
    statuses = {}
    for name in GPU_BACKENDS:
        reason = _unavailable_reason(name, device)
        statuses[name] = BackendStatus(name, not reason, reason)
    statuses["cpu"] = BackendStatus("cpu", True)
    return statuses


# Mode keys of `supports`: causal, and the variants (window, softcap, KV caches, varlen, split keys, sinks,
# ALiBi).
_KNOWN_MODES = {"causal", "window", "softcap", "kv_cache", "paged", "varlen", "num_splits", "sinks", "alibi",
                "fp8_cache"}


def supports(backend: str, dtype: str, head_dim: int, *, device: int = 0, **mode: Any) -> Support:
    """Says in advance whether `forward(..., backend=backend)` takes arrays of `dtype` and `head_dim` on
    this machine (CUDA `device` for GPU backends) in the given mode, and if not, why. dtype is q's:
    float8_e4m3fn asks about fp8 attention (q, k and v of it).

    Mode keys: causal (bool), window ((left, right) or None), softcap (float), kv_cache, paged, sinks and
    alibi (bool: forward with cache_seqlens / block_table / sinks / alibi_slopes ...), fp8_cache (bool: a
    float8_e4m3fn KV cache with q of `dtype`), varlen (bool:
    varlen_forward), num_splits (int or None); values as forward takes them (a value that asks for
    nothing, such as window=(-1, -1) or softcap=0, is the plain case). Other keys name features this
    version does not have."""
    if backend not in BACKENDS:
        return Support(False, f"unknown backend {backend!r}")
    if dtype not in _arrays.DTYPES + ("float8_e4m3fn",):
        return Support(False, f"dtype {dtype} is not one of {', '.join(_arrays.DTYPES)}, float8_e4m3fn")
    for key, value in mode.items():
        if key not in _KNOWN_MODES:
            return Support(False, f"mode {key!r} is not implemented")
        if key == "causal" and not isinstance(value, (bool, np.bool_)):
            return Support(False, "causal must be a bool")
    if _C is None:
        return Support(False, _EXTENSION_ERROR)
    try:
        _check_modes(mode)
    except (TypeError, ValueError) as error:
        return Support(False, str(error))
    # Every backend takes every mode (host arrays run where device arrays do) for the head dims it has
    # kernels for. num_splits > 1 is a schedule of the tensor-core backends; the CUDA-core ones run the
    # keys in one pass, with the same result up to rounding.
    fp8_cache = bool(mode.get("fp8_cache", False))
    if fp8_cache and (dtype == "float32" or mode.get("varlen")):
        return Support(False, "a float8_e4m3fn KV cache takes float16 / bfloat16 q, in a KV-cache call (not varlen)")
    if backend == "cpu":
        refusal = _head_dim_refusal(head_dim)
        return Support(not refusal, refusal)
    if not isinstance(head_dim, (int, np.integer)) or isinstance(head_dim, (bool, np.bool_)):
        return Support(False, f"head dim must be an int, got {head_dim!r}")
    reason = _unavailable_reason(backend, device)
    if reason:
        return Support(False, reason)
    refusal = _C.head_dim_refusal(getattr(_C.Backend, backend), int(head_dim), dtype, device)
    if not refusal and dtype == "float8_e4m3fn":  # fp8 attention's kernel takes fewer options
        refusal = _C.fp8_attention_options_refusal(
            bool(mode.get("varlen")), bool(mode.get("kv_cache") or mode.get("paged")),
            bool(mode.get("softcap")), bool(mode.get("alibi")), (mode.get("num_splits") or 1) > 1)
    return Support(not refusal, refusal)


def _check_modes(mode: dict[str, Any]) -> None:
    """The values of a `supports` mode, checked as `forward` checks them (the extension's validator on
    a one-element probe for window, softcap and num_splits)."""
    for key in ("kv_cache", "paged", "varlen", "sinks", "alibi", "fp8_cache"):
        if key in mode:
            _flag(mode[key], key)
    options = {key: mode[key] for key in ("window", "softcap", "num_splits") if key in mode}
    _validate_probe(8, bool(mode.get("causal", False)), **options)


@functools.lru_cache(maxsize=None)
def _head_dim_refusal(head_dim: Any) -> str:
    """Why the cpu backend refuses a head dim ("" when it takes it)."""
    if not isinstance(head_dim, (int, np.integer)) or not 0 < head_dim <= 1024:
        return f"head dim must be a positive int, got {head_dim!r}"
    try:
        _validate_probe(int(head_dim))
    except ValueError as error:
        return str(error)
    return ""


def _validate_probe(head_dim: int, causal: bool = False, **options: Any) -> None:
    """The extension's validator on a one-element call of `head_dim` with `options`: how `supports`
    asks it."""
    probe = np.zeros((1, 1, 1, head_dim), np.float32)
    _C.validate(probe, probe, probe, None, causal, None, _CPU, **options)


def device_info(device: int = 0) -> dict[str, Any]:
    """The GPU this package would use: name, compute capability, multiprocessors, memory, driver and
    runtime versions, the architectures the extension was compiled for (all, and those with the Hopper
    wgmma kernels), which tensor-core kernel family `tensorcore` runs on it, and whether the extension
    loaded. Without a usable GPU the dict holds `available: False` and the `reason`."""
    wgmma = getattr(_C, "wgmma_architectures", "")
    info: dict[str, Any] = {
        "extension_loaded": _C is not None,
        "extension_error": _EXTENSION_ERROR,
        "extension_has_cuda": bool(getattr(_C, "has_cuda", False)),
        "compiled_architectures": [a for a in getattr(_C, "compiled_architectures", "").split(",") if a],
        "wgmma_architectures": wgmma.split(",") if wgmma else [],
        "head_dims": dict(_C.head_dims) if _C is not None else {},
    }
    count, error = _C.device_count() if _C is not None else (0, _EXTENSION_ERROR)
    info["device_count"] = count
    if count == 0 or not 0 <= device < count:
        info.update(available=False, reason=error or f"CUDA device {device} does not exist")
        return info
    info.update(available=True, device=device, **_C.device_properties(device))
    # Which kernel family `tensorcore` runs here (for the head dims of head_dims["sm90"] on wgmma).
    family = _C.tensorcore_family(device)
    info["tensorcore_kernel"] = {"wgmma": "wgmma (sm_90a)", "mma.sync": "mma.sync (sm_80)"}.get(family)
    return info


def check_device_values(enabled: bool) -> bool:
    """A debug switch: when enabled, index arrays on the device (cache_seqlens, cache_leftpad,
    block_table, cu_seqlens_*) are read back with one synchronization and checked as host values are,
    raising the same ValueError (by default their values are not read, and the kernels clamp them).
    CUTLASSFA_CHECK_DEVICE_VALUES=1 enables it at import. Returns the previous setting."""
    _require_extension()
    previous = bool(_C.check_device_values())
    _C.set_check_device_values(_flag(enabled, "enabled"))
    return previous


def empty_cache() -> None:
    """Returns the device memory the workspace pools keep reserved between calls to the driver."""
    if _C is not None and _C.has_cuda:
        _C.empty_cache()


# --------------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------------

def _backend_code(backend: Any) -> int:
    code = _BACKEND_CODES.get(backend) if isinstance(backend, str) else None
    if code is None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str, got {type(backend).__name__}")
        if backend in BACKENDS + ("auto",):
            _require_extension()
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS + ('auto',))}")
    return code


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _scale(softmax_scale: Any) -> float | None:
    """softmax_scale as a float (its value is the extension's to check)."""
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    return float(softmax_scale)


def _probe_arguments(name: str, backend: Any, causal: Any, options: dict[str, Any]) -> tuple[int, bool]:
    """The backend code and causal flag of a call that asks about a forward call (select_backend, plan); its
    keyword arguments are forward's or varlen_forward's."""
    code = _backend_code(backend)
    causal = _flag(causal, "causal")
    _require_extension()
    unknown = sorted(options.keys() - set(_OPTION_NAMES) - set(_VARLEN_NAMES))
    if unknown:
        raise TypeError(f"{name}() got an unexpected keyword argument {unknown[0]!r}")
    if options.get("out_dtype") is not None:
        options["out_dtype"] = _dtype_name(options["out_dtype"])
    return code, causal


def _dtype_name(dtype: Any) -> str | None:
    """out_dtype as the extension takes it: the name of a dtype of any framework (torch.bfloat16,
    jnp.float16, numpy's, ml_dtypes') or a name; None stays None (the extension checks the value)."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"out_dtype must be a dtype or its name, got {dtype!r}") from None


def select_backend(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
                   backend: str = "auto", **options: Any) -> str:
    """The backend `forward(q, k, v, causal=causal, backend=backend, **options)` runs: `auto` resolves to
    the first of tensorcore (sm_80+), large_tile (sm_80+), small_tile (sm_61+) and naive (sm_61+) that is
    available and runs the call, then cpu for host arrays when no GPU can be used. `options` are
    forward's (window, softcap, cache_seqlens, ...), or varlen_forward's with cu_seqlens_q / cu_seqlens_k
    (and max_seqlen_q / max_seqlen_k). Raises as `forward` would for invalid arguments."""
    code, causal = _probe_arguments("select_backend", backend, causal, options)
    resolved = _C.validate(q, k, v, None, causal, _scale(softmax_scale), code, **options)
    return "cpu" if resolved == _CPU else _C.Backend(resolved).name


def plan(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None, backend: str = "auto",
         device: tuple[int, int] | None = None, **options: Any) -> dict[str, Any]:
    """What `forward(q, k, v, causal=causal, backend=backend, **options)` would launch, launching nothing
    (`options` are forward's, or varlen_forward's with cu_seqlens_q / cu_seqlens_k and max_seqlen_q /
    max_seqlen_k). Returns a dict:
      backend: the backend the call resolves to ("cpu": the numpy code);
      kernel: "sm90decode", "sm90ws", "sm90" or "sm80" (the tensor-core families, cpp/README.md),
        "large_tile", "small_tile", "naive"; "fill" when no query row sees a key (the outputs are filled,
        no kernel runs); "cpu";
      num_splits: the key splits (more than 1: partial results, then a combine kernel);
      gqa_packed: the grouped query heads of one query run as the rows of one tile;
      tile: (query rows, keys) a CTA takes a step, or None; kernel_head_dim: the compiled head dim that runs
        (zero-padded above the call's), or None;
      fp8_dequantized: an fp8 cache that the decode kernel does not take, run on a dequantized copy;
      tuned: kernel and splits came from the measured table (cutlassfa/tuning.py); tune_class: the table's
        class of the call (cpp/include/cutlassfa/tuning.h), or None.
    device: None, where forward would run the call (the arrays' GPU; host arrays: GPU 0, or the cpu backend
    as forward resolves it); or (compute capability as major * 10 + minor, multiprocessors), e.g. (90, 132)
    for an H100 SXM, to plan for a GPU that need not be here (this build's kernels for it; no GPU needed).
    Raises as `forward` would for invalid arguments, and when the backend cannot run there."""
    code, causal = _probe_arguments("plan", backend, causal, options)
    capability = multiprocessors = 0
    if device is not None:
        if (not isinstance(device, tuple) or len(device) != 2 or not all(type(x) is int for x in device)
                or device[0] < 10 or device[1] < 1):
            raise ValueError("device must be None or (compute capability as major * 10 + minor, multiprocessors), "
                             f"e.g. (90, 132); got {device!r}")
        capability, multiprocessors = device
    if not hasattr(_C, "plan"):
        raise RuntimeError("this cutlassfa was built without CUDA: it has no kernels to plan")
    if _TUNING_PENDING:
        _install_tuning()
    return _C.plan(q, k, v, causal, _scale(softmax_scale), code, capability, multiprocessors, **options)


# --------------------------------------------------------------------------------------------------
# forward and varlen_forward
# --------------------------------------------------------------------------------------------------

_NO_SOFTCAP = 0.0  # forward's default, recognised by identity: one cheap test for "no option given"
_OPTION_NAMES = ("window", "softcap", "cache_seqlens", "cache_leftpad", "block_table", "k_new", "v_new", "num_splits",
                 "sinks", "alibi_slopes", "k_descale", "v_descale", "q_descale", "out_dtype")
_VARLEN_NAMES = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def forward(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
            window: tuple[int, int] | None = None, softcap: float = _NO_SOFTCAP, cache_seqlens: Any = None,
            cache_leftpad: Any = None, block_table: Any = None, k_new: Any = None, v_new: Any = None,
            num_splits: int | None = None, sinks: Any = None, alibi_slopes: Any = None, k_descale: Any = None,
            v_descale: Any = None, q_descale: Any = None, out_dtype: Any = None, backend: str = "auto",
            return_lse: bool = False, out: Any = None) -> Any:
    """Attention forward pass: softmax(scale · q kᵀ) v, computed blockwise without materializing the
    N×N score matrix (except by the `naive` backend).

    q: (B, Hq, Nq, d) or (B, Nq, d); k, v: (B, Hkv, Nk, d) or (B, Nk, d), Hq a multiple of Hkv (GQA).
    dtypes float32, float16, bfloat16; d a multiple of 8 up to 256 (`supports` says which backend runs
    which); the last dim contiguous, other strides free.
    numpy arrays and PyTorch CPU tensors compute on the GPU when one is usable (host in, host out) or
    on the CPU; CUDA arrays of PyTorch, CuPy or JAX are read in place and the result is of the same
    framework and device, computed on the framework's current stream. Every option below takes the
    same path on every kind of array.

    causal: bottom-right aligned as FlashAttention-2: query i sees key j iff j <= i + Nk - Nq; a row
    that sees no key gives 0 (and lse = -inf). softmax_scale defaults to 1/sqrt(d).
    Returns out, or (out, lse) when return_lse; lse is float32 (B, Hq, Nq) (or (B, Nq)), natural log.

    window=(left, right): query i sees key j iff i + Nk - Nq - left <= j <= i + Nk - Nq + right (-1:
    unbounded on that side); causal=True is (-1, 0) and combines with a left bound.
    softcap=c > 0: scores become c * tanh(s / c) before the softmax (lse of the capped scores).
    sinks: (Hq,) attention-sink logits, one per query head (gpt-oss; float32, or float16 / bfloat16 read
    as float32; on q's device or host values): row i of head h gains e^sinks[h] in its softmax
    denominator and nothing in its numerator, out_i = sum_j e^s_ij v_j / (sum_j e^s_ij + e^sinks[h]) and
    lse_i = log(sum_j e^s_ij + e^sinks[h]). Not capped by softcap; a row that sees no key gives 0 and
    lse = sinks[h]; -inf is no sink.
    alibi_slopes: (Hq,) or (B, Hq) ALiBi slopes (Bloom, MPT; float32, or float16 / bfloat16 read as
    float32; on q's device or host values): the score of query i and key j gains -slope * |i + L - Nq - j|
    after softcap (L: the entry's keys, as the causal alignment); lse includes it.
    KV cache: k and v are caches (B, Hkv, Ncache, d), or with block_table (B, max_pages) int32 paged
    caches (num_pages, Hkv, page_size, d) (key p of entry b: row p % page_size of page
    block_table[b, p // page_size]); q must be 4-D. cache_seqlens (B,): entry b attends keys
    [cache_leftpad[b], cache_seqlens[b] + Nnew), aligned bottom-right against that length. k_new, v_new
    (B, Hkv, Nnew, d) are written into the caches at cache_seqlens[b] first (cache_seqlens itself is
    not modified). Index arrays are int32 on q's device, or host ints (copied). Host values are checked
    in full; device values are not (that would need a synchronization; `check_device_values(True)`
    checks them, for debugging): the kernels clamp lengths to the capacity and leftpad to the length,
    mask the keys behind a page index outside [0, num_pages) (never read), and drop appended keys past
    the capacity or on such a page.
    FP8 KV caches: k and v (and k_new, v_new) of float8_e4m3fn (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn)
    with q of float16 or bfloat16, in a KV-cache call (cache_seqlens or block_table given). k_descale /
    v_descale: float32 dequantization scales, each a float (per tensor), (Hkv,) (per K/V head) or (B, Hkv)
    (per entry and head; on q's device or host values); None is 1. The result is attention(q, k * k_descale,
    v * v_descale) with float32 accumulation, in q's dtype. The decode kernel (sm_90: at most 32 query rows
    per K/V head, Nq x Hq / Hkv, or 128 of at most 16 queries; head dims 64 and 128, power-of-two page
    sizes) reads the fp8 bytes; every other call and backend runs on a dequantized copy of the cache in q's
    dtype (a workspace of B x Hkv x capacity x d x 2 bytes for K and for V, freed after the call).
    FP8 attention: q, k and v all float8_e4m3fn (any call: dense, cache, or varlen_forward), with q_descale
    (as k_descale; query head h takes the entry of its K/V head, h // (Hq / Hkv)), k_descale and v_descale:
    the result is attention(q * q_descale, k * k_descale, v * v_descale) with float32 accumulation, in
    out_dtype (bfloat16 by default, or float16; a dtype of any framework or its name; `out` must have it).
    The tensorcore backend runs it on sm_90 (dense arrays, causal or any window, GQA; the head dims of
    `_C.head_dims["sm90ws_fp8"]`; P is rounded to e4m3 for P V, ~2-3 % relative L2 on random inputs); the
    cpu backend runs every form; other backends, GPUs, head dims and options are refused (`supports`).
    num_splits: None (the backend chooses from the batch, heads, keys and multiprocessors, so that one
    pass fills the GPU; a call with none of the options above and at most 64 fp16 / bf16 queries chooses
    the same way, other such calls run one pass) or n >= 1 parts of the keys (at most one per 128 keys
    and 1024 in all), merged by lse. The split is a schedule of the tensor-core backends; the CUDA-core
    backends (and varlen batches) run the keys in one pass. It changes nothing beyond rounding.
    """
    # The types of the flags are checked here, every value in one call into the extension (the per-call
    # cost of a tiny problem is a few microseconds: keep this path free of anything per-call that can be
    # cached).
    code = _BACKEND_CODES.get(backend) if type(backend) is str else None
    if code is None:
        code = _backend_code(backend)  # raises the error that says what is wrong
    if causal is not True and causal is not False:
        causal = _flag(causal, "causal")
    if return_lse is not True and return_lse is not False:
        return_lse = _flag(return_lse, "return_lse")
    if softmax_scale is not None:
        softmax_scale = _scale(softmax_scale)
    plain = (window is None and softcap is _NO_SOFTCAP and cache_seqlens is None and cache_leftpad is None
             and block_table is None and k_new is None and v_new is None and num_splits is None and sinks is None
             and alibi_slopes is None and k_descale is None and v_descale is None and q_descale is None
             and out_dtype is None)
    options = () if plain else (window, softcap, cache_seqlens, cache_leftpad, block_table, k_new, v_new, num_splits,
                                sinks, alibi_slopes, k_descale, v_descale, q_descale, _dtype_name(out_dtype))

    module = type(q).__module__
    if module.startswith("torch"):
        # Through torch.ops.cutlassfa.forward only while PyTorch must see the call (compiling, tracing,
        # autograd recording); eager calls go straight to the extension (the operator costs 3-13 us).
        torch_integration = _TORCH_INTEGRATION or _torch_integration()
        if torch_integration.must_use_op(q, k, v):
            return torch_integration.op_forward(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                                                return_lse=return_lse, out=out, **_given(options))
    elif module.startswith("jax") and _jax_integration_takes(q, k, v, options):
        from .integrations import jax as jax_integration

        return jax_integration.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                                       return_lse=return_lse, out=out, **_given(options))
    if _C is None:
        raise RuntimeError(_EXTENSION_ERROR)
    if _TUNING_PENDING:
        _install_tuning()
    if module.startswith("jax"):
        result = _forward_jax(q, k, v, out, causal, softmax_scale, code, return_lse, options)
    elif module.startswith("cupy"):
        result = _C.forward(q, k, v, out, causal, softmax_scale, code, return_lse, _arrays.cupy_empty,
                            _arrays.cupy_stream(q), False, *options)
    else:  # PyTorch (host or CUDA) and numpy: allocation and stream come from the extension
        result = _C.forward(q, k, v, out, causal, softmax_scale, code, return_lse, None, -1, False, *options)
    if result is None:  # the resolved backend is `cpu`; every argument has been validated
        result = _forward_cpu(q, k, v, out, causal, softmax_scale, return_lse, options)
    return result if return_lse else result[0]


def varlen_forward(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *, max_seqlen_q: int | None = None,
                   max_seqlen_k: int | None = None, causal: bool = False, softmax_scale: float | None = None,
                   window: tuple[int, int] | None = None, softcap: float = 0.0, sinks: Any = None,
                   alibi_slopes: Any = None, q_descale: Any = None, k_descale: Any = None, v_descale: Any = None,
                   out_dtype: Any = None, backend: str = "auto", return_lse: bool = False, out: Any = None) -> Any:
    """Attention over a batch of sequences of different lengths, packed without padding (FlashAttention's
    varlen layout), on the same path as `forward`: CUDA arrays of PyTorch or CuPy in place, host arrays
    (numpy, PyTorch CPU tensors) on the GPU when one is usable, else on the `cpu` backend. JAX arrays
    and tracers go through cutlassfa.jax.varlen_forward (max_seqlen_q / max_seqlen_k then Python ints).

    q (total_q, Hq, d); k, v (total_k, Hkv, d), Hq a multiple of Hkv; dtypes as `forward`, d a multiple
    of 8 from 8 to 256, any strides. cu_seqlens_q / cu_seqlens_k: (B+1,) int prefix sums, 0 first,
    non-decreasing, ending at total_q / total_k: sequence b is rows [cu[b], cu[b+1]); empty sequences
    are allowed (int32 arrays on q's device, or host ints, copied). max_seqlen_q / max_seqlen_k: None
    or at least each sequence's length; they size the GPU grid: with cu_seqlens on the device and
    None, the grid covers the totals (correct, slower). Device values are not checked (that would
    need a synchronization): the kernels clamp each sequence's first row to [0, total] and its length to
    max_seqlen and to the array; rows no sequence covers are not written.
    causal, window, softcap, sinks, alibi_slopes (B = the sequences), softmax_scale, and fp8 attention's
    q_descale, k_descale, v_descale and out_dtype: as `forward`, aligned bottom-right within each sequence.
    Returns out (total_q, Hq, d), or (out, lse) when return_lse, lse float32 (Hq, total_q).
    """
    code = _backend_code(backend)
    causal, return_lse = _flag(causal, "causal"), _flag(return_lse, "return_lse")
    scale = _scale(softmax_scale)
    module = type(q).__module__
    options = (window, softcap) + (None,) * 6 + (sinks, alibi_slopes, k_descale, v_descale, q_descale,
                                                _dtype_name(out_dtype))  # forward's, in order
    if module.startswith("jax"):
        from .integrations import jax as jax_integration

        return jax_integration.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                              max_seqlen_k=max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
                                              backend=backend, return_lse=return_lse, out=out, **_given(options))
    if module.startswith("torch") and _torch_integration().must_use_op(q, k, v):
        return _torch_integration().op_varlen_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal,
            softmax_scale=softmax_scale, backend=backend, return_lse=return_lse, out=out, **_given(options))
    _require_extension()
    if _TUNING_PENDING:
        _install_tuning()
    alloc, stream = (_arrays.cupy_empty, _arrays.cupy_stream(q)) if module.startswith("cupy") else (None, -1)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    result = _C.forward(q, k, v, out, causal, scale, code, return_lse, alloc, stream, False, *options, *varlen)
    if result is None:
        result = _forward_cpu(q, k, v, out, causal, scale, return_lse, options, varlen)
    return result if return_lse else result[0]


# The measured dispatch table (cutlassfa/tuning.py) is looked up on the first call that plans for a GPU (a
# query of the GPU before would initialize CUDA at import).
_TUNING_PENDING = True


def _install_tuning() -> None:
    global _TUNING_PENDING
    _TUNING_PENDING = False
    from . import tuning

    tuning.ensure_installed()


def _given(options: tuple) -> dict[str, Any]:
    """The options of a call that ask for something, by name (for the framework integrations)."""
    return {name: value for name, value in zip(_OPTION_NAMES, options)
            if value is not None and not (name == "softcap" and value is _NO_SOFTCAP)}


_TORCH_INTEGRATION = None


def _torch_integration() -> Any:
    """cutlassfa.integrations.torch, imported (and the operator registered) on first use."""
    global _TORCH_INTEGRATION
    if _TORCH_INTEGRATION is None:
        from .integrations import torch as torch_integration

        _TORCH_INTEGRATION = torch_integration
    return _TORCH_INTEGRATION


def _jax_integration_takes(q: Any, k: Any, v: Any, options: tuple) -> bool:
    """JAX tracers (inside jax.jit / vmap, as any array argument) and arrays on the CPU go to the XLA
    integration; so do concrete GPU arrays when its FFI handler is registered (a custom call on XLA's
    stream, no synchronization). Without it, concrete GPU arrays take the direct path, which waits for
    them and synchronizes. JAX arrays are immutable: k_new / v_new are refused here (cutlassfa.jax.forward
    returns the updated caches)."""
    import jax

    from .integrations import jax as jax_integration

    if options and (options[5] is not None or options[6] is not None):
        raise TypeError("k_new / v_new are appended into k and v in place, and JAX arrays are immutable: use "
                        "cutlassfa.jax.forward, which returns the updated caches")
    if any(isinstance(a, jax.core.Tracer) for a in (q, k, v, *options)):  # sinks may be traced alone
        return True
    if all(d.platform == "cpu" for a in (q, k, v) for d in a.devices()):
        return True  # the integration runs the cpu backend through a host callback
    return jax_integration.ffi_registered()


def _host_index(value: Any) -> Any:
    """An index argument as the cpu backend reads it: numpy, a sequence of ints, or a PyTorch CPU tensor
    seen through numpy (the extension has validated it)."""
    return value if value is None or isinstance(value, (np.ndarray, list, tuple)) else _arrays.host_numpy(value)


def _host_floats(value: Any) -> np.ndarray:
    """A float argument (sinks) as the cpu backend reads it: float32 numpy (the extension has validated it)."""
    if isinstance(value, (list, tuple, int, float)):
        return np.asarray(value, np.float32)
    return np.asarray(_arrays.host_numpy(value), np.float32)


def _forward_cpu(q: Any, k: Any, v: Any, out: Any, causal: bool, scale: float | None, return_lse: bool,
                 options: tuple = (), varlen: tuple | None = None) -> tuple[Any, Any]:
    """The numpy backend on host arrays (numpy, or PyTorch CPU tensors seen through numpy), after the
    extension has validated every argument."""
    from . import cpu

    like = q
    q, k, v = (_arrays.host_numpy(x) for x in (q, k, v))
    (window, softcap, cache_seqlens, cache_leftpad, block_table, k_new, v_new, num_splits, sinks, alibi_slopes,
     k_descale, v_descale, q_descale, out_dtype) = options or (None, _NO_SOFTCAP) + (None,) * 12
    fp8 = q.dtype.name == "float8_e4m3fn"  # fp8 attention: float32 math on the dequantized inputs
    if out is None:
        out = _arrays.empty_host_like(like, q.shape, (out_dtype or "bfloat16") if fp8 else q.dtype.name)
    out_np = _arrays.host_numpy(out)
    kv_cache = any(x is not None for x in (cache_seqlens, cache_leftpad, block_table, k_new, v_new))
    if fp8:
        q, k, v, k_descale, v_descale = _dequantized_fp8(q, k, v, q_descale, k_descale, v_descale, kv_cache, varlen)
    common = dict(causal=causal, softmax_scale=scale, window=window, softcap=softcap or 0.0,
                  sinks=None if sinks is None else _host_floats(sinks),
                  alibi_slopes=None if alibi_slopes is None else _host_floats(alibi_slopes), return_lse=True,
                  out=out_np.astype(np.float32) if fp8 else out_np)  # rows no entry covers keep out's
    if varlen is not None:
        cu_q, cu_k, max_q, max_k = varlen
        _, lse = cpu.varlen_forward_cpu(q, k, v, _host_index(cu_q), _host_index(cu_k), max_seqlen_q=max_q,
                                        max_seqlen_k=max_k, **common)
    elif kv_cache:
        _, lse = cpu.kvcache_forward_cpu(q, k, v, cache_seqlens=_host_index(cache_seqlens),
                                         cache_leftpad=_host_index(cache_leftpad),
                                         block_table=_host_index(block_table),
                                         k_new=None if k_new is None else _arrays.host_numpy(k_new),
                                         v_new=None if v_new is None else _arrays.host_numpy(v_new),
                                         k_descale=None if k_descale is None else _host_floats(k_descale),
                                         v_descale=None if v_descale is None else _host_floats(v_descale),
                                         num_splits=num_splits, **common)
    else:
        view4 = (lambda a: a[:, None]) if q.ndim == 3 else (lambda a: a)
        computed = common["out"]
        common["out"] = view4(computed)
        _, lse = cpu.forward_cpu(view4(q), view4(k), view4(v), num_splits=num_splits, **common)
        common["out"] = computed
        lse = lse.reshape(q.shape[:-1])
    if fp8:
        out_np[...] = common["out"]  # rounded once, float32 to out_dtype
    return out, (_arrays.host_like(like, lse) if return_lse else None)


def _dequantized_fp8(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_descale: Any, k_descale: Any, v_descale: Any,
                     kv_cache: bool, varlen: tuple | None) -> tuple:
    """fp8 attention's inputs for the cpu backend: q, k, v times their descales as float32 (a KV cache
    stays fp8, descaled where it is read, so that appended keys land in it), and the descales left to apply."""
    from ._options import dequantized, varlen_layout

    floats = [None if x is None else _host_floats(x) for x in (q_descale, k_descale, v_descale)]
    heads_kv = k.shape[1] if k.ndim == 4 or varlen is not None else 1
    if varlen is not None:
        cu_q, cu_k, max_q, max_k = varlen
        layout = varlen_layout(_host_index(cu_q), _host_index(cu_k), max_seqlen_q=max_q, max_seqlen_k=max_k)
        rows = [layout.rows(b, q.shape[0], k.shape[0]) for b in range(layout.batch)]
        q_rows, kv_rows = [r[:2] for r in rows], [r[2:] for r in rows]
    else:
        q_rows = kv_rows = None
    q = dequantized(q, floats[0], "q_descale", heads_kv, dtype=np.float32, entries=q_rows)
    if kv_cache:
        return q, k, v, floats[1], floats[2]
    k, v = (dequantized(x, f, name, heads_kv, dtype=np.float32, entries=kv_rows)
            for x, f, name in ((k, floats[1], "k_descale"), (v, floats[2], "v_descale")))
    return q, k, v, None, None


def _forward_jax(q: Any, k: Any, v: Any, out: Any, causal: bool, scale: float | None, code: int,
                 return_lse: bool, options: tuple) -> tuple[Any, Any]:
    """JAX computes asynchronously on streams of its own and its arrays are immutable: wait for the
    inputs, write into device buffers of ours on a per-thread stream, synchronize, hand the buffers over."""
    for x in (q, k, v, *options):
        if hasattr(x, "block_until_ready"):
            x.block_until_ready()
    if out is not None and type(out).__module__.startswith("jax"):
        raise TypeError("out is not supported for JAX arrays (they are immutable)")
    result = _C.forward(q, k, v, out, causal, scale, code, return_lse, _arrays.device_buffer, _C.stream_per_thread,
                        True, *options)
    if result is None:
        raise ValueError("backend 'cpu' needs host (numpy) arrays; q, k and v are on a CUDA device")
    o, lse = result
    shape = tuple(q.shape)
    return (_arrays.finish_jax(o, shape, q.dtype.name, _C),
            _arrays.finish_jax(lse, shape[:-1], "float32", _C) if lse is not None else None)
