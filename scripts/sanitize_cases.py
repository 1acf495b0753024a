"""Runs every available GPU backend over a small version of the GPU test matrix (ragged N, Nq != Nk,
causal, GQA, each dtype and head dim) and checks each result against the fp64 reference. Meant to run
under compute-sanitizer (scripts/sanitize.sh), so shapes stay small; host arrays only, no framework."""

import sys

import numpy as np

import cutlassfa
from cutlassfa.reference import attention_reference, rel_l2

SHAPES = [(1, 2, 2, 1, 1), (1, 2, 1, 77, 77), (1, 2, 2, 130, 65), (1, 2, 2, 65, 190)]  # B, Hq, Hkv, Nq, Nk


def main() -> int:
    import ml_dtypes

    rng = np.random.default_rng()
    backends = [name for name in ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive")
                if cutlassfa.backends()[name].available]
    if len(sys.argv) > 1:
        backends = [b for b in backends if b in sys.argv[1:]]
    failures = 0
    runs = 0
    for backend in backends:
        for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
            for d in (32, 64, 128):
                for causal in (False, True):
                    for b, hq, hk, nq, nk in SHAPES:
                        q = rng.standard_normal((b, hq, nq, d)).astype(dtype)
                        k = rng.standard_normal((b, hk, nk, d)).astype(dtype)
                        v = rng.standard_normal((b, hk, nk, d)).astype(dtype)
                        out, _ = cutlassfa.forward(q, k, v, causal=causal, backend=backend, return_lse=True)
                        ref, _ = attention_reference(q, k, v, causal=causal)
                        err = rel_l2(out.astype(np.float64), ref)
                        runs += 1
                        if not err <= 2e-2:
                            failures += 1
                            print(f"FAIL {backend} {np.dtype(dtype).name} d={d} causal={causal} "
                                  f"{(b, hq, hk, nq, nk)} rel_err={err:.3g}")
    print(f"{runs} runs over {backends}, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
