// Host side of one instantiation: the TMA descriptors of q, k and v over their (row, dim, head, batch)
// views (fp8: V^T's), the tile scheduler (sm90ws/scheduler.h) and the persistent launch, one CTA per SM at most.
// Included only by the instantiation files generated from cpp/sm90ws/instantiate.cu.in.
#pragma once

#include <algorithm>
#include <climits>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "common/launch_kernel.h"
#include "cutlassfa/backends.h"
#include "cutlassfa/params.h"
#include "cutlassfa/workspace.h"
#include "sm90ws/kernel.h"
#include "sm90ws/kernel_traits.h"
#include "sm90ws/launch_fwd.h"

namespace cutlassfa::sm90ws {

// A (rows, kCols, heads, batch) view of q, k or v for its descriptor. A stride over an extent of 1 is
// never applied and may be anything; the descriptor checks every stride, so it becomes kCols (16-byte
// multiple).
template <class Element, int kCols>
auto rdhb_tensor(void const* base, long long batch_stride, long long head_stride, long long row_stride, int rows,
                 int heads, int batch) {
  auto used = [](long long stride, int extent) { return static_cast<int64_t>(extent <= 1 ? kCols : stride); };
  return make_tensor(make_gmem_ptr(static_cast<Element const*>(base)), make_shape(rows, kCols, heads, batch),
                     make_stride(used(row_stride, rows), _1{}, used(head_stride, heads), used(batch_stride, batch)));
}

// fp8: the V^T workspace (sm90ws/fp8_v_transpose.h: params.v and its strides) as (dim, key, head, batch).
template <class Element, int kHeadDim>
auto vt_tensor(FwdParams const& params) {
  return make_tensor(make_gmem_ptr(static_cast<Element const*>(params.v)),
                     make_shape(kHeadDim, fp8_vt_keys(params.seqlen_k), params.heads_kv, params.batch),
                     make_stride(static_cast<int64_t>(params.v_row_stride), _1{},
                                 static_cast<int64_t>(params.v_head_stride), static_cast<int64_t>(params.v_batch_stride)));
}

template <int kHeadDim, class Input, bool kVarlen, class Output, ScoreTerm kScoreTerm>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
  using T = Traits<kHeadDim, Input, kVarlen, Output, kScoreTerm>;
  using Element = typename T::Element;
  constexpr int kHeadDimQK = T::kHeadDimQK;
  constexpr int kHeadDimQLoad = T::kHeadDimQLoad;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) { return err; }
  int const sms = device_multiprocessors(device);  // asked once per device (cutlassfa/backends.h)
  if (sms <= 0) { return cudaErrorInvalidDevice; }
  int const num_m_blocks = (params.seqlen_q + T::kBlockM - 1) / T::kBlockM;  // varlen: of the longest entry
  TmaExtents const extents = tma_extents(params, kVarlen);
  long long const num_tiles = static_cast<long long>(num_m_blocks) * params.heads_q * params.batch;
  if (num_tiles > INT_MAX - sms) { return cudaErrorInvalidConfiguration; }  // tile indices run to num_tiles + grid
  int const grid = static_cast<int>(std::min<long long>(num_tiles, sms));
  auto v_tensor = [&] {
    if constexpr (T::kFp8) {
      return vt_tensor<Element, kHeadDim>(params);
    } else {
      return rdhb_tensor<Element, kHeadDim>(params.v, params.v_batch_stride, params.v_head_stride, params.v_row_stride,
                                            extents.rows_k, params.heads_kv, extents.batch);
    }
  };
  KernelParams<T> kp{params,
                     make_tma_copy(SM90_TMA_LOAD{},
                                   rdhb_tensor<typename T::ElementQLoad, kHeadDimQLoad>(
                                       params.q, params.q_batch_stride, params.q_head_stride, params.q_row_stride,
                                       extents.rows_q, params.heads_q, extents.batch),
                                   typename T::SmemLayoutQLoad{}, Shape<Int<T::kBlockM>, Int<kHeadDimQLoad>>{}, _1{}),
                     make_tma_copy(SM90_TMA_LOAD{},
                                   rdhb_tensor<Element, kHeadDimQK>(params.k, params.k_batch_stride, params.k_head_stride,
                                                  params.k_row_stride, extents.rows_k, params.heads_kv, extents.batch),
                                   take<0, 2>(typename T::SmemLayoutK{}), Shape<Int<T::kBlockN>, Int<kHeadDimQK>>{}, _1{}),
                     make_tma_copy(SM90_TMA_LOAD{}, v_tensor(), take<0, 2>(typename T::SmemLayoutV{}),
                                   typename T::TileShapeV{}, _1{}),
                     TileScheduler{static_cast<int>(num_tiles), num_m_blocks, 1, nullptr}};
  auto* const kernel = &flash_fwd_ws_kernel<T>;
  err = opt_in_shared_memory(kernel, T::kSmemSize);
  if (err != cudaSuccess) { return err; }
  // A mask makes tiles unequal (causal, windows): past the first wave, tiles go to whoever is free, the
  // heaviest first, in sections of heads whose K and V fit in 32 MB together (FlashAttention-3's dynamic
  // scheduler's budget; an H100 / H200 has 50 MB of L2).
  // Varlen entries differ in length too.
  bool const unequal = params.window_left >= 0 || params.window_right >= 0 || kVarlen;
  void* counter = nullptr;
  if (unequal && num_tiles > grid) {
    long long const kv_bytes =
        static_cast<long long>(params.seqlen_k) * (kHeadDimQK + kHeadDim) * sizeof(Element) / params.heads_ratio;
    long long const pairs = static_cast<long long>(params.heads_q) * params.batch;
    kp.scheduler.heads_per_section = static_cast<int>(std::clamp((32ll << 20) / std::max(kv_bytes, 1ll), 1ll, pairs));
    err = workspace_alloc(&counter, sizeof(int), stream);
    if (err != cudaSuccess) { return err; }
    err = cudaMemsetAsync(counter, 0, sizeof(int), stream);
    kp.scheduler.counter = static_cast<int*>(counter);
  }
  if (err == cudaSuccess) {
    kernel<<<grid, T::kNThreads, T::kSmemSize, stream>>>(kp);
    err = cudaGetLastError();
  }
  cudaError_t const free_err = workspace_free(counter, stream);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace cutlassfa::sm90ws
