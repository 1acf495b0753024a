// The combine step of split keys (Flash-Decoding): split s of every row wrote its normalized fp32 O_s
// to o_accum[s][b][h][row] and its lse_s to lse_accum[s][b][h][row] (an empty split: O_s = 0, lse_s =
// -inf). The row's result is
//     lse = log sum_s exp(lse_s),    O = sum_s exp(lse_s - lse) O_s,
// computed in fp32 around the largest lse_s, written to o (its dtype and strides) and lse when asked.
// A row that no split saw (every lse_s = -inf) gets O = 0 and lse = -inf.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cutlassfa/launch.h"

namespace cutlassfa {
namespace {

// The block's threads reduce over the splits together: the lse_s of a row are read once, in
// parallel, into shared memory as weights exp(lse_s - lse), and every output column then sums its
// partials with independent loads. (A loop of one thread over the splits, each step a dependent L2
// round trip, took ~30 us for a B 1 x 128k decode of 66 splits, a third of the whole call.)
// The weights are read 8 at a time by the unrolled sum (vector loads of shared memory): the array
// is padded to a multiple of 8 with zero weights, so no read goes past it (compute-sanitizer caught
// a 16-byte read past 3 weights).
__host__ __device__ constexpr int padded_splits(int splits) { return (splits + 7) / 8 * 8; }

__device__ float block_reduce(float x, bool max, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    float const y = __shfl_xor_sync(0xffffffffu, x, offset);
    x = max ? fmaxf(x, y) : x + y;
  }
  int const warps = blockDim.x / 32;
  __syncthreads();  // scratch is free (an earlier reduction has been read)
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < warps; ++w) x = max ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

template <typename T>
__global__ void split_combine_kernel(const FwdParams params) {
  extern __shared__ float weight[];  // padded_splits(num_splits), the padding weighing 0
  __shared__ float scratch[32];
  long long const rows = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  int const splits = params.num_splits, padded = padded_splits(splits);
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    int const i = static_cast<int>(r % params.seqlen_q);
    int const h = static_cast<int>((r / params.seqlen_q) % params.heads_q);
    int const b = static_cast<int>(r / (static_cast<long long>(params.seqlen_q) * params.heads_q));
    float m = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += blockDim.x) {
      weight[s] = params.lse_accum[s * rows + r];
      m = fmaxf(m, weight[s]);
    }
    m = block_reduce(m, true, scratch);
    float sum = 0.f;
    if (m != -INFINITY) {
      for (int s = threadIdx.x; s < splits; s += blockDim.x) sum += expf(weight[s] - m);  // -inf: 0
    }
    sum = block_reduce(sum, false, scratch);
    float const lse = m == -INFINITY ? -INFINITY : m + logf(sum);
    for (int s = threadIdx.x; s < padded; s += blockDim.x) {  // an empty split (O_s = 0) weighs 0
      weight[s] = s >= splits || lse == -INFINITY ? 0.f : expf(weight[s] - lse);
    }
    __syncthreads();
    T* o = static_cast<T*>(params.o) + b * params.o_batch_stride + h * params.o_head_stride + i * params.o_row_stride;
    const float* partial = params.o_accum + r * params.head_dim;
    long long const split_stride = rows * params.head_dim;
    for (int c = threadIdx.x; c < params.head_dim; c += blockDim.x) {
      float acc = 0.f;
#pragma unroll 8
      for (int s = 0; s < padded; ++s) {
        if (weight[s] != 0.f) acc += weight[s] * partial[s * split_stride + c];  // never 0 * a stale value
      }
      o[c] = static_cast<T>(acc);
    }
    if (threadIdx.x == 0 && params.lse != nullptr) {
      params.lse[b * params.lse_batch_stride + h * params.lse_head_stride + i] = lse;
    }
    __syncthreads();  // weight is rewritten for the next row
  }
}

template <typename T>
cudaError_t launch(const FwdParams& params, cudaStream_t stream) {
  long long const rows = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  if (rows == 0) return cudaSuccess;
  if (params.num_splits > kMaxCombinedSplits) return cudaErrorInvalidValue;
  unsigned const blocks = static_cast<unsigned>(rows < 65536 ? rows : 65536);
  int const threads = params.head_dim <= 64 ? 64 : 128;  // one row of d outputs per block
  size_t const smem = static_cast<size_t>(padded_splits(params.num_splits)) * sizeof(float);
  split_combine_kernel<T><<<blocks, threads, smem, stream>>>(params);
  return cudaGetLastError();
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
