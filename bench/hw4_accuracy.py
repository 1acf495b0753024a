"""Max abs error of each GPU backend on the full HW4 test shapes (fp32, inputs uniform in [-3, 3]),
against an fp64 reference computed on the GPU in row chunks, over every output element.
The HW4 rule: max abs error <= 5e-3. Needs PyTorch with CUDA.

    python bench/hw4_accuracy.py [backend ...]
"""

import sys

import torch

import cutlassfa

SHAPES = [(13600, 128, 32), (500, 2048, 64), (4, 32768, 32), (2, 32768, 64)]  # (B, N, d)


def reference_max_abs_error(q, k, v, out, rows=4096):
    worst = 0.0
    scale = q.shape[-1] ** -0.5
    for b in range(q.shape[0]) if q.shape[0] <= 8 else [slice(None)]:
        for i in range(0, q.shape[1], rows):
            qb, kb, vb = q[b, i:i + rows].double(), k[b].double(), v[b].double()
            ref = torch.softmax(qb @ kb.transpose(-1, -2) * scale, dim=-1) @ vb
            worst = max(worst, (out[b, i:i + rows].double() - ref).abs().max().item())
    return worst


def main() -> int:
    backends = sys.argv[1:] or ["tensorcore", "large_tile"]
    failed = False
    for b, n, d in SHAPES:
        q, k, v = (torch.empty(b, n, d, device="cuda").uniform_(-3, 3) for _ in range(3))
        for backend in backends:
            out = cutlassfa.forward(q, k, v, backend=backend)
            err = reference_max_abs_error(q, k, v, out)
            failed |= err > 5e-3
            print(f"{backend:11s} (B, N, d) = {(b, n, d)}: max abs error {err:.3e} "
                  f"{'ok' if err <= 5e-3 else 'FAIL'}", flush=True)
        del q, k, v
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
