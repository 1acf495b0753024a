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

// Tensor-core FlashAttention-2 through CuTe SM80 mma.sync atoms (sm_80 and up): fp16, bf16, and fp32
// inputs as split-fp16 products. cpp/sm80/launch.cu.
cudaError_t launch_sm80(const FwdParams& params, cudaStream_t stream);

// Tensor-core FlashAttention with Hopper warpgroup MMA (sm_90a only): fp16, bf16, and fp32 inputs
// pre-split into fp16 hi/lo. cpp/sm90/launch.cu.
cudaError_t launch_sm90(const FwdParams& params, cudaStream_t stream);

}  // namespace cutlassfa
