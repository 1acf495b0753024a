// The one run-time dispatch from a backend to its kernel family. The tensor-core family was chosen
// once per device (backends.cpp).
#include "cutlassfa/config.h"
#include "cutlassfa/dispatch.h"
#include "cutlassfa/launch.h"

namespace cutlassfa {
#if !CUTLASSFA_HAS_SM80
// Built without any sm_80+ architecture: the tensor-core families are absent.
cudaError_t launch_sm80(const FwdParams&, cudaStream_t) { return cudaErrorNoKernelImageForDevice; }
#endif
#if !CUTLASSFA_HAS_SM90
cudaError_t launch_sm90(const FwdParams&, cudaStream_t) { return cudaErrorNoKernelImageForDevice; }
#endif

cudaError_t run_forward(Backend backend, const FwdParams& params, cudaStream_t stream) {
  switch (backend) {
    case Backend::kNaive: return launch_naive(params, stream);
    case Backend::kSmallTile: return launch_small_tile(params, stream);
    case Backend::kLargeTile: return launch_large_tile(params, stream);
    case Backend::kTensorCoreSm80: return launch_sm80(params, stream);
    case Backend::kTensorCore: {
      int device = 0;
      cudaError_t const err = cudaGetDevice(&device);
      if (err != cudaSuccess) return err;
      bool const wgmma = tensorcore_family(device) == Family::kWgmma && wgmma_head_dim(params.head_dim);
      return wgmma ? launch_sm90(params, stream) : launch_sm80(params, stream);
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace cutlassfa
