"""Running context-parallel calls in several processes for the tests: one set of processes (gloo on the
CPU, or NCCL with one process per GPU) runs every case of a test module, and each case says, per rank
of its group, the call and its arguments.

A case: {"call": name in cutlassfa.distributed, "world": size of its group, "ranks": [kwargs of group
rank 0, 1, ...]}. Argument values that are numpy arrays become torch tensors on the process's device
(bfloat16 through ml_dtypes); a key "strided" in a rank's kwargs lists the names to pass through a
(B, N, H, d) buffer; "gather_head_groups" sets `_context_parallel.GATHER_HEAD_GROUPS` for the call. The
worker records ("ok", out, lse) as numpy, or (exception name, message).
World sizes below the number of processes run on subgroups (`groups`), so peers are translated from
group to global ranks.
"""

from __future__ import annotations

import os
import pickle
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

TIMEOUT_S = 300  # the whole run of the processes, all cases; ~15-30 s on 2 busy cores
GLOO_PROCESSES = 4  # CPU runs (CI)
NCCL_PROCESSES = 8  # GPU runs: at most this many GPUs, one process each


def torch_distributed() -> tuple[Any, Any]:
    """(torch, torch.distributed) for a test module, or the module skipped when PyTorch or its gloo
    backend is missing."""
    import pytest

    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
    return torch, dist


def groups_for(processes: int) -> dict[int, list[int]]:
    """The ranks of each world size's group for a run of `processes` processes (GPU runs may have fewer or
    more): subgroups that do not start at rank 0 where they can, so that peers are translated."""
    table = {1: {1: [0]}, 2: {1: [1], 2: [0, 1]}, 3: {1: [2], 2: [0, 2], 3: [0, 1, 2]},
             4: {1: [3], 2: [1, 3], 3: [0, 2, 3], 4: [0, 1, 2, 3]}}
    if processes in table:
        return table[processes]
    return {w: list(range(processes - w, processes)) for w in range(1, processes + 1)}


def to_torch(x: np.ndarray, strided: bool = False) -> Any:
    import torch

    t = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) if x.dtype.name == "bfloat16" else torch.from_numpy(x)
    if strided:  # (B, H, N, d) seen through a (B, N, H, d) buffer, as a model's activations would be
        t = t.transpose(1, 2).contiguous().transpose(1, 2)
    return t


def to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _worker(rank: int, workdir: str, processes: int, device: str) -> None:
    """One rank: every case whose group holds it; results (or the exception's name) to a file."""
    import torch
    import torch.distributed as dist

    from cutlassfa import _context_parallel, distributed

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: no dependence on the host's name
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{workdir}/store",
                            rank=rank, world_size=processes, timeout=timedelta(seconds=120))
    with open(f"{workdir}/cases.pkl", "rb") as f:
        groups, cases = pickle.load(f)
    handles = {w: (dist.new_group(ranks) if w < processes else None) for w, ranks in groups.items()}
    results = {}
    for key, case in cases.items():
        world = case["world"]
        if rank not in groups[world]:
            continue
        kwargs = dict(case["ranks"][groups[world].index(rank)])
        strided = kwargs.pop("strided", ())
        _context_parallel.GATHER_HEAD_GROUPS = kwargs.pop("gather_head_groups", 1)
        for name, value in kwargs.items():
            if isinstance(value, np.ndarray):
                kwargs[name] = to_torch(value, name in strided).to(device)
        try:
            out, lse = getattr(distributed, case["call"])(group=handles[world], return_lse=True,
                                                          backend="cpu" if device == "cpu" else "auto", **kwargs)
            results[key] = ("ok", to_numpy(out), to_numpy(lse))
        except Exception as error:  # reported to the test, which checks every rank raised alike
            results[key] = (type(error).__name__, str(error))
    with open(f"{workdir}/results_{rank}.pkl", "wb") as f:
        pickle.dump(results, f)
    dist.destroy_process_group()


def run(workdir: Path, processes: int, device: str, cases: dict) -> dict:
    """Runs every case in `processes` spawned processes; returns {rank: {case key: result}}."""
    import torch.multiprocessing as mp

    with open(workdir / "cases.pkl", "wb") as f:
        pickle.dump((groups_for(processes), cases), f)
    context = mp.start_processes(_worker, args=(str(workdir), processes, device), nprocs=processes, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers still running after {TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)
    results = {}
    for rank in range(processes):
        with open(workdir / f"results_{rank}.pkl", "rb") as f:
            results[rank] = pickle.load(f)
    return results


def session_seed() -> int:
    pinned = os.environ.get("CUTLASSFA_TEST_SEED")
    return int(pinned) if pinned else int(np.random.SeedSequence().entropy % (1 << 63))


def per_rank(results: dict, groups: dict[int, list[int]], world: int, key: Any) -> list:
    """The results of one case, in group-rank order."""
    return [results[rank][key] for rank in groups[world]]


def run_script(name: str, argv: list[str]) -> int:
    """scripts/<name>.py's main(argv) in this process (one rank, gloo; no second torch import), its process
    group destroyed afterwards."""
    import importlib.util

    import torch.distributed as dist

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        return module.main(argv)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def nccl_processes(limit: int) -> int:
    """How many NCCL processes a GPU run takes (one a GPU, at most `limit`); skips the caller's test when
    PyTorch has no CUDA device or NCCL, or the tensor-core backend cannot run."""
    import pytest
    import torch
    import torch.distributed as dist

    import cutlassfa

    if not torch.cuda.is_available() or not dist.is_nccl_available():
        pytest.skip("no CUDA device (or no NCCL) for PyTorch")
    status = cutlassfa.backends()["tensorcore"]
    if not status.available:
        pytest.skip(f"tensorcore: {status.reason}")
    return min(limit, torch.cuda.device_count())
