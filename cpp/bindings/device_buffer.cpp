#include "bindings/device_buffer.h"

#include <cuda_runtime.h>

#include "bindings/cuda_errors.h"

namespace cutlassfa::bindings {

DeviceBuffer::DeviceBuffer(size_t bytes, int device) : bytes_(bytes), device_(device) {
  DeviceGuard guard(device);
  cudaError_t const status = cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes);
  if (status != cudaSuccess) throw_cuda_error(status, "DeviceBuffer", bytes);
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ == nullptr) return;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  cudaFree(ptr_);
  cudaSetDevice(previous);
}

}  // namespace cutlassfa::bindings
