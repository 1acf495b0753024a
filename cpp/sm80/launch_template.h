// Host side of one kernel instantiation: traits and the causal switch (the launch itself is
// sm80/launch_kernel.h). Included only by the instantiation files cpp/src/inst/sm80_hdim<d>.cu.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"
#include "sm80/flash_fwd_kernel.h"
#include "sm80/kernel_traits.h"
#include "sm80/launch_fwd.h"
#include "sm80/launch_kernel.h"
#include "sm80/static_switch.h"

namespace cutlassfa::sm80 {

template <class Traits, bool kIsCausal>
cudaError_t run_flash_fwd(const FwdParams& params, cudaStream_t stream) {
  static_assert(Traits::kSmemSize <= 99 * 1024, "fits the opt-in shared memory of sm_86/sm_89 (99 KB)");
  return launch_fwd_kernel<Traits>(&flash_fwd_kernel<Traits, kIsCausal>, params, stream);
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
