"""Where a bench or gate result came from: the source commit (and whether the tree had uncommitted
changes), the GPU (name, clocks, driver, CUDA) and the software versions. Every bench and check JSON
carries `provenance()`; a field that cannot be read is null, never guessed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

_NVIDIA_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
                      "temperature.gpu", "power.limit")


def package_version() -> str:
    try:
        from . import __version__

        return str(__version__)
    except ImportError:
        return "unknown"


def _git(where: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _our_checkout(where: Path) -> Path | None:
    """The top of the git checkout holding `where`, if that checkout is this project's source tree
    (an installed package inside some other repository must not report that repository's commit)."""
    top = _git(where, "rev-parse", "--show-toplevel")
    if top and (Path(top) / "python" / "cutlassfa").is_dir():
        return Path(top)
    return None


def git_state() -> dict[str, Any]:
    """{commit, dirty, commit_source}. CUTLASSFA_COMMIT / CUTLASSFA_DIRTY (0 or 1) first, when whoever
    ran a build from a copy of a checkout set them (such a copy may carry a .git of another commit);
    else git in the source tree the package was imported from, else in the current directory; else the
    build configuration (`_build_config.GIT_COMMIT` / `GIT_DIRTY`, when the build recorded them).
    Unknown: ("<version>+unknown", None)."""
    if os.environ.get("CUTLASSFA_COMMIT"):
        flag = os.environ.get("CUTLASSFA_DIRTY", "")
        dirty = {"0": False, "1": True}.get(flag)
        return {"commit": os.environ["CUTLASSFA_COMMIT"], "dirty": dirty, "commit_source": "CUTLASSFA_COMMIT"}
    for where in (Path(__file__).resolve().parent, Path.cwd()):
        top = _our_checkout(where)
        if top is not None:
            commit = _git(top, "rev-parse", "HEAD")
            status = _git(top, "status", "--porcelain", "--untracked-files=no")
            if commit:
                return {"commit": commit, "dirty": None if status is None else bool(status),
                        "commit_source": f"git ({top})"}
    try:
        from . import _build_config  # type: ignore[attr-defined]

        if getattr(_build_config, "GIT_COMMIT", ""):
            dirty = getattr(_build_config, "GIT_DIRTY", None)
            return {"commit": _build_config.GIT_COMMIT, "dirty": dirty, "commit_source": "build configuration"}
    except ImportError:
        pass
    return {"commit": f"{package_version()}+unknown", "dirty": None, "commit_source": None}


def _nvidia_smi(device: int) -> dict[str, Any]:
    """Clocks (MHz), driver, temperature and power limit from nvidia-smi; {} when it is not there."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        done = subprocess.run([exe, f"--query-gpu={','.join(_NVIDIA_SMI_FIELDS)}", "--format=csv,noheader,nounits",
                               "-i", str(device)], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in done.stdout.strip().split(",")]
    if done.returncode != 0 or len(values) != len(_NVIDIA_SMI_FIELDS):
        return {}
    out: dict[str, Any] = {}
    for key, value in zip(_NVIDIA_SMI_FIELDS, values):
        try:
            out[key.replace(".", "_")] = float(value) if key not in ("name", "driver_version") else value
        except ValueError:
            out[key.replace(".", "_")] = None  # "[N/A]"
    return out


def sm_clock_mhz(device: int = 0) -> float | None:
    """The SM clock nvidia-smi reads now (MHz), or None without it: a timing's clock after sustained load
    can sit well below the maximum (bench/NOTES-tensorcore.md)."""
    return _nvidia_smi(device).get("clocks_sm")


def gpu(device: int = 0) -> dict[str, Any] | None:
    """The GPU results were measured on: name, compute capability ("9.0"), multiprocessors, L2 bytes,
    driver and CUDA runtime versions, current and maximum SM / memory clocks (MHz). None without one."""
    info: dict[str, Any] = {}
    try:
        from . import device_info

        info = dict(device_info(device))
    except Exception:  # noqa: BLE001 - no extension, no driver: described by torch below, or None
        info = {}
    out: dict[str, Any] = {}
    if info.get("available"):
        cc = info.get("compute_capability")
        out = {"name": info.get("name"), "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
               "multiprocessors": info.get("multiprocessors"), "driver_version": info.get("driver_version"),
               "cuda_runtime_version": info.get("runtime_version")}
    try:
        import torch

        if torch.cuda.is_available() and device < torch.cuda.device_count():
            p = torch.cuda.get_device_properties(device)
            out.setdefault("name", p.name)
            out.setdefault("compute_capability", f"{p.major}.{p.minor}")
            out.setdefault("multiprocessors", p.multi_processor_count)
            out["l2_cache_bytes"] = getattr(p, "L2_cache_size", None)
    except ImportError:
        pass
    if not out:
        return None
    smi = _nvidia_smi(device)
    out["nvidia_smi"] = smi or None
    if smi.get("driver_version"):
        out["driver"] = smi["driver_version"]
    return out


def software() -> dict[str, Any]:
    """Versions of python, numpy, cutlassfa and, when importable, torch (its CUDA and cuDNN), CuPy, JAX."""
    import numpy as np

    sw: dict[str, Any] = {"python": sys.version.split()[0], "numpy": np.__version__, "cutlassfa": package_version()}
    for module in ("torch", "cupy", "jax"):
        if module not in sys.modules and not _importable(module):
            continue
        try:
            mod = __import__(module)
        except Exception:  # noqa: BLE001 - a broken optional install is reported as such
            sw[module] = "failed to import"
            continue
        sw[module] = getattr(mod, "__version__", "unknown")
        if module == "torch":
            sw["torch_cuda"] = mod.version.cuda
            try:
                sw["cudnn"] = mod.backends.cudnn.version() if mod.backends.cudnn.is_available() else None
            except Exception:  # noqa: BLE001
                sw["cudnn"] = None
    return sw


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def provenance(device: int = 0) -> dict[str, Any]:
    """Everything above, plus the ISO 8601 time of the run (UTC), for a result document."""
    return {**git_state(), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "gpu": gpu(device), "software": software()}
