// Host side of one instantiation: the TMA descriptors of q, k and v over their (row, dim, head, batch)
// views, and the launch (one CTA per kBlockM-row Q tile, head and batch; common/launch_kernel.h's grid).
// Included only by the instantiation files generated from cpp/sm90ws/instantiate.cu.in.
#pragma once

#include <climits>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "common/launch_kernel.h"
#include "cutlassfa/params.h"
#include "sm90ws/kernel.h"
#include "sm90ws/kernel_traits.h"
#include "sm90ws/launch_fwd.h"

namespace cutlassfa::sm90ws {

// A (rows, d, heads, batch) view of q, k or v for its descriptor. A stride over an extent of 1 is never
// applied and may be anything; the descriptor checks every stride, so it becomes d (16-byte multiple).
template <class Traits>
auto rdhb_tensor(void const* base, long long batch_stride, long long head_stride, long long row_stride, int rows,
                 int heads, int batch) {
  using Element = typename Traits::Element;
  auto used = [](long long stride, int extent) {
    return static_cast<int64_t>(extent <= 1 ? Traits::kHeadDim : stride);
  };
  return make_tensor(make_gmem_ptr(static_cast<Element const*>(base)), make_shape(rows, Traits::kHeadDim, heads, batch),
                     make_stride(used(row_stride, rows), _1{}, used(head_stride, heads), used(batch_stride, batch)));
}

template <int kHeadDim, class Element>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
  using T = Traits<kHeadDim, Element>;
  KernelParams<T> kp{params,
                     make_tma_copy(SM90_TMA_LOAD{},
                                   rdhb_tensor<T>(params.q, params.q_batch_stride, params.q_head_stride,
                                                  params.q_row_stride, params.seqlen_q, params.heads_q, params.batch),
                                   typename T::SmemLayoutQ{}, Shape<Int<T::kBlockM>, Int<kHeadDim>>{}, _1{}),
                     make_tma_copy(SM90_TMA_LOAD{},
                                   rdhb_tensor<T>(params.k, params.k_batch_stride, params.k_head_stride,
                                                  params.k_row_stride, params.seqlen_k, params.heads_kv, params.batch),
                                   take<0, 2>(typename T::SmemLayoutK{}), Shape<Int<T::kBlockN>, Int<kHeadDim>>{}, _1{}),
                     make_tma_copy(SM90_TMA_LOAD{},
                                   rdhb_tensor<T>(params.v, params.v_batch_stride, params.v_head_stride,
                                                  params.v_row_stride, params.seqlen_k, params.heads_kv, params.batch),
                                   take<0, 2>(typename T::SmemLayoutV{}), Shape<Int<T::kBlockN>, Int<kHeadDim>>{}, _1{})};
  auto* const kernel = &flash_fwd_ws_kernel<T>;
  cudaError_t const err = opt_in_shared_memory(kernel, T::kSmemSize);
  if (err != cudaSuccess) { return err; }
  long long const num_m_blocks = (params.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  long long const num_ctas = num_m_blocks * params.heads_q * params.batch;
  if (num_ctas > INT_MAX) { return cudaErrorInvalidConfiguration; }
  kernel<<<static_cast<unsigned>(num_ctas), T::kNThreads, T::kSmemSize, stream>>>(kp);
  return cudaGetLastError();
}

}  // namespace cutlassfa::sm90ws
