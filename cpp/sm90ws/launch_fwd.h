// Declarations shared by launch.cu and the instantiation files (no CuTe here).
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa::sm90ws {

// Builds the TMA descriptors and launches the kernel for one (head dim, element); params are in the
// scope of launch_sm90ws (checked there). Element: cutlass::half_t or cutlass::bfloat16_t; kVarlen: a
// varlen batch (both cu_seqlens). Defined in sm90ws/launch_template.h, instantiated from
// sm90ws/instantiate.cu.in (dense) and sm90ws/instantiate_varlen.cu.in.
template <int kHeadDim, class Element, bool kVarlen>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa::sm90ws
