"""The measured dispatch table (`cutlassfa tune`): for classes of calls on one kind of GPU, the tensor-core
kernel and key splits that ran fastest there. The planner (cpp/include/cutlassfa/tuning.h) takes an entry
that matches a call and whose kernel covers it, and the hand-written heuristics otherwise.

Which table, the first found for the GPU of device 0 (a host's other GPU kinds plan by the heuristics):
``CUTLASSFA_TUNE=off`` none; ``CUTLASSFA_TUNE=<path>`` that file; the user's cache
(``$XDG_CACHE_HOME/cutlassfa/tune/`` or ``~/.cache/...``, written by `cutlassfa tune`); the tables this package
ships (``cutlassfa/tune_tables/``). A table names its GPU, multiprocessor count and the cutlassfa version that
measured it; one of another GPU, a user table of another version, or a file that does not parse is ignored
with one warning (never an error). A table's kernel can round differently from the heuristics' choice: the
results of a call can differ in the last bits between tuned and untuned runs, as between split counts.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

FORMAT = 1
ENVIRONMENT = "CUTLASSFA_TUNE"
KERNELS = ("sm90decode", "sm90ws", "sm90", "sm80")  # the tile kernels a table may choose
_CLASS_FIELDS = 7  # cutlassfa/tuning.h TuneClass


@dataclass(frozen=True)
class Entry:
    """One class of calls: its TuneClass, the kernel and splits that ran fastest, and what was measured
    (the calls of the class timed, the speed over the heuristics' choice)."""

    tune_class: tuple[int, ...]
    kernel: str
    num_splits: int
    measured: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Table:
    gpu: str
    multiprocessors: int
    capability: int
    version: str
    entries: tuple[Entry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "gpu": self.gpu, "multiprocessors": self.multiprocessors,
                "capability": self.capability, "cutlassfa": self.version,
                "entries": [{"class": list(e.tune_class), "kernel": e.kernel, "num_splits": e.num_splits,
                             "measured": e.measured} for e in self.entries]}

    @staticmethod
    def from_json(data: Any) -> Table:
        """The table a JSON document holds; ValueError saying what is wrong."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a cutlassfa tuning table of format {FORMAT}")
        gpu, sms, capability, version = (data.get(k) for k in ("gpu", "multiprocessors", "capability", "cutlassfa"))
        if not (isinstance(gpu, str) and _positive_int(sms) and _positive_int(capability) and isinstance(version, str)
                and isinstance(data.get("entries"), list)):
            raise ValueError("gpu, multiprocessors, capability, cutlassfa or entries missing or of the wrong type")
        entries = []
        for i, e in enumerate(data["entries"]):
            cls = e.get("class") if isinstance(e, dict) else None
            if not (isinstance(cls, list) and len(cls) == _CLASS_FIELDS and all(_small_int(x) for x in cls)
                    and e.get("kernel") in KERNELS and _positive_int(e.get("num_splits"))
                    and e["num_splits"] <= 1024):
                raise ValueError(f"entry {i} is not {{class: {_CLASS_FIELDS} ints, kernel: one of {KERNELS}, "
                                 "num_splits: 1..1024}")
            entries.append(Entry(tuple(cls), e["kernel"], e["num_splits"], e.get("measured") or {}))
        classes = [e.tune_class for e in entries]
        if len(set(classes)) != len(classes):
            raise ValueError("two entries for one class of calls")
        return Table(gpu, sms, capability, version, tuple(entries))


def _positive_int(x: Any) -> bool:
    return type(x) is int and x > 0


def _small_int(x: Any) -> bool:
    return type(x) is int and -(1 << 31) <= x < (1 << 31)


def table_name(gpu: str, multiprocessors: int) -> str:
    """The file name of a GPU's table: its name in lower case, words joined by '-', and its multiprocessors."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "gpu"
    return f"{slug}-{multiprocessors}sm.json"


def user_directory() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "cutlassfa" / "tune"


def shipped_directory() -> pathlib.Path:
    return pathlib.Path(__file__).parent / "tune_tables"


@dataclass
class Status:
    """Which table is in use: `path` (None: none), where it came from (`origin`: "environment", "user",
    "package"), its entries, and `note` (why none, or what was ignored)."""

    path: str | None = None
    origin: str = ""
    entries: int = 0
    note: str = ""


def find(gpu: str, multiprocessors: int, capability: int, version: str) -> tuple[Table | None, Status]:
    """The table for this GPU (module docstring's order), and the status `cutlassfa info` reports. A table
    that cannot be used is skipped with one warning; the next place is tried."""
    setting = os.environ.get(ENVIRONMENT, "").strip()
    if setting.lower() in ("0", "off", "none", "false"):
        return None, Status(note=f"off ({ENVIRONMENT}={setting})")
    name = table_name(gpu, multiprocessors)
    places = [(pathlib.Path(setting), "environment")] if setting else []
    places += [(user_directory() / name, "user"), (shipped_directory() / name, "package")]
    notes = []
    for path, origin in places:
        if not path.is_file():
            if origin == "environment":
                notes.append(f"{path} does not exist")
                warnings.warn(f"cutlassfa: {ENVIRONMENT}={setting}: no such file; the planner's heuristics are used",
                              RuntimeWarning, stacklevel=3)
            continue
        try:
            table = Table.from_json(json.loads(path.read_text()))
            foreign = _foreign(table, gpu, multiprocessors, capability, version, origin)
            if foreign:
                raise ValueError(foreign)
        except (OSError, ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
            notes.append(f"{path} ignored: {error}")
            warnings.warn(f"cutlassfa: tuning table {path} ignored: {error}", RuntimeWarning, stacklevel=3)
            continue
        return table, Status(str(path), origin, len(table.entries), "; ".join(notes))
    return None, Status(note="; ".join(notes) or "none for this GPU: the planner's heuristics")


def _foreign(table: Table, gpu: str, multiprocessors: int, capability: int, version: str, origin: str) -> str:
    if (table.gpu, table.multiprocessors, table.capability) != (gpu, multiprocessors, capability):
        return (f"measured on {table.gpu} ({table.multiprocessors} multiprocessors, sm_{table.capability}), "
                f"not this {gpu} ({multiprocessors}, sm_{capability})")
    if origin == "user" and table.version != version:  # the package's own tables ship with its kernels
        return f"measured with cutlassfa {table.version}, not {version} (run `cutlassfa tune` again)"
    return ""


def install(extension: Any, table: Table | None, capability: int, multiprocessors: int) -> None:
    """Hands `table` (None: none) to the planner of `extension` (cutlassfa._C) for devices of that kind."""
    entries = [] if table is None else [(e.tune_class, e.kernel, e.num_splits) for e in table.entries]
    extension.set_tuning(capability, multiprocessors, entries)


_status: Status | None = None


def ensure_installed() -> Status:
    """Finds and installs the table for device 0 once per process (on the first call that plans for a GPU;
    asking the GPU earlier would initialize CUDA at import). Returns its status."""
    global _status
    if _status is not None:
        return _status
    from . import __version__, _api

    _status = Status(note="no GPU, or an extension without CUDA")
    if _api._C is None or not hasattr(_api._C, "set_tuning"):
        return _status
    info = _api.device_info(0)
    if not info.get("available"):
        return _status
    capability = int(info["compute_capability"][0]) * 10 + int(info["compute_capability"][1])
    table, _status = find(info["name"], info["multiprocessors"], capability, __version__)
    install(_api._C, table, capability, info["multiprocessors"])
    return _status
