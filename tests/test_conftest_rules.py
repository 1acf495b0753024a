"""The suite's own rules (tests/conftest.py), run in a fresh pytest on a scratch directory: with
CUTLASSFA_REQUIRE_GPU=1 a skipped GPU test fails with its reason (a missing optional package excepted),
and --seed replays the inputs of a test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SAMPLE = '''
import pytest


@pytest.mark.gpu
def test_needs_a_gpu():
    pytest.skip("no usable CUDA device (driver too old)")


@pytest.mark.gpu
def test_needs_cupy():
    pytest.importorskip("a_module_that_is_not_there")


def test_prints_its_input(rng):
    print("FIRST-DRAW", rng.integers(1 << 30))
'''


def _pytest(tmp_path: Path, *args: str, require_gpu: str = "") -> subprocess.CompletedProcess:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = dict(os.environ, CUTLASSFA_REQUIRE_GPU=require_gpu)
    env.pop("CUTLASSFA_TEST_SEED", None)
    package = Path(__import__("cutlassfa").__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-rs",
                           "--rootdir", str(tmp_path), *args, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_gpu_skips_fail_when_a_gpu_is_required(tmp_path):
    lenient = _pytest(tmp_path)
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    assert "1 passed, 2 skipped" in lenient.stdout
    strict = _pytest(tmp_path, require_gpu="1")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "1 failed, 1 passed, 1 skipped" in strict.stdout
    assert "CUTLASSFA_REQUIRE_GPU=1 but this GPU test was skipped" in strict.stdout
    assert "driver too old" in strict.stdout


def test_seed_is_printed_and_replays(tmp_path):
    first = _pytest(tmp_path)
    seed = first.stdout.split("replay with --seed ")[1].split(")")[0]
    draw = first.stdout.split("FIRST-DRAW ")[1].split()[0]
    again = _pytest(tmp_path, "--seed", seed)
    assert f"cutlassfa: seed {seed}" in again.stdout and f"FIRST-DRAW {draw}" in again.stdout


def test_each_test_draws_from_its_own_seed():
    from conftest import derive_seed, session_seed

    assert derive_seed("tests/a.py::test_x") == derive_seed("tests/a.py::test_x")
    assert derive_seed("tests/a.py::test_x") != derive_seed("tests/a.py::test_y")
    assert isinstance(session_seed(), int)
