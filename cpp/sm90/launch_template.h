// Host side of one SM90 kernel instantiation: traits and the causal switch (the launch itself is
// sm80/launch_kernel.h, shared). Included only by the instantiation files cpp/src/inst/sm90_hdim<d>.cu.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"
#include "sm80/launch_kernel.h"
#include "sm80/static_switch.h"
#include "sm90/flash_fwd_kernel.h"
#include "sm90/kernel_traits.h"
#include "sm90/launch_fwd.h"

namespace cutlassfa::sm90 {

template <class Traits, bool kIsCausal>
cudaError_t run_flash_fwd(const FwdParams& params, cudaStream_t stream) {
  return sm80::launch_fwd_kernel<Traits>(&flash_fwd_kernel<Traits, kIsCausal>, params, stream);
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
