// Launch of one forward kernel instantiation, shared by the SM80 and SM90 launch templates: the
// shared-memory opt-in and the flattened grid. Light (no CuTe).
#pragma once

#include <climits>

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa::sm80 {

// One CTA per (m_block, head, batch), flattened into x (limit 2^31 - 1) so that neither batch nor
// heads is bound by the 65535 limit of y and z; the kernel decodes it with m_block fastest.
template <class Traits, class Kernel>
cudaError_t launch_fwd_kernel(Kernel kernel, const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmemSize = Traits::kSmemSize;
  if constexpr (kSmemSize > 48 * 1024) {
    cudaError_t const err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemSize);
    if (err != cudaSuccess) { return err; }
  }
  long long const num_m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  long long const num_ctas = num_m_blocks * params.heads_q * params.batch;
  if (num_ctas > INT_MAX) { return cudaErrorInvalidConfiguration; }
  kernel<<<static_cast<unsigned>(num_ctas), Traits::kNThreads, kSmemSize, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cutlassfa::sm80
