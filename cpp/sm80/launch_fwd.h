// Declarations shared by the tensor-core launcher and the per-head-dim instantiation files. Light on
// purpose (no CuTe): launch_tensorcore.cu compiles in seconds, the kernels compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa::sm80 {

// Enqueue the forward kernel for one (head dim, input element, output element); switches on
// params.causal. Element is cutlass::half_t or cutlass::bfloat16_t, ElementOut is Element or float.
// Defined in sm80/launch_template.h, instantiated in cpp/src/inst/sm80_hdim<d>.cu.
template <int kHeadDim, class Element, class ElementOut>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// fp32 q, k, v (16-byte aligned, strides multiples of 4) read directly by the kernel, S in split
// fp16 (three MMAs), P V in fp16, O in fp32. Instantiated beside run_fwd.
template <int kHeadDim>
cudaError_t run_fwd_fp32(const FwdParams& params, cudaStream_t stream);

// True when launch_tensorcore accepts params: head_dim in {32, 64, 128}, heads consistent, and the
// 16-byte alignment its cp.async loads and vector stores need (see launch_tensorcore.cu).
bool tensorcore_supports(const FwdParams& params);

}  // namespace cutlassfa::sm80
