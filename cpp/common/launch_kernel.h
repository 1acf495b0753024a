// Launch of one forward kernel instantiation, shared by the tensor-core launch templates: the
// shared-memory opt-in (once per device) and the flattened grid. Light (no CuTe).
#pragma once

#include <atomic>
#include <climits>

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa {

// cudaFuncSetAttribute for `kernel` once per device (it is a per-context setting): a tiny call's
// whole budget is a few microseconds, and the attribute never changes. Devices beyond 64 set it
// every time.
template <class Kernel>
cudaError_t opt_in_shared_memory(Kernel kernel, int bytes) {
  static std::atomic<unsigned long long> done{0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) { return err; }
  unsigned long long const bit = device < 64 ? 1ull << device : 0;
  if (bit != 0 && (done.load(std::memory_order_relaxed) & bit)) { return cudaSuccess; }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) { done.fetch_or(bit, std::memory_order_relaxed); }
  return err;
}

// One CTA per (m_block, head, batch), flattened into x (limit 2^31 - 1) so that neither batch nor
// heads is bound by the 65535 limit of y and z; the kernel decodes it with m_block fastest.
template <class Traits, class Kernel>
cudaError_t launch_fwd_kernel(Kernel kernel, const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmemSize = Traits::kSmemSize;
  if constexpr (kSmemSize > 48 * 1024) {
    cudaError_t const err = opt_in_shared_memory(kernel, kSmemSize);
    if (err != cudaSuccess) { return err; }
  }
  long long const num_m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  long long const num_ctas = num_m_blocks * params.heads_q * params.batch;
  if (num_ctas > INT_MAX) { return cudaErrorInvalidConfiguration; }
  kernel<<<static_cast<unsigned>(num_ctas), Traits::kNThreads, kSmemSize, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cutlassfa
