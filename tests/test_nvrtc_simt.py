"""sm_61 and sm_70 build check of the CUDA-core kernels, CPU only.

CUDA 13's nvcc no longer targets sm_61 (GTX 10xx) or sm_70 (V100), so the kernel headers under cpp/simt/
are compiled to machine code (a cubin) for each by NVRTC 12 from PyPI, driven through cuda-python's
bindings. Every template instantiation the launchers use is requested by name expression: small_tile
for each dtype and head dim (causal is a run-time flag of the same kernel, so each instantiation covers
causal and not), and the three naive kernels per dtype. The architecture the cubin records in its ELF
header must be the one asked for.

Needs: nvidia-cuda-nvrtc-cu12 (libnvrtc.so.12), cuda-bindings 12.x (cuda.bindings.nvrtc) and
nvidia-cuda-runtime-cu12 (whose include/ holds cuda_fp16.h and cuda_bf16.h: NVRTC 12 has no builtin copy).
"""

from __future__ import annotations

import pathlib
import re
import struct

import pytest

_INSTALL = ("pip install 'cuda-bindings>=12.4,<13' 'nvidia-cuda-nvrtc-cu12>=12.4,<13' "
            "'nvidia-cuda-runtime-cu12>=12.4,<13'")
nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason=f"NVRTC not importable: {_INSTALL}")


def _nvrtc_version() -> tuple[int, int] | str:
    """NVRTC's (major, minor), or why it cannot be called (the bindings load the library lazily)."""
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as error:  # noqa: BLE001 - e.g. cuda.pathfinder not finding libnvrtc.so.12
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return (major, minor) if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else f"nvrtcVersion failed: {err}"


_VERSION = _nvrtc_version()
if isinstance(_VERSION, str) or _VERSION[0] != 12:  # the test extras pin NVRTC 12 (13 dropped sm_61 and sm_70)
    _FOUND = _VERSION if isinstance(_VERSION, str) else "found %d.%d" % _VERSION
    pytest.skip(f"optional package: NVRTC 12 is needed ({_FOUND}); {_INSTALL}", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIMT_DIR = ROOT / "cpp" / "simt"
INCLUDE_DIR = ROOT / "cpp" / "include"

DTYPES = ["float", "__half", "__nv_bfloat16"]


def _cmake_list(name: str) -> list[int]:
    """A head-dim list of CMakeLists.txt (`set(NAME 32 64 ...)`), where the launchers' instantiations come from."""
    match = re.search(rf"^set\({name}((?: \d+)+)\)", (ROOT / "CMakeLists.txt").read_text(), re.MULTILINE)
    assert match, f"{name} not found in CMakeLists.txt"
    return [int(d) for d in match.group(1).split()]


HEAD_DIMS = _cmake_list("CUTLASSFA_SMALL_TILE_HEAD_DIMS")

SMALL_TILE_KERNELS = [
    f"&cutlassfa::simt::flash_fwd_simt_kernel<cutlassfa::simt::SmallTile<{d}>, {t}>"
    for t in DTYPES
    for d in HEAD_DIMS
]
NAIVE_KERNELS = [
    k
    for t in DTYPES
    for k in (f"&cutlassfa::simt::naive_scores_kernel<{t}>", f"&cutlassfa::simt::naive_pv_kernel<{t}>")
] + ["&cutlassfa::simt::naive_softmax_kernel"]

SOURCE = '#include "flash_simt.cuh"\n#include "naive.cuh"\n'
ARCHITECTURES = [61, 70]  # what CUDA 13 dropped and small_tile / naive still promise

# NVRTC 12 warns that pre-sm_75 targets are deprecated; that one warning is expected.
EXPECTED_WARNING = "are deprecated"
EM_CUDA = 190  # ELF e_machine of a CUDA cubin


def cubin_architecture(cubin: bytes) -> int:
    """The SM a cubin was compiled for, from its ELF header (64-bit, little-endian). e_flags holds it in
    bits 0-7 up to ELF ABI version 7 (with the virtual architecture in bits 16-23), in bits 8-15 from
    ABI version 8 on (as LLVM's ELF.h reads EF_CUDA_SM)."""
    assert cubin[:4] == b"\x7fELF" and cubin[4] == 2 and cubin[5] == 1, "not a 64-bit little-endian ELF"
    (machine,) = struct.unpack_from("<H", cubin, 18)
    assert machine == EM_CUDA, f"e_machine {machine} is not EM_CUDA"
    (flags,) = struct.unpack_from("<I", cubin, 48)
    return (flags & 0xFF) if cubin[8] <= 7 else (flags >> 8) & 0xFF


def _check(result) -> None:
    err = result[0]
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"NVRTC call failed: {err}"


def _cuda_runtime_include() -> pathlib.Path:
    """The include/ of nvidia-cuda-runtime-cu12, for cuda_fp16.h and cuda_bf16.h."""
    try:
        import nvidia.cuda_runtime as cuda_runtime  # namespace package from nvidia-cuda-runtime-cu12
    except ImportError:
        pytest.skip("optional package: nvidia-cuda-runtime-cu12 (cuda_fp16.h / cuda_bf16.h) is not installed")
    for base in cuda_runtime.__path__:
        include = pathlib.Path(base) / "include"
        if (include / "cuda_fp16.h").is_file() and (include / "cuda_bf16.h").is_file():
            return include
    pytest.skip("nvidia-cuda-runtime-cu12 has no include/cuda_fp16.h")


def _compile(source: str, name_expressions: list[str], arch: int = 61) -> tuple[bytes, str, list[str]]:
    """Compiles `source` for sm_`arch`; returns (cubin, log, lowered names). Fails the test on error."""
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"simt_sm{arch}.cu".encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    try:
        for expr in name_expressions:
            _check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()))
        opts = [
            f"--gpu-architecture=sm_{arch}".encode(),
            b"--std=c++17",
            b"-I" + str(SIMT_DIR).encode(),
            b"-I" + str(INCLUDE_DIR).encode(),
            b"-I" + str(INCLUDE_DIR.parent).encode(),  # cpp/: common/opaque.h
            b"-I" + str(_cuda_runtime_include()).encode(),
        ]
        (compile_err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, log_size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * log_size
        _check(nvrtc.nvrtcGetProgramLog(prog, log))
        log_text = log.decode(errors="replace").rstrip("\x00 \n")
        assert compile_err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"sm_{arch} compile failed:\n{log_text}"

        lowered = []
        for expr in name_expressions:
            err, name = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"no instantiation for {expr}"
            lowered.append(name.decode() if isinstance(name, bytes) else name)

        err, cubin_size = nvrtc.nvrtcGetCUBINSize(prog)
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
        cubin = b" " * cubin_size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin))
        return cubin, log_text, lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize(
    "family,kernels", [("small_tile", SMALL_TILE_KERNELS), ("naive", NAIVE_KERNELS)], ids=["small_tile", "naive"]
)
def test_simt_kernels_compile_for_old_architectures(family, kernels, arch):
    cubin, log, lowered = _compile(SOURCE, kernels, arch)
    assert len(cubin) > 0, "empty cubin"
    assert cubin_architecture(cubin) == arch, f"the cubin records sm_{cubin_architecture(cubin)}"
    problems = [
        line for line in log.splitlines() if ("warning" in line or "error" in line) and EXPECTED_WARNING not in line
    ]
    assert not problems, "\n".join(problems)
    # Every requested kernel is in the image under its mangled name.
    for name in lowered:
        assert name.encode() in cubin, f"{name} missing from the {family} cubin"


def test_broken_source_fails():
    """The check is real: a kernel that does not compile makes NVRTC fail."""
    with pytest.raises(AssertionError, match="sm_70 compile failed"):
        _compile(SOURCE + "__global__ void broken() { undeclared_symbol(); }\n", [], 70)


def test_architecture_is_read_from_the_cubin():
    """The ELF reader tells architectures apart (a cubin of one small kernel per architecture)."""
    source = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
    assert [cubin_architecture(_compile(source, [], arch)[0]) for arch in (61, 70, 75, 80)] == [61, 70, 75, 80]
