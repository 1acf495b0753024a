// Host side of the CUDA-core FlashAttention family: run-time (dtype, head dim) -> compile-time
// switch and the launch of flash_fwd_simt_kernel for one configuration (SmallTile or LargeTile).
// Included by launch_small_tile.cu and launch_large_tile.cu only (one translation unit per config
// keeps the build parallel).
#pragma once

#include <cuda_runtime.h>

#include "common/launch_kernel.h"
#include "common/static_switch.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"
#include "flash_simt.cuh"

namespace cutlassfa {
namespace simt {

template <typename Kt, typename T>
cudaError_t launch_flash_simt_kernel(const FwdParams& params, cudaStream_t stream) {
  auto kernel = flash_fwd_simt_kernel<Kt, T>;
  // All of (m block, batch * head) in gridDim.x, m block fastest: batch * heads is not limited to 65535.
  const long long num_m_blocks = (params.seqlen_q + Kt::kBlockM - 1) / Kt::kBlockM;
  const long long num_blocks = num_m_blocks * params.batch * params.heads_q;
  if (num_blocks <= 0) return cudaSuccess;
  if (num_blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  if (Kt::kSmemBytes > 48 * 1024) {
    // Opt-in shared memory beyond 48 KB; a device with less reports an error here.
    const cudaError_t err = opt_in_shared_memory(kernel, Kt::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  kernel<<<static_cast<unsigned>(num_blocks), Kt::kThreads, Kt::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

// The one place where dtype and head dim become template arguments; every mask, length, page and
// softcap mode stays a run-time value of the same kernel. A head dim runs on the next compiled one
// of kHeadDims (ascending), zero-padded. Launch<T, D>::run(params, stream) launches one instantiation.
template <template <typename, int> class Launch, int... kHeadDims>
cudaError_t dispatch_flash_simt(const FwdParams& params, cudaStream_t stream) {
  auto by_head_dim = [&](auto type_tag) -> cudaError_t {
    using T = decltype(type_tag);
    return padded_head_dim_switch<kHeadDims...>(
        params.head_dim, [&](auto head_dim) { return Launch<T, decltype(head_dim)::value>::run(params, stream); });
  };
  switch (params.dtype) {
    case DType::kFloat32: return by_head_dim(float{});
    case DType::kFloat16: return by_head_dim(__half{});
    case DType::kBFloat16: return by_head_dim(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace simt
}  // namespace cutlassfa
