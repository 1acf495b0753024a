// Entry point of the warp-specialized Hopper forward kernel (sm_90a only; cpp/sm90ws/).
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"

namespace cutlassfa {

// (Declared in cutlassfa/launch.h, for the dispatch.) Enqueues the kernel on `stream` and returns the
// first CUDA error (never synchronizes). Covers fp16 / bf16, head dims of CUTLASSFA_SM90WS_HEAD_DIMS
// (exactly), dense (batch, heads, seqlen, d) tensors or a varlen batch (packed (total, heads, d) with
// both cu_seqlens; head dims of CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS), base and batch / head / row strides
// 16-byte aligned (the TMA descriptors), any seqlen_q and seqlen_k, any window (causal = (-1, 0);
// common/mask.h), GQA / MQA, lse; and fp32 dense tensors at CUTLASSFA_SM90WS_FP32_HEAD_DIMS, K and V
// through the split pre-pass (cutlassfa/split_fp32.h), Q split in the kernel (q and o aligned as above).
// Anything else (softcap, KV caches, paged caches, left padding, split keys, fp32 varlen, other head
// dims, unaligned tensors) returns cudaErrorNotSupported before any launch, so that the caller can fall
// back to another kernel. The caller has checked that the device is sm_90.
cudaError_t launch_sm90ws(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa
