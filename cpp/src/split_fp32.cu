// The fp32 split pre-pass of the wgmma kernels (cutlassfa/split_fp32.h).
#include "cutlassfa/split_fp32.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include <cuda_fp16.h>

#include "common/split_half.h"
#include "cutlassfa/workspace.h"

namespace cutlassfa {
namespace {

// One fp32 tensor (batch, heads, seqlen, d) with any strides, and where its split rows go.
struct SplitTensor {
  const float* src;
  __half* dst;  // rows of blocks * d halves, contiguous (batch, heads, seqlen)
  long long batch_stride, head_stride, row_stride;
  int heads, seqlen;
  int rows;    // batch * heads * seqlen
  int blocks;  // column blocks per output row: 2 for Q and K (hi, lo), 1 for V (hi)
};

// Eight consecutive values of a row: 16-byte loads where the strides allow.
__device__ __forceinline__ SplitEight split_row_eight(const float* src) {
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    return split_eight(reinterpret_cast<const float4*>(src)[0], reinterpret_cast<const float4*>(src)[1]);
  }
  return split_eight(make_float4(src[0], src[1], src[2], src[3]), make_float4(src[4], src[5], src[6], src[7]));
}

// Thread (x, y) of a block converts values 8 x .. 8 x + 7 of rows y, y + blockDim.y, ... of its
// share (first + blockIdx.y picks q, k or v); blockDim.x = d / 8. A memory-bound pass: 16-byte loads
// and stores, and the row's (batch, head, position) found once per 8 values in 32-bit arithmetic.
__global__ void split_fp32_kernel(SplitTensor q, SplitTensor k, SplitTensor v, int head_dim, int first) {
  int const which = first + static_cast<int>(blockIdx.y);
  SplitTensor const t = which == 0 ? q : (which == 1 ? k : v);
  int const col = 8 * static_cast<int>(threadIdx.x);
  for (int row = blockIdx.x * blockDim.y + threadIdx.y; row < t.rows; row += gridDim.x * blockDim.y) {
    int const n = row % t.seqlen;
    int const bh = row / t.seqlen;
    const float* src = t.src + (bh / t.heads) * t.batch_stride + (bh % t.heads) * t.head_stride + n * t.row_stride + col;
    SplitEight const s = split_row_eight(src);
    __half* dst = t.dst + static_cast<long long>(row) * t.blocks * head_dim + col;  // 16-byte aligned: d % 8 == 0
    *reinterpret_cast<uint4*>(dst) = s.hi;
    if (t.blocks == 2) { *reinterpret_cast<uint4*>(dst + head_dim) = s.lo; }
  }
}

}  // namespace

cudaError_t split_fp32_inputs(const FwdParams& params, FwdParams& split, void** workspace, cudaStream_t stream,
                              bool split_q) {
  int const d = params.head_dim;
  long long const rows_q = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  long long const rows_k = static_cast<long long>(params.batch) * params.heads_kv * params.seqlen_k;
  long long const halves_q = split_q ? rows_q * 2 * d : 0;
  long long const halves_k = rows_k * 2 * d;
  long long const halves_v = rows_k * d;
  // 32-bit row indices, with room for the grid stride (2^30 rows of 32 fp32 values are 128 GB);
  // 8 values a thread.
  if (rows_q > INT_MAX / 2 || rows_k > INT_MAX / 2 || d % 8 != 0 || d > 2048) { return cudaErrorNotSupported; }
  __half* halves = nullptr;
  cudaError_t err = workspace_alloc(reinterpret_cast<void**>(&halves),
                                    static_cast<size_t>(halves_q + halves_k + halves_v) * sizeof(__half), stream);
  if (err != cudaSuccess) { return err; }

  SplitTensor const q{static_cast<const float*>(params.q), halves, params.q_batch_stride, params.q_head_stride,
                      params.q_row_stride, params.heads_q, params.seqlen_q, static_cast<int>(rows_q), /*blocks=*/2};
  SplitTensor const k{static_cast<const float*>(params.k), halves + halves_q, params.k_batch_stride,
                      params.k_head_stride, params.k_row_stride, params.heads_kv, params.seqlen_k,
                      static_cast<int>(rows_k), /*blocks=*/2};
  SplitTensor const v{static_cast<const float*>(params.v), halves + halves_q + halves_k, params.v_batch_stride,
                      params.v_head_stride, params.v_row_stride, params.heads_kv, params.seqlen_k,
                      static_cast<int>(rows_k), /*blocks=*/1};
  dim3 const block(d / 8, std::max(1, 256 / (d / 8)));
  long long const row_blocks = (std::max(split_q ? rows_q : 0, rows_k) + block.y - 1) / block.y;
  dim3 const grid(static_cast<unsigned>(std::min(row_blocks, 1LL << 20)), split_q ? 3 : 2);
  split_fp32_kernel<<<grid, block, 0, stream>>>(q, k, v, d, /*first=*/split_q ? 0 : 1);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    workspace_free(halves, stream);
    return err;
  }

  split = params;  // same o (fp32, the caller's strides) and lse; q too unless split
  if (split_q) {
    split.q = q.dst;
    split.q_row_stride = 2LL * d;
    split.q_head_stride = split.q_row_stride * params.seqlen_q;
    split.q_batch_stride = split.q_head_stride * params.heads_q;
  }
  split.k = k.dst;
  split.v = v.dst;
  split.k_row_stride = 2LL * d;
  split.k_head_stride = split.k_row_stride * params.seqlen_k;
  split.k_batch_stride = split.k_head_stride * params.heads_kv;
  split.v_row_stride = d;
  split.v_head_stride = static_cast<long long>(d) * params.seqlen_k;
  split.v_batch_stride = split.v_head_stride * params.heads_kv;
  *workspace = halves;
  return cudaSuccess;
}

}  // namespace cutlassfa
