// Host entry points of every kernel family. Each enqueues its kernel(s) on `stream` and returns the
// first CUDA error it met (launch configuration, cudaGetLastError after each launch, workspace
// allocation); it never synchronizes. Callers have already validated params and set the device.
#pragma once

#include <cuda_runtime.h>

#include "cutlassfa/params.h"

namespace cutlassfa {

// Three steps through global memory (S = QK^T, softmax, PV): the O(N^2) baseline.
cudaError_t launch_naive(const FwdParams& params, cudaStream_t stream);

// CUDA-core FlashAttention-2, fits the 48 KB shared memory of every architecture (sm_61 and up).
cudaError_t launch_small_tile(const FwdParams& params, cudaStream_t stream);

// CUDA-core FlashAttention-2 with larger tiles in opt-in shared memory (sm_80 and up).
cudaError_t launch_large_tile(const FwdParams& params, cudaStream_t stream);

// Tensor-core FlashAttention: on an sm_90 device with the sm_90a kernels built, head dims 64 and 128
// (fp16, bf16, fp32) run the warpgroup-MMA (wgmma) kernel; everything else the SM80 mma.sync kernel.
cudaError_t launch_tensorcore(const FwdParams& params, cudaStream_t stream);

// Tensor-core FlashAttention-2 through CuTe SM80 mma.sync atoms only (sm_80 and up).
cudaError_t launch_tensorcore_sm80(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa
