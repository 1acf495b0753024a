// Host side of one kernel instantiation: grid, shared-memory opt-in, launch. Included only by the
// instantiation files cpp/src/inst/sm80_hdim<d>.cu.
#pragma once

#include <climits>

#include <cuda_runtime.h>

#include "cutlassfa/params.h"
#include "sm80/flash_fwd_kernel.h"
#include "sm80/kernel_traits.h"
#include "sm80/launch_fwd.h"
#include "sm80/static_switch.h"

namespace cutlassfa::sm80 {

template <class Traits, bool kIsCausal>
cudaError_t run_flash_fwd(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmemSize = Traits::kSmemSize;
  static_assert(kSmemSize <= 99 * 1024, "fits the opt-in shared memory of sm_86/sm_89 (99 KB)");
  auto kernel = &flash_fwd_kernel<Traits, kIsCausal>;
  if constexpr (kSmemSize > 48 * 1024) {
    cudaError_t const err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemSize);
    if (err != cudaSuccess) { return err; }
  }
  // One CTA per (m_block, head, batch), flattened into x (limit 2^31 - 1) so that neither batch nor
  // heads is bound by the 65535 limit of y and z.
  long long const num_m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  long long const num_ctas = num_m_blocks * params.heads_q * params.batch;
  if (num_ctas > INT_MAX) { return cudaErrorInvalidConfiguration; }
  kernel<<<static_cast<unsigned>(num_ctas), Traits::kNThreads, kSmemSize, stream>>>(params);
  return cudaGetLastError();
}

template <int kHeadDim, class Element, class ElementOut>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
  using Traits = DefaultFwdTraits<kHeadDim, Element, ElementOut>;
  return CUTLASSFA_BOOL_SWITCH(params.causal, kIsCausal,
                               [&] { return run_flash_fwd<Traits, kIsCausal>(params, stream); });
}

template <int kHeadDim>
cudaError_t run_fwd_fp32(const FwdParams& params, cudaStream_t stream) {
  using Traits = Fp32FwdTraits<kHeadDim>;
  return CUTLASSFA_BOOL_SWITCH(params.causal, kIsCausal,
                               [&] { return run_flash_fwd<Traits, kIsCausal>(params, stream); });
}

}  // namespace cutlassfa::sm80
