"""The measured dispatch table (cutlassfa/tuning.py, cutlassfa tune): its file format, where it is looked
up, tables that are corrupt or of another GPU (ignored with one warning, never an error), the hand-off to
the planner, the sweep's choice rule; and on an sm_90 GPU, that the planner takes an entry (plan and the
launched result) and that a short sweep writes a valid table."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import cutlassfa
from cutlassfa import tuning
from cutlassfa.bench import tune
from cutlassfa.bench.tune import Choice, Measured

GPU, SMS, CAP, VERSION = "NVIDIA H100 80GB HBM3", 132, 90, cutlassfa.__version__
CLASS = (2, 128, 1, 3, 4, 0, 14)


def _table(gpu=GPU, sms=SMS, capability=CAP, version=VERSION, entries=((CLASS, "sm90decode", 4),)):
    return tuning.Table(gpu, sms, capability, version,
                        tuple(tuning.Entry(cls, kernel, splits, {"speedup": 1.1}) for cls, kernel, splits in entries))


@pytest.fixture
def places(tmp_path, monkeypatch):
    """An empty user cache and package directory; returns (user dir, package dir)."""
    user, package = tmp_path / "cache" / "cutlassfa" / "tune", tmp_path / "package"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(tuning.ENVIRONMENT, raising=False)
    monkeypatch.setattr(tuning, "shipped_directory", lambda: package)
    return user, package


def _write(directory, table_or_text, name=None):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or tuning.table_name(GPU, SMS))
    text = table_or_text if isinstance(table_or_text, str) else json.dumps(table_or_text.to_json())
    path.write_text(text)
    return path


def _find():
    return tuning.find(GPU, SMS, CAP, VERSION)


# --- format ---------------------------------------------------------------------------------------------

def test_table_round_trips_through_json():
    table = _table(entries=((CLASS, "sm90decode", 4), ((1, 64, 0, 8, 1, 12, 12), "sm90", 1)))
    assert tuning.Table.from_json(json.loads(json.dumps(table.to_json()))) == table


@pytest.mark.parametrize("broken, message", [
    ({"format": 2}, "format"),
    ({"multiprocessors": "132"}, "wrong type"),
    ({"entries": [{"class": [1, 2, 3], "kernel": "sm90", "num_splits": 1}]}, "entry 0"),
    ({"entries": [{"class": list(CLASS), "kernel": "naive", "num_splits": 1}]}, "entry 0"),
    ({"entries": [{"class": list(CLASS), "kernel": "sm90", "num_splits": 0}]}, "entry 0"),
    ({"entries": [{"class": list(CLASS), "kernel": "sm90", "num_splits": 2000}]}, "entry 0"),
    ({"entries": [{"class": list(CLASS), "kernel": "sm90", "num_splits": 1}] * 2}, "two entries"),
])
def test_malformed_tables_are_refused_with_the_reason(broken, message):
    data = dict(_table().to_json(), **broken)
    with pytest.raises(ValueError, match=message):
        tuning.Table.from_json(data)


def test_table_names_are_file_safe():
    assert tuning.table_name("NVIDIA H100 80GB HBM3", 132) == "nvidia-h100-80gb-hbm3-132sm.json"
    assert tuning.table_name("  ", 8) == "gpu-8sm.json"


# --- lookup ---------------------------------------------------------------------------------------------

def test_no_table_means_the_heuristics(places):
    table, status = _find()
    assert table is None and status.path is None and "heuristics" in status.note


def test_the_user_table_comes_before_the_package_one(places):
    user, package = places
    _write(package, _table(entries=((CLASS, "sm90", 2),)))
    table, status = _find()
    assert status.origin == "package" and table.entries[0].kernel == "sm90"
    _write(user, _table())
    table, status = _find()
    assert status.origin == "user" and table.entries[0].kernel == "sm90decode" and status.entries == 1


def test_the_environment_names_a_table_or_turns_tables_off(places, tmp_path, monkeypatch):
    user, _ = places
    _write(user, _table())
    chosen = _write(tmp_path / "elsewhere", _table(entries=((CLASS, "sm80", 3),)), "mine.json")
    monkeypatch.setenv(tuning.ENVIRONMENT, str(chosen))
    table, status = _find()
    assert status.origin == "environment" and table.entries[0].kernel == "sm80"
    monkeypatch.setenv(tuning.ENVIRONMENT, "off")
    table, status = _find()
    assert table is None and "off" in status.note


@pytest.mark.parametrize("content, reason", [
    ("{not json", "ignored"),
    (_table(gpu="NVIDIA A100-SXM4-80GB", sms=108, capability=80), "measured on NVIDIA A100"),
    (_table(sms=114), "measured on"),
    (_table(version="0.0.1"), "run `cutlassfa tune` again"),
])
def test_corrupt_or_foreign_user_tables_are_ignored_with_one_warning(places, content, reason):
    user, package = places
    _write(user, content)
    _write(package, _table(entries=((CLASS, "sm90", 2),)))
    with pytest.warns(RuntimeWarning, match="ignored") as caught:
        table, status = _find()
    assert len(caught) == 1 and reason in str(caught[0].message)
    assert status.origin == "package" and table.entries[0].kernel == "sm90"  # the next place is used
    assert reason in status.note


def test_the_package_tables_hold_for_any_version_of_the_package(places):
    _, package = places
    _write(package, _table(version="0.0.1"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table, status = _find()
    assert status.origin == "package" and table is not None


def test_a_missing_environment_table_warns_and_falls_back(places, tmp_path, monkeypatch):
    monkeypatch.setenv(tuning.ENVIRONMENT, str(tmp_path / "nowhere.json"))
    with pytest.warns(RuntimeWarning, match="no such file"):
        table, status = _find()
    assert table is None and "does not exist" in status.note


def test_install_hands_the_entries_to_the_planner():
    calls = []

    class Extension:
        def set_tuning(self, *args):
            calls.append(args)

    tuning.install(Extension(), _table(), CAP, SMS)
    tuning.install(Extension(), None, CAP, SMS)
    assert calls == [(CAP, SMS, [(CLASS, "sm90decode", 4)]), (CAP, SMS, [])]


def test_info_reports_the_table(capsys):
    from cutlassfa.cli import main

    main(["info"])
    assert "tuning table:" in capsys.readouterr().out


def test_the_shipped_tables_parse_and_are_found_for_their_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no user table in the way
    monkeypatch.delenv(tuning.ENVIRONMENT, raising=False)
    shipped = sorted(tuning.shipped_directory().glob("*.json"))
    assert shipped, "the package ships no tuning table"
    for path in shipped:
        table = tuning.Table.from_json(json.loads(path.read_text()))
        assert path.name == tuning.table_name(table.gpu, table.multiprocessors) and table.entries
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            found, status = tuning.find(table.gpu, table.multiprocessors, table.capability, "9.9.9")
        assert (found, status.origin, status.entries) == (table, "package", len(table.entries))


# --- the sweep's rule -----------------------------------------------------------------------------------

def test_candidates_surround_the_heuristics_split_count():
    found = {(c.kernel, c.num_splits) for c in tune.candidates(Choice("sm90decode", 8), ("sm90decode", "sm90"))}
    assert found == {("sm90decode", 1), ("sm90decode", 4), ("sm90decode", 16),
                     ("sm90", 1), ("sm90", 4), ("sm90", 8), ("sm90", 16)}


def _measured(cls, heuristic_ms, **others):
    times = {"sm90decode/8": heuristic_ms, **{k.replace("_", "/"): v for k, v in others.items()}}
    return Measured(None, cls, Choice("sm90decode", 8), times)


class _Case:
    label = "case"


def test_choose_takes_the_best_candidate_over_a_class_and_leaves_weak_ones_out():
    a, b, c = (1,) * 7, (2,) * 7, (3,) * 7
    results = [_measured(a, 10.0, sm90decode_4=9.0, sm90_8=9.5), _measured(a, 20.0, sm90decode_4=18.0, sm90_8=19.0),
               _measured(b, 10.0, sm90decode_4=9.9),  # 1.01x: below MIN_GAIN
               _measured(c, 10.0, sm90decode_4=8.0), _measured(c, 10.0, sm90decode_4=10.5)]  # one case 0.95x
    for m in results:
        m.case = _Case()
    chosen = {cls: (choice.kernel, choice.num_splits, measured["speedup"]) for cls, choice, measured in
              tune.choose(results)}
    assert chosen == {a: ("sm90decode", 4, pytest.approx(1.1111, abs=1e-4))}


def test_a_sweep_keeps_the_earlier_entries_of_the_classes_it_did_not_measure():
    a, b, c = (1,) * 7, (2,) * 7, (3,) * 7
    earlier = _table(entries=((a, "sm90", 2), (b, "sm90decode", 4)))
    now = _table(entries=((c, "sm80", 1),))
    whole = tune.merged(now, earlier, measured={b, c})  # b measured again and no longer wins: dropped
    assert [(e.tune_class, e.kernel) for e in whole.entries] == [(a, "sm90"), (c, "sm80")]
    assert tune.merged(now, _table(sms=114, entries=((a, "sm90", 2),)), {c}) == now  # another GPU's: not kept
    assert tune.merged(now, None, {c}) == now


@pytest.mark.parametrize("verify", [False, True])
def test_tune_without_a_gpu_says_so(capsys, verify):
    from cutlassfa.cli import main

    if cutlassfa.device_info().get("available") and hasattr(cutlassfa._C, "set_tuning"):
        pytest.skip("machine: a GPU is here (the GPU tests run the sweep)")
    assert main(["tune", "--grid", "quick"] + (["--verify", "table.json"] if verify else [])) == 1
    assert "needs a GPU" in capsys.readouterr().err


# --- the planner (a CUDA build with the sm_90a kernels; no GPU needed: it plans for an H100's kind) ------

@pytest.fixture
def planner():
    """cutlassfa._C of a build with the sm_90a kernels; no table installed after the test."""
    if not hasattr(cutlassfa._C, "set_tuning") or "90a" not in cutlassfa.device_info()["wgmma_architectures"]:
        pytest.skip("build: the planner's table needs a CUDA build with the sm_90a kernels")
    yield cutlassfa._C
    cutlassfa._C.set_tuning(CAP, SMS, [])


def test_the_planner_takes_an_entry_that_covers_the_call_for_its_gpu_only(planner, rng):
    q = rng.standard_normal((4, 32, 1, 128)).astype(np.float16)
    k = rng.standard_normal((4, 8, 4096, 128)).astype(np.float16)
    call = dict(causal=True, cache_seqlens=np.full(4, 3000, np.int32), device=(CAP, SMS))
    untuned = cutlassfa.plan(q, k, k, **call)
    assert (untuned["kernel"], untuned["tuned"]) == ("sm90decode", False)
    cls = untuned["tune_class"]
    assert cls[:3] == (1, 128, 1 | 4) and cls[4] == 4  # fp16, d 128, causal + cache lengths, 32:8 heads
    for kernel, splits, packed in (("sm90decode", 3, False), ("sm90", 2, True), ("sm80", 1, True)):
        planner.set_tuning(CAP, SMS, [(cls, kernel, splits)])
        tuned = cutlassfa.plan(q, k, k, **call)
        got = (tuned["kernel"], tuned["num_splits"], tuned["gqa_packed"], tuned["tuned"])
        assert got == (kernel, splits, packed, True)
        assert not cutlassfa.plan(q, k, k, **dict(call, num_splits=2))["tuned"]  # the caller's count wins
        assert not cutlassfa.plan(q, k, k, **dict(call, device=(CAP, SMS - 18)))["tuned"]  # another GPU
        other = cutlassfa.plan(q, k, k, **dict(call, cache_seqlens=None))  # another class: no cache lengths
        assert not other["tuned"] and other["tune_class"] != cls
    planner.set_tuning(CAP, SMS, [(cls, "sm90ws", 1)])  # takes no cache: passed over
    assert cutlassfa.plan(q, k, k, **call) == untuned
    planner.set_tuning(CAP, SMS, [])
    assert cutlassfa.plan(q, k, k, **call) == untuned


def test_a_varlen_batch_takes_the_table_kernel_in_one_pass(planner, rng):
    lengths = np.array([0, 700, 1800, 4000], np.int32)
    q = rng.standard_normal((4000, 16, 128)).astype(np.float16)
    k = rng.standard_normal((4000, 4, 128)).astype(np.float16)
    call = dict(causal=True, cu_seqlens_q=lengths, cu_seqlens_k=lengths, max_seqlen_q=2200, max_seqlen_k=2200,
                device=(CAP, SMS))
    untuned = cutlassfa.plan(q, k, k, **call)
    assert (untuned["kernel"], untuned["num_splits"]) == ("sm90ws", 1)
    planner.set_tuning(CAP, SMS, [(untuned["tune_class"], "sm90", 1)])
    assert (cutlassfa.plan(q, k, k, **call)["kernel"], cutlassfa.plan(q, k, k, **call)["tuned"]) == ("sm90", True)
    planner.set_tuning(CAP, SMS, [(untuned["tune_class"], "sm90", 2)])  # a varlen batch is never split
    assert cutlassfa.plan(q, k, k, **call) == untuned


def test_the_sweep_keeps_the_candidates_the_planner_runs_as_asked(planner):
    from cutlassfa._inputs import Case

    decode = Case("bfloat16", 8, 32, 8, 1, 2048, 128, False)
    arrays = [np.zeros(s, np.float16) for s in ((8, 32, 1, 128), (8, 8, 2048, 128), (8, 8, 2048, 128))]
    cls, heuristic, choices = tune.planned_choices(decode, arrays, {"causal": False}, (CAP, SMS))
    labels = [c.label() for c in choices]
    assert labels[0] == heuristic.label() and heuristic.kernel == "sm90decode" and len(set(labels)) == len(labels)
    assert {"sm90ws/1", "sm90/1", "sm80/1"} <= set(labels)  # each family that covers a dense decode call
    assert cutlassfa.plan(*arrays, device=(CAP, SMS))["tuned"] is False  # no table left behind


@pytest.mark.parametrize("entry", [((1, 2, 3), "sm90", 1), (CLASS, "naive", 1), (CLASS, "sm90", 0), (CLASS, "sm90")])
def test_the_planner_refuses_malformed_entries(planner, entry):
    with pytest.raises(ValueError, match="tuning entry 0"):
        planner.set_tuning(CAP, SMS, [entry])


# --- on the GPU -----------------------------------------------------------------------------------------

@pytest.fixture
def tunable(hopper):
    """(torch, (capability, multiprocessors)) of an sm_90 GPU; no table installed after the test."""
    sms = cutlassfa.device_info()["multiprocessors"]
    yield hopper, (90, sms)
    cutlassfa._C.set_tuning(90, sms, [])


@pytest.mark.gpu
def test_gpu_the_planner_takes_an_entry_that_covers_the_call(tunable, rng):
    torch, (cap, sms) = tunable
    q = torch.from_numpy(rng.standard_normal((4, 32, 1, 128)).astype(np.float32)).to("cuda", torch.bfloat16)
    k = torch.from_numpy(rng.standard_normal((4, 8, 4096, 128)).astype(np.float32)).to("cuda", torch.bfloat16)
    v = torch.randn_like(k)
    lengths = torch.full((4,), 3000, dtype=torch.int32, device="cuda")
    untuned = cutlassfa.plan(q, k, v, causal=True, cache_seqlens=lengths)
    assert untuned["kernel"] == "sm90decode" and not untuned["tuned"]
    cls = untuned["tune_class"]
    expected = cutlassfa.forward(q, k, v, causal=True, cache_seqlens=lengths)
    for kernel, splits in (("sm90decode", 3), ("sm90", 2), ("sm80", 1)):
        cutlassfa._C.set_tuning(cap, sms, [(cls, kernel, splits)])
        tuned = cutlassfa.plan(q, k, v, causal=True, cache_seqlens=lengths)
        assert (tuned["kernel"], tuned["num_splits"], tuned["tuned"]) == (kernel, splits, True)
        got = cutlassfa.forward(q, k, v, causal=True, cache_seqlens=lengths)
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
        # An explicit num_splits is the caller's; another GPU's table is not used.
        assert not cutlassfa.plan(q, k, v, causal=True, cache_seqlens=lengths, num_splits=2)["tuned"]
        assert not cutlassfa.plan(q, k, v, causal=True, cache_seqlens=lengths, device=(90, sms + 1))["tuned"]
    # A kernel that does not cover the call is passed over (the warp-specialized one takes no cache).
    cutlassfa._C.set_tuning(cap, sms, [(cls, "sm90ws", 1)])
    assert cutlassfa.plan(q, k, v, causal=True, cache_seqlens=lengths) == untuned


@pytest.mark.gpu
def test_gpu_a_short_sweep_writes_a_table(tunable, tmp_path, monkeypatch):
    from cutlassfa.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out = tmp_path / "table.json"
    assert main(["tune", "--grid", "quick", "--cases", "0:3", "--rounds", "2", "--calls-per-graph", "2",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    table = tuning.Table.from_json(data)
    assert table.multiprocessors == tunable[1][1] and len(data["cases"]) >= 1
    for case in data["cases"]:
        assert case["heuristic"] in case["ms"] and all(ms > 0 for ms in case["ms"].values())
    verified = tmp_path / "verified.json"
    assert main(["tune", "--grid", "quick", "--cases", "0:3", "--rounds", "2", "--calls-per-graph", "2",
                 "--verify", str(out), "--out", str(verified)]) == 0
    report = json.loads(verified.read_text())
    assert report["changed"] + report["unchanged"] >= 1 and len(report["cases"]) == report["changed"]
    for row in report["cases"]:
        assert row["tuned"] != row["untuned"] and row["tuned_ms"] > 0 and row["untuned_ms"] > 0
