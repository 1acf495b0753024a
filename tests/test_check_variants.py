"""The accuracy gate on the attention variants: its matrix holds every variant mode the cpu backend
advertises (windows, softcap, padded head dims, KV caches, varlen), and it fails a backend that gets a
variant wrong (ignores the window, the softcap, the appended keys, leftpad or the causal mask of a
varlen batch; returns a finite lse for a row that sees no key), that refuses an advertised variant, or
that it cannot feed (a GPU backend on numpy arrays: unchecked, with the reason). The quick matrix
stays small, and the report and JSON name each case's variant."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import cutlassfa
from cutlassfa import check
from cutlassfa.check import Advertised, Backend, variants
from cutlassfa.check.cases import configurations

CPU = check.public_backend("cpu", "numpy")
MODE_KEYS = {"causal", "window", "softcap", "kv_cache", "paged", "varlen", "num_splits", "sinks", "alibi", "fp8_cache"}


def _variant_cases(quick=True, dtypes=check.DTYPES, kinds=None):
    cases = [c for c in check.build_cases(quick, dtypes) if c.variant is not None]
    return [c for c in cases if kinds is None or c.variant.kind in kinds]


def _wrap(change):
    """The cpu backend, with its keyword arguments passed through `change` first."""
    def fn(q, k, v, **kwargs):
        return CPU.fn(q, k, v, **change(dict(kwargs)))

    return fn


def _gate(fn, cases, seed=0):
    results = check.run_check([Backend("cpu", fn)], cases, seed)
    return check.report(results, seed=seed), results


# ---------------------------------------------------------------------------------------------------
# The matrix.
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("quick", [True, False])
def test_matrix_holds_every_variant_mode_the_cpu_backend_advertises(quick):
    cases = check.build_cases(quick)
    assert {k for c in cases for k in c.mode} == MODE_KEYS == set(cutlassfa._api._KNOWN_MODES)
    assert all(CPU.advertises(c) for c in cases)
    # every (dtype, variant) in the matrix, and nothing the cpu backend advertises left out
    # (an fp8 cache takes half-precision q only)
    assert {(c.dtype, c.variant.name) for c in cases if c.variant} == {
        (dt, spec.variant.name) for dt in check.DTYPES for spec in variants.SPECS if variants.takes(spec, dt)}
    assert check.coverage_gaps("cpu", CPU.advertises, cases, check.DTYPES) == []
    # each variant mode names something (fp8 attention: q's dtype does) and is a mode `supports` takes
    for spec in variants.SPECS:
        dtype = "float16" if spec.variant.fp8_cache else "float8_e4m3fn" if spec.variant.fp8 else "float32"
        assert spec.variant.mode or spec.variant.fp8
        assert cutlassfa.supports("cpu", dtype, 64, causal=spec.causal, **spec.variant.mode)


def test_matrix_holds_the_windows_softcaps_caches_and_batches_asked_for():
    by_name = {c.variant.name: c for c in _variant_cases(quick=False)}
    windows = {name: (c.variant.window, c.causal) for name, c in by_name.items() if c.variant.window}
    assert ((32, -1), False) in windows.values()  # left only
    assert any(left > 0 and right > 0 and not causal for (left, right), causal in windows.values())  # two-sided
    assert any(left > 0 and causal for (left, _), causal in windows.values())  # causal + left bound
    assert ((0, 0), False) in windows.values()
    wide = by_name["window-wider-than-n"]
    assert min(wide.variant.window) > max(wide.Nq, wide.Nk)
    capped = [c for c in by_name.values() if c.variant.softcap]
    assert {c.variant.window is None for c in capped} == {True, False}
    kv = [c.variant for c in by_name.values() if c.variant.kind == "kvcache"]
    assert any(not v.page_size for v in kv) and any(v.page_size for v in kv)
    assert any(v.page_size and any(n % v.page_size for n in v.cache_seqlens) for v in kv)
    assert {bool(v.n_new) for v in kv} == {True, False} and any(v.cache_leftpad for v in kv)
    assert any((v.num_splits or 1) > 1 for v in kv) and any(0 in v.cache_seqlens for v in kv)
    varlen = [c for c in by_name.values() if c.variant.kind == "varlen"]
    assert {c.causal for c in varlen} == {False, True}
    sunk = [c.variant for c in by_name.values() if c.variant.sinks]  # every kind, split, paged, with softcap
    assert {v.kind for v in sunk} == {"dense", "kvcache", "varlen"}
    assert any(v.num_splits for v in sunk) and any(v.page_size for v in sunk) and any(v.softcap for v in sunk)
    biased = [c.variant for c in by_name.values() if c.variant.alibi]  # every kind; caches with leftpad, pages
    assert {v.kind for v in biased} == {"dense", "kvcache", "varlen"}
    assert any(v.cache_leftpad and v.page_size and v.num_splits for v in biased) and any(v.softcap for v in biased)
    for c in varlen:
        lengths = list(zip(c.variant.seqlens_q, c.variant.seqlens_k))
        assert len(set(c.variant.seqlens_q)) > 2  # ragged
        assert any(nq == 0 < nk for nq, nk in lengths) and any(nk == 0 < nq for nq, nk in lengths)


def test_padded_head_dims_neighbour_every_compiled_width_of_every_family():
    padded = variants.padded_head_dims()
    assert padded and all(d % 8 == 0 and 8 <= d <= 256 and d not in cutlassfa.HEAD_DIMS for d in padded)
    assert variants.padded_neighbour_gaps() == []
    for family, widths in variants.families().items():
        for low, width in zip((0,) + tuple(sorted(widths)), sorted(widths)):
            assert any(low < d < width for d in padded), (family, width)
    for quick in (True, False):
        plain = {(c.dtype, c.d) for c in check.build_cases(quick) if c.variant is None and not c.hw4}
        assert {(dt, d) for dt in check.DTYPES for d in padded} <= plain


def test_quick_matrix_stays_small():
    quick, full = check.build_cases(quick=True), check.build_cases(quick=False)
    added = [c for c in quick if c.variant is not None or c.d not in cutlassfa.HEAD_DIMS]
    # each (dtype, variant) once (fp8 caches and fp8 attention: half-precision dtypes only), each (dtype, padded
    # head dim) once; the budget grew with the sink, ALiBi, fp8-cache and fp8-attention variants (the CPU's quick
    # run: 250 cases in 3-33 s)
    fp8_specs = sum(spec.variant.fp8_cache or spec.variant.fp8 for spec in variants.SPECS)
    assert len(added) == len(check.DTYPES) * (len(variants.SPECS) + len(variants.padded_head_dims())) - fp8_specs <= 104
    assert len(quick) <= 252 and len(full) > 3 * len(quick)
    assert max(Counter((c.dtype, c.variant.name) for c in quick if c.variant).values()) == 1


def test_every_backend_on_a_gpu_touches_every_variant_in_quick(monkeypatch):
    """With every backend available and advertising what the extension's head-dim rules say (small_tile
    up to 192, the tensor-core backends fp32 up to 128), the quick matrix leaves no configuration of
    any backend uncovered."""
    def gpu_rules(backend, dtype, head_dim, **mode):
        if backend == "small_tile" and head_dim > 192:
            return Advertised(False, "limit")
        if backend.startswith("tensorcore") and dtype == "float32" and head_dim > 128:
            return Advertised(False, "limit")
        return Advertised(True)

    monkeypatch.setattr(cutlassfa, "supports", gpu_rules)
    for quick in (True, False):
        cases = check.build_cases(quick)
        for name in check.BACKEND_ORDER:
            backend = check.public_backend(name, "torch")
            assert check.coverage_gaps(name, backend.advertises, cases, check.DTYPES) == [], (name, quick)
            touched = {(c.dtype, c.variant.name) for c in cases if c.variant and backend.advertises(c)}
            assert len(touched) == sum(variants.takes(spec, dt) for dt in check.DTYPES for spec in variants.SPECS)


def test_a_variant_advertised_but_not_in_the_matrix_is_a_gap():
    cases = [c for c in check.build_cases(quick=True) if c.variant is None or c.variant.name != "softcap"]
    gaps = check.coverage_gaps("cpu", CPU.advertises, cases, check.DTYPES)
    assert len(gaps) == len(check.DTYPES) and all(" softcap {" in gap for gap in gaps)
    assert len(configurations(check.DTYPES)) > len(variants.SPECS) * len(check.DTYPES)


# ---------------------------------------------------------------------------------------------------
# Wrong variants fail.
# ---------------------------------------------------------------------------------------------------
def _drop(*names):
    return lambda kwargs: {k: v for k, v in kwargs.items() if k not in names}


def _without_leftpad(kwargs):
    if "cache_leftpad" in kwargs:
        kwargs["cache_leftpad"] = np.zeros_like(kwargs["cache_leftpad"])
    return kwargs


BREAKAGES = {  # what the backend gets wrong -> which variant cases must catch it
    # (a window wider than N is no window: ignoring it is right)
    "ignores the window": (_drop("window"), lambda c: c.variant.window not in (None, (1000, 1000))),
    "ignores the softcap": (_drop("softcap"), lambda c: c.variant.softcap > 0),
    "ignores k_new / v_new": (_drop("k_new", "v_new"), lambda c: c.variant.n_new > 0),
    "ignores cache_leftpad": (_without_leftpad, lambda c: bool(c.variant.cache_leftpad)),
    "ignores causal in varlen": (lambda kw: dict(kw, causal=False) if "cu_seqlens_q" in kw else kw,
                                 lambda c: c.variant.kind == "varlen" and c.causal),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_backend_that_gets_a_variant_wrong_fails(breakage, capsys):
    change, affected = BREAKAGES[breakage]
    cases = [c for c in _variant_cases() if affected(c)]
    assert cases
    code, results = _gate(_wrap(change), cases)
    out = capsys.readouterr().out
    assert code == 1 and "FAILED" in out
    assert all(r.status == "fail" for r in results), [(r.case.label, r.status) for r in results if r.status != "fail"]
    assert cases[0].variant.name in out  # the offenders table names the variant


def test_a_backend_that_ignores_the_window_passes_the_plain_cases():
    """The same wrapper on the plain cases passes: only the variant cases catch it."""
    plain = [c for c in check.build_cases(quick=True, dtypes=["float32"]) if c.variant is None][:6]
    code, _ = _gate(_wrap(_drop("window")), plain)
    assert code == 0


def test_finite_lse_for_rows_that_see_no_key_fails():
    """window (0, 0) with Nq > Nk and a varlen sequence without keys leave rows that see nothing: their
    lse must be -inf (and out 0)."""
    def finite_lse(q, k, v, **kwargs):
        out, lse = CPU.fn(q, k, v, **kwargs)
        return out, np.where(np.isneginf(lse), 0.0, lse).astype(lse.dtype)

    cases = [c for c in _variant_cases(dtypes=["float32"]) if c.variant.name in ("window-diagonal", "varlen")]
    cases = [c for c in cases if c.variant.kind == "varlen" or c.Nq > c.Nk]
    assert cases
    code, results = _gate(finite_lse, cases)
    assert code == 1
    assert all("lse of rows that see no key is not -inf" in r.reasons for r in results)


def test_a_backend_refusing_an_advertised_variant_fails(capsys):
    def no_windows(q, k, v, **kwargs):
        if "window" in kwargs:
            raise NotImplementedError("no windows here")
        return CPU.fn(q, k, v, **kwargs)

    cases = _variant_cases(dtypes=["float32"])
    code, results = _gate(no_windows, cases)
    out = capsys.readouterr().out
    assert code == 1 and "refused a case it advertises: no windows here" in out
    refused = [r for r in results if r.status == "fail"]
    assert refused and all(r.case.variant.window is not None for r in refused)
    assert all(r.status == "pass" for r in results if r.case.variant.window is None)


def test_same_seed_replays_the_same_variant_inputs(seed):
    cases = _variant_cases(dtypes=["float16"], kinds=("kvcache", "varlen"))[:3]
    first = check.run_check([CPU], cases, seed)
    again = check.run_check([CPU], cases, seed)
    other = check.run_check([CPU], cases, seed + 1)
    assert [r.rel_err for r in first] == [r.rel_err for r in again] != [r.rel_err for r in other]


# ---------------------------------------------------------------------------------------------------
# The report and the JSON name the variant.
# ---------------------------------------------------------------------------------------------------
def test_report_and_json_show_each_case_variant(tmp_path, capsys, seed):
    path = tmp_path / "check.json"
    code = check.main(["--quick", "--backends", "cpu", "--seed", str(seed), "--no-progress", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    for spec in variants.SPECS:
        assert f"| cpu     | {spec.variant.name} " in out
    assert "| cpu     | padded head dim " in out and "| cpu     | plain " in out
    doc = json.loads(path.read_text())
    rows = doc["results"]
    assert all({"dtype", "B", "H", "Hk", "Nq", "Nk", "d", "causal", "hw4", "status", "rel_err"} <= set(r) for r in rows)
    assert {r["variant_name"] for r in rows} >= {s.variant.name for s in variants.SPECS} | {"plain"}
    paged = next(r for r in rows if r["variant_name"] == "kvcache-paged")
    assert paged["variant"]["page_size"] == 7 and paged["mode"] == {"causal": False, "kv_cache": True, "paged": True}
    assert paged["variant_name"] in paged["label"]
    assert next(r for r in rows if r["variant_name"] == "plain")["variant"] is None
    per_variant = doc["checked_per_variant"]["cpu"]
    assert sum(per_variant.values()) == doc["checked"]["cpu"] and per_variant["varlen-causal"] == len(check.DTYPES)
