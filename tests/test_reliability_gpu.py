"""Failure behaviour on a GPU: no growth of host or device memory over 10,000 calls, correct results
from concurrent threads on different streams, launch errors raised with the CUDA error string."""

import threading

import numpy as np
import pytest

import cutlassfa
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, rel_l2

pytestmark = pytest.mark.gpu


def _need_torch():
    if not cutlassfa.backends()["small_tile"].available:
        pytest.skip(cutlassfa.backends()["small_tile"].reason)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("optional package: this torch has no CUDA")
    return torch


def _run_threads(worker, count: int) -> None:
    """Runs worker(0) ... worker(count - 1) at once, one thread each, and waits for all."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.exclusive  # the device's free memory: other processes would move it
@pytest.mark.parametrize("path", ["device", "host"])
def test_soak_no_memory_growth(path):
    torch = _need_torch()
    from cutlassfa import _C

    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16)
    args = (q, q, q) if path == "device" else tuple(q.cpu().numpy() for _ in range(3))
    for _ in range(200):  # reach steady state: allocator pools, module loads
        cutlassfa.forward(*args, causal=True)
    torch.cuda.synchronize()
    rss0, (free0, _) = _rss_bytes(), _C.memory_info(0)
    for _ in range(10_000):
        cutlassfa.forward(*args, causal=True, return_lse=True)
    torch.cuda.synchronize()
    rss1, (free1, _) = _rss_bytes(), _C.memory_info(0)
    print(f"{path}: host RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB, "
          f"device free {free0 / 2**20:.1f} -> {free1 / 2**20:.1f} MiB")
    assert rss1 - rss0 < 16 * 2**20
    assert free0 - free1 < 16 * 2**20


def test_threads_on_their_own_streams(rng):
    torch = _need_torch()
    cases = [tuple(torch.from_numpy(rng.standard_normal((2, 4, 200, 64)).astype(np.float16)).cuda()
                   for _ in range(3)) for _ in range(6)]
    expected = [attention_reference(*(t.float().cpu().numpy() for t in c), causal=True)[0] for c in cases]
    bound = bound_for(cutlassfa.select_backend(*cases[0]), "float16").rel_l2
    errors: list = []

    def worker(index: int) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(20):
                out = cutlassfa.forward(*cases[index], causal=True)
                stream.synchronize()
                err = rel_l2(out.float().cpu().numpy(), expected[index])
                if not err <= bound:
                    errors.append((index, err))

    _run_threads(worker, len(cases))
    assert not errors


def test_numpy_calls_from_threads(rng):
    _need_torch()
    cases = [tuple(rng.standard_normal((1, 2, 150, 32)).astype(np.float32) for _ in range(3)) for _ in range(4)]
    expected = [attention_reference(*c)[0] for c in cases]
    bound = bound_for(cutlassfa.select_backend(*cases[0]), "float32").rel_l2
    errors: list = []

    def worker(index: int) -> None:
        for _ in range(20):
            err = rel_l2(cutlassfa.forward(*cases[index]), expected[index])
            if not err <= bound:
                errors.append((index, err))

    _run_threads(worker, len(cases))
    assert not errors
