// Host entry points of every kernel family. Each enqueues its kernel(s) on `stream` and returns the
// first CUDA error it met (launch configuration, cudaGetLastError after each launch, workspace
// allocation); it never synchronizes. Callers have already validated params and set the device.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa {

// Three steps through global memory (S = QK^T, softmax, PV): the O(N^2) baseline.
cudaError_t launch_naive(const FwdParams& params, cudaStream_t stream);

// CUDA-core FlashAttention-2, fits the 48 KB shared memory of every architecture (sm_61 and up).
cudaError_t launch_small_tile(const FwdParams& params, cudaStream_t stream);

// CUDA-core FlashAttention-2 with larger tiles in opt-in shared memory (sm_80 and up).
cudaError_t launch_large_tile(const FwdParams& params, cudaStream_t stream);

// Tensor-core FlashAttention-2 through CuTe SM80 mma.sync atoms (sm_80 and up): fp16, bf16, and fp32
// inputs as split-fp16 products. cpp/sm80/launch.cu.
cudaError_t launch_sm80(const FwdParams& params, cudaStream_t stream);

// Tensor-core FlashAttention with Hopper warpgroup MMA (sm_90a only): fp16, bf16, and fp32 inputs
// pre-split into fp16 hi/lo. cpp/sm90/launch.cu.
cudaError_t launch_sm90(const FwdParams& params, cudaStream_t stream);

// The warp-specialized Hopper kernel (sm_90a only): TMA producer warpgroup, two consumer warpgroups.
// Covers dense fp16 / bf16 calls of its head dims, any window (causal included); returns cudaErrorNotSupported before
// any launch for anything else (the caller then runs launch_sm90). cpp/sm90ws/launch.h says exactly what.
cudaError_t launch_sm90ws(const FwdParams& params, cudaStream_t stream);

// The decode kernel of the mma.sync family, run on sm_90 and up (two 100 KB CTAs a multiprocessor):
// the few query rows of one K/V head (seqlen_q x heads_ratio <= kSm80DecodeRows) against a K/V cache,
// one CTA per (batch, K/V head, key split), fp16 / bf16 at CUTLASSFA_SM80_DECODE_HEAD_DIMS; contiguous
// or paged caches (power-of-two page sizes) with or without seqlens_k, causal or a right window bound,
// lse, splits. Anything else (varlen, left padding or a left window bound, softcap, other page sizes):
// cudaErrorNotSupported before any launch.
// cpp/sm80/launch_decode.cu.
constexpr int kSm80DecodeRows = 32;
constexpr int kSm80DecodeCtasPerSm = 2;
bool sm80_decode_covers(const FwdParams& params);
cudaError_t launch_sm80_decode(const FwdParams& params, cudaStream_t stream);

// ---- Steps around the attention kernels (built for every architecture, beside fill.cu) ----

// Keys appended to a KV cache this call: k_new / v_new (batch, heads_kv, n_new, head_dim) of the
// params' dtype, strides in elements (the head_dim stride is 1).
struct AppendKV {
  const void* k_new;
  const void* v_new;
  long long k_new_strides[3];  // batch, head, row
  long long v_new_strides[3];
  int n_new;
};

// Writes k_new / v_new into params.k / params.v (contiguous or paged) at position seqlens_k[b] + j of
// entry b; a position past the capacity (seqlen_k) or through a page index outside [0, num_pages) is
// dropped. params.seqlens_k itself is not modified. cpp/src/append_kv.cu.
cudaError_t launch_append_kv(const FwdParams& params, const AppendKV& append, cudaStream_t stream);

// Merges the num_splits partial results of o_accum / lse_accum into params.o and params.lse (when not
// nullptr) by their lse; at most kMaxCombinedSplits splits. cpp/src/split_combine.cu.
constexpr int kMaxCombinedSplits = 1024;
cudaError_t launch_split_combine(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa
