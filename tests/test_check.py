"""`cutlassfa check`, the accuracy gate: it passes the cpu backend on the quick matrix, and it fails
(exit 1, the offender listed) for every kind of broken backend it is meant to catch."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cutlassfa
from cutlassfa import check
from cutlassfa.check import Backend, Case


def _cpu(q, k, v, *, causal, softmax_scale):
    return cutlassfa.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, backend="cpu", return_lse=True)


def _gate(fn, cases=None, seed=0, name="cpu"):
    """Runs `fn` as backend `name` (so its bounds apply) and returns (exit code, results)."""
    cases = cases if cases is not None else check.build_cases(quick=True)
    results = check.run_check([Backend(name, fn)], cases, seed)
    return check.report(results, seed=seed), results


# ---------------------------------------------------------------------------------------------------
# The table and the matrix.
# ---------------------------------------------------------------------------------------------------
def test_bounds_table_is_complete_and_within_the_gate():
    for backend in check.BACKEND_ORDER + ("*",):
        for dtype in check.DTYPES:
            bound = check.bound_for(backend, dtype)
            assert 0 < bound.rel_l2 <= check.GATE_REL_L2
            assert bound.lse > 0
    assert check.bound_for("someone_elses", "float16") == check.BOUNDS["*"]["float16"]


@pytest.mark.parametrize("quick", [True, False])
def test_matrix_covers_the_axes(quick):
    cases = check.build_cases(quick)
    assert {c.dtype for c in cases} == set(check.DTYPES)
    assert {c.causal for c in cases} == {False, True}
    assert any(c.Nq != c.Nk for c in cases) and any(c.H != c.Hk for c in cases)
    assert any(c.Nq == 1 for c in cases) and any(c.Nq % 64 for c in cases if c.Nq > 1)
    assert any(c.hw4 for c in cases) and all(c.dtype == "float32" and c.H == 1 for c in cases if c.hw4)
    if not quick:
        assert {c.d for c in cases} == {32, 64, 128}


def test_round_to_bfloat16_matches_ml_dtypes(bf16):
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 100
    np.testing.assert_array_equal(check.round_to(x, "bfloat16"), x.astype(bf16).astype(np.float32))
    np.testing.assert_array_equal(check.round_to(x, "float16"), x.astype(np.float16).astype(np.float32))


# ---------------------------------------------------------------------------------------------------
# The real cpu backend passes.
# ---------------------------------------------------------------------------------------------------
def test_cpu_backend_passes_quick_gate(tmp_path, capsys):
    path = tmp_path / "check.json"
    code = check.main(["--quick", "--backends", "cpu", "--seed", "123", "--no-progress", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "seed 123" in out and "PASSED" in out
    doc = json.loads(path.read_text())
    assert doc["passed"] is True and doc["seed"] == 123
    assert {r["status"] for r in doc["results"]} <= {"pass", "unsupported"}
    assert all(r["backend"] == "cpu" for r in doc["results"])
    assert sum(r["status"] == "pass" for r in doc["results"]) > 50


def test_unknown_backend_is_a_usage_error(capsys):
    assert check.main(["--quick", "--backends", "nope", "--no-progress"]) == 2
    assert check.main(["--quick", "--dtypes", "float8", "--no-progress"]) == 2


# ---------------------------------------------------------------------------------------------------
# Broken backends fail the gate.
# ---------------------------------------------------------------------------------------------------
def test_noisy_backend_through_public_forward_fails(monkeypatch, capsys):
    """A forward that adds 5 % noise, injected where check calls cutlassfa.forward."""
    real = cutlassfa.forward

    def noisy(q, k, v, **kwargs):
        out, lse = real(q, k, v, **kwargs)
        noise = np.random.default_rng(1).standard_normal(out.shape) * 0.05 * np.abs(out.astype(np.float32)).mean()
        return (out.astype(np.float32) + noise).astype(out.dtype), lse

    monkeypatch.setattr(cutlassfa, "forward", noisy)
    code = check.main(["--quick", "--backends", "cpu", "--seed", "5", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED" in out and "| cpu" in out and "rel-L2" in out


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


def test_wrong_lse_fails():
    def bad_lse(q, k, v, *, causal, softmax_scale):
        out, lse = _cpu(q, k, v, causal=causal, softmax_scale=softmax_scale)
        return out, lse + 0.1

    code, results = _gate(bad_lse, [Case("float32", 1, 2, 2, 77, 77, 32, True)])
    assert code == 1 and any("lse" in why for why in results[0].reasons)


def test_ignoring_the_causal_mask_fails():
    def no_mask(q, k, v, *, causal, softmax_scale):
        return _cpu(q, k, v, causal=False, softmax_scale=softmax_scale)

    code, _ = _gate(no_mask, [Case("float16", 2, 4, 2, 77, 257, 32, True)])
    assert code == 1


def test_crash_is_an_offender_but_unsupported_is_not(capsys):
    def crash(*args, **kwargs):
        raise RuntimeError("illegal memory access")

    def refuse(*args, **kwargs):
        raise NotImplementedError("bfloat16 is not supported by this backend")

    case = [Case("float32", 1, 2, 2, 77, 77, 32, False)]
    code, results = _gate(crash, case)
    assert code == 1 and results[0].status == "error"
    code, results = _gate(refuse, case)
    assert code == 0 and results[0].status == "unsupported"
    assert "unsupported" in capsys.readouterr().out


def test_injected_backends_are_gated_side_by_side():
    good = Backend("cpu", _cpu)
    bad = Backend("broken", lambda q, k, v, **kw: (np.zeros_like(q), None))
    results = check.run_check([good, bad], [Case("float32", 1, 2, 2, 77, 77, 32, False)], seed=0)
    assert [r.status for r in results] == ["pass", "fail"]
    assert check.report(results, seed=0) == 1


# ---------------------------------------------------------------------------------------------------
# On a GPU: every available backend through the real gate.
# ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_quick_gate_on_gpu(capsys):
    available, _ = check.available_backends()
    if not any(name != "cpu" for name in available):
        pytest.skip("no GPU backend available")
    code = check.main(["--quick", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0, out
