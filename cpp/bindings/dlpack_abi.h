// The parts of the DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html, version 1.x) that the
// bindings read: DLTensor, the versioned managed tensor, and the C exchange API that frameworks
// publish as `type(tensor).__dlpack_c_exchange_api__` (PyTorch does): converting a tensor, asking
// for the framework's current stream and allocating a tensor through it take nanoseconds there,
// where `__dlpack__()` from Python takes microseconds per array.
#pragma once

#include <cstdint>

namespace cutlassfa::dlpack {

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3, kCUDAManaged = 13 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kFloat8E4M3FN = 10 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; nullptr means compact row-major
  uint64_t byte_offset;
};

struct Version {
  uint32_t major;
  uint32_t minor;
};

struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};

struct ExchangeApiHeader {
  Version version;
  ExchangeApiHeader* prev_api;
};

struct ExchangeApi {
  ExchangeApiHeader header;
  int (*managed_tensor_allocator)(Tensor* prototype, ManagedTensorVersioned** out, void* error_ctx,
                                  void (*set_error)(void* error_ctx, const char* kind, const char* message));
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, ManagedTensorVersioned** out);
  int (*managed_tensor_to_py_object_no_sync)(ManagedTensorVersioned* tensor, void** out_py_object);
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);  // may be null
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

}  // namespace cutlassfa::dlpack
