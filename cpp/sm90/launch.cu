// launch_sm90: the wgmma tensor-core family's entry point (sm_90a only; the caller checked the device
// and the head dim, see cpp/src/dispatch.cpp). fp16 / bf16 go straight to the kernels instantiated from
// the head-dim list (cpp/sm90/instantiate.cu.in); fp32 is split into fp16 hi/lo by a pre-pass first
// (launch_fp32.cu).
#include <cuda_runtime.h>

#include <cutlass/numeric_types.h>

#include "common/alignment.h"
#include "common/static_switch.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"
#include "sm90/launch_fwd.h"

namespace cutlassfa {

cudaError_t launch_sm90(const FwdParams& params, cudaStream_t stream) {
  if (!tensorcore_aligned(params)) { return cudaErrorInvalidValue; }
  if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) { return cudaSuccess; }
  if (params.dtype == DType::kFloat32) {
    // The fp32 pre-pass lays out dense (batch, heads, seqlen) tensors of a compiled head dim; paged
    // caches, varlen batches and zero-padded head dims run on the mma.sync family, which splits fp32
    // inside its kernel.
    bool const dense_compiled = head_dim_listed<CUTLASSFA_SM90_HEAD_DIMS>(params.head_dim) &&
                                params.head_dim <= CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM;
    bool const indirect = params.block_table != nullptr || params.cu_seqlens_q != nullptr || params.cu_seqlens_k != nullptr;
    if (!dense_compiled || indirect) {
      return launch_sm80(params, stream);
    }
    return sm90::launch_fp32(params, stream);
  }
  return fp16_switch(params.dtype, [&](auto element) {
    using Element = decltype(element);
    return padded_head_dim_switch<CUTLASSFA_SM90_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
      return sm90::run_fwd<decltype(head_dim)::value, Element>(params, stream);
    });
  });
}

}  // namespace cutlassfa
