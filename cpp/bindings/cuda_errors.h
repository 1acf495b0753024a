// CUDA errors as Python exceptions, and a scoped current device.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace cutlassfa::bindings {

// Raises the Python exception for `status` (out of memory: MemoryError; otherwise RuntimeError with the
// CUDA error name), after clearing the runtime's last (non-sticky) error so the next call starts clean.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what, size_t bytes = 0);

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw_cuda_error(status, what);
}

// Makes `device` current for the scope and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int current = previous_;
    cudaGetDevice(&current);
    if (current != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace cutlassfa::bindings
