"""The stamp that guards prebuilt kernel objects (cpp/prebuilt_kernels.cmake, run as a CMake script as the
export runs it): the same sources and configuration give the same stamp wherever the trees lie; any kernel
source, generated instantiation, flag, architecture, compiler release or CUTLASS release changes it; the
bindings, the instantiations' grouping into objects (a machine's core count), and a patch release of the
compiler, do not."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "cpp" / "prebuilt_kernels.cmake"
CMAKE = shutil.which("cmake")
pytestmark = pytest.mark.skipif(CMAKE is None, reason="machine: no cmake on PATH")


def _tree(root: pathlib.Path) -> dict[str, pathlib.Path]:
    files = {"cpp/sm90/launch.cu": "kernel", "cpp/common/mask.h": "rule", "cpp/bindings/forward.cpp": "binding",
             "generated/inst/sm90_hdim128.cu": "instance", "generated/_build_config.py": "python",
             "generated/objects/sm90_1.cu": '#include "inst/sm90_hdim128.cu"',
             "cutlass/include/cutlass/version.h": "#define CUTLASS_MAJOR 4", "README.md": "docs"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return {"source": root, "generated": root / "generated", "cutlass": root / "cutlass/include"}


def _stamp(tree, tmp_path, compiler="13.0.88", flags="-O3,-lineinfo", architectures="90a", extra=()) -> str:
    out = tmp_path / f"stamp{len(list(tmp_path.glob('stamp*')))}"
    subprocess.run([CMAKE, f"-DSOURCE_DIR={tree['source']}", f"-DGENERATED={tree['generated']}",
                    f"-DCOMPILER={compiler}", f"-DFLAGS={flags}", f"-DARCHITECTURES={architectures}",
                    f"-DCUTLASS_INCLUDE={tree['cutlass']}", f"-DSTAMP_FILE={out}", *extra, "-P", str(SCRIPT)],
                   check=True, capture_output=True)
    return out.read_text().strip()


def test_the_export_records_its_grouping_of_instances(tmp_path):
    """A build that links the objects groups its instantiation files as the exporting machine did (so that
    one object stands for each group), whatever its own core count."""
    tree = _tree(tmp_path / "a")
    (tmp_path / "export").mkdir()
    _stamp(tree, tmp_path / "export")
    assert not (tmp_path / "export" / "INSTANCES_PER_OBJECT").exists()
    stamp = _stamp(tree, tmp_path / "export", extra=["-DINSTANCES_PER_OBJECT=6"])
    assert (tmp_path / "export" / "INSTANCES_PER_OBJECT").read_text().strip() == "6"
    assert stamp == _stamp(tree, tmp_path)  # the grouping is not part of the stamp


def test_the_stamp_names_the_kernel_sources_and_the_configuration(tmp_path):
    tree = _tree(tmp_path / "a")
    base = _stamp(tree, tmp_path)
    assert len(base) == 64
    assert _stamp(_tree(tmp_path / "elsewhere"), tmp_path) == base  # the trees' paths do not matter
    assert _stamp(tree, tmp_path, compiler="13.0.99") == base  # a patch release of the compiler
    for changed in ({"compiler": "13.1.0"}, {"flags": "-O2,-lineinfo"}, {"architectures": "80,90a"}):
        assert _stamp(tree, tmp_path, **changed) != base, changed
    for name, counts in (("cpp/bindings/forward.cpp", False), ("generated/_build_config.py", False),
                         ("README.md", False), ("generated/objects/sm90_1.cu", False), ("cpp/common/mask.h", True), ("generated/inst/sm90_hdim128.cu", True),
                         ("cutlass/include/cutlass/version.h", True)):
        path = tree["source"] / name
        original = path.read_text()
        path.write_text(original + " changed")
        assert (_stamp(tree, tmp_path) != base) == counts, name
        path.write_text(original)
    (tree["generated"] / "objects/sm90_2.cu").write_text('#include "inst/sm90_hdim64.cu"')  # grouped otherwise
    assert _stamp(tree, tmp_path) == base
    (tree["source"] / "cpp/sm90/new_kernel.cu").write_text("more")
    assert _stamp(tree, tmp_path) != base
