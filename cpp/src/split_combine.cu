// The combine step of split keys (Flash-Decoding): split s of every row wrote its normalized fp32 O_s
// to o_accum[s][b][h][row] and its lse_s to lse_accum[s][b][h][row] (an empty split: O_s = 0, lse_s =
// -inf). The row's result is their merge by lse (common/lse_merge.h), computed in fp32 around the
// largest lse_s, the attention sink added once (params.h), written to o (its dtype and strides) and lse
// when asked.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/dependent_launch.h"
#include "common/lse_merge.h"
#include "cutlassfa/backends.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/rules.h"

namespace cutlassfa {
namespace {

// One block per row, kCombineWarps warps, three dependent memory round trips in all: the row's lse_s
// are read once by the whole block into shared memory; every warp reduces them to the row's lse
// itself (shared memory and shuffles only), then sums the partials of its own share of the splits
// (split s to warp s % kCombineWarps), each lane 4 columns with 16-byte loads, kUnroll splits in
// flight (66 splits: two batches); the warps' sums meet once in shared memory. (One thread walking
// the splits took ~30 us for a B 1 x 128k decode of 66 splits; a block with one column a thread and
// 8 loads in flight, 12.7 us under ncu; a weight read from global memory before each partial, 9.7 us.)
constexpr int kCombineWarps = 8;
constexpr int kUnroll = 8;

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <typename T>
__global__ void __launch_bounds__(kCombineWarps * 32) split_combine_kernel(const FwdParams params) {
  // Shared memory: the warps' sums (kCombineWarps, head_dim), then the row's lse_s (num_splits).
  extern __shared__ float4 smem[];
  float4* warp_sums = smem;
  float* split_lse = reinterpret_cast<float*>(smem + kCombineWarps * (params.head_dim / 4));
  wait_for_primary_grid();  // launched as a dependent of the split kernel: its partials are complete
  long long const rows = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  int const splits = params.num_splits, chunks = params.head_dim / 4;
  int const warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  long long const split_stride = rows * params.head_dim;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    for (int s = static_cast<int>(threadIdx.x); s < splits; s += blockDim.x) split_lse[s] = params.lse_accum[s * rows + r];
    __syncthreads();
    float m = -INFINITY;
    for (int s = lane; s < splits; s += 32) m = fmaxf(m, split_lse[s]);
    m = warp_max(m);
    float sum = 0.f;
    if (m != -INFINITY) {
      for (int s = lane; s < splits; s += 32) sum += expf(split_lse[s] - m);  // -inf: 0
    }
    int const b = static_cast<int>(r / (static_cast<long long>(params.seqlen_q) * params.heads_q));
    int const h = static_cast<int>((r / params.seqlen_q) % params.heads_q);
    int const i = static_cast<int>(r % params.seqlen_q);
    float lse = merged_lse(m, warp_sum(sum));
    if (params.sinks != nullptr) {  // the sink once, in the merged row (rules.h): the weights are against it
      lse = rules::lse_with_sink(lse, params.sinks[h * params.sinks_head_stride + i * params.sinks_row_stride]);
    }

    const float* partial = params.o_accum + r * params.head_dim;
    for (int c = lane; c < chunks; c += 32) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s0 = warp; s0 < splits; s0 += kUnroll * kCombineWarps) {
        float weight[kUnroll];
        float4 value[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {  // an empty split (lse_s = -inf) weighs 0 and is not read
          int const s = s0 + u * kCombineWarps;
          weight[u] = s < splits ? merge_weight(split_lse[s], lse) : 0.f;
          value[u] = weight[u] != 0.f ? reinterpret_cast<const float4*>(partial + s * split_stride)[c]
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          acc.x += weight[u] * value[u].x;
          acc.y += weight[u] * value[u].y;
          acc.z += weight[u] * value[u].z;
          acc.w += weight[u] * value[u].w;
        }
      }
      warp_sums[warp * chunks + c] = acc;
    }
    __syncthreads();
    T* o = static_cast<T*>(params.o) + b * params.o_batch_stride + h * params.o_head_stride + i * params.o_row_stride;
    const float* sums = reinterpret_cast<const float*>(warp_sums);
    for (int col = static_cast<int>(threadIdx.x); col < params.head_dim; col += blockDim.x) {
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < kCombineWarps; ++w) total += sums[w * params.head_dim + col];
      o[col] = static_cast<T>(total);
    }
    if (threadIdx.x == 0 && params.lse != nullptr) {
      params.lse[b * params.lse_batch_stride + h * params.lse_head_stride + i] = lse;
    }
    __syncthreads();  // warp_sums and split_lse are rewritten for the next row
  }
}

template <typename T>
cudaError_t launch(const FwdParams& params, cudaStream_t stream) {
  long long const rows = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  if (rows == 0) return cudaSuccess;
  if (params.num_splits > kMaxCombinedSplits || params.head_dim % 4 != 0) return cudaErrorInvalidValue;
  int device = 0;
  cudaError_t const err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  unsigned const blocks = static_cast<unsigned>(rows < 65536 ? rows : 65536);
  size_t const smem = (static_cast<size_t>(kCombineWarps) * params.head_dim + params.num_splits) * sizeof(float);
  return launch_dependent(&split_combine_kernel<T>, device_capability(device) >= 90, dim3(blocks),
                          dim3(kCombineWarps * 32), smem, stream, params);
}

}  // namespace

cudaError_t launch_split_combine(const FwdParams& params, cudaStream_t stream) {
  switch (params.dtype) {
    case DType::kFloat32: return launch<float>(params, stream);
    case DType::kFloat16: return launch<__half>(params, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(params, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cutlassfa
