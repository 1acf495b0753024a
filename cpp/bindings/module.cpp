// Python bindings (the extension module `cutlassfa._C`): the forward call, device queries, and what this
// build contains. Argument types are checked in python/cutlassfa/_api.py; everything about the arrays is
// checked here (bindings/problem.cpp).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/problem.h"
#include "bindings/variant.h"
#include "cutlassfa/backends.h"
#include "cutlassfa/config.h"

#if CUTLASSFA_HAS_CUDA
#include <cuda_runtime.h>

#include "bindings/cuda_errors.h"
#include "bindings/device_buffer.h"
#include "bindings/forward.h"
#include "cutlassfa/workspace.h"
#endif
#if CUTLASSFA_HAS_JAX_FFI
#include "jax/ffi.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;
using cutlassfa::Backend;

namespace {

nb::tuple int_tuple(std::initializer_list<int> values) {
  nb::list items;
  for (int x : values) items.append(x);
  return nb::steal<nb::tuple>(PySequence_Tuple(items.ptr()));
}

double scale_or_default(nb::handle scale) {
  return scale.is_none() ? std::numeric_limits<double>::quiet_NaN() : nb::cast<double>(scale);
}

// The variant arguments of validate_variant / forward_variant, as Python passes them (keywords).
cutlassfa::bindings::VariantArgs variant_args(int window_left, int window_right, double softcap, nb::handle cache_seqlens,
                                              nb::handle cache_leftpad, nb::handle block_table, nb::handle k_new,
                                              nb::handle v_new, int64_t num_splits, nb::handle cu_seqlens_q,
                                              nb::handle cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  cutlassfa::bindings::VariantArgs args;
  args.window_left = window_left, args.window_right = window_right, args.softcap = softcap;
  args.cache_seqlens = cache_seqlens, args.cache_leftpad = cache_leftpad, args.block_table = block_table;
  args.k_new = k_new, args.v_new = v_new, args.num_splits = num_splits;
  args.cu_seqlens_q = cu_seqlens_q, args.cu_seqlens_k = cu_seqlens_k;
  args.max_seqlen_q = max_seqlen_q, args.max_seqlen_k = max_seqlen_k;
  return args;
}

#define CUTLASSFA_VARIANT_ARGS                                                                                   \
  "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.0, "cache_seqlens"_a.none() = nb::none(),          \
      "cache_leftpad"_a.none() = nb::none(), "block_table"_a.none() = nb::none(), "k_new"_a.none() = nb::none(), \
      "v_new"_a.none() = nb::none(), "num_splits"_a = 0, "cu_seqlens_q"_a.none() = nb::none(),                  \
      "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = -1, "max_seqlen_k"_a = -1

#if CUTLASSFA_HAS_CUDA
nb::dict device_properties(int device) {
  using cutlassfa::bindings::check;
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
  cutlassfa::bindings::DeviceGuard guard(device);
  size_t free_bytes = 0, total_bytes = 0;
  cutlassfa::bindings::check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return nb::make_tuple(free_bytes, total_bytes);
}

// Hands a filled DeviceBuffer to JAX through DLPack, zero copy; the array keeps the buffer alive.
nb::ndarray<nb::jax> wrap_jax(nb::handle buffer_object, std::vector<size_t> shape, int dtype_code, int bits) {
  auto& buffer = nb::cast<cutlassfa::bindings::DeviceBuffer&>(buffer_object);
  nb::dlpack::dtype dtype{static_cast<uint8_t>(dtype_code), static_cast<uint8_t>(bits), 1};
  return nb::ndarray<nb::jax>(reinterpret_cast<void*>(buffer.ptr()), shape.size(), shape.data(), buffer_object,
                              nullptr, dtype, nb::device::cuda::value, buffer.device());
}

void synchronize(int device, uintptr_t stream) {
  cutlassfa::bindings::DeviceGuard guard(device);
  nb::gil_scoped_release release;
  cutlassfa::bindings::check(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}
#endif

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "cutlassfa extension (internal; use the cutlassfa package)";

  m.attr("has_cuda") = bool(CUTLASSFA_HAS_CUDA);
  m.attr("compiled_architectures") = CUTLASSFA_ARCHITECTURES;
  m.attr("tensorcore_architectures") = CUTLASSFA_SM80_ARCHITECTURES;
  m.attr("wgmma_architectures") = CUTLASSFA_SM90_ARCHITECTURES;
  // Head dims with compiled kernels, per kernel family: the one list of CMakeLists.txt.
  nb::dict head_dims;
  head_dims["small_tile"] = int_tuple({CUTLASSFA_SMALL_TILE_HEAD_DIMS});
  head_dims["large_tile"] = int_tuple({CUTLASSFA_LARGE_TILE_HEAD_DIMS});
  head_dims["sm80"] = int_tuple({CUTLASSFA_SM80_HEAD_DIMS});
  head_dims["sm90"] = int_tuple({CUTLASSFA_SM90_HEAD_DIMS});
  m.attr("head_dims") = head_dims;
  m.attr("BACKEND_AUTO") = cutlassfa::bindings::kBackendAuto;
  m.attr("BACKEND_CPU") = cutlassfa::bindings::kBackendCpu;

  nb::enum_<Backend>(m, "Backend")
      .value("naive", Backend::kNaive)
      .value("small_tile", Backend::kSmallTile)
      .value("large_tile", Backend::kLargeTile)
      .value("tensorcore", Backend::kTensorCore)
      .value("tensorcore_sm80", Backend::kTensorCoreSm80);

  m.def("device_count", [] {
    std::string reason;
    int const count = cutlassfa::device_count(&reason);
    return nb::make_tuple(count, reason);
  });
  m.def("backend_unavailable_reason", [](Backend b, int device) { return cutlassfa::backend_unavailable_reason(b, device); },
        "backend"_a, "device"_a);
  m.def("head_dim_refusal", [](Backend b, int head_dim, const std::string& dtype) {
          int const code = cutlassfa::bindings::dtype_of_name(dtype);
          if (code < 0) throw nb::value_error(("unknown dtype " + dtype).c_str());
          return cutlassfa::head_dim_refusal(b, head_dim, static_cast<cutlassfa::DType>(code));
        },
        "backend"_a, "head_dim"_a, "dtype"_a);
  m.attr("LIMIT_PREFIX") = cutlassfa::kLimitPrefix;
  m.def("tensorcore_family", [](int device) {
    switch (cutlassfa::tensorcore_family(device)) {
      case cutlassfa::Family::kWgmma: return std::string("wgmma");
      case cutlassfa::Family::kMmaSync: return std::string("mma.sync");
      case cutlassfa::Family::kNone: break;
    }
    return std::string();
  }, "device"_a);
  m.def("validate", [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, nb::handle scale,
                       int backend) {
    return cutlassfa::bindings::resolve_backend(
        cutlassfa::bindings::validate(q, k, v, out, causal, scale_or_default(scale)), backend);
  }, "q"_a, "k"_a, "v"_a, "out"_a.none(), "causal"_a, "scale"_a.none(), "backend"_a,
        "Validates the arguments of forward and returns the backend it would run (BACKEND_CPU for cpu).");
  m.def("validate_variant", [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, nb::handle scale,
                               int backend, int window_left, int window_right, double softcap, nb::handle cache_seqlens,
                               nb::handle cache_leftpad, nb::handle block_table, nb::handle k_new, nb::handle v_new,
                               int64_t num_splits, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                               int64_t max_seqlen_q, int64_t max_seqlen_k) {
    auto const args = variant_args(window_left, window_right, softcap, cache_seqlens, cache_leftpad, block_table, k_new,
                                   v_new, num_splits, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    auto const vp = cutlassfa::bindings::validate_variant(q, k, v, out, causal, scale_or_default(scale), args);
    return cutlassfa::bindings::resolve_backend(vp.problem, backend);
  }, "q"_a, "k"_a, "v"_a, "out"_a.none(), "causal"_a, "scale"_a.none(), "backend"_a, CUTLASSFA_VARIANT_ARGS,
        "validate for forward with variant arguments (window, softcap, KV caches, num_splits) and varlen_forward "
        "(cu_seqlens_q / cu_seqlens_k given).");

#if CUTLASSFA_HAS_CUDA
  m.attr("stream_per_thread") = reinterpret_cast<uintptr_t>(cudaStreamPerThread);
  nb::class_<cutlassfa::bindings::DeviceBuffer>(m, "DeviceBuffer")
      .def(nb::init<size_t, int>(), "bytes"_a, "device"_a)
      .def_prop_ro("ptr", &cutlassfa::bindings::DeviceBuffer::ptr)
      .def_prop_ro("bytes", &cutlassfa::bindings::DeviceBuffer::bytes)
      .def_prop_ro("device", &cutlassfa::bindings::DeviceBuffer::device);
  m.def("device_properties", &device_properties, "device"_a);
  m.def("memory_info", &memory_info, "device"_a);
  m.def("wrap_jax", &wrap_jax, "buffer"_a, "shape"_a, "dtype_code"_a, "bits"_a);
  m.def("synchronize", &synchronize, "device"_a, "stream"_a);
  m.def("empty_cache", [] { cutlassfa::bindings::check(cutlassfa::workspace_trim(), "cudaMemPoolTrimTo"); });
  m.def("forward", [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, nb::handle scale,
                      int backend, bool return_lse, nb::handle alloc, int64_t stream, bool sync) {
    return cutlassfa::bindings::forward(q, k, v, out, causal, scale_or_default(scale), backend, return_lse, alloc,
                                        stream, sync);
  }, "q"_a, "k"_a, "v"_a, "out"_a.none(), "causal"_a, "scale"_a.none(), "backend"_a, "return_lse"_a,
        "alloc"_a.none(), "stream"_a, "sync"_a);
  m.def("forward_variant", [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, nb::handle scale,
                              int backend, bool return_lse, nb::handle alloc, int64_t stream, bool sync, int window_left,
                              int window_right, double softcap, nb::handle cache_seqlens, nb::handle cache_leftpad,
                              nb::handle block_table, nb::handle k_new, nb::handle v_new, int64_t num_splits,
                              nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
                              int64_t max_seqlen_k) {
    auto const args = variant_args(window_left, window_right, softcap, cache_seqlens, cache_leftpad, block_table, k_new,
                                   v_new, num_splits, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    return cutlassfa::bindings::forward_variant(q, k, v, out, causal, scale_or_default(scale), backend, return_lse,
                                                alloc, stream, sync, args);
  }, "q"_a, "k"_a, "v"_a, "out"_a.none(), "causal"_a, "scale"_a.none(), "backend"_a, "return_lse"_a,
        "alloc"_a.none(), "stream"_a, "sync"_a, CUTLASSFA_VARIANT_ARGS);
#endif
#if CUTLASSFA_HAS_JAX_FFI
  cutlassfa::register_jax_ffi(m);
#endif
}
