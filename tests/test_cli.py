"""The `cutlassfa` command line, in process through `cli.main`, plus one smoke test of the installed
entry point. `run` and `info` go through cutlassfa.forward / backends / device_info, so those tests
need the public API (they skip when it is missing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import cutlassfa
from cutlassfa import cli, hw4
from cutlassfa.hw4 import read_hw4_output, write_hw4_input
from cutlassfa.reference import attention_reference

needs_api = pytest.mark.skipif(
    not all(hasattr(cutlassfa, f) for f in ("forward", "backends", "device_info")),
    reason="cutlassfa.forward/backends/device_info (the public API) not available yet",
)


def gen_case(tmp_path, b=2, n=64, d=32, seed=1, name="case"):
    prefix = str(tmp_path / name)
    assert cli.main(["gen", prefix, "--B", str(b), "--N", str(n), "--d", str(d), "--seed", str(seed)]) == 0
    return prefix


def assert_clean_error(capsys, status, expected_status=2, match=None):
    err = capsys.readouterr().err
    assert status == expected_status
    assert "error" in err and "Traceback" not in err
    if match:
        assert match in err
    return err


# ---- gen ------------------------------------------------------------------------------------------


def test_gen_writes_input_and_reference(tmp_path, capsys):
    prefix = gen_case(tmp_path, b=3, n=40, d=64, seed=123)
    assert "seed=123" in capsys.readouterr().out
    raw = np.fromfile(prefix + ".in", dtype="<f4", offset=12).reshape(3, 3, 40, 64)
    assert np.fromfile(prefix + ".in", dtype="<i4", count=3).tolist() == [3, 40, 64]
    assert np.abs(raw).max() <= 3.0 and np.abs(raw).max() > 2.5  # uniform in [-3, 3]
    want, _ = attention_reference(raw[:, 0], raw[:, 1], raw[:, 2])
    got = read_hw4_output(prefix + ".out", (3, 40, 64))
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_gen_seed_and_range(tmp_path):
    a = gen_case(tmp_path, seed=7, name="a")
    b = gen_case(tmp_path, seed=7, name="b")
    c = gen_case(tmp_path, seed=8, name="c")
    read = lambda prefix, ext: Path(prefix + ext).read_bytes()  # noqa: E731
    assert read(a, ".in") == read(b, ".in") and read(a, ".out") == read(b, ".out")
    assert read(a, ".in") != read(c, ".in")
    assert cli.main(["gen", str(tmp_path / "r"), "--B", "1", "--N", "50", "--d", "32", "--range", "0.5"]) == 0
    q, k, v = hw4.read_hw4(tmp_path / "r.in")
    assert max(np.abs(x).max() for x in (q, k, v)) <= 0.5


def test_gen_fresh_seed_is_printed_and_replayable(tmp_path, capsys):
    assert cli.main(["gen", str(tmp_path / "x"), "--B", "1", "--N", "8", "--d", "32"]) == 0
    seed = capsys.readouterr().out.split("seed=")[1].rstrip(")\n")
    gen_case(tmp_path, b=1, n=8, d=32, seed=int(seed), name="y")
    assert (tmp_path / "x.in").read_bytes() == (tmp_path / "y.in").read_bytes()


@pytest.mark.parametrize(
    "args",
    [["--B", "1", "--N", "8", "--d", "48"], ["--B", "0", "--N", "8", "--d", "32"], ["--B", "1", "--N", "0", "--d", "32"],
     ["--B", "1", "--N", "8", "--d", "32", "--range", "-1"]],
)
def test_gen_rejects_bad_arguments(tmp_path, capsys, args):
    status = cli.main(["gen", str(tmp_path / "bad"), *args])
    assert_clean_error(capsys, status)
    assert os.listdir(tmp_path) == []


def test_gen_removes_input_if_reference_cannot_be_written(tmp_path, monkeypatch, capsys):
    def fail(path, o):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(hw4, "write_hw4_output", fail)
    status = cli.main(["gen", str(tmp_path / "g"), "--B", "1", "--N", "8", "--d", "32"])
    assert_clean_error(capsys, status, match="No space")
    assert os.listdir(tmp_path) == []


# ---- run -------------------------------------------------------------------------------------------


@needs_api
@pytest.mark.parametrize("n,d", [(128, 32), (200, 64)])
def test_run_cpu_meets_hw4_criterion(tmp_path, capsys, n, d):
    prefix = gen_case(tmp_path, b=2, n=n, d=d, seed=None or 5)
    capsys.readouterr()
    assert cli.main(["run", prefix + ".in", prefix + ".got", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "backend=cpu" in out and "compute" in out and "output" in out
    got = read_hw4_output(prefix + ".got", (2, n, d))
    want = read_hw4_output(prefix + ".out", (2, n, d))
    assert np.abs(got - want).max() <= 5e-3


@needs_api
def test_run_auto_reports_resolved_backend(tmp_path, capsys):
    prefix = gen_case(tmp_path, b=1, n=16, d=32)
    capsys.readouterr()
    assert cli.main(["run", prefix + ".in", prefix + ".got"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.split("backend=")[1] in cutlassfa.backends()  # a concrete name, not "auto"


@needs_api
def test_run_in_batch_chunks_gives_same_bytes(tmp_path, monkeypatch, rng):
    q, k, v = (rng.uniform(-3, 3, (7, 20, 32)).astype(np.float32) for _ in range(3))
    write_hw4_input(tmp_path / "c.in", q, k, v)
    assert cli.main(["run", str(tmp_path / "c.in"), str(tmp_path / "whole"), "--backend", "cpu"]) == 0
    monkeypatch.setattr(cli, "_RUN_CHUNK_ELEMS", 2 * 20 * 32)  # two batches per forward call
    calls = []
    real = cutlassfa.forward
    monkeypatch.setattr(cutlassfa, "forward", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    assert cli.main(["run", str(tmp_path / "c.in"), str(tmp_path / "parts"), "--backend", "cpu"]) == 0
    assert calls == [(2, 20, 32)] * 3 + [(1, 20, 32)]
    assert (tmp_path / "whole").read_bytes() == (tmp_path / "parts").read_bytes()


def test_run_missing_input(tmp_path, capsys):
    status = cli.main(["run", str(tmp_path / "nope.in"), str(tmp_path / "o")])
    assert_clean_error(capsys, status, match="nope.in")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "content",
    [b"", b"\x01\x00\x00\x00", np.array([1, 2, 32], "<i4").tobytes() + b"\0" * 100,
     np.array([1, 2, 48], "<i4").tobytes() + b"\0" * (3 * 2 * 48 * 4)],
    ids=["empty", "short-header", "truncated", "unsupported-d"],
)
def test_run_malformed_input(tmp_path, capsys, content):
    (tmp_path / "bad.in").write_bytes(content)
    status = cli.main(["run", str(tmp_path / "bad.in"), str(tmp_path / "o"), "--backend", "cpu"])
    assert_clean_error(capsys, status)
    assert os.listdir(tmp_path) == ["bad.in"]


def _no_compute(monkeypatch):
    """Makes any computation fail the test: errors must be found before it."""
    def forbidden(*args, **kwargs):
        raise AssertionError("computed before reporting the error")

    monkeypatch.setattr(cutlassfa, "forward", forbidden)


def test_run_missing_output_directory(tmp_path, capsys, monkeypatch):
    prefix = gen_case(tmp_path, b=1, n=8, d=32)
    _no_compute(monkeypatch)
    status = cli.main(["run", prefix + ".in", str(tmp_path / "no" / "o"), "--backend", "cpu"])
    err = assert_clean_error(capsys, status, match=str(tmp_path / "no"))
    assert ".tmp" not in err


@pytest.mark.parametrize("trailing_slash", [True, False])
def test_run_into_a_directory_fails_before_computing(tmp_path, capsys, monkeypatch, trailing_slash):
    prefix = gen_case(tmp_path, b=1, n=8, d=32)
    (tmp_path / "adir").mkdir()
    target = str(tmp_path / "adir") + (os.sep if trailing_slash else "")
    _no_compute(monkeypatch)
    err = assert_clean_error(capsys, cli.main(["run", prefix + ".in", target, "--backend", "cpu"]),
                             match="adir")
    assert "directory" in err.lower() and ".tmp" not in err
    assert os.listdir(tmp_path / "adir") == []


def test_run_expect_missing_reference_leaves_no_output(tmp_path, capsys, monkeypatch):
    prefix = gen_case(tmp_path, b=1, n=8, d=32)
    _no_compute(monkeypatch)
    status = cli.main(["run", prefix + ".in", str(tmp_path / "o"), "--backend", "cpu",
                       "--expect", str(tmp_path / "missing.out")])
    assert_clean_error(capsys, status, match="missing.out")
    assert not (tmp_path / "o").exists()


def test_run_expect_of_the_wrong_size_leaves_no_output(tmp_path, capsys, monkeypatch):
    prefix = gen_case(tmp_path, b=1, n=8, d=32)
    (tmp_path / "short.out").write_bytes(b"\0" * 12)
    _no_compute(monkeypatch)
    status = cli.main(["run", prefix + ".in", str(tmp_path / "o"), "--backend", "cpu",
                       "--expect", str(tmp_path / "short.out")])
    assert_clean_error(capsys, status, match="1024 bytes")
    assert not (tmp_path / "o").exists()


@needs_api
def test_run_expect_reports_the_hw4_verdict(tmp_path, capsys):
    prefix = gen_case(tmp_path, b=1, n=16, d=32)
    capsys.readouterr()
    assert cli.main(["run", prefix + ".in", str(tmp_path / "o"), "--backend", "cpu", "--expect", prefix + ".out"]) == 0
    assert "ok" in capsys.readouterr().out
    wrong = read_hw4_output(prefix + ".out", (1, 16, 32)) + np.float32(0.01)
    hw4.write_hw4_output(tmp_path / "wrong.out", wrong)
    assert cli.main(["run", prefix + ".in", str(tmp_path / "o"), "--backend", "cpu",
                     "--expect", str(tmp_path / "wrong.out")]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_gen_into_a_missing_directory_names_it(capsys):
    err = assert_clean_error(capsys, cli.main(["gen", "/nonexistent/dir/x", "--B", "1", "--N", "8", "--d", "32"]),
                             match="/nonexistent/dir")
    assert ".tmp" not in err and "x.in" in err


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"cutlassfa {cutlassfa.__version__}"


def test_run_unknown_backend(tmp_path, capsys):
    prefix = gen_case(tmp_path, b=1, n=8, d=32)
    assert cli.main(["run", prefix + ".in", str(tmp_path / "o"), "--backend", "gpu9000"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@needs_api
def test_run_compute_failure(tmp_path, capsys, monkeypatch):
    prefix = gen_case(tmp_path, b=1, n=8, d=32)

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(cutlassfa, "forward", broken)
    status = cli.main(["run", prefix + ".in", str(tmp_path / "o"), "--backend", "cpu"])
    assert_clean_error(capsys, status, expected_status=1, match="illegal memory access")
    assert not (tmp_path / "o").exists()


@needs_api
def test_run_unavailable_gpu_backend(tmp_path, capsys):
    prefix = gen_case(tmp_path, b=1, n=8, d=32)
    if not cutlassfa.backends()["tensorcore"].available:
        code = cli.main(["run", prefix + ".in", str(tmp_path / "o"), "--backend", "tensorcore"])
        assert_clean_error(capsys, code, expected_status=2, match="tensorcore")  # 1 is for compute failures
    else:  # tensorcore runs here: hide the GPU from a fresh process
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
        result = subprocess.run([sys.executable, "-m", "cutlassfa.cli", "run", prefix + ".in", str(tmp_path / "o"),
                                 "--backend", "tensorcore"], capture_output=True, text=True, env=env)
        assert result.returncode == 2, result.stderr  # 1 is for compute failures
        assert "error" in result.stderr and "tensorcore" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()


# ---- info, help, wiring of check / bench -----------------------------------------------------------


@needs_api
def test_info_lists_every_backend(capsys, monkeypatch):
    from cutlassfa import _diagnostics

    monkeypatch.setattr(_diagnostics, "build_problem", lambda: "")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for name, status in cutlassfa.backends().items():
        line = next(l for l in out.splitlines() if l.split()[:1] == [name])
        assert ("unavailable" in line) == (not status.available)
        if not status.available:
            assert status.reason in line
    info = cutlassfa.device_info()
    assert "device:" in out
    if "reason" in info:
        assert str(info["reason"]) in out
    if "name" in info:
        assert str(info["name"]) in out


@needs_api
def test_info_says_loudly_when_the_build_is_broken(capsys, monkeypatch):
    """nvcc found at build time, extension unusable: `info` says so first, on stdout and stderr, and
    exits 1 (a broken build must not read as "no GPU")."""
    from cutlassfa import _diagnostics

    config = types.SimpleNamespace(CUDA_COMPILER="/usr/local/cuda/bin/nvcc", EXTENSION=True)
    monkeypatch.setattr(_diagnostics, "build_config", lambda: config)
    monkeypatch.setattr(_diagnostics, "extension_error", lambda: "undefined symbol: cudaLaunchKernelExC")
    assert cli.main(["info"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("BUILD ERROR:") and "undefined symbol" in captured.out
    assert "/usr/local/cuda/bin/nvcc" in captured.err


def test_help_lists_subcommands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("run", "gen", "info", "check", "bench"):
        assert command in out
    assert cli.main(["gen", "--help"]) == 0
    assert "OUTPUT_PREFIX.in" in capsys.readouterr().out


def test_no_subcommand_is_a_usage_error(capsys):
    assert cli.main([]) == 2
    assert "usage" in capsys.readouterr().err


def test_external_subcommand_is_wired(monkeypatch, capsys):
    fake = types.ModuleType("cutlassfa.bench")
    fake.add_arguments = lambda p: p.add_argument("--reps", type=int, default=1)
    fake.run = lambda args: print(f"bench reps={args.reps}") or 3
    monkeypatch.setitem(sys.modules, "cutlassfa.bench", fake)
    assert cli.main(["bench", "--reps", "5"]) == 3
    assert "bench reps=5" in capsys.readouterr().out


def test_missing_external_module(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cutlassfa.check", None)  # makes `import cutlassfa.check` fail
    status = cli.main(["check", "--anything"])
    assert_clean_error(capsys, status, match="not available")


def test_other_subcommands_do_not_import_check_or_bench(tmp_path, monkeypatch):
    for name in ("cutlassfa.check", "cutlassfa.bench"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    gen_case(tmp_path, b=1, n=4, d=32)
    assert "cutlassfa.check" not in sys.modules and "cutlassfa.bench" not in sys.modules


# ---- the installed entry point ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["entry-point", "python-m"])
def test_installed_entry_point(tmp_path, how):
    env = dict(os.environ)
    if how == "entry-point":
        exe = shutil.which("cutlassfa")
        if exe is None:
            pytest.skip("the `cutlassfa` entry point is not on PATH (package not installed)")
        command = [exe]
    else:  # the same code path in a fresh process, wherever cutlassfa was imported from here
        command = [sys.executable, "-m", "cutlassfa.cli"]
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    prefix = str(tmp_path / "smoke")

    def call(*args):
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300, env=env)

    gen = call("gen", prefix, "--B", "2", "--N", "64", "--d", "32", "--seed", "3")
    assert gen.returncode == 0, gen.stderr
    run = call("run", prefix + ".in", prefix + ".got", "--backend", "cpu")
    assert run.returncode == 0, run.stderr
    got, want = (read_hw4_output(prefix + ext, (2, 64, 32)) for ext in (".got", ".out"))
    assert np.abs(got - want).max() <= 5e-3
    bad = call("run", prefix + ".missing", prefix + ".x")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert call("info").returncode == 0
