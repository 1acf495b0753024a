// Declarations shared by launch.cu and the instantiation files (no CuTe here).
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa::sm90ws {

// Builds the TMA descriptors and launches the kernel for one (head dim, input type); params are in the
// scope of launch_sm90ws (checked there). Input: cutlass::half_t or cutlass::bfloat16_t, or float for
// fp32 inputs with K and V already split (cutlassfa/split_fp32.h: params.k / v point at the fp16 halves,
// params.q and params.o at fp32), or cutlass::float_e4m3_t with V already transposed
// (sm90ws/fp8_v_transpose.h: params.v at V^T) and O of Output (bf16 or fp16); kVarlen: a varlen batch (both
// cu_seqlens); kScoreTerm: softcap or ALiBi on every score (sm90ws/score_terms.h). Defined in
// sm90ws/launch_template.h, instantiated from sm90ws/instantiate.cu.in (dense), sm90ws/instantiate_varlen.cu.in,
// sm90ws/instantiate_softcap.cu.in, sm90ws/instantiate_alibi.cu.in, sm90ws/instantiate_fp32.cu.in and
// sm90ws/instantiate_fp8.cu.in.
enum class ScoreTerm { kNone, kSoftcap, kAlibi };
template <int kHeadDim, class Input, bool kVarlen, class Output = Input, ScoreTerm kScoreTerm = ScoreTerm::kNone>
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa::sm90ws
