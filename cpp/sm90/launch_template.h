// Host side of one SM90 kernel instantiation: traits and the kernel (the launch itself is
// common/launch_kernel.h). Included only by the instantiation files generated from
// cpp/sm90/instantiate.cu.in, one per head dim.
#pragma once

#include <cuda_runtime.h>

#include "common/launch_kernel.h"
#include "common/static_switch.h"
#include "cutlassfa/config.h"
#include "cutlassfa/params.h"
#include "sm90/flash_fwd_kernel.h"
#include "sm90/kernel_traits.h"
#include "sm90/launch_fwd.h"

namespace cutlassfa::sm90 {

template <class Traits>
cudaError_t run_flash_fwd(const FwdParams& params, cudaStream_t stream) {
  // One kernel for every mask (the window, left padding and ragged end are run-time values that only
  // the masked K/V steps read), and a general one for paged caches, zero-padded head dims, score terms
  // (softcap, ALiBi) and left padding.
  bool const general = params.block_table != nullptr || params.head_dim != Traits::kHeadDim ||
                       params.has_score_terms() || params.leftpad_k != nullptr;
  return bool_switch(general, [&](auto general_t) {
    return launch_fwd_kernel<Traits>(&flash_fwd_kernel<Traits, decltype(general_t)::value>, params, stream);
  });
}

template <int kHeadDim, class Element>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
  return run_flash_fwd<DefaultFwdTraits<kHeadDim, Element>>(params, stream);
}

template <int kHeadDim>
cudaError_t run_fwd_split(const FwdParams& params, cudaStream_t stream) {
  return run_flash_fwd<Fp32FwdTraits<kHeadDim>>(params, stream);
}

}  // namespace cutlassfa::sm90
