#include "cutlassfa/dispatch.h"

#include "cutlassfa/launch.h"

namespace cutlassfa {

#if !CUTLASSFA_HAS_SM80
// Built without any sm_80+ architecture: the tensor-core family is absent.
cudaError_t launch_tensorcore(const FwdParams&, cudaStream_t) { return cudaErrorNoKernelImageForDevice; }
cudaError_t launch_tensorcore_sm80(const FwdParams&, cudaStream_t) { return cudaErrorNoKernelImageForDevice; }
#endif

int min_compute_capability(Backend backend) {
  switch (backend) {
    case Backend::kNaive:
    case Backend::kSmallTile: return 61;
    case Backend::kLargeTile:  // opt-in shared memory beyond 99 KB per block
    case Backend::kTensorCore:
    case Backend::kTensorCoreSm80: return 80;  // mma.sync m16n8k16 and cp.async
  }
  return 1000;
}

bool is_compiled(Backend backend) {
  bool const tensorcore = backend == Backend::kTensorCore || backend == Backend::kTensorCoreSm80;
  return !tensorcore || CUTLASSFA_HAS_SM80;
}

cudaError_t run_forward(Backend backend, const FwdParams& params, cudaStream_t stream) {
  switch (backend) {
    case Backend::kNaive: return launch_naive(params, stream);
    case Backend::kSmallTile: return launch_small_tile(params, stream);
    case Backend::kLargeTile: return launch_large_tile(params, stream);
    case Backend::kTensorCore: return launch_tensorcore(params, stream);
    case Backend::kTensorCoreSm80: return launch_tensorcore_sm80(params, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cutlassfa
