// fp32 inputs on the wgmma kernel: the shared split pre-pass (cutlassfa/split_fp32.h), then the kernel
// whose S GEMM (warpgroup_gemm_split, common/wgmma.h) forms the three products of the [hi | lo] halves.
#include <cuda_runtime.h>

#include "common/static_switch.h"
#include "cutlassfa/params.h"
#include "cutlassfa/split_fp32.h"
#include "cutlassfa/workspace.h"
#include "sm90/launch_fwd.h"

namespace cutlassfa::sm90 {

cudaError_t launch_fp32(const FwdParams& params, cudaStream_t stream) {
  FwdParams p;
  void* workspace = nullptr;
  cudaError_t err = split_fp32_inputs(params, p, &workspace, stream);
  if (err != cudaSuccess) { return err; }
  err = head_dim_switch<CUTLASSFA_SM90_HEAD_DIMS>(
      params.head_dim, [&](auto head_dim) {
        constexpr int kHeadDim = decltype(head_dim)::value;
        if constexpr (kHeadDim <= CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM) {
          return run_fwd_split<kHeadDim>(p, stream);
        } else {
          return cudaErrorInvalidValue;
        }
      });
  // Stream-ordered: released once the kernel that reads it has finished.
  cudaError_t const free_err = workspace_free(workspace, stream);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace cutlassfa::sm90
