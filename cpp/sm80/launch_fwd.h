// Declarations shared by the SM80 launcher and the per-head-dim instantiation files. Light on
// purpose (no CuTe): launch.cu compiles in seconds, the kernels compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa::sm80 {

// Enqueue the forward kernel for one (head dim, input element, output element): the plain or the
// general instantiation (sm80/launch_template.h says which calls take the general one). Element is
// cutlass::half_t or cutlass::bfloat16_t, ElementOut is Element or float.
// Defined in sm80/launch_template.h, instantiated from sm80/instantiate.cu.in.
template <int kHeadDim, class Element, class ElementOut>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// fp32 q, k, v (16-byte aligned, strides multiples of 4) read directly by the kernel, S in split
// fp16 (three MMAs), P V in fp16, O in fp32. Instantiated beside run_fwd.
template <int kHeadDim>
cudaError_t run_fwd_fp32(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa::sm80
