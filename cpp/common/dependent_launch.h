// Programmatic dependent launch (sm_90): a kernel launched with `launch_dependent` may be scheduled
// before the kernel ahead of it in the stream has finished, once that one has called
// `allow_dependent_launch` in every CTA (or exited); it must call `wait_for_primary_grid` before it
// reads what the earlier kernel wrote. That hides the launch gap between two back-to-back kernels
// (the split-keys kernel and its combine: a few microseconds of a 70 us decode step). Before sm_90
// both device calls compile to nothing and the launch attribute is not set.
#pragma once

#include <cuda_runtime.h>

namespace cutlassfa {

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Returns once the kernel ahead has completed and its memory operations are visible.
__device__ __forceinline__ void wait_for_primary_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the stream's previous
// kernel where `dependent` (the caller checked for sm_90 or later).
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), bool dependent, dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, Args const&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = dependent ? &attribute : nullptr;
  config.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace cutlassfa
