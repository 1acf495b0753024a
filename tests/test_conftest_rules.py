"""The suite's own rules (tests/conftest.py), run in a fresh pytest on a scratch directory: with
CUTLASSFA_REQUIRE_GPU=1 a skipped GPU test fails with its reason (a missing optional package excepted),
--seed replays the inputs of a test, and --shard I/N splits the suite into disjoint parts that together
run every test once (scripts/test_shards.sh)."""

from __future__ import annotations

import collections
import os
import re
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


def test_shards_cover_every_test_once_with_modules_whole():
    from conftest import shard_of_items

    # a: 10 tests, b: 3, c: 3, d: 1, big: 40 (more than a part's share of 57 / 3 = 19: dealt out)
    ids = [f"tests/{m}.py::test_{i}" for m, n in (("a", 10), ("big", 40), ("b", 3), ("c", 3), ("d", 1))
           for i in range(n)]
    parts = shard_of_items(ids, 3)
    assert len(parts) == len(ids) and set(parts) <= {0, 1, 2}
    by_module = collections.defaultdict(set)
    for nodeid, part in zip(ids, parts):
        by_module[nodeid.split("::")[0]].add(part)
    assert all(len(by_module[f"tests/{m}.py"]) == 1 for m in "abcd")  # whole modules stay in one part
    assert by_module["tests/big.py"] == {0, 1, 2}
    loads = collections.Counter(parts)
    assert max(loads.values()) - min(loads.values()) <= 10  # within the largest whole module
    assert shard_of_items(ids, 1) == [0] * len(ids)
    assert shard_of_items(ids, 3) == parts  # the same in every process of a run


def test_shard_option_runs_disjoint_parts_of_the_suite(tmp_path):
    (tmp_path / "test_more.py").write_text("def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    whole = _pytest(tmp_path, "--collect-only")
    every = set(re.findall(r"\S+\.py::\S+", whole.stdout))
    assert len(every) == 5, whole.stdout
    seen = []
    for i in range(3):
        part = _pytest(tmp_path, "--collect-only", "--shard", f"{i}/3")
        assert part.returncode in (0, 5), part.stdout + part.stderr  # 5: this part got no test
        seen += re.findall(r"\S+\.py::\S+", part.stdout)
    assert sorted(seen) == sorted(every)
    bad = _pytest(tmp_path, "--shard", "3/3")
    assert bad.returncode == 4 and "I must be in 0 .. N - 1" in bad.stdout + bad.stderr


def test_exclusive_tests_run_apart_from_the_parts(tmp_path):
    (tmp_path / "test_timed.py").write_text(
        "import pytest\n\n\n@pytest.mark.exclusive\ndef test_timed():\n    pass\n\n\n"
        "def test_plain():\n    pass\n")
    ids = lambda result: re.findall(r"\S+\.py::\S+", result.stdout)
    every = ids(_pytest(tmp_path, "--collect-only"))
    parts = [ids(_pytest(tmp_path, "--collect-only", "--shard", f"{i}/2")) for i in range(2)]
    alone = ids(_pytest(tmp_path, "--collect-only", "--shard", "exclusive"))
    assert [i for i in every if i.endswith("::test_timed")] == alone and len(alone) == 1
    assert sorted(parts[0] + parts[1] + alone) == sorted(every)


def test_a_slow_test_weighs_like_many_in_the_balance():
    from conftest import shard_of_items

    # one slow test (weight 50) in a module of its own, and 60 plain tests in six modules of 10
    ids = ["tests/slow.py::test_long"] + [f"tests/m{m}.py::test_{i}" for m in range(6) for i in range(10)]
    parts = shard_of_items(ids, 2, [50] + [1] * 60)
    slow_part = parts[0]
    assert parts[1:].count(slow_part) <= 10  # the slow test's part holds one plain module at most
