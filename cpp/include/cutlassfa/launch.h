// Host entry points of every kernel family. Each enqueues its kernel(s) on `stream` and returns the
// first CUDA error it met (launch configuration, cudaGetLastError after each launch, workspace
// allocation); it never synchronizes. Callers have already validated params and set the device.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/head_dim_fold.h"
#include "cutlassfa/params.h"

namespace cutlassfa {

// Each tensor-core family also registers, host-side and without launching anything, what it covers
// (`*_covers`: the calls its launcher takes; outside them the launcher returns cudaErrorNotSupported
// before any launch) and the tile it runs a call with (`*_tile`, read from the tile shapes its traits
// are built from). The planner (cutlassfa/dispatch.h, make_plan) chooses among them; a launcher is only
// ever called for a call its family covers.

// The instantiation a tensor-core kernel runs a call on: its head dim (the call's, or the next compiled
// width, zero-padded) and its tile, query rows (kBlockM) by keys a K/V step (kBlockN).
struct KernelTile {
  int head_dim = 0;
  int block_m = 0;
  int block_n = 0;
};

// The tile of the compiled head dim that runs head_dim (head_dim_fold.h); an empty KernelTile when none does.
template <bool kPadded, int... kHeadDims, class F>
KernelTile tile_switch(int head_dim, F&& f) {
  return head_dim_fold<kPadded, kHeadDims...>(head_dim, KernelTile{}, f);
}

// Three steps through global memory (S = QK^T, softmax, PV): the O(N^2) baseline.
cudaError_t launch_naive(const FwdParams& params, cudaStream_t stream);

// CUDA-core FlashAttention-2, fits the 48 KB shared memory of every architecture (sm_61 and up).
cudaError_t launch_small_tile(const FwdParams& params, cudaStream_t stream);

// CUDA-core FlashAttention-2 with larger tiles in opt-in shared memory (sm_80 and up).
cudaError_t launch_large_tile(const FwdParams& params, cudaStream_t stream);

// Tensor-core FlashAttention-2 through CuTe SM80 mma.sync atoms (sm_80 and up): fp16, bf16, and fp32
// inputs as split-fp16 products. Covers every call the tensor-core backends accept (validation,
// head_dim_runs): the family the planner falls to when no other covers a call. cpp/sm80/launch.cu.
cudaError_t launch_sm80(const FwdParams& params, cudaStream_t stream);
KernelTile sm80_tile(const FwdParams& params);

// Tensor-core FlashAttention with Hopper warpgroup MMA (sm_90a only), cpp/sm90/launch.cu: fp16 / bf16
// at any head dim up to the widest of CUTLASSFA_SM90_HEAD_DIMS (zero-padded to the next listed one), and
// fp32 inputs pre-split into fp16 hi / lo for dense (batch, heads, seqlen) tensors at a listed head dim
// up to CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM (no paged cache, no varlen batch). Paged caches, varlen
// batches, softcap, ALiBi, left padding and split keys run on it. The general sm_90 kernel: what neither
// the decode kernel nor the warp-specialized one covers.
bool sm90_covers(const FwdParams& params);
KernelTile sm90_tile(const FwdParams& params);
cudaError_t launch_sm90(const FwdParams& params, cudaStream_t stream);

// The warp-specialized Hopper kernel (sm_90a only), cpp/sm90ws/launch.cu: TMA producer warpgroup, two
// or three consumer warpgroups. Covers one-pass calls without score terms (softcap, ALiBi) or a KV
// cache: dense fp16 / bf16 tensors at CUTLASSFA_SM90WS_HEAD_DIMS, varlen batches at
// CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS, dense fp32 at CUTLASSFA_SM90WS_FP32_HEAD_DIMS, dense fp8 attention at
// CUTLASSFA_SM90WS_FP8_HEAD_DIMS, any window; cpp/sm90ws/launch.h says exactly what.
bool sm90ws_covers(const FwdParams& params);
KernelTile sm90ws_tile(const FwdParams& params);
cudaError_t launch_sm90ws(const FwdParams& params, cudaStream_t stream);

// The decode kernel (mma.sync, run on sm_90 and up: two 100 KB CTAs a multiprocessor),
// cpp/sm90decode/launch_decode.cu: the few query rows of one K/V head (seqlen_q x heads_ratio <=
// kSm90DecodeRows, or up to kSm90DecodeMaxRows of at most kSm90DecodeChunkedQueries queries) against a K/V
// cache, one CTA per (batch, K/V head, key split, chunk of at most kSm90DecodeRows of those rows:
// KernelTile::block_m), fp16 / bf16 q with a cache
// of q's dtype or fp8 (e4m3, params.h kv_fp8; the only kernel that reads fp8 bytes: the others run a
// dequantized copy, below) at CUTLASSFA_SM90_DECODE_HEAD_DIMS; contiguous or paged caches (power-of-two page sizes) with or without
// seqlens_k, causal or any window, left padding, softcap (those three in a general instantiation), ALiBi,
// sinks, lse, splits. Not: varlen, other page sizes, devices below sm_90 (`capability`: major * 10 + minor).
// kSm90DecodeCtasPerSm is its traits' kCtasPerSm (a static_assert in launch_decode.cu ties them).
constexpr int kSm90DecodeRows = 32;
constexpr int kSm90DecodeMaxRows = 128;
constexpr int kSm90DecodeChunkedQueries = 16;
constexpr int kSm90DecodeCtasPerSm = 2;
// The widest head the decode kernel runs in four-warp CTAs of up to two slabs; a wider one (d = 256) takes one
// slab in two-warp CTAs (decode_kernel.h), of which the splits fill two a multiprocessor (dispatch.cpp).
constexpr int kSm90DecodeFourWarpHeadDim = 128;
bool sm90_decode_covers(const FwdParams& params, int capability);
KernelTile sm90_decode_tile(const FwdParams& params);
cudaError_t launch_sm90_decode(const FwdParams& params, cudaStream_t stream);

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

// FP8 caches on the kernels other than the decode kernel (cpp/src/dequantize_kv.cu): the cache dequantized
// (descales applied) into a compact copy of q's dtype, (B, Hkv, seqlen_k, d), or for a paged cache a pool of
// B x pages-an-entry pages and a table naming them (-1 where the original names no page), in one workspace
// buffer of dequantized_kv_bytes; dequantized_params are the call's params on the copy (kv_fp8 off).
struct DequantizedKV {
  void* k;
  void* v;
  int* block_table;  // paged caches only
};
size_t dequantized_kv_bytes(const FwdParams& params);
DequantizedKV dequantized_kv_in(const FwdParams& params, void* buffer);  // the copy's parts in `buffer`
FwdParams dequantized_params(const FwdParams& params, const DequantizedKV& copy);
cudaError_t launch_dequantize_kv(const FwdParams& params, const DequantizedKV& copy, cudaStream_t stream);

// Merges the num_splits partial results of o_accum / lse_accum into params.o and params.lse (when not
// nullptr) by their lse; at most kMaxCombinedSplits splits. cpp/src/split_combine.cu.
constexpr int kMaxCombinedSplits = 1024;
cudaError_t launch_split_combine(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa
