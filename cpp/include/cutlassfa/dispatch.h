// Backend names and the one run-time dispatch from a backend to its kernel family.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa {

// kTensorCore is the fastest tensor-core kernel for the device (wgmma on sm_90 when built for sm_90a,
// mma.sync otherwise); kTensorCoreSm80 is always the mma.sync kernel, for comparison and testing.
enum class Backend : int { kNaive = 0, kSmallTile = 1, kLargeTile = 2, kTensorCore = 3, kTensorCoreSm80 = 4 };

// Lowest compute capability (major * 10 + minor) each backend runs on.
int min_compute_capability(Backend backend);

// True when this build carries the backend's kernels (the tensor-core family is only built for sm_80+).
bool is_compiled(Backend backend);

// Enqueues the backend's kernels on `stream`; returns the first CUDA error met.
cudaError_t run_forward(Backend backend, const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa
