// Python bindings: a thin layer. Argument validation lives in python/cutlassfa/_api.py; this module
// describes arrays (through DLPack), owns device buffers, copies, and runs one backend on one stream.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cutlassfa/dispatch.h"

namespace nb = nanobind;
using namespace nb::literals;
using cutlassfa::Backend;
using cutlassfa::FwdParams;

namespace {

// Raises a Python exception carrying the CUDA error string; out-of-memory becomes MemoryError.
void throw_cuda_error(cudaError_t status, const char* what, size_t bytes = 0) {
  cudaGetLastError();  // reset the last (non-sticky) error so the next call starts clean
  if (status == cudaErrorMemoryAllocation && bytes > 0) {
    PyErr_Format(PyExc_MemoryError, "%s: CUDA out of memory allocating %zu bytes (%s)", what, bytes,
                 cudaGetErrorString(status));
  } else if (status == cudaErrorMemoryAllocation) {
    PyErr_Format(PyExc_MemoryError, "%s: CUDA out of memory for its workspace (%s)", what,
                 cudaGetErrorString(status));
  } else {
    PyErr_Format(PyExc_RuntimeError, "%s: %s (%s)", what, cudaGetErrorString(status),
                 cudaGetErrorName(status));
  }
  throw nb::python_error();
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw_cuda_error(status, what);
}

// Makes `device` current for the scope and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Device memory owned by Python (the host-array path and outputs for frameworks without an allocator).
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, int device) : bytes_(bytes), device_(device) {
    DeviceGuard guard(device);
    cudaError_t status = cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes);
    if (status != cudaSuccess) throw_cuda_error(status, "DeviceBuffer", bytes);
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      int previous = 0;
      cudaGetDevice(&previous);
      cudaSetDevice(device_);
      cudaFree(ptr_);
      cudaSetDevice(previous);
    }
  }
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

nb::tuple device_count() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return nb::make_tuple(0, std::string(cudaGetErrorString(status)));
  }
  return nb::make_tuple(count, std::string());
}

nb::dict device_properties(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  nb::dict d;
  d["name"] = std::string(prop.name);
  d["compute_capability"] = nb::make_tuple(prop.major, prop.minor);
  d["multiprocessors"] = prop.multiProcessorCount;
  d["total_memory"] = static_cast<size_t>(prop.totalGlobalMem);
  d["l2_cache_bytes"] = prop.l2CacheSize;
  d["shared_memory_per_block_optin"] = static_cast<size_t>(prop.sharedMemPerBlockOptin);
  d["driver_version"] = driver;
  d["runtime_version"] = runtime;
  return d;
}

nb::tuple memory_info(int device) {
  DeviceGuard guard(device);
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return nb::make_tuple(free_bytes, total_bytes);
}

// (data pointer, shape, strides in elements, (dtype code, bits), (device type, device id)) of any
// DLPack-capable array: numpy, CuPy, PyTorch, JAX.
nb::tuple describe(nb::ndarray<nb::ro> array) {
  std::vector<int64_t> shape, strides;
  for (size_t i = 0; i < array.ndim(); ++i) {
    shape.push_back(static_cast<int64_t>(array.shape(i)));
    strides.push_back(array.stride(i));
  }
  nb::dlpack::dtype dtype = array.dtype();
  return nb::make_tuple(reinterpret_cast<uintptr_t>(array.data()), shape, strides,
                        nb::make_tuple(static_cast<int>(dtype.code), static_cast<int>(dtype.bits)),
                        nb::make_tuple(array.device_type(), array.device_id()));
}

// Exports a filled DeviceBuffer to JAX through DLPack, zero copy: JAX arrays cannot be allocated from
// here, so forward() writes into a buffer of ours and wraps it; the array keeps the buffer alive.
nb::ndarray<nb::jax> wrap_jax(nb::handle buffer_object, std::vector<size_t> shape, int dtype_code, int bits) {
  auto& buffer = nb::cast<DeviceBuffer&>(buffer_object);
  nb::dlpack::dtype dtype{static_cast<uint8_t>(dtype_code), static_cast<uint8_t>(bits), 1};
  return nb::ndarray<nb::jax>(reinterpret_cast<void*>(buffer.ptr()), shape.size(), shape.data(),
                              buffer_object, nullptr, dtype, nb::device::cuda::value, buffer.device());
}

void memcpy_2d(uintptr_t dst, size_t dst_pitch, uintptr_t src, size_t src_pitch, size_t width,
               size_t height, int device, uintptr_t stream) {
  DeviceGuard guard(device);
  nb::gil_scoped_release release;
  check(cudaMemcpy2DAsync(reinterpret_cast<void*>(dst), dst_pitch, reinterpret_cast<const void*>(src),
                          src_pitch, width, height, cudaMemcpyDefault,
                          reinterpret_cast<cudaStream_t>(stream)),
        "cudaMemcpy2DAsync");
}

void synchronize(int device, uintptr_t stream) {
  DeviceGuard guard(device);
  nb::gil_scoped_release release;
  check(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

void forward(Backend backend, const FwdParams& params, int device, uintptr_t stream) {
  DeviceGuard guard(device);
  cudaError_t status;
  {
    nb::gil_scoped_release release;
    status = cutlassfa::run_forward(backend, params,
                                    reinterpret_cast<cudaStream_t>(stream));
  }
  check(status, "cutlassfa kernel launch");
}

template <typename T>
void def_pointer(nb::class_<FwdParams>& cls, const char* name, T FwdParams::*member) {
  cls.def_prop_rw(
      name, [member](const FwdParams& p) { return reinterpret_cast<uintptr_t>(p.*member); },
      [member](FwdParams& p, uintptr_t value) { p.*member = reinterpret_cast<T>(value); });
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "cutlassfa CUDA extension (internal; use the cutlassfa package)";

  m.attr("compiled_architectures") = CUTLASSFA_ARCHITECTURES;
  m.attr("tensorcore_architectures") = CUTLASSFA_SM80_ARCHITECTURES;
  m.attr("wgmma_architectures") = CUTLASSFA_SM90_ARCHITECTURES;
  m.attr("stream_per_thread") = reinterpret_cast<uintptr_t>(cudaStreamPerThread);

  nb::enum_<Backend>(m, "Backend")
      .value("naive", Backend::kNaive)
      .value("small_tile", Backend::kSmallTile)
      .value("large_tile", Backend::kLargeTile)
      .value("tensorcore", Backend::kTensorCore)
      .value("tensorcore_sm80", Backend::kTensorCoreSm80);
  m.def("min_compute_capability", [](Backend b) { return cutlassfa::min_compute_capability(b); });
  m.def("is_compiled", [](Backend b) { return cutlassfa::is_compiled(b); });

  nb::class_<FwdParams> params(m, "FwdParams");
  params.def(nb::init<>());
  def_pointer(params, "q", &FwdParams::q);
  def_pointer(params, "k", &FwdParams::k);
  def_pointer(params, "v", &FwdParams::v);
  def_pointer(params, "o", &FwdParams::o);
  def_pointer(params, "lse", &FwdParams::lse);
  params.def_rw("q_batch_stride", &FwdParams::q_batch_stride)
      .def_rw("q_head_stride", &FwdParams::q_head_stride)
      .def_rw("q_row_stride", &FwdParams::q_row_stride)
      .def_rw("k_batch_stride", &FwdParams::k_batch_stride)
      .def_rw("k_head_stride", &FwdParams::k_head_stride)
      .def_rw("k_row_stride", &FwdParams::k_row_stride)
      .def_rw("v_batch_stride", &FwdParams::v_batch_stride)
      .def_rw("v_head_stride", &FwdParams::v_head_stride)
      .def_rw("v_row_stride", &FwdParams::v_row_stride)
      .def_rw("o_batch_stride", &FwdParams::o_batch_stride)
      .def_rw("o_head_stride", &FwdParams::o_head_stride)
      .def_rw("o_row_stride", &FwdParams::o_row_stride)
      .def_rw("batch", &FwdParams::batch)
      .def_rw("heads_q", &FwdParams::heads_q)
      .def_rw("heads_kv", &FwdParams::heads_kv)
      .def_rw("heads_ratio", &FwdParams::heads_ratio)
      .def_rw("seqlen_q", &FwdParams::seqlen_q)
      .def_rw("seqlen_k", &FwdParams::seqlen_k)
      .def_rw("head_dim", &FwdParams::head_dim)
      .def_rw("softmax_scale", &FwdParams::softmax_scale)
      .def_rw("softmax_scale_log2", &FwdParams::softmax_scale_log2)
      .def_rw("causal", &FwdParams::causal)
      .def_prop_rw(
          "dtype", [](const FwdParams& p) { return static_cast<int>(p.dtype); },
          [](FwdParams& p, int value) { p.dtype = static_cast<cutlassfa::DType>(value); });

  nb::class_<DeviceBuffer>(m, "DeviceBuffer")
      .def(nb::init<size_t, int>(), "bytes"_a, "device"_a)
      .def_prop_ro("ptr", &DeviceBuffer::ptr)
      .def_prop_ro("bytes", &DeviceBuffer::bytes)
      .def_prop_ro("device", &DeviceBuffer::device);

  m.def("device_count", &device_count);
  m.def("device_properties", &device_properties, "device"_a);
  m.def("memory_info", &memory_info, "device"_a);
  m.def("describe", &describe, "array"_a);
  m.def("wrap_jax", &wrap_jax, "buffer"_a, "shape"_a, "dtype_code"_a, "bits"_a);
  m.def("memcpy_2d", &memcpy_2d, "dst"_a, "dst_pitch"_a, "src"_a, "src_pitch"_a, "width"_a, "height"_a,
        "device"_a, "stream"_a);
  m.def("synchronize", &synchronize, "device"_a, "stream"_a);
  m.def("forward", &forward, "backend"_a, "params"_a, "device"_a, "stream"_a);
}
