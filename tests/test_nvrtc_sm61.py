"""sm_61 build check of the CUDA-core kernels, CPU only.

CUDA 13's nvcc no longer targets sm_61 (GTX 10xx), so the kernel headers under cpp/simt/ are compiled
to sm_61 machine code (a cubin) by NVRTC 12 from PyPI, driven through cuda-python's bindings. Every
template instantiation the launchers use is requested by name expression: small_tile for each dtype
and head dim (causal is a run-time flag of the same kernel, so each instantiation covers causal and
not), and the three naive kernels per dtype.

Needs: nvidia-cuda-nvrtc-cu12 (libnvrtc.so.12), cuda-bindings 12.x (cuda.bindings.nvrtc) and
nvidia-cuda-runtime-cu12 (whose include/ holds cuda_fp16.h and cuda_bf16.h: NVRTC 12 has no builtin copy).
"""

from __future__ import annotations

import pathlib

import pytest

nvrtc = pytest.importorskip(
    "cuda.bindings.nvrtc",
    reason="NVRTC not importable: pip install 'cuda-bindings>=12.4,<13' 'nvidia-cuda-nvrtc-cu12>=12.4,<13' "
    "'nvidia-cuda-runtime-cu12>=12.4,<13'",
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIMT_DIR = ROOT / "cpp" / "simt"
INCLUDE_DIR = ROOT / "cpp" / "include"

DTYPES = ["float", "__half", "__nv_bfloat16"]
HEAD_DIMS = [32, 64, 128]

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

# NVRTC 12 warns that pre-sm_75 targets are deprecated; that one warning is expected.
EXPECTED_WARNING = "are deprecated"


def _check(result) -> None:
    err = result[0]
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"NVRTC call failed: {err}"


def _cuda_runtime_include() -> pathlib.Path:
    """The include/ of nvidia-cuda-runtime-cu12, for cuda_fp16.h and cuda_bf16.h."""
    try:
        import nvidia.cuda_runtime as cuda_runtime  # namespace package from nvidia-cuda-runtime-cu12
    except ImportError:
        pytest.skip("nvidia-cuda-runtime-cu12 not installed (needed for cuda_fp16.h / cuda_bf16.h)")
    for base in cuda_runtime.__path__:
        include = pathlib.Path(base) / "include"
        if (include / "cuda_fp16.h").is_file() and (include / "cuda_bf16.h").is_file():
            return include
    pytest.skip("nvidia-cuda-runtime-cu12 has no include/cuda_fp16.h")


def _compile_sm61(source: str, name_expressions: list[str]) -> tuple[bytes, str, list[str]]:
    """Compiles `source` for sm_61; returns (cubin, log, lowered names). Fails the test on error."""
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"simt_sm61.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    try:
        for expr in name_expressions:
            _check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()))
        opts = [
            b"--gpu-architecture=sm_61",
            b"--std=c++17",
            b"-I" + str(SIMT_DIR).encode(),
            b"-I" + str(INCLUDE_DIR).encode(),
            b"-I" + str(_cuda_runtime_include()).encode(),
        ]
        (compile_err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, log_size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * log_size
        _check(nvrtc.nvrtcGetProgramLog(prog, log))
        log_text = log.decode(errors="replace").rstrip("\x00 \n")
        assert compile_err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"sm_61 compile failed:\n{log_text}"

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


def test_nvrtc_version_is_12():
    err, major, minor = nvrtc.nvrtcVersion()
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    if major != 12:  # the test extras pin NVRTC 12; a machine with another one cannot run this check
        pytest.skip(f"NVRTC {major}.{minor} found: the sm_61 check needs NVRTC 12 (13 dropped sm_61)")


@pytest.mark.parametrize(
    "family,kernels", [("small_tile", SMALL_TILE_KERNELS), ("naive", NAIVE_KERNELS)], ids=["small_tile", "naive"]
)
def test_simt_kernels_compile_for_sm61(family, kernels):
    cubin, log, lowered = _compile_sm61(SOURCE, kernels)
    assert len(cubin) > 0, "empty cubin"
    assert cubin[:4] == b"\x7fELF", "cubin is not an ELF image"
    problems = [
        line for line in log.splitlines() if ("warning" in line or "error" in line) and EXPECTED_WARNING not in line
    ]
    assert not problems, "\n".join(problems)
    # Every requested kernel is in the image under its mangled name.
    for name in lowered:
        assert name.encode() in cubin, f"{name} missing from the {family} cubin"


def test_broken_source_fails():
    """The check is real: a kernel that does not compile makes NVRTC fail."""
    with pytest.raises(AssertionError, match="sm_61 compile failed"):
        _compile_sm61(SOURCE + "__global__ void broken() { undeclared_symbol(); }\n", [])
