// Stream-ordered device workspaces for kernels that need scratch memory (the fp32 split pre-pass, the
// naive backend's score matrix) and for the host path's device copies, taken from one memory pool per
// device that keeps up to kRetainBytes reserved across synchronizations: a cudaMallocAsync on the
// default pool (release threshold 0) gave memory back at every synchronize, and a loop with a
// synchronize per call then paid for fresh mappings each time (fp32 (500, 2048, 64): 3.73 ms against
// 2.5 ms back to back on an H200). Allocation and release are stream-ordered, so they are safe across
// threads and streams, and capturable in CUDA graphs.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace cutlassfa {

// Memory a device's pool keeps reserved after a synchronize (beyond it, freed memory goes back).
constexpr size_t kRetainBytes = size_t{1} << 30;

// Allocates `bytes` on the current device, ordered on `stream`.
cudaError_t workspace_alloc(void** ptr, size_t bytes, cudaStream_t stream);

// Releases memory of workspace_alloc once the work queued on `stream` before this call is done.
cudaError_t workspace_free(void* ptr, cudaStream_t stream);

// Returns the reserved memory of every device's pool to the driver (cutlassfa.empty_cache()).
cudaError_t workspace_trim();

}  // namespace cutlassfa
