"""Shared fixtures and the suite's rules.

Seeds: one session seed, fresh on every run (so repeated runs cover new inputs), printed in the header
and in the report of every failing test; `--seed S` or CUTLASSFA_TEST_SEED=S replays a run. Each test's
`rng` / `seed` derives from the session seed and the test's id, so a replayed test sees the same
inputs whatever else runs. Hypothesis is seeded from it too.

CUTLASSFA_REQUIRE_GPU=1 (the GPU machine runs with it): a `gpu` test that skips fails instead, with the
skip's reason, unless the reason names a missing optional package (pytest.importorskip's "could not
import ...", a reason starting with "optional package", or one starting with "machine:" for hardware the
machine lacks, such as a second GPU). A broken driver or extension then cannot
read as "no GPU, everything green".

`slow` tests run only with --run-slow (or CUTLASSFA_RUN_SLOW=1). `--shard I/N` runs one of N disjoint parts
of the suite; `--shard exclusive` runs the tests marked `exclusive` (they time the wall clock, read the
device's free memory or need most of it, which other processes would disturb), which no part I/N holds.
scripts/test_shards.sh runs the N parts at once, then the exclusive ones alone.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

# The tests multiply many small matrices; OpenBLAS threads spin-waiting on a loaded CI machine made
# the CPU-backend suite 10x slower (67 s vs 6.7 s measured with 2 cores under load). Must be set
# before numpy is first imported; an explicit setting in the environment wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# The planner's choices the tests assert are its heuristics': no measured table (cutlassfa/tuning.py) on
# any machine, unless a test sets one (tests/test_tuning.py). `cutlassfa check` runs with the tables.
os.environ["CUTLASSFA_TUNE"] = "off"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

try:
    import cutlassfa.reference  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # a plain checkout: test the sources in python/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from cutlassfa._diagnostics import REQUIRE_GPU_VARIABLE, gpu_required  # noqa: E402

SEED_VARIABLE = "CUTLASSFA_TEST_SEED"
# "machine:" names hardware the machine does not have (a second GPU for the NCCL ring tests): no
# setting of the package can make it appear, so it is not a broken GPU path.
OPTIONAL_SKIP_PREFIXES = ("could not import", "optional package", "machine:")
_SESSION_SEED: int | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--seed", type=int, default=None,
                     help=f"session seed of the random inputs (default: ${SEED_VARIABLE}, else fresh)")
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked slow")
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only part I (0-based) of N disjoint parts of the collected tests, tests "
                          "marked exclusive left out; 'exclusive' runs only those "
                          "(scripts/test_shards.sh runs the N parts in parallel, then the exclusive ones)")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_SEED
    config.addinivalue_line("markers", "slow: minutes on a CPU; runs with --run-slow or CUTLASSFA_RUN_SLOW=1")
    config.addinivalue_line("markers", "exclusive: times the wall clock, reads device-wide memory or needs most "
                                       "of it; a sharded run holds it out of the parallel parts (--shard exclusive)")
    seed = config.getoption("--seed")
    if seed is None and os.environ.get(SEED_VARIABLE):
        seed = int(os.environ[SEED_VARIABLE])
    _SESSION_SEED = seed if seed is not None else int(np.random.SeedSequence().entropy % (1 << 31))
    # Hypothesis draws from the same seed, so --seed replays its examples too (its own option wins).
    if hasattr(config.option, "hypothesis_seed") and config.option.hypothesis_seed is None:
        config.option.hypothesis_seed = _SESSION_SEED


def session_seed() -> int:
    assert _SESSION_SEED is not None
    return _SESSION_SEED


def _seed_line() -> str:
    required = f"; {REQUIRE_GPU_VARIABLE}=1: GPU skips fail" if gpu_required() else ""
    return f"cutlassfa: seed {session_seed()} (replay with --seed {session_seed()}){required}"


def pytest_report_header(config: pytest.Config) -> str:
    return _seed_line()


def pytest_terminal_summary(terminalreporter) -> None:
    """The seed again at the end, where -q output shows it too."""
    terminalreporter.write_line(_seed_line())


def shard_of_items(nodeids: list[str], count: int, weights: list[int] | None = None) -> list[int]:
    """The part (0 .. count - 1) of each test id. Whole modules, so that a module's fixtures (the ring
    tests' process group) are set up once: heaviest first onto the lightest part. A module heavier than
    a part's share is dealt out test by test instead. `weights` (default 1 each) stand for each test's
    run time. Every process of a sharded run collects the same ids and computes the same parts."""
    weights = weights or [1] * len(nodeids)
    modules: dict[str, list[int]] = {}
    for i, nodeid in enumerate(nodeids):
        modules.setdefault(nodeid.split("::", 1)[0], []).append(i)
    share = sum(weights) / count
    parts = [0] * len(nodeids)
    loads = [0] * count
    whole = []
    for name, indices in modules.items():
        if sum(weights[i] for i in indices) > share:
            for i in sorted(indices, key=lambda i: -weights[i]):
                part = min(range(count), key=lambda p: (loads[p], p))
                parts[i] = part
                loads[part] += weights[i]
        else:
            whole.append(name)
    module_weight = {name: sum(weights[i] for i in modules[name]) for name in whole}
    for name in sorted(whole, key=lambda m: (-module_weight[m], m)):
        part = min(range(count), key=lambda p: (loads[p], p))
        loads[part] += module_weight[name]
        for i in modules[name]:
            parts[i] = part
    return parts


# A slow test (minutes) weighs as much as this many ordinary ones when the parts are balanced.
SLOW_TEST_WEIGHT = 150


def _apply_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("--shard")
    if spec is None:
        return
    if spec == "exclusive":
        keep = ["exclusive" in item.keywords for item in items]
    else:
        try:
            index, count = (int(x) for x in spec.split("/"))
        except ValueError:
            raise pytest.UsageError(f"--shard takes I/N (e.g. 0/4) or 'exclusive', got {spec!r}") from None
        if not 0 <= index < count:
            raise pytest.UsageError(f"--shard {spec}: I must be in 0 .. N - 1")
        shared = [item for item in items if "exclusive" not in item.keywords]
        weights = [SLOW_TEST_WEIGHT if "slow" in item.keywords else 1 for item in shared]
        part_of = dict(zip((id(item) for item in shared),
                           shard_of_items([item.nodeid for item in shared], count, weights)))
        keep = [part_of.get(id(item)) == index for item in items]
    dropped = [item for item, kept in zip(items, keep) if not kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = [item for item, kept in zip(items, keep) if kept]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _apply_shard(config, items)
    if config.getoption("--run-slow") or os.environ.get("CUTLASSFA_RUN_SLOW", "") not in ("", "0"):
        return
    skip = pytest.mark.skip(reason="slow: runs with --run-slow or CUTLASSFA_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def derive_seed(nodeid: str) -> int:
    """The seed of one test: the session seed mixed with the test's id."""
    digest = hashlib.sha256(f"{session_seed()}:{nodeid}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """This test's seed (see the module docstring)."""
    return derive_seed(request.node.nodeid)


@pytest.fixture
def rng(seed: int) -> np.random.Generator:
    """A numpy Generator seeded for this test."""
    return np.random.default_rng(seed)


def is_optional_skip(reason: str) -> bool:
    """A skip for want of an optional package, allowed even under CUTLASSFA_REQUIRE_GPU=1."""
    text = reason.split("Skipped: ", 1)[-1].strip().lower()
    return text.startswith(OPTIONAL_SKIP_PREFIXES)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("seed", f"replay with --seed {session_seed()} "
                                         f"(or {SEED_VARIABLE}={session_seed()})"))
    if report.skipped and gpu_required() and item.get_closest_marker("gpu") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not is_optional_skip(reason):
            report.outcome = "failed"
            report.longrepr = f"{REQUIRE_GPU_VARIABLE}=1 but this GPU test was skipped: {reason}"


@pytest.fixture
def torch():
    """The torch module, with a CUDA device visible to it; an optional-package skip otherwise."""
    torch = pytest.importorskip("torch", reason="optional package torch")
    if not torch.cuda.is_available():
        pytest.skip("optional package torch: no CUDA device visible to PyTorch")
    return torch


@pytest.fixture
def need_backend():
    """need_backend(name) skips the test when that backend cannot run here (cutlassfa.backends() says
    why); under CUTLASSFA_REQUIRE_GPU=1 the skip of a GPU test is a failure."""
    import cutlassfa

    status = cutlassfa.backends()

    def need(backend: str) -> None:
        if not status[backend].available:
            pytest.skip(f"{backend}: {status[backend].reason}")

    return need


@pytest.fixture
def hopper(torch, need_backend):
    """torch, skipping unless `tensorcore` runs the wgmma families here (an sm_90 device and an sm_90a
    build: the planner's sm_90 kernels)."""
    import cutlassfa

    need_backend("tensorcore")
    info = cutlassfa.device_info()
    if not (tuple(info["compute_capability"]) == (9, 0) and "90a" in info["wgmma_architectures"]):
        pytest.skip("machine: the planner's sm_90 kernels need an sm_90 GPU and an sm_90a build")
    return torch


@pytest.fixture
def bf16():
    """numpy's bfloat16 (ml_dtypes); skips the test when ml_dtypes is not installed."""
    return pytest.importorskip("ml_dtypes").bfloat16


@pytest.fixture
def resolve_dtype():
    """Function 'float32' / 'float16' / 'bfloat16' -> numpy dtype (skips bfloat16 without ml_dtypes)."""

    def resolve(name: str) -> np.dtype:
        if name == "bfloat16":
            return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
        return np.dtype(name)

    return resolve


@pytest.fixture
def make_qkv(rng: np.random.Generator):
    """Factory: make_qkv(B, Hq, Hkv, Nq, Nk, d, dtype, scale=1.0) -> standard-normal q, k, v."""

    def make(b, hq, hkv, nq, nk, d, dtype=np.float32, scale=1.0):
        q = (rng.standard_normal((b, hq, nq, d)) * scale).astype(dtype)
        k = (rng.standard_normal((b, hkv, nk, d)) * scale).astype(dtype)
        v = rng.standard_normal((b, hkv, nk, d)).astype(dtype)
        return q, k, v

    return make


@pytest.fixture(scope="session")
def ffi_harness(tmp_path_factory):
    """cpp/jax/ffi.cpp's handler on XLA's CPU platform (tests/jax_ffi_harness/harness.cpp) built as a Python
    module and registered as the CPU target of the custom call (needs jax, g++, nanobind and the CUDA
    runtime headers; skips without them). About 10 s on 2 cores."""
    import shutil
    import subprocess
    import sysconfig

    jax = pytest.importorskip("jax", reason="optional package jax")
    nanobind = pytest.importorskip("nanobind", reason="optional package nanobind")
    from cutlassfa.integrations import jax as cutlassfa_jax

    root = Path(__file__).resolve().parents[1]
    cuda_include = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    if shutil.which("g++") is None or not (cuda_include / "cuda_runtime.h").exists():
        pytest.skip("machine: needs g++ and the CUDA runtime headers to build the FFI harness")
    build = tmp_path_factory.mktemp("jax_ffi_harness")
    nb_dir = Path(nanobind.__file__).parent
    target = build / f"jax_ffi_harness{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-fvisibility=hidden",
               f"-I{nb_dir / 'include'}", f"-I{nb_dir / 'ext' / 'robin_map' / 'include'}",
               f"-I{sysconfig.get_paths()['include']}", "-isystem", jax.ffi.include_dir(), f"-I{cuda_include}",
               f"-I{root / 'cpp' / 'include'}", f"-I{root / 'cpp'}",
               str(root / "tests" / "jax_ffi_harness" / "harness.cpp"), str(root / "cpp" / "src" / "problem.cpp"),
               str(nb_dir / "src" / "nb_combined.cpp"),
               "-o", str(target)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    sys.path.insert(0, str(build))
    try:
        import jax_ffi_harness
    finally:
        sys.path.remove(str(build))
    jax.ffi.register_ffi_target(cutlassfa_jax.FFI_TARGET, jax_ffi_harness.cpu_handler(), platform="cpu")
    assert type(jax_ffi_harness.jax_ffi_forward()).__name__ == "PyCapsule"
    return jax_ffi_harness
