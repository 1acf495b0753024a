// Hopper (sm_90a, wgmma) forward kernels for head dim 128: fp16, bf16, and fp32
// (pre-split fp16 inputs, fp32 output), each causal and not.
#include "sm90/launch_template.h"

namespace cutlassfa::sm90 {

template cudaError_t run_fwd<128, cutlass::half_t>(const FwdParams&, cudaStream_t);
template cudaError_t run_fwd<128, cutlass::bfloat16_t>(const FwdParams&, cudaStream_t);
template cudaError_t run_fwd_split<128>(const FwdParams&, cudaStream_t);

}  // namespace cutlassfa::sm90
