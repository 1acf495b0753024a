// naive: the O(N^2) baseline, S = Q K^T materialized in a stream-ordered workspace.
#include <cuda_runtime.h>

#include "cutlassfa/launch.h"
#include "cutlassfa/workspace.h"
#include "naive.cuh"

namespace cutlassfa {
namespace {

// Grid-stride kernels: enough blocks to fill any GPU, never more than the work.
unsigned grid_for(long long work_items) {
  const long long kMaxBlocks = 1 << 20;
  return static_cast<unsigned>(work_items < kMaxBlocks ? (work_items > 0 ? work_items : 1) : kMaxBlocks);
}

template <typename T>
cudaError_t launch_naive_typed(const FwdParams& params, cudaStream_t stream) {
  constexpr int kTile = simt::kNaiveTile;
  const long long bh = static_cast<long long>(params.batch) * params.heads_q;
  const long long m_tiles = (params.seqlen_q + kTile - 1) / kTile;
  const long long n_tiles = (params.seqlen_k + kTile - 1) / kTile;
  const size_t s_bytes = static_cast<size_t>(bh) * params.seqlen_q * params.seqlen_k * sizeof(float);

  float* S = nullptr;
  cudaError_t err = workspace_alloc(reinterpret_cast<void**>(&S), s_bytes, stream);
  if (err != cudaSuccess) return err;

  const dim3 tile_block(kTile, kTile);
  simt::naive_scores_kernel<T><<<grid_for(bh * m_tiles * n_tiles), tile_block, 0, stream>>>(params, S);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    constexpr int kRowsPerBlock = 8;  // one warp per row
    simt::naive_softmax_kernel<<<grid_for((bh * params.seqlen_q + kRowsPerBlock - 1) / kRowsPerBlock),
                                 kRowsPerBlock * 32, 0, stream>>>(params, S);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    simt::naive_pv_kernel<T>
        <<<grid_for(bh * m_tiles * ((params.head_dim + kTile - 1) / kTile)), tile_block, 0, stream>>>(params, S);
    err = cudaGetLastError();
  }
  const cudaError_t free_err = workspace_free(S, stream);  // stream-ordered: after the kernels
  return err != cudaSuccess ? err : free_err;
}

}  // namespace

cudaError_t launch_naive(const FwdParams& params, cudaStream_t stream) {
  // Any head dim (no compiled width): the validator's multiples of 8 up to kMaxHeadDim.
  if (params.head_dim < 1 || params.head_dim > kMaxHeadDim) return cudaErrorInvalidValue;
  if (params.batch <= 0 || params.heads_q <= 0 || params.seqlen_q <= 0 || params.seqlen_k <= 0) return cudaSuccess;
  switch (params.dtype) {
    case DType::kFloat32: return launch_naive_typed<float>(params, stream);
    case DType::kFloat16: return launch_naive_typed<__half>(params, stream);
    case DType::kBFloat16: return launch_naive_typed<__nv_bfloat16>(params, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cutlassfa
