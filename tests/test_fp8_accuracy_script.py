"""scripts/fp8_accuracy.py, fp8 attention's accuracy report: its quantization and what it reports,
run through the cpu backend (which computes the dequantized math in float32, so its own error is tiny while
the fp8 algorithm's and the quantization's are not)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")
SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "fp8_accuracy.py"


def _module():
    spec = importlib.util.spec_from_file_location("fp8_accuracy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quantized_round_trips_within_e4m3_and_keeps_the_amax():
    acc = _module()
    x = torch.randn(2, 3, 50, 16, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    x8, descale = acc.quantized(x)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == ()
    back = x8.float() * descale
    assert float(back.abs().max()) == pytest.approx(float(x.float().abs().max()), rel=2.0**-4)
    assert acc.rel_l2(acc.host64(back), acc.host64(x)) < 2.0**-4


def test_report_on_the_cpu_backend(monkeypatch):
    acc = _module()
    monkeypatch.setattr(acc, "SHAPES", [(1, 2, 1, 33, 65), (1, 2, 2, 1, 17)])
    rows = acc.measure("cpu", [64], "cpu")
    assert [(r["inputs"], r["causal"]) for r in rows] == [("random", False), ("random", True), ("outliers", False),
                                                           ("outliers", True)]
    for r in rows:
        assert r["kernel_max"] < 5e-3  # float32 on the dequantized inputs, bf16 out
        assert r["kernel_median"] <= r["kernel_max"] and r["vs_bf16_median"] <= r["vs_bf16_max"]
        assert r["vs_bf16_max"] > r["kernel_max"]  # quantizing q, k and v costs more than the kernel
        assert r["lse_max_abs"] < 1e-2
    assert rows[0]["e4m3_p_max"] > 5e-3  # diffuse rows: P's rounding is the fp8 algorithm's error
    assert "| random | 64 | no |" in acc.table(rows)
