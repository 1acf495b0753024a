// The fp32 split pre-pass of the wgmma kernels (cutlassfa/split_fp32.h).
#include "cutlassfa/split_fp32.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include <cuda_fp16.h>

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

// Eight consecutive values of a row as fp16 pairs: hi = fp16(x), lo = fp16(x - hi).
struct SplitEight {
  __half2 hi[4];
  __half2 lo[4];
};

__device__ __forceinline__ SplitEight split_eight(const float* src) {
  float x[8];
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {  // 16-byte loads where the strides allow
    float4 const a = reinterpret_cast<const float4*>(src)[0];
    float4 const b = reinterpret_cast<const float4*>(src)[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    for (int i = 0; i < 8; ++i) { x[i] = src[i]; }
  }
  SplitEight s;
  for (int i = 0; i < 4; ++i) {
    s.hi[i] = __floats2half2_rn(x[2 * i], x[2 * i + 1]);
    float2 const hf = __half22float2(s.hi[i]);
    s.lo[i] = __floats2half2_rn(x[2 * i] - hf.x, x[2 * i + 1] - hf.y);  // exact differences in fp32
  }
  return s;
}

// Thread (x, y) of a block converts values 8 x .. 8 x + 7 of rows y, y + blockDim.y, ... of its
// share (blockIdx.y picks q, k or v); blockDim.x = d / 8. A memory-bound pass: 16-byte loads and
// stores, and the row's (batch, head, position) found once per 8 values in 32-bit arithmetic.
__global__ void split_fp32_kernel(SplitTensor q, SplitTensor k, SplitTensor v, int head_dim) {
  SplitTensor const t = blockIdx.y == 0 ? q : (blockIdx.y == 1 ? k : v);
  int const col = 8 * static_cast<int>(threadIdx.x);
  for (int row = blockIdx.x * blockDim.y + threadIdx.y; row < t.rows; row += gridDim.x * blockDim.y) {
    int const n = row % t.seqlen;
    int const bh = row / t.seqlen;
    const float* src = t.src + (bh / t.heads) * t.batch_stride + (bh % t.heads) * t.head_stride + n * t.row_stride + col;
    SplitEight const s = split_eight(src);
    __half* dst = t.dst + static_cast<long long>(row) * t.blocks * head_dim + col;  // 16-byte aligned: d % 8 == 0
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(s.hi);
    if (t.blocks == 2) { *reinterpret_cast<uint4*>(dst + head_dim) = *reinterpret_cast<const uint4*>(s.lo); }
  }
}

}  // namespace

cudaError_t split_fp32_inputs(const FwdParams& params, FwdParams& split, void** workspace, cudaStream_t stream) {
  int const d = params.head_dim;
  long long const rows_q = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  long long const rows_k = static_cast<long long>(params.batch) * params.heads_kv * params.seqlen_k;
  long long const halves_q = rows_q * 2 * d;
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
  long long const row_blocks = (std::max(rows_q, rows_k) + block.y - 1) / block.y;
  dim3 const grid(static_cast<unsigned>(std::min(row_blocks, 1LL << 20)), 3);
  split_fp32_kernel<<<grid, block, 0, stream>>>(q, k, v, d);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    workspace_free(halves, stream);
    return err;
  }

  split = params;  // same o (fp32, the caller's strides) and lse
  split.q = q.dst;
  split.k = k.dst;
  split.v = v.dst;
  split.q_row_stride = 2LL * d;
  split.q_head_stride = split.q_row_stride * params.seqlen_q;
  split.q_batch_stride = split.q_head_stride * params.heads_q;
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
