"""How a kernel family's instantiation files become objects (cpp/instance_objects.cmake, run as a CMake script
with the family's files): every file is #included by exactly one object, by its path under the generated
folder; no object holds more than it may; the files go round-robin, so that a list's first (small) and last
(large) head dims share objects; an unchanged object file is not rewritten (its object is not rebuilt)."""

from __future__ import annotations

import math
import os
import pathlib
import re
import shutil
import subprocess

import pytest

MODULE = pathlib.Path(__file__).resolve().parents[1] / "cpp" / "instance_objects.cmake"
CMAKE = shutil.which("cmake")
pytestmark = pytest.mark.skipif(CMAKE is None, reason="machine: no cmake on PATH")


def _bundle(tmp_path: pathlib.Path, names: list[str], per_object: int) -> dict[str, list[str]]:
    """The objects cutlassfa_bundle writes for instance files `names` under <generated>/inst: object file name ->
    the paths it #includes, in order."""
    generated = tmp_path / "generated"
    (generated / "inst").mkdir(parents=True, exist_ok=True)
    for name in names:
        (generated / "inst" / name).write_text("// an instance\n")
    files = ";".join(str(generated / "inst" / name) for name in names)
    script = tmp_path / "run.cmake"
    script.write_text(f'set(GENERATED "{generated}")\ninclude("{MODULE}")\n'
                      f'cutlassfa_bundle(fam {per_object} sources "{files}")\nmessage(STATUS "SOURCES=${{sources}}")\n')
    run = subprocess.run([CMAKE, "-P", str(script)], check=True, capture_output=True, text=True)
    listed = re.search(r"SOURCES=(.*)", run.stdout + run.stderr).group(1).strip().split(";")
    objects = {}
    for source in listed:
        path = pathlib.Path(source)
        assert path.parent == generated / "objects"
        objects[path.name] = re.findall(r'#include "([^"]+)"', path.read_text())
    return objects


@pytest.mark.parametrize("count, per_object", [(12, 3), (5, 3), (5, 1), (1, 3), (7, 2)])
def test_every_instance_is_in_one_object(tmp_path, count, per_object):
    names = [f"fam_hdim{32 * (i + 1)}.cu" for i in range(count)]
    objects = _bundle(tmp_path, names, per_object)
    assert len(objects) == math.ceil(count / per_object)
    assert list(objects) == [f"fam_{i + 1}.cu" for i in range(len(objects))]
    included = [path for paths in objects.values() for path in paths]
    assert sorted(included) == sorted(f"inst/{name}" for name in names)  # each once, relative to the folder
    assert all(1 <= len(paths) <= per_object for paths in objects.values())


def test_round_robin_mixes_the_list(tmp_path):
    names = [f"fam_hdim{d}.cu" for d in (32, 64, 96, 128, 256)]
    objects = _bundle(tmp_path, names, 3)
    assert objects == {"fam_1.cu": ["inst/fam_hdim32.cu", "inst/fam_hdim96.cu", "inst/fam_hdim256.cu"],
                       "fam_2.cu": ["inst/fam_hdim64.cu", "inst/fam_hdim128.cu"]}


def test_an_unchanged_object_keeps_its_file(tmp_path):
    names = ["fam_hdim64.cu", "fam_hdim128.cu"]
    _bundle(tmp_path, names, 3)
    written = tmp_path / "generated" / "objects" / "fam_1.cu"
    old = written.stat().st_mtime_ns - 3600 * 10**9
    os.utime(written, ns=(old, old))  # an hour ago: a rewrite now would move it
    _bundle(tmp_path, names, 3)
    assert written.stat().st_mtime_ns == old
    _bundle(tmp_path, names + ["fam_hdim256.cu"], 3)  # another list: rewritten
    assert written.stat().st_mtime_ns != old
