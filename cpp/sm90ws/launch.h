// Entry point of the warp-specialized Hopper forward kernel (sm_90a only; cpp/sm90ws/).
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"

namespace cutlassfa {

// (Declared in cutlassfa/launch.h, for the planner.) sm90ws_covers: whether the kernel runs a call, pure
// (no launch). It covers fp16 / bf16, head dims of CUTLASSFA_SM90WS_HEAD_DIMS (exactly), dense (batch,
// heads, seqlen, d) tensors or a varlen batch (packed (total, heads, d) with both cu_seqlens; head dims of
// CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS), base and batch / head / row strides 16-byte aligned and below 2^40
// bytes (the TMA descriptors), any seqlen_q, seqlen_k >= 1, any window (causal = (-1, 0); common/mask.h),
// GQA / MQA, lse; and fp32 dense tensors at CUTLASSFA_SM90WS_FP32_HEAD_DIMS, K and V through the split
// pre-pass (cutlassfa/split_fp32.h), Q split in the kernel (q and o aligned as above); and fp8 attention (e4m3
// q, k, v; O in out_dtype bf16 / fp16) at CUTLASSFA_SM90WS_FP8_HEAD_DIMS, dense, q and k by TMA, v through the
// V^T pre-pass (sm90ws/fp8_v_transpose.h); ALiBi or softcap (not both) on dense fp16 / bf16 tensors at
// CUTLASSFA_SM90WS_ALIBI_HEAD_DIMS / _SOFTCAP_HEAD_DIMS (sm90ws/score_terms.h). Not: softcap or ALiBi elsewhere,
// KV caches, paged caches, left padding, split keys, fp32 varlen, other head dims, unaligned tensors.
// launch_sm90ws enqueues the kernel on `stream` and returns the first CUDA error (never synchronizes); a
// call outside sm90ws_covers returns cudaErrorNotSupported before any launch (the planner never makes
// one; the self-test checks the refusal). The caller has checked that the device is sm_90.
bool sm90ws_covers(const FwdParams& params);
KernelTile sm90ws_tile(const FwdParams& params);
cudaError_t launch_sm90ws(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa
