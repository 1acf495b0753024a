"""The installation is what the build promised: when nvcc was found at build time
(`cutlassfa._build_config.CUDA_COMPILER`), the CUDA extension must be there and load. CI builds with
nvcc, so a build that quietly went CPU-only, or an extension that fails to load (wrong architecture,
missing symbol), fails here instead of reading as "no GPU" with every GPU test skipped."""

from __future__ import annotations

import types

import pytest

from cutlassfa import _diagnostics
from cutlassfa._diagnostics import build_config, build_problem, gpu_required


def test_extension_is_usable_when_built_with_nvcc():
    config = build_config()
    if config is None:
        pytest.skip("running from the source tree: no build configuration (cutlassfa._build_config)")
    print(f"CUDA_COMPILER={config.CUDA_COMPILER!r} EXTENSION={getattr(config, 'EXTENSION', None)} "
          f"ARCHITECTURES={getattr(config, 'ARCHITECTURES', None)!r}")
    assert build_problem() == ""


NVCC = types.SimpleNamespace(CUDA_COMPILER="/usr/local/cuda/bin/nvcc", EXTENSION=True, ARCHITECTURES="90a")


@pytest.mark.parametrize("config,error,expected", [
    (types.SimpleNamespace(CUDA_COMPILER="", EXTENSION=False, ARCHITECTURES=""), "not built", ""),
    (NVCC, "", ""),
    (NVCC, "cutlassfa._C cannot be imported (No module named 'cutlassfa._C')", "extension is unusable"),
    (types.SimpleNamespace(CUDA_COMPILER="/opt/nvcc", EXTENSION=False, ARCHITECTURES=""), "", "CPU-only"),
])
def test_build_problem(config, error, expected):
    problem = build_problem(config, error)
    if expected:
        assert expected in problem and config.CUDA_COMPILER in problem and error in problem
    else:
        assert problem == ""


def test_extension_error_reads_device_info_when_it_says(monkeypatch):
    import cutlassfa

    monkeypatch.setattr(cutlassfa, "device_info",
                        lambda device=0: {"extension_loaded": False, "extension_error": "wrong architecture"})
    assert _diagnostics.extension_error() == "wrong architecture"
    monkeypatch.setattr(cutlassfa, "device_info", lambda device=0: {"extension_loaded": True})
    assert _diagnostics.extension_error() == ""


@pytest.mark.parametrize("value,required", [("", False), ("0", False), ("1", True), ("yes", True)])
def test_gpu_required(monkeypatch, value, required):
    monkeypatch.setenv("CUTLASSFA_REQUIRE_GPU", value)
    assert gpu_required() is required
