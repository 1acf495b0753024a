// Host side of one SM80 kernel instantiation: traits and the kernel (the launch itself is
// common/launch_kernel.h). Included only by the instantiation files generated from
// cpp/sm80/instantiate.cu.in, one per head dim.
#pragma once

#include <cuda_runtime.h>

#include "common/launch_kernel.h"
#include "common/static_switch.h"
#include "cutlassfa/config.h"
#include "cutlassfa/params.h"
#include "sm80/flash_fwd_kernel.h"
#include "sm80/kernel_traits.h"
#include "sm80/launch_fwd.h"

namespace cutlassfa::sm80 {

template <class Traits>
cudaError_t run_flash_fwd(const FwdParams& params, cudaStream_t stream) {
  static_assert(Traits::kSmemSize <= 99 * 1024, "fits the opt-in shared memory of sm_86/sm_89 (99 KB)");
  // One kernel for every mask (the window, left padding and ragged end are run-time values that only
  // the masked K/V steps read), and a general one for paged caches, zero-padded head dims, score terms
  // (softcap, ALiBi) and left padding.
  bool const general = params.block_table != nullptr || params.head_dim != Traits::kHeadDim ||
                       params.has_score_terms() || params.leftpad_k != nullptr;
  return bool_switch(general, [&](auto general_t) {
    return launch_fwd_kernel<Traits>(&flash_fwd_kernel<Traits, decltype(general_t)::value>, params, stream);
  });
}

template <int kHeadDim, class Element, class ElementOut>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
  return run_flash_fwd<DefaultFwdTraits<kHeadDim, Element, ElementOut>>(params, stream);
}

template <int kHeadDim>
cudaError_t run_fwd_fp32(const FwdParams& params, cudaStream_t stream) {
  return run_flash_fwd<Fp32FwdTraits<kHeadDim>>(params, stream);
}

}  // namespace cutlassfa::sm80
