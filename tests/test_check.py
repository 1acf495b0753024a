"""`cutlassfa check`, the accuracy gate: it passes the cpu backend on the quick matrix, and it fails
(exit 1, the offender or the problem listed) for every way of fooling it: a broken backend, a backend
that refuses every case, advertised cases left unchecked (no ml_dtypes, CuPy without bfloat16), a
backend that checked nothing, a GPU backend missing under CUTLASSFA_REQUIRE_GPU=1, and a return of the
fp32 tensor-core path to a single fp16 rounding of q and k."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest

import cutlassfa
from cutlassfa import check
from cutlassfa._inputs import Case, round_to
from cutlassfa.check import Advertised, Backend, Bound


def _cpu(q, k, v, *, causal, softmax_scale):
    return cutlassfa.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, backend="cpu", return_lse=True)


def _gate(fn, cases=None, seed=0, name="cpu", **report_kwargs):
    """Runs `fn` as backend `name` (so its bounds apply) and returns (exit code, results)."""
    cases = cases if cases is not None else check.build_cases(quick=True)
    results = check.run_check([Backend(name, fn)], cases, seed)
    return check.report(results, seed=seed, **report_kwargs), results


def _plain(cases):
    """The plain cases on compiled head dims (no variant, no padded head dim, no HW4)."""
    return [c for c in cases if c.variant is None and not c.hw4 and c.d in cutlassfa.HEAD_DIMS]


def _f32_cases():
    return _plain(check.build_cases(quick=True, dtypes=["float32"]))


# ---------------------------------------------------------------------------------------------------
# The table and the matrix.
# ---------------------------------------------------------------------------------------------------
def test_bounds_table_is_pinned():
    """Every bound, written out: loosening one is a visible diff here, with its reason in the commit."""
    half = {"float16": Bound(1e-3, 1e-4), "bfloat16": Bound(8e-3, 1e-4)}
    cuda_core = {"float32": Bound(1e-5, 5e-5), **half}
    assert check.BOUNDS == {
        "tensorcore": {"float32": Bound(1e-3, 5e-5), **half, "float8_e4m3fn": Bound(4e-2, 1e-2)},
        "tensorcore_sm80": {"float32": Bound(1e-3, 5e-5), **half},
        "large_tile": cuda_core,
        "small_tile": cuda_core,
        "naive": cuda_core,
        "cpu": {**cuda_core, "float8_e4m3fn": Bound(8e-3, 1e-4)},
        "*": {"float32": Bound(1e-4, 1e-4), "float16": Bound(3e-3, 1e-2), "bfloat16": Bound(1.5e-2, 5e-2),
              "float8_e4m3fn": Bound(4e-2, 5e-2)},
    }
    assert check.GATE_REL_L2 == 0.02 and check.HW4_MAX_ABS == 5e-3
    # fp8 attention's own gate: the exact fp8 algorithm (P in e4m3) exceeds 2 % on the gate's fp8 inputs.
    assert check.FP8 == "float8_e4m3fn" and check.FP8_GATE_REL_L2 == 0.04
    assert check.FA_RULE_FACTOR == 2.0 and check.FA_RULE_FLOOR == {"float16": 2.0**-11, "bfloat16": 2.0**-8}


def test_bounds_table_is_complete_and_within_the_gate():
    for backend in check.BACKEND_ORDER + ("*",):
        for dtype in check.DTYPES:
            bound = check.bound_for(backend, dtype)
            assert 0 < bound.rel_l2 <= check.GATE_REL_L2
            assert bound.lse > 0
    assert check.bound_for("someone_elses", "float16") == check.BOUNDS["*"]["float16"]
    assert check.bound_for("tensorcore_sm80", check.FP8) == check.BOUNDS["*"][check.FP8]
    assert check.rel_l2_limit("tensorcore", check.FP8) == check.FP8_GATE_REL_L2
    assert check.rel_l2_limit("cpu", check.FP8) == 8e-3


@pytest.mark.parametrize("quick", [True, False])
def test_matrix_covers_the_axes(quick):
    cases = check.build_cases(quick)
    assert {c.dtype for c in cases} == set(check.DTYPES)
    assert {c.causal for c in cases} == {False, True}
    assert any(c.Nq != c.Nk for c in cases) and any(c.H != c.Hk for c in cases)
    assert any(c.Nq == 1 for c in cases) and any(c.Nq % 64 for c in cases if c.Nq > 1)
    assert any(c.hw4 for c in cases) and all(c.dtype == "float32" and c.H == 1 for c in cases if c.hw4)
    if not quick:
        assert {32, 64, 128} <= {c.d for c in _plain(cases)} == set(cutlassfa.HEAD_DIMS)


@pytest.mark.parametrize("quick", [True, False])
def test_matrix_covers_every_advertised_configuration(quick):
    cases = check.build_cases(quick)
    assert {(c.dtype, c.d, c.causal) for c in _plain(cases)} == {
        (dt, d, causal) for dt in check.DTYPES for d in cutlassfa.HEAD_DIMS for causal in (False, True)}
    assert check.coverage_gaps("cpu", lambda case: Advertised(True), cases, check.DTYPES) == []


def test_advertised_configuration_outside_the_matrix_fails(monkeypatch, capsys):
    """A head dim advertised but missing from the matrix (here: added after the cases were built) is a
    failure, not a silent pass."""
    cases = _f32_cases()[:2]
    monkeypatch.setattr(cutlassfa, "HEAD_DIMS", (32, 64, 128, 256))  # 256 added after the cases were built
    gaps = check.coverage_gaps("cpu", lambda case: Advertised(case.d != 64), cases, ["float32"])
    assert {(c.d, c.causal) for c in cases} == {(32, False)}
    compiled = [gap for gap in gaps if "{'causal'" in gap and "d=" in gap]
    assert len(compiled) == 3 * 2 - 1  # d 32, 128, 256 advertised, x causal, but for the one covered
    assert any("d=256" in gap for gap in compiled) and not any("d=64 " in gap for gap in gaps)
    # and every padded head dim and variant, which these two cases do not cover either
    takes = sum(check.variants.takes(spec, "float32") for spec in check.variants.SPECS)
    assert len(gaps) == len(compiled) + len(check.variants.padded_head_dims()) + takes
    results = check.run_check([Backend("cpu", _cpu)], cases, seed=0)
    assert check.report(results, seed=0, gaps=gaps) == 1
    assert "which no case of the matrix covers" in capsys.readouterr().out


def test_round_to_bfloat16_matches_ml_dtypes(bf16, rng):
    x = rng.standard_normal(10_000).astype(np.float32) * 100
    np.testing.assert_array_equal(round_to(x, "bfloat16"), x.astype(bf16).astype(np.float32))
    np.testing.assert_array_equal(round_to(x, "float16"), x.astype(np.float16).astype(np.float32))


# ---------------------------------------------------------------------------------------------------
# The real cpu backend passes, and says how much it checked.
# ---------------------------------------------------------------------------------------------------
def test_cpu_backend_passes_quick_gate(tmp_path, capsys, seed):
    path = tmp_path / "check.json"
    code = check.main(["--quick", "--backends", "cpu", "--seed", str(seed), "--no-progress", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    checked = len(check.build_cases(quick=True))
    assert f"seed {seed}" in out and f"PASSED: {checked} cases checked (cpu {checked})" in out
    doc = json.loads(path.read_text())
    assert doc["passed"] is True and doc["seed"] == seed and doc["problems"] == []
    assert doc["checked"] == {"cpu": checked}
    assert {r["status"] for r in doc["results"]} == {"pass"} and all(r["backend"] == "cpu" for r in doc["results"])
    # Provenance: where the result came from.
    assert doc["commit"] and "dirty" in doc and doc["created"].startswith("20")
    assert doc["software"]["numpy"] == np.__version__ and "gpu" in doc


def test_same_seed_replays_the_same_inputs(seed):
    cases = [Case("float16", 1, 2, 1, 33, 70, 32, True)]
    first = check.run_check([Backend("cpu", _cpu)], cases, seed)
    again = check.run_check([Backend("cpu", _cpu)], cases, seed)
    other = check.run_check([Backend("cpu", _cpu)], cases, seed + 1)
    assert first[0].rel_err == again[0].rel_err != other[0].rel_err


def test_usage_errors_exit_2(capsys, tmp_path):
    assert check.main(["--quick", "--backends", "nope", "--no-progress"]) == 2
    assert check.main(["--quick", "--dtypes", "float8", "--no-progress"]) == 2
    if not cutlassfa.backends()["tensorcore"].available:
        assert check.main(["--quick", "--backends", "tensorcore", "--no-progress"]) == 2
        assert "not available" in capsys.readouterr().err


def test_json_into_a_missing_folder_fails_at_once(tmp_path, capsys):
    path = tmp_path / "missing" / "check.json"
    start = time.perf_counter()
    assert check.main(["--backends", "cpu", "--no-progress", "--json", str(path)]) == 2
    assert time.perf_counter() - start < 5  # the full matrix was not run first
    captured = capsys.readouterr()
    assert str(tmp_path / "missing") in captured.err and "seed" not in captured.out


# ---------------------------------------------------------------------------------------------------
# Broken backends fail the gate.
# ---------------------------------------------------------------------------------------------------
def test_noisy_backend_through_public_forward_fails(monkeypatch, capsys, seed):
    """A forward that adds 5 % noise, injected where check calls cutlassfa.forward."""
    real = cutlassfa.forward

    def noisy(q, k, v, **kwargs):
        out, lse = real(q, k, v, **kwargs)
        noise = np.random.default_rng(1).standard_normal(out.shape) * 0.05 * np.abs(out.astype(np.float32)).mean()
        return (out.astype(np.float32) + noise).astype(out.dtype), lse

    monkeypatch.setattr(cutlassfa, "forward", noisy)
    code = check.main(["--quick", "--backends", "cpu", "--seed", str(seed), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED" in out and "| cpu" in out and "rel-L2" in out


def test_backend_refusing_every_case_fails(monkeypatch, capsys):
    """NotImplementedError on every call used to read as 'unsupported' and pass: now each refusal of an
    advertised case is a failure."""
    def refuse(*args, **kwargs):
        raise NotImplementedError("this backend supports nothing")

    monkeypatch.setattr(cutlassfa, "forward", refuse)
    code = check.main(["--quick", "--backends", "cpu", "--seed", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1 and "PASSED" not in out
    assert "refused a case it advertises" in out
    assert f"checked per backend: cpu {len(check.build_cases(quick=True))}" in out


def test_backend_that_advertises_nothing_checks_zero_cases_and_fails(capsys):
    nothing = Backend("cpu", _cpu, advertises=lambda case: Advertised(False, "not this one"))
    results = check.run_check([nothing], check.build_cases(quick=True), seed=0)
    assert {r.status for r in results} == {"not advertised"}
    assert check.report(results, seed=0, backends=["cpu"]) == 1
    out = capsys.readouterr().out
    assert "cpu: 0 cases checked" in out and "not advertised by cpu" in out


def test_only_advertised_cases_run_and_each_must_pass(monkeypatch, capsys):
    """With `cutlassfa.supports` saying cpu takes no causal case, causal cases are not run (and listed as
    such); a refusal of a non-causal case, which is advertised, is a failure."""
    def supports(backend, dtype, head_dim, **mode):
        return Advertised(not mode.get("causal"), "no causal here" if mode.get("causal") else "")

    monkeypatch.setattr(cutlassfa, "supports", supports, raising=False)
    calls = []

    def refuse_non_causal(q, k, v, *, causal, softmax_scale, **kw):
        calls.append(causal)
        if not causal:
            raise NotImplementedError("non-causal refused")

    monkeypatch.setattr(cutlassfa, "forward", refuse_non_causal)
    assert check.main(["--quick", "--backends", "cpu", "--seed", "2", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert calls and not any(calls)  # causal cases never ran
    assert "not advertised by cpu (not run)" in out and "no causal here" in out


def test_fallback_support_when_cutlassfa_has_no_supports(monkeypatch):
    monkeypatch.delattr(cutlassfa, "supports", raising=False)
    assert check.supports("cpu", "bfloat16", 128, causal=True)
    assert not check.supports("cpu", "float32", 48, causal=False)
    refused = check.supports("cpu", "float32", 64, causal=False, window=(8, 0))
    assert not refused and "window" in refused.reason
    status = cutlassfa.backends()["tensorcore"]
    assert bool(check.supports("tensorcore", "float16", 64, causal=False)) == status.available


def test_unchecked_bfloat16_without_ml_dtypes_is_stated_and_fails(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` now fails
    code = check.main(["--quick", "--backends", "cpu", "--seed", "3", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1 and "PASSED" not in out
    # bfloat16 cases, and the float16 ones with fp8 arrays (an fp8 cache, fp8 attention: float8_e4m3fn arrays
    # come from ml_dtypes too)
    cases = check.build_cases(quick=True)
    bf16 = sum(c.dtype == "bfloat16" for c in cases)
    fp8 = sum(c.dtype == "float16" and c.variant is not None and (c.variant.fp8_cache or c.variant.fp8)
              for c in cases)
    assert f"{bf16} advertised cases not checked: bfloat16" in out
    assert f"{fp8} advertised cases not checked: float8" in out
    assert f"checked per backend: cpu {len(cases) - bf16 - fp8}" in out


def test_cupy_inputs_without_bfloat16_are_unchecked_not_passed(capsys):
    """What `--inputs cupy` does to bfloat16: the harness cannot feed the case, and says so."""
    cupy_fed = Backend("cpu", _cpu, framework="cupy")
    cases = [Case("bfloat16", 1, 2, 2, 33, 33, 32, False)]
    results = check.run_check([cupy_fed], cases, seed=0)
    assert [r.status for r in results] == ["unchecked"]
    assert check.report(results, seed=0) == 1
    out = capsys.readouterr().out
    assert "not checked: CuPy has no bfloat16 arrays" in out and "cpu: 0 cases checked" in out


def test_required_gpu_backend_that_cannot_run_fails(monkeypatch, capsys):
    """CUTLASSFA_REQUIRE_GPU=1: a GPU backend that is unavailable (here: made so) fails the gate with
    its reason instead of being left out."""
    real = cutlassfa.backends()
    table = dict(real, tensorcore=cutlassfa.BackendStatus("tensorcore", False, "CUDA driver too old (test)"))
    monkeypatch.setattr(cutlassfa, "backends", lambda device=0: table)
    monkeypatch.setenv("CUTLASSFA_REQUIRE_GPU", "1")
    code = check.main(["--quick", "--dtypes", "float32", "--backends", "cpu,tensorcore", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1
    assert "tensorcore: cannot run, and CUTLASSFA_REQUIRE_GPU=1 requires it: CUDA driver too old (test)" in out
    monkeypatch.delenv("CUTLASSFA_REQUIRE_GPU")
    assert check.main(["--quick", "--dtypes", "float32", "--backends", "cpu,tensorcore", "--no-progress"]) == 2


def test_nan_output_fails():
    def nan(q, k, v, *, causal, softmax_scale):
        out, lse = _cpu(q, k, v, causal=causal, softmax_scale=softmax_scale)
        out = out.copy()
        out.reshape(-1)[0] = np.nan
        return out, lse

    code, results = _gate(nan, [Case("float32", 1, 2, 2, 77, 77, 64, False)])
    assert code == 1 and results[0].status == "fail"


def test_small_half_precision_error_is_caught_by_the_flashattention_rule():
    """0.25 % relative noise in fp16 is inside the 0.3 % fp16 bound of a backend without its own row
    in the table ("*") but > 2x naive same-precision."""
    def slightly_off(q, k, v, *, causal, softmax_scale):
        out, lse = _cpu(q, k, v, causal=causal, softmax_scale=softmax_scale)
        o = out.astype(np.float64)
        noise = np.random.default_rng(2).standard_normal(o.shape)
        o += noise * 0.0025 * np.linalg.norm(o) / np.sqrt(o.size)
        return o.astype(out.dtype), lse

    code, results = _gate(slightly_off, [Case("float16", 2, 4, 4, 257, 257, 64, False)], name="other")
    assert code == 1
    (r,) = results
    assert r.rel_err < check.bound_for("other", "float16").rel_l2
    assert any("naive same-precision" in why for why in r.reasons)


def test_hw4_max_abs_criterion():
    """One element off by 0.01: rel-L2 stays tiny, the HW4 max-abs rule still catches it."""
    def one_bad(q, k, v, *, causal, softmax_scale):
        out, lse = _cpu(q, k, v, causal=causal, softmax_scale=softmax_scale)
        out = out.copy()
        out.reshape(-1)[7] += 0.01
        return out, lse

    case = Case("float32", 4, 1, 1, 128, 128, 32, False, hw4=True)
    code, results = _gate(one_bad, [case])
    assert code == 1
    assert any("HW4" in why for why in results[0].reasons)


def test_wrong_or_missing_lse_fails():
    def bad_lse(q, k, v, *, causal, softmax_scale):
        out, lse = _cpu(q, k, v, causal=causal, softmax_scale=softmax_scale)
        return out, lse + 0.1

    code, results = _gate(bad_lse, [Case("float32", 1, 2, 2, 77, 77, 32, True)])
    assert code == 1 and any("lse" in why for why in results[0].reasons)
    code, results = _gate(lambda *a, **kw: _cpu(*a, **kw)[0], [Case("float32", 1, 2, 2, 77, 77, 32, True)])
    assert code == 1 and results[0].reasons == ["no lse returned"]


def test_ignoring_the_causal_mask_fails():
    def no_mask(q, k, v, *, causal, softmax_scale):
        return _cpu(q, k, v, causal=False, softmax_scale=softmax_scale)

    code, _ = _gate(no_mask, [Case("float16", 2, 4, 2, 77, 257, 32, True)])
    assert code == 1


def test_crash_is_an_error():
    def crash(*args, **kwargs):
        raise RuntimeError("illegal memory access")

    code, results = _gate(crash, [Case("float32", 1, 2, 2, 77, 77, 32, False)])
    assert code == 1 and results[0].status == "error" and "illegal memory access" in results[0].reasons[0]


def test_injected_backends_are_gated_side_by_side():
    good = Backend("cpu", _cpu)
    bad = Backend("broken", lambda q, k, v, **kw: (np.zeros_like(q), None))
    results = check.run_check([good, bad], [Case("float32", 1, 2, 2, 77, 77, 32, False)], seed=0)
    assert [r.status for r in results] == ["pass", "fail"]
    assert check.report(results, seed=0) == 1


# ---------------------------------------------------------------------------------------------------
# The fp32 tensor-core path regressed to one fp16 rounding of q and k (emulated on the CPU).
# ---------------------------------------------------------------------------------------------------
def _fp16(x):
    return x.astype(np.float16).astype(np.float32)


def single_fp16_scores(q, k, v, *, causal, softmax_scale):
    """The regression: q and k rounded once to fp16, then fp32 math (the cpu backend)."""
    return _cpu(_fp16(q), _fp16(k), v, causal=causal, softmax_scale=softmax_scale)


def split_fp16_scores(q, k, v, *, causal, softmax_scale):
    """The path as it is: S exact to ~2^-22 (split hi + lo), V rounded to fp16."""
    return _cpu(q, k, _fp16(v), causal=causal, softmax_scale=softmax_scale)


def test_lse_bound_catches_single_fp16_scores(seed):
    """Its rel-L2 hides under the 1e-3 tensor-core fp32 bound; its lse error (~1e-3) does not hide under
    the 5e-5 lse bound. The split path passes the same gate."""
    cases = _f32_cases()
    code, results = _gate(single_fp16_scores, cases, seed=seed, name="tensorcore")
    assert code == 1
    bound = check.bound_for("tensorcore", "float32")
    assert all(r.rel_err <= bound.rel_l2 for r in results), "rel-L2 alone would have caught it: test is moot"
    caught = [r for r in results if any(why.startswith("lse") for why in r.reasons)]
    # Measured over 30 seeds: 23-24 of 24 cases caught, worst lse error 0.7-1.3e-3 (15-27x the bound).
    assert len(caught) >= 0.8 * len(results), [(r.case.label, r.lse_err) for r in results if r not in caught]
    assert max(r.lse_err for r in results) >= 10 * bound.lse
    code, results = _gate(split_fp16_scores, cases, seed=seed, name="tensorcore")
    assert code == 0, [(r.case.label, r.reasons) for r in results if r.reasons]


# ---------------------------------------------------------------------------------------------------
# On a GPU: every available backend through the real gate.
# ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_quick_gate_on_gpu(capsys, tmp_path, seed):
    gpu = [n for n, s in cutlassfa.backends().items() if n != "cpu" and s.available]
    if not gpu:
        pytest.skip("no GPU backend available: " + cutlassfa.backends()["small_tile"].reason)
    path = tmp_path / "check.json"
    code = check.main(["--quick", "--no-progress", "--seed", str(seed), "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads(path.read_text())
    assert all(doc["checked"][name] > 0 for name in gpu), doc["checked"]
    assert doc["gpu"]["name"] and doc["gpu"]["driver_version"]


def test_device_inputs_that_cannot_be_made_are_a_usage_error(monkeypatch, capsys):
    """--inputs cupy (or torch) where that framework cannot make CUDA arrays stops at once, before any
    case, instead of crashing or reporting every case of the GPU backends as unchecked."""
    table = dict(cutlassfa.backends(), small_tile=cutlassfa.BackendStatus("small_tile", True))
    monkeypatch.setattr(cutlassfa, "backends", lambda device=0: table)
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert check.main(["--quick", "--backends", "small_tile", "--inputs", "cupy", "--no-progress"]) == 2
    assert "--inputs cupy: cupy is not installed" in capsys.readouterr().err
