"""cutlassfa: FlashAttention forward pass on tensor cores (CUTLASS/CuTe mma.sync) and CUDA cores.

    import cutlassfa
    out = cutlassfa.forward(q, k, v, causal=True)

See `forward` for the contract and `backends()` for what runs on this machine.
"""

from ._api import BACKENDS, HEAD_DIMS, BackendStatus, backends, device_info, forward, select_backend

__version__ = "0.1.0"
__all__ = ["BACKENDS", "HEAD_DIMS", "BackendStatus", "backends", "device_info", "forward", "select_backend",
           "__version__"]
