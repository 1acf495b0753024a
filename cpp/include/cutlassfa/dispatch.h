// The one run-time dispatch from a backend to its kernel family (cpp/src/dispatch.cpp).
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/backends.h"
#include "cutlassfa/params.h"

namespace cutlassfa {

// Enqueues the backend's kernels on `stream` (on the current device); returns the first CUDA error.
cudaError_t run_forward(Backend backend, const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa
