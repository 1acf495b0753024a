// Declarations shared by the SM90 launcher and the instantiation files (no CuTe here).
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa::sm90 {

// Enqueue the wgmma forward kernel for one (head dim, element): the plain or the general
// instantiation (sm90/launch_template.h says which calls take the general one). Element is
// cutlass::half_t or cutlass::bfloat16_t; O is written in Element. The caller has
// checked the alignment contract (common/alignment.h) and that the device is sm_90.
// Defined in sm90/launch_template.h, instantiated from sm90/instantiate.cu.in.
template <int kHeadDim, class Element>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// The fp32 kernel on pre-split inputs: params.q and params.k point to fp16 rows of 2 * kHeadDim
// columns ([hi lo]), params.v to fp16 rows of kHeadDim, params.o to fp32.
// Instantiated beside run_fwd.
template <int kHeadDim>
cudaError_t run_fwd_split(const FwdParams& params, cudaStream_t stream);

// fp32 q, k, v (any strides), a head dim of CUTLASSFA_SM90_HEAD_DIMS: split into fp16
// (cutlassfa/split_fp32.h), then run_fwd_split. Defined in sm90/launch_fp32.cu.
cudaError_t launch_fp32(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa::sm90
