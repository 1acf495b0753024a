// Host side of one SM90 kernel instantiation: grid, shared-memory opt-in, launch. Included only by
// the instantiation files cpp/src/inst/sm90_hdim<d>.cu.
#pragma once

#include <climits>

#include <cuda_runtime.h>

#include "cutlassfa/params.h"
#include "sm80/static_switch.h"
#include "sm90/flash_fwd_kernel.h"
#include "sm90/kernel_traits.h"
#include "sm90/launch_fwd.h"

namespace cutlassfa::sm90 {

template <class Traits, bool kIsCausal>
cudaError_t run_flash_fwd(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmemSize = Traits::kSmemSize;
  auto kernel = &flash_fwd_kernel<Traits, kIsCausal>;
  if constexpr (kSmemSize > 48 * 1024) {
    cudaError_t const err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemSize);
    if (err != cudaSuccess) { return err; }
  }
  // Same flattened 1-D grid as SM80: (batch, head, m_block), m_block fastest.
  long long const num_m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  long long const num_ctas = num_m_blocks * params.heads_q * params.batch;
  if (num_ctas > INT_MAX) { return cudaErrorInvalidConfiguration; }
  kernel<<<static_cast<unsigned>(num_ctas), Traits::kNThreads, kSmemSize, stream>>>(params);
  return cudaGetLastError();
}

template <int kHeadDim, class Element>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
  using Traits = DefaultFwdTraits<kHeadDim, Element>;
  return CUTLASSFA_BOOL_SWITCH(params.causal, kIsCausal,
                               [&] { return run_flash_fwd<Traits, kIsCausal>(params, stream); });
}

template <int kHeadDim>
cudaError_t run_fwd_split(const FwdParams& params, cudaStream_t stream) {
  using Traits = Fp32FwdTraits<kHeadDim>;
  return CUTLASSFA_BOOL_SWITCH(params.causal, kIsCausal,
                               [&] { return run_flash_fwd<Traits, kIsCausal>(params, stream); });
}

}  // namespace cutlassfa::sm90
