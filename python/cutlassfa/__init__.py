"""cutlassfa: FlashAttention forward pass on tensor cores (CUTLASS/CuTe: Hopper warpgroup MMA on sm_90,
mma.sync on sm_80 and up) and CUDA cores, for numpy, PyTorch, CuPy and JAX arrays.

    import cutlassfa
    out = cutlassfa.forward(q, k, v, causal=True)
    out = cutlassfa.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)

See `forward` for the contract, `backends()` for what runs on this machine, `supports()` for what each
backend takes and `plan()` for the kernel a call runs.
"""

from ._api import (BACKENDS, HEAD_DIMS, BackendStatus, Support, backends, check_device_values, device_info,
                   empty_cache, forward, plan, select_backend, supports, varlen_forward)
from .merge import merge_attention, merge_attention_into

__version__ = "0.1.0"
__all__ = ["BACKENDS", "HEAD_DIMS", "BackendStatus", "Support", "backends", "check_device_values", "device_info",
           "empty_cache", "forward", "merge_attention", "merge_attention_into", "plan", "select_backend", "supports",
           "varlen_forward", "__version__"]
