"""Max abs error of each GPU backend on the full HW4 test shapes (fp32, inputs uniform in [-3, 3]),
against the float64 answer computed on the GPU a block of rows at a time, over every output element.
The HW4 rule: max abs error <= 5e-3 (cutlassfa.hw4). Needs PyTorch with CUDA. The same check runs in
tests/test_gpu.py::test_hw4_rule_on_the_full_shapes.

    python bench/hw4_accuracy.py [backend ...]
"""

import sys

import torch

import cutlassfa
from cutlassfa import hw4
from cutlassfa.check.hw4_rule import max_abs_error


def main() -> int:
    backends = sys.argv[1:] or ["tensorcore", "large_tile"]
    failed = False
    for b, n, d in hw4.FULL_SHAPES:
        q, k, v = (torch.empty(b, n, d, device="cuda").uniform_(-hw4.INPUT_RANGE, hw4.INPUT_RANGE) for _ in range(3))
        for backend in backends:
            out = cutlassfa.forward(q, k, v, backend=backend)
            err = max_abs_error(q, k, v, out)
            failed |= not err <= hw4.MAX_ABS_ERROR
            print(f"{backend:11s} (B, N, d) = {(b, n, d)}: max abs error {err:.3e} "
                  f"{'ok' if err <= hw4.MAX_ABS_ERROR else 'FAIL'}", flush=True)
        del q, k, v
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
