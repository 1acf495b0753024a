// fp8 attention's V operand: e4m3 wgmma reads P V's B operand K-major (keys contiguous), V is (keys, d)
// with d contiguous. A pre-pass writes V^T once per call into a stream-ordered workspace, rows of keys
// in the P V key order of sm90ws/fp8_key_order.h, which the kernel then loads by TMA as it loads K.
// (FlashAttention-3 transposes V in shared memory in its producer instead: one read of V rather than a
// read, a write and a read; a later step to measure.)
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa::sm90ws {

// Enqueues V^T of params.v (e4m3, dense (batch, heads_kv, seqlen_k, d), rows 16-byte aligned) into a
// workspace (cutlassfa/workspace.h): (batch, heads_kv, d, fp8_vt_keys(seqlen_k)) compact, column k of
// each 32-key group holding key fp8_pv_key(k) of the group, zeros for keys past seqlen_k. Sets `vt` to
// params with v and its strides pointing there (row stride: between rows of d). On success *workspace is
// to be released (workspace_free) on `stream` after the kernel that reads it is enqueued.
cudaError_t transpose_v_fp8(const FwdParams& params, FwdParams& vt, void** workspace, cudaStream_t stream);

}  // namespace cutlassfa::sm90ws
