// Device memory owned by Python: outputs written for JAX (whose arrays are immutable: we fill a buffer
// and hand it over through DLPack) and large allocations the tests make on purpose.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cutlassfa::bindings {

class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, int device);  // raises MemoryError when the device is out of memory
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  uintptr_t ptr() const { return reinterpret_cast<uintptr_t>(ptr_); }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

}  // namespace cutlassfa::bindings
