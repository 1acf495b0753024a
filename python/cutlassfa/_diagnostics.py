"""Is this installation what it should be? A build that found nvcc must have a CUDA extension that
loads, and a machine that must test its GPU (CUTLASSFA_REQUIRE_GPU=1) must not quietly fall back to
the CPU. Used by `cutlassfa info`, `cutlassfa check` and the test suite."""

from __future__ import annotations

import importlib
import os
from typing import Any

REQUIRE_GPU_VARIABLE = "CUTLASSFA_REQUIRE_GPU"


def gpu_required() -> bool:
    """Whether CUTLASSFA_REQUIRE_GPU is set (to anything but "" or "0"): then a GPU backend or GPU test
    that cannot run is a failure, not a skip."""
    return os.environ.get(REQUIRE_GPU_VARIABLE, "") not in ("", "0")


def build_config() -> Any | None:
    """The `cutlassfa._build_config` module written at build time, or None (running from a source tree)."""
    try:
        return importlib.import_module("cutlassfa._build_config")
    except ImportError:
        return None


def extension_error() -> str:
    """Why the CUDA extension `cutlassfa._C` did not load ("" when it did). Reads `device_info()`'s
    `extension_loaded` / `extension_error` when present, else imports the extension itself."""
    try:
        from . import device_info

        info = device_info()
    except Exception:  # noqa: BLE001 - an API that cannot even describe the device is the problem
        info = {}
    if "extension_loaded" in info:
        return "" if info["extension_loaded"] else str(info.get("extension_error") or "the extension did not load")
    try:
        importlib.import_module("cutlassfa._C")
    except ImportError as error:
        return f"cutlassfa._C cannot be imported ({error})"
    return ""


def build_problem(config: Any | None = None, error: str | None = None) -> str:
    """A sentence describing a broken build, or "": nvcc was found at build time (CUDA_COMPILER) but the
    extension was not configured (EXTENSION false) or is missing / fails to load. `config` and `error`
    default to this installation's; tests pass their own."""
    config = build_config() if config is None else config
    if config is None:
        return ""
    compiler = getattr(config, "CUDA_COMPILER", "")
    if not compiler:
        return ""
    if not getattr(config, "EXTENSION", True):
        return (f"the CUDA compiler {compiler} was found at build time but the CUDA extension was not "
                "built (the installation is CPU-only)")
    error = extension_error() if error is None else error
    if error:
        return f"the CUDA compiler {compiler} was found at build time but the CUDA extension is unusable: {error}"
    return ""
