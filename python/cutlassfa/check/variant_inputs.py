"""Inputs of the variant cases, their float64 reference and the half-precision yardstick.

Dense variants use the plain case's q, k, v. A KV-cache case draws each entry's keys (cache part, then
the appended ones) and writes the cache part into a contiguous cache (B, Hkv, Ncache, d) or into the
pages of a paged one that a shuffled block_table names; every slot no entry owns holds other random
values, so a backend that reads past a length, before a leftpad or through the wrong page is off.
A varlen case packs ragged sequences. The reference is cutlassfa.reference's kvcache_reference /
varlen_reference on the cache layout; the yardstick (naive_same_precision) runs on each entry's own
keys, so the scatter into the cache is checked too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._inputs import Case, case_values, numpy_dtype, round_to
from .._options import dequantized

HALF = ("float16", "bfloat16")


@dataclass
class VariantInputs:
    """q, k, v (float32, rounded to the dtype), further float arrays (k_new, v_new, sinks), int32 index arrays
    (cache_seqlens, block_table, cu_seqlens_q ...), scalar options (window, softcap, num_splits,
    max_seqlen_*), the float64 reference and the same-precision naive output (half dtypes only)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    ref_out: np.ndarray
    ref_lse: np.ndarray
    naive: np.ndarray | None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    index: dict[str, np.ndarray] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    kv_dtype: str | None = None  # of k, v, k_new and v_new when not the case's (an fp8 cache)


def _mask_options(case: Case, rng: np.random.Generator) -> dict[str, Any]:
    """What the reference, the yardstick and forward all take: window, softcap, and the sinks and ALiBi
    slopes (float32 rounded to the case's dtype: forward gets them in that dtype, on the arrays' device).
    One head has no sink (-inf); the others lie around the scores' scale, so that they change every row."""
    v = case.variant
    options: dict[str, Any] = {}
    if v.window is not None:
        options["window"] = v.window
    if v.softcap:
        options["softcap"] = v.softcap
    if v.sinks:
        sinks = rng.normal(1.0, 2.0, case.H)
        sinks[0] = -np.inf
        options["sinks"] = round_to(sinks, case.dtype)
    if v.alibi:  # per entry and head, as Bloom's geometric slopes (1/2 .. 1/256) times a random factor
        batch = len(v.cache_seqlens or v.seqlens_q) or case.B
        slopes = 2.0 ** -np.linspace(1, 8, case.H)[None, :] * rng.uniform(0.5, 1.5, (batch, 1))
        options["alibi_slopes"] = round_to(slopes, case.dtype)
    return options


def _entry(masking: dict[str, Any], i: int) -> dict[str, Any]:
    """The mask options of entry i alone (its row of the ALiBi slopes)."""
    if "alibi_slopes" not in masking:
        return masking
    return {**masking, "alibi_slopes": masking["alibi_slopes"][i:i + 1]}


def _forward_options(masking: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The mask options split into forward's scalar options and its float arrays (sinks, ALiBi slopes)."""
    options = dict(masking)
    arrays = {name: options.pop(name) for name in ("sinks", "alibi_slopes") if name in options}
    return options, arrays


def variant_inputs(case: Case, rng: np.random.Generator) -> VariantInputs:
    """Inputs and reference of a variant case. Raises Unsupported where the yardstick needs a dtype
    numpy cannot hold here (bfloat16 without ml_dtypes)."""
    half = numpy_dtype(case.dtype) if case.dtype in HALF else None
    build = {"dense": _dense, "kvcache": _kvcache, "varlen": _varlen}[case.variant.kind]
    return build(case, rng, half)


def _draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return round_to(rng.standard_normal(shape), dtype)


def _draw_e4m3(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Standard normal values times 4 rounded to float8_e4m3fn, as float32 (`dtype` unused: the cache's own)."""
    return (rng.standard_normal(shape) * 4).astype(numpy_dtype("float8_e4m3fn")).astype(np.float32)


def _fp8_descales(rng: np.random.Generator, batch: int, heads_kv: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Descales per (entry, K/V head), multiples of 1/32: an e4m3 value (3 mantissa bits) times one is exact
    in float16 and bfloat16, so the half-precision yardstick computes on exactly the dequantized inputs."""
    return {name: rng.integers(2, 12, (batch, heads_kv)).astype(np.float32) / 32 for name in names}


def _p_rounding(case: Case) -> dict[str, Any]:
    """The yardstick's P V operand: e4m3 for fp8 attention (what an fp8 kernel's second GEMM takes; rounding
    P there is that algorithm's own error, 2^-4 relative an element), else the case's dtype."""
    return {"p_dtype": numpy_dtype("float8_e4m3fn")} if case.variant.fp8 else {}


def _fp8_attention(case: Case) -> dict[str, Any]:
    """forward's options of an fp8-attention case: the output in the case's dtype."""
    return {"out_dtype": case.dtype} if case.variant.fp8 else {}


def _dense(case: Case, rng: np.random.Generator, half: Any) -> VariantInputs:
    from cutlassfa import reference

    if case.variant.fp8:
        q, k, v = (_draw_e4m3(rng, shape, case.dtype) for shape in case.shapes())
        descales = _fp8_descales(rng, case.B, case.Hk, ("q_descale", "k_descale", "v_descale"))
    else:
        q, k, v = case_values(case, rng)
        descales = {}
    masking = _mask_options(case, rng)
    ref_out, ref_lse = reference.attention_reference(q, k, v, causal=case.causal, **masking, **descales)
    naive = None
    if half is not None:  # the yardstick on the dequantized inputs
        dq, dk, dv = (dequantized(x, descales.get(name), name, case.Hk, dtype=np.float64) for x, name in
                      ((q, "q_descale"), (k, "k_descale"), (v, "v_descale")))
        naive = reference.naive_same_precision(dq, dk, dv, half, causal=case.causal, **masking, **_p_rounding(case))
    options, arrays = _forward_options(masking)
    if case.variant.num_splits is not None:
        options["num_splits"] = case.variant.num_splits
    return VariantInputs(q, k, v, ref_out, ref_lse, naive, arrays={**arrays, **descales},
                         options={**options, **_fp8_attention(case)}, kv_dtype="float8_e4m3fn" if descales else None)


def _kvcache(case: Case, rng: np.random.Generator, half: Any) -> VariantInputs:
    from cutlassfa import reference

    var, dt = case.variant, case.dtype
    b, hk, d = case.B, case.Hk, case.d
    seqlens = np.array(var.cache_seqlens, np.int32)
    leftpad = np.array(var.cache_leftpad or (0,) * b, np.int32)
    q = (_draw_e4m3 if var.fp8 else _draw)(rng, (b, case.H, case.Nq, d), dt)
    draw_kv = _draw_e4m3 if var.fp8_cache or var.fp8 else _draw
    # Each entry's keys and values: the cache part, then the n_new appended ones.
    keys = [draw_kv(rng, (hk, int(n) + var.n_new, d), dt) for n in seqlens]
    values = [draw_kv(rng, (hk, int(n) + var.n_new, d), dt) for n in seqlens]
    index: dict[str, np.ndarray] = {"cache_seqlens": seqlens}
    if var.cache_leftpad:
        index["cache_leftpad"] = leftpad
    if var.page_size:
        per_entry = case.Nk // var.page_size
        pages = b * per_entry + 1  # one page no entry uses
        table = rng.permutation(pages)[: b * per_entry].reshape(b, per_entry).astype(np.int32)
        k_cache, v_cache = (draw_kv(rng, (pages, hk, var.page_size, d), dt) for _ in range(2))
        for i, n in enumerate(seqlens):
            at = np.arange(n)
            k_cache[table[i, at // var.page_size], :, at % var.page_size] = keys[i][:, :n].transpose(1, 0, 2)
            v_cache[table[i, at // var.page_size], :, at % var.page_size] = values[i][:, :n].transpose(1, 0, 2)
        index["block_table"] = table
    else:
        k_cache, v_cache = (draw_kv(rng, (b, hk, case.Nk, d), dt) for _ in range(2))
        for i, n in enumerate(seqlens):
            k_cache[i, :, :n], v_cache[i, :, :n] = keys[i][:, :n], values[i][:, :n]
    arrays = {}
    if var.n_new:
        arrays = {"k_new": np.stack([x[:, n:] for x, n in zip(keys, seqlens)]),
                  "v_new": np.stack([x[:, n:] for x, n in zip(values, seqlens)])}
    masking = _mask_options(case, rng)
    names = ("q_descale",) * var.fp8 + ("k_descale", "v_descale") * (var.fp8_cache or var.fp8)
    descales = _fp8_descales(rng, b, hk, names)
    ref_out, ref_lse = reference.kvcache_reference(q, k_cache, v_cache, causal=case.causal, **index, **arrays,
                                                   **masking, **descales)
    naive = None
    if half is not None:  # the yardstick on each entry's dequantized keys
        if "k_descale" in descales:
            keys = [x * descales["k_descale"][i][:, None, None] for i, x in enumerate(keys)]
            values = [x * descales["v_descale"][i][:, None, None] for i, x in enumerate(values)]
        dq = dequantized(q, descales.get("q_descale"), "q_descale", hk, dtype=np.float64)
        naive = np.concatenate([reference.naive_same_precision(dq[i:i + 1], keys[i][None, :, lp:],
                                                               values[i][None, :, lp:], half, causal=case.causal,
                                                               **_entry(masking, i), **_p_rounding(case))
                                for i, lp in enumerate(leftpad)])
    options, sink_array = _forward_options(masking)
    if var.num_splits is not None:
        options["num_splits"] = var.num_splits
    return VariantInputs(q, k_cache, v_cache, ref_out, ref_lse, naive, {**arrays, **sink_array, **descales}, index,
                         {**options, **_fp8_attention(case)}, kv_dtype="float8_e4m3fn" if descales else None)


def _varlen(case: Case, rng: np.random.Generator, half: Any) -> VariantInputs:
    from cutlassfa import reference

    var, dt = case.variant, case.dtype
    cu_q = np.concatenate([[0], np.cumsum(var.seqlens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(var.seqlens_k)]).astype(np.int32)
    draw = _draw_e4m3 if var.fp8 else _draw
    q = draw(rng, (int(cu_q[-1]), case.H, case.d), dt)
    k, v = (draw(rng, (int(cu_k[-1]), case.Hk, case.d), dt) for _ in range(2))
    descales = _fp8_descales(rng, len(var.seqlens_q), case.Hk, ("q_descale", "k_descale", "v_descale") * var.fp8)
    masking = _mask_options(case, rng)
    ref_out, ref_lse = reference.varlen_reference(q, k, v, cu_q, cu_k, causal=case.causal, **masking, **descales)
    naive = None
    if half is not None:  # on each sequence's dequantized rows
        naive = np.zeros(q.shape, np.float64)
        heads_first = lambda x: x.transpose(1, 0, 2)[None]  # noqa: E731 - (n, H, d) -> (1, H, n, d)
        for i, (q0, q1, k0, k1) in enumerate(zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:])):
            entry = {name: x[i:i + 1] for name, x in descales.items()}
            sq, sk, sv = (dequantized(heads_first(x), entry.get(name), name, case.Hk, dtype=np.float64) for x, name in
                          ((q[q0:q1], "q_descale"), (k[k0:k1], "k_descale"), (v[k0:k1], "v_descale")))
            o = reference.naive_same_precision(sq, sk, sv, half, causal=case.causal, **_entry(masking, i),
                                               **_p_rounding(case))
            naive[q0:q1] = o[0].transpose(1, 0, 2)
    options, arrays = _forward_options(masking)
    options.update(max_seqlen_q=max(var.seqlens_q), max_seqlen_k=max(var.seqlens_k), **_fp8_attention(case))
    return VariantInputs(q, k, v, ref_out, ref_lse, naive, {**arrays, **descales},
                         {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}, options,
                         kv_dtype="float8_e4m3fn" if descales else None)


def index_to_framework(x: np.ndarray, framework: str) -> Any:
    """An int32 index array as `framework` arrays: numpy on the host, int32 on the CUDA device otherwise
    (what a serving stack passes; the kernels then read the values on the device)."""
    x = np.ascontiguousarray(x, dtype=np.int32)
    if framework == "numpy":
        return x
    if framework == "torch":
        import torch

        return torch.from_numpy(x).to("cuda")
    if framework == "cupy":
        import cupy

        return cupy.asarray(x)
    raise ValueError(f"unknown array framework {framework!r}")
