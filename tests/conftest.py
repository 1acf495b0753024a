"""Shared fixtures.

`rng` is a numpy Generator with a fresh seed on every test, so repeated runs cover new inputs; the
seed is printed in the report of a failing test and can be pinned with CUTLASSFA_TEST_SEED=<int>.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The tests multiply many small matrices; OpenBLAS threads spin-waiting on a loaded CI machine made
# the CPU-backend suite 10x slower (67 s vs 6.7 s measured with 2 cores under load). Must be set
# before numpy is first imported; an explicit setting in the environment wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

try:
    import cutlassfa.reference  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # a plain checkout: test the sources in python/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

_SEED_KEY = pytest.StashKey[int]()


def _fresh_seed() -> int:
    pinned = os.environ.get("CUTLASSFA_TEST_SEED")
    return int(pinned) if pinned else int(np.random.SeedSequence().entropy % (1 << 63))


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A numpy Generator seeded afresh for each test (seed shown if the test fails)."""
    seed = _fresh_seed()
    request.node.stash[_SEED_KEY] = seed
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    seed = item.stash.get(_SEED_KEY, None)
    if seed is not None and report.failed:
        report.sections.append(("rng seed", f"reproduce with CUTLASSFA_TEST_SEED={seed}"))


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
