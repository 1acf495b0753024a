// Launch of one forward kernel instantiation, shared by the tensor-core launch templates: the
// shared-memory opt-in (once per device) and the flattened grid. Light (no CuTe).
#pragma once

#include <algorithm>
#include <climits>
#include <mutex>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa {

// cudaFuncSetAttribute for `kernel` once per device (it is a per-context setting): a tiny call's
// whole budget is a few microseconds, and the attribute never changes. Remembered per kernel
// function (not per kernel type: every kernel of one signature shares a type) and device; devices
// beyond 64 set it every time.
template <class Kernel>
cudaError_t opt_in_shared_memory(Kernel kernel, int bytes) {
  static std::mutex mutex;
  static std::vector<std::pair<const void*, unsigned long long>> done;  // kernel -> devices set
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) { return err; }
  unsigned long long const bit = device < 64 ? 1ull << device : 0;
  const void* const key = reinterpret_cast<const void*>(kernel);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = std::find_if(done.begin(), done.end(), [key](auto const& entry) { return entry.first == key; });
  if (it != done.end() && bit != 0 && (it->second & bit)) { return cudaSuccess; }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) { return err; }
  if (it == done.end()) {
    done.emplace_back(key, bit);
  } else {
    it->second |= bit;
  }
  return cudaSuccess;
}

// One CTA per (split, m_block, head, batch), flattened into x (limit 2^31 - 1) so that neither batch
// nor heads is bound by the 65535 limit of y and z; the kernel decodes it (common/tile.h).
template <class Traits, class Kernel>
cudaError_t launch_fwd_kernel(Kernel kernel, const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmemSize = Traits::kSmemSize;
  if constexpr (kSmemSize > 48 * 1024) {
    cudaError_t const err = opt_in_shared_memory(kernel, kSmemSize);
    if (err != cudaSuccess) { return err; }
  }
  long long const num_m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  long long const num_ctas = num_m_blocks * params.heads_q * params.batch * params.num_splits;
  if (num_ctas > INT_MAX) { return cudaErrorInvalidConfiguration; }
  kernel<<<static_cast<unsigned>(num_ctas), Traits::kNThreads, kSmemSize, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cutlassfa
