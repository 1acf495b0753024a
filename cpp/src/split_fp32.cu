// The fp32 split pre-pass of the wgmma kernels (cutlassfa/split_fp32.h).
#include "cutlassfa/split_fp32.h"

#include <algorithm>

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
  long long rows;  // batch * heads * seqlen
  int blocks;      // column blocks per output row: 2 for Q and K (hi, lo), 1 for V (hi)
};

// Each thread converts 4 consecutive values of one row (blockIdx.y picks q, k or v).
__global__ void split_fp32_kernel(SplitTensor q, SplitTensor k, SplitTensor v, int head_dim) {
  SplitTensor const t = blockIdx.y == 0 ? q : (blockIdx.y == 1 ? k : v);
  int const groups_per_row = head_dim / 4;
  long long const groups = t.rows * groups_per_row;
  for (long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<long long>(gridDim.x) * blockDim.x) {
    long long const row = g / groups_per_row;
    int const col = static_cast<int>(g % groups_per_row) * 4;
    long long const n = row % t.seqlen;
    long long const bh = row / t.seqlen;
    const float* src = t.src + (bh / t.heads) * t.batch_stride + (bh % t.heads) * t.head_stride + n * t.row_stride + col;
    float const x[4] = {src[0], src[1], src[2], src[3]};
    __half2 hi[2];
    __half2 lo[2];
    for (int i = 0; i < 2; ++i) {
      hi[i] = __floats2half2_rn(x[2 * i], x[2 * i + 1]);
      float2 const hf = __half22float2(hi[i]);
      lo[i] = __floats2half2_rn(x[2 * i] - hf.x, x[2 * i + 1] - hf.y);  // exact differences in fp32
    }
    __half* dst = t.dst + row * t.blocks * head_dim + col;
    for (int b = 0; b < t.blocks; ++b) {
      __half2 const* part = b == 1 ? lo : hi;
      *reinterpret_cast<uint2*>(dst + b * head_dim) =
          make_uint2(*reinterpret_cast<unsigned const*>(&part[0]), *reinterpret_cast<unsigned const*>(&part[1]));
    }
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
  __half* halves = nullptr;
  cudaError_t err = workspace_alloc(reinterpret_cast<void**>(&halves),
                                    static_cast<size_t>(halves_q + halves_k + halves_v) * sizeof(__half), stream);
  if (err != cudaSuccess) { return err; }

  SplitTensor const q{static_cast<const float*>(params.q), halves, params.q_batch_stride, params.q_head_stride,
                      params.q_row_stride, params.heads_q, params.seqlen_q, rows_q, /*blocks=*/2};
  SplitTensor const k{static_cast<const float*>(params.k), halves + halves_q, params.k_batch_stride,
                      params.k_head_stride, params.k_row_stride, params.heads_kv, params.seqlen_k, rows_k,
                      /*blocks=*/2};
  SplitTensor const v{static_cast<const float*>(params.v), halves + halves_q + halves_k, params.v_batch_stride,
                      params.v_head_stride, params.v_row_stride, params.heads_kv, params.seqlen_k, rows_k,
                      /*blocks=*/1};
  int const threads = 256;
  long long const groups = std::max(rows_q, rows_k) * (d / 4);
  dim3 const grid(static_cast<unsigned>(std::min((groups + threads - 1) / threads, 1LL << 20)), 3);
  split_fp32_kernel<<<grid, threads, 0, stream>>>(q, k, v, d);
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
