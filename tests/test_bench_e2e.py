"""`cutlassfa bench --e2e` on the CPU: tiny transformers models with the baseline attention, cutlassfa's
(the cpu backend) and none, in float32: every figure is there and consistent, and greedy tokens agree."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="optional package torch")
pytest.importorskip("transformers", reason="optional package transformers")

from cutlassfa.bench import cli, e2e  # noqa: E402


@pytest.mark.parametrize("model", ["llama", "gemma2"])
def test_e2e_row_on_the_cpu(model):
    row = e2e.measure(e2e.Workload(model, 2, 20, 3, "tiny"), rounds=1, device="cpu")
    baseline = e2e.baseline_of(model)
    assert row["baseline"] == baseline and set(row["implementations"]) == {baseline, "cutlassfa", "none"}
    for figures in row["implementations"].values():
        assert figures["prefill_ms"] > 0 and figures["generate_s"] > 0
        assert figures["tokens_per_s"] == pytest.approx(2 * 3 / figures["generate_s"])
    ours, base = row["implementations"]["cutlassfa"], row["implementations"][baseline]
    assert row["generate_speedup"] == pytest.approx(ours["tokens_per_s"] / base["tokens_per_s"])
    none = row["implementations"]["none"]
    assert row["generate_ceiling"] == pytest.approx(none["tokens_per_s"] / base["tokens_per_s"])
    assert row["prefill_ceiling"] == pytest.approx(base["prefill_ms"] / none["prefill_ms"])
    # One round: its paired ratio is the ratio of the medians.
    assert row["generate_speedup_rounds"] == pytest.approx({k: row["generate_speedup"] for k in ("median", "q1", "q3")})
    assert row["decode_step_speedup_rounds"]["median"] == pytest.approx(row["decode_step_speedup"])
    assert row["greedy_token_agreement"] == 1.0  # float32: the same tokens as transformers' own attention
    assert f"| {row['workload']} | {baseline} |" in e2e.e2e_table([row])


def test_e2e_static_cache_row():
    """generate with cache_implementation="static" (compiled by transformers on a GPU, eager here)."""
    row = e2e.measure(e2e.Workload("llama", 2, 12, 3, "tiny", cache="static"), rounds=1, device="cpu")
    assert row["cache"] == "static" and row["workload"].endswith(", static cache")
    assert row["greedy_token_agreement"] == 1.0


def test_e2e_prefill_only_row():
    row = e2e.measure(e2e.Workload("llama", 1, 16, 0, "tiny"), rounds=1, device="cpu")
    assert "generate_speedup" not in row and "generate_ceiling" not in row and row["prefill_speedup"] > 0
    assert "(prefill)" in e2e.e2e_table([row]) and f"{row['prefill_ceiling']:.3f}x (prefill)" in e2e.e2e_table([row])


def test_cli_writes_the_tables(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(e2e, "CPU_WORKLOADS", [e2e.Workload("llama", 1, 12, 2, "tiny")])
    path = tmp_path / "e2e.json"
    assert cli.main(["--e2e", "--e2e-rounds", "1", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["transformers"] and len(doc["rows"]) == 1 and "commit" in doc["provenance"]
    assert "llama: batch 1, prompt 12, 2 new" in capsys.readouterr().out
    assert cli.main(["--e2e", "--e2e-rounds", "0"]) == 2


def test_paired_ratios_spread():
    assert e2e._spread([1.0, 2.0, 3.0, 4.0, 5.0]) == {"median": 3.0, "q1": 2.0, "q3": 4.0}
    assert e2e._spread([1.25]) == {"median": 1.25, "q1": 1.25, "q3": 1.25}


def test_rounds_rotate_the_order(monkeypatch):
    """Each round starts with the next implementation, so no one always runs first (or right after another)."""
    import transformers

    calls = []

    real_set = transformers.PreTrainedModel.set_attn_implementation
    monkeypatch.setattr(transformers.PreTrainedModel, "set_attn_implementation",
                        lambda self, name: (calls.append(name), real_set(self, name))[1])
    row = e2e.measure(e2e.Workload("llama", 1, 12, 2, "tiny"), rounds=3, device="cpu")
    timed = calls[3:]  # after one warm-up call of each
    assert len(timed) == 9 and timed[0] != timed[3] != timed[6] != timed[0]
    assert all(sorted(timed[i:i + 3]) == sorted(calls[:3]) for i in (0, 3, 6))
    spread = row["generate_speedup_rounds"]
    assert spread["q1"] <= spread["median"] <= spread["q3"]
