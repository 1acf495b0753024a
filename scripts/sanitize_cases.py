"""Runs every available GPU backend over a small version of the GPU test matrix (ragged N, Nq != Nk,
causal, GQA, each dtype and head dim) and checks each result against the fp64 reference under the
gate's bounds. Meant to run under compute-sanitizer (scripts/sanitize.sh), so shapes stay small.

Host (numpy) arrays are compacted before the launch, so they test compact layouts only; the strided
cases run the kernels on CUDA tensors in the transposed and padded layouts of cutlassfa._inputs with a
strided `out=` (needs PyTorch with CUDA; --no-strided leaves them out, and says so).

    python scripts/sanitize_cases.py [--no-strided] [backend ...]
"""

import sys

import numpy as np

import cutlassfa
from cutlassfa._inputs import Case, as_layout, case_values, numpy_dtype, to_numpy64
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, rel_l2

SHAPES = [(1, 2, 2, 1, 1), (1, 2, 1, 77, 77), (1, 2, 2, 130, 65), (1, 2, 2, 65, 190)]  # B, Hq, Hkv, Nq, Nk
STRIDED_LAYOUTS = ("bnhd", "padded")
DTYPES = ("float32", "float16", "bfloat16")


def _run(backend, case, values, layout):
    """One forward; returns its rel-L2 error. layout None: numpy host arrays."""
    ref, _ = attention_reference(*values, causal=case.causal)
    if layout is None:
        q, k, v = (x.astype(numpy_dtype(case.dtype)) for x in values)
        out, _ = cutlassfa.forward(q, k, v, causal=case.causal, backend=backend, return_lse=True)
    else:
        q, k, v = (as_layout(x, case.dtype, "torch", layout)[0] for x in values)
        out, _ = as_layout(np.zeros(ref.shape, np.float32), case.dtype, "torch", layout)
        cutlassfa.forward(q, k, v, causal=case.causal, backend=backend, out=out, return_lse=True)
    return rel_l2(to_numpy64(out), ref)


def main(argv) -> int:
    strided = "--no-strided" not in argv
    names = [a for a in argv if not a.startswith("--")]
    backends = [name for name in ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive")
                if cutlassfa.backends()[name].available and (not names or name in names)]
    if not backends:
        print("FAIL no GPU backend available: " + "; ".join(
            f"{n}: {s.reason}" for n, s in cutlassfa.backends().items() if not s.available))
        return 1
    layouts = [None]
    if strided:
        try:
            import torch

            if not torch.cuda.is_available():
                raise ImportError("torch has no CUDA")
        except ImportError as error:
            print(f"FAIL strided device cases need PyTorch with CUDA ({error}); --no-strided leaves them out")
            return 1
        layouts += list(STRIDED_LAYOUTS)
    else:
        print("strided device cases left out (--no-strided): only compact layouts are checked")
    rng = np.random.default_rng()
    failures = runs = 0
    for backend in backends:
        for dtype in DTYPES:
            for d in (32, 64, 128):
                for causal in (False, True):
                    for b, hq, hk, nq, nk in SHAPES:
                        case = Case(dtype, b, hq, hk, nq, nk, d, causal)
                        values = case_values(case, rng)
                        for layout in layouts:
                            err = _run(backend, case, values, layout)
                            runs += 1
                            if not err <= bound_for(backend, dtype).rel_l2:
                                failures += 1
                                print(f"FAIL {backend} {case.label} {layout or 'host'} rel_err={err:.3g}")
    print(f"{runs} runs over {backends} (layouts: {', '.join(l or 'host' for l in layouts)}), {failures} failures")
    if strided:
        # Give PyTorch's cached blocks back before exit: memcheck's leak check reported them (allocated by
        # Tensor.to in as_layout) although no tensor was alive any more.
        import gc

        import torch

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
