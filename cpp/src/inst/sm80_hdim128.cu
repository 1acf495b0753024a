// Tensor-core forward kernels for head dim 128: fp16, bf16, and fp32 inputs with fp32 output
// (split-fp16 MMAs); each causal and not. One file per head dim keeps the build parallel.
#include "sm80/launch_template.h"

namespace cutlassfa::sm80 {

template cudaError_t run_fwd<128, cutlass::half_t, cutlass::half_t>(const FwdParams&, cudaStream_t);
template cudaError_t run_fwd<128, cutlass::bfloat16_t, cutlass::bfloat16_t>(const FwdParams&, cudaStream_t);
template cudaError_t run_fwd_fp32<128>(const FwdParams&, cudaStream_t);

}  // namespace cutlassfa::sm80
