"""The "cpu" backend: the GPU kernels' blockwise online softmax, written with numpy.

Same algorithm and loop order as the CUDA kernels (FlashAttention-2): for each block of query rows
walk the key/value blocks left to right, keeping per row a running max ``m_i``, a running sum
``l_i`` and an unnormalized accumulator ``acc`` (all float32); divide by ``l_i`` once at the end.
Key blocks that the causal mask hides completely are never visited. Memory is
O(rows-in-flight x block_n): the N x N score matrix never exists.

Vectorized over batch, heads and the rows of a query block, so a (2, 16, 1024, 64) call takes a
fraction of a second.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["forward_cpu"]

_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
# Scores held per (batch chunk x query block x key block) step, in float32 elements (16 MiB).
_STEP_ELEMS = 1 << 22
# Float32 copies of K and V held per batch chunk, in elements (2 x 32 MiB).
_KV_ELEMS = 1 << 23


def forward_cpu(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool,
    softmax_scale: float | None,
    return_lse: bool,
    out: np.ndarray | None = None,
    block_n: int = 128,
    block_m: int = 128,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Blockwise attention forward on the CPU.

    Args:
        q: (B, Hq, Nq, d); k, v: (B, Hkv, Nk, d); one dtype among float32, float16, bfloat16
            (validated by the caller; any strides).
        causal: bottom-right aligned mask: query i sees key j iff j <= i + Nk - Nq.
        softmax_scale: None means 1/sqrt(d).
        return_lse: also return the float32 (B, Hq, Nq) natural-log softmax denominator.
        out: optional (B, Hq, Nq, d) array of q's dtype to write into (any strides).
        block_n: keys per inner-loop step (the kernels' tile N). block_m: query rows per block.

    Returns:
        out, or (out, lse). Rows that see no key give 0 and lse -inf. NaN in an input
        propagates to the rows that read it, as on the GPU.
    """
    if block_n < 1 or block_m < 1:
        raise ValueError(f"block sizes must be >= 1, got block_m={block_m}, block_n={block_n}")
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    if out is None:
        out = np.empty(q.shape, dtype=q.dtype)
    lse = np.empty((b, hq, nq), dtype=np.float32)
    if out.size == 0:
        lse.fill(-np.inf)
        return (out, lse) if return_lse else out
    if nk == 0 or hkv == 0:
        out[...] = 0
        lse.fill(-np.inf)
        return (out, lse) if return_lse else out

    group = hq // hkv
    bm = min(block_m, nq)
    bn = min(block_n, nk)
    nb = max(1, min(_STEP_ELEMS // (hq * bm * bn), _KV_ELEMS // (hkv * nk * d), b))
    # Finite inputs never hit an invalid operation or an overflow (the guards below see to that);
    # inf/NaN inputs do, and then NaN propagating to the affected rows is the intended result; rounding
    # tiny outputs to float16/bfloat16 underflows to subnormals or zero, as it should.
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        for b0 in range(0, b, nb):
            b1 = min(b, b0 + nb)
            # float32 copies of this chunk's K/V (no copy when already float32).
            kc = k[b0:b1].astype(np.float32, copy=False)  # (nb, Hkv, Nk, d)
            vc = v[b0:b1].astype(np.float32, copy=False)  # (nb, Hkv, Nk, d)
            for i0 in range(0, nq, bm):
                i1 = min(nq, i0 + bm)
                o_blk, lse_blk = _query_block(q[b0:b1, :, i0:i1], kc, vc, i0, nq, scale, causal, bn, group)
                out[b0:b1, :, i0:i1] = o_blk  # rounds to the input dtype
                lse[b0:b1, :, i0:i1] = lse_blk
    return (out, lse) if return_lse else out


def _query_block(
    q_blk: np.ndarray,
    kc: np.ndarray,
    vc: np.ndarray,
    i0: int,
    nq: int,
    scale: float,
    causal: bool,
    block_n: int,
    group: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Online softmax of one block of query rows against all visible key blocks.

    q_blk (nb, Hq, rows, d) in the input dtype; kc/vc (nb, Hkv, Nk, d) float32.
    Returns out (nb, Hq, rows, d) float32 and lse (nb, Hq, rows) float32.
    """
    nb, hq, rows, d = q_blk.shape
    hkv, nk = kc.shape[1], kc.shape[2]
    offset = nk - nq  # bottom-right alignment: row i sees keys j <= i + offset
    # The query heads of one GQA group share K/V, so stack them as rows of one bigger GEMM.
    tQ = q_blk.astype(np.float32).reshape(nb, hkv, group * rows, d)  # (nb, Hkv, group*rows, d)
    # Scores are kept in log2 units: scale * log2(e) is folded in once, so each step is one exp2.
    scale_log2 = np.float32(scale * _LOG2E)

    m_i = np.full((nb, hkv, group * rows), -np.inf, dtype=np.float32)  # running max (log2 units)
    l_i = np.zeros((nb, hkv, group * rows), dtype=np.float32)  # running sum of exp2(s - m_i)
    acc = np.zeros((nb, hkv, group * rows, d), dtype=np.float32)  # unnormalized output

    rows_idx = np.arange(i0, i0 + rows)
    # Causal: the last row of the block sees keys < i0 + rows + offset; later key blocks are skipped.
    n_end = min(nk, i0 + rows + offset) if causal else nk
    for j0 in range(0, max(n_end, 0), block_n):
        j1 = min(nk, j0 + block_n)
        tS = np.matmul(tQ, np.swapaxes(kc[:, :, j0:j1], -1, -2))  # (nb, Hkv, group*rows, bn)
        tS *= scale_log2
        # Only blocks crossing the diagonal need the mask (the kernels' "masked steps").
        if causal and j1 - 1 > i0 + offset:
            visible = np.arange(j0, j1)[None, :] <= rows_idx[:, None] + offset  # (rows, bn)
            np.copyto(tS.reshape(nb, hkv, group, rows, j1 - j0), -np.inf, where=~visible)
        m_new = np.maximum(m_i, tS.max(axis=-1))
        # A row that has seen only masked keys keeps max -inf; shift by 0 so exp2 gives 0, not NaN.
        m_safe = np.where(m_new == -np.inf, np.float32(0), m_new)
        alpha = np.exp2(m_i - m_safe)  # rescales what was accumulated under the old max
        tP = np.exp2(tS - m_safe[..., None])  # (nb, Hkv, group*rows, bn)
        l_i = l_i * alpha + tP.sum(axis=-1)
        acc *= alpha[..., None]
        acc += np.matmul(tP, vc[:, :, j0:j1])
        m_i = m_new

    # Rows with no visible key (causal with Nq > Nk) are decided by position, not by l_i, so a
    # NaN input still shows up as NaN in the rows that read it.
    row_sees_key = np.tile(rows_idx + offset >= 0 if causal else np.ones(rows, dtype=bool), group)
    l_safe = np.where(row_sees_key, l_i, np.float32(1))
    o = np.where(row_sees_key[:, None], acc / l_safe[..., None], np.float32(0))
    lse = np.where(row_sees_key, (m_i + np.log2(l_safe)) * np.float32(_LN2), np.float32(-np.inf))
    return o.reshape(nb, hq, rows, d), lse.reshape(nb, hq, rows)
