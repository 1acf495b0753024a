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

template <typename T>
__global__ void split_combine_kernel(const FwdParams params) {
  long long const rows = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  int const splits = params.num_splits;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    int const i = static_cast<int>(r % params.seqlen_q);
    int const h = static_cast<int>((r / params.seqlen_q) % params.heads_q);
    int const b = static_cast<int>(r / (static_cast<long long>(params.seqlen_q) * params.heads_q));
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, params.lse_accum[s * rows + r]);
    float lse = -INFINITY;
    if (m != -INFINITY) {
      float sum = 0.f;
      for (int s = 0; s < splits; ++s) sum += expf(params.lse_accum[s * rows + r] - m);
      lse = m + logf(sum);
    }
    T* o = static_cast<T*>(params.o) + b * params.o_batch_stride + h * params.o_head_stride + i * params.o_row_stride;
    for (int c = threadIdx.x; c < params.head_dim; c += blockDim.x) {
      float acc = 0.f;
      if (lse != -INFINITY) {
        for (int s = 0; s < splits; ++s) {
          float const lse_s = params.lse_accum[s * rows + r];
          if (lse_s == -INFINITY) continue;  // an empty split adds nothing
          acc += expf(lse_s - lse) * params.o_accum[(s * rows + r) * params.head_dim + c];
        }
      }
      o[c] = static_cast<T>(acc);
    }
    if (threadIdx.x == 0 && params.lse != nullptr) {
      params.lse[b * params.lse_batch_stride + h * params.lse_head_stride + i] = lse;
    }
  }
}

template <typename T>
cudaError_t launch(const FwdParams& params, cudaStream_t stream) {
  long long const rows = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  if (rows == 0) return cudaSuccess;
  unsigned const blocks = static_cast<unsigned>(rows < 65536 ? rows : 65536);
  int const threads = params.head_dim <= 64 ? 64 : 128;  // one row of d outputs per block
  split_combine_kernel<T><<<blocks, threads, 0, stream>>>(params);
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
