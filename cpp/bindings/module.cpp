// Python bindings (the extension module `cutlassfa._C`): the forward call, device queries, and what this
// build contains. Python (python/cutlassfa/_api.py) checks the types of the options; every argument's
// values, and the arrays, are validated here (bindings/request.cpp), for every call.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/request.h"
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

// softmax_scale: NaN stands for None (1/sqrt(d), bindings/request.cpp); a NaN given is refused here.
double scale_or_default(nb::handle scale) {
  if (scale.is_none()) return std::numeric_limits<double>::quiet_NaN();
  double const value = nb::cast<double>(scale);
  if (std::isnan(value)) cutlassfa::value_error("softmax_scale must be finite, got nan");
  return value;
}

// forward()'s arguments as Python passes them (the options after sync as keywords, or positional from
// _api.py); bindings/request.cpp validates every one.
cutlassfa::bindings::Request request(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal,
                                     nb::handle scale, nb::handle window, nb::handle softcap, nb::handle cache_seqlens,
                                     nb::handle cache_leftpad, nb::handle block_table, nb::handle k_new,
                                     nb::handle v_new, nb::handle num_splits, nb::handle sinks, nb::handle alibi_slopes,
                                     nb::handle k_descale, nb::handle v_descale, nb::handle q_descale,
                                     nb::handle out_dtype, nb::handle cu_seqlens_q,
                                     nb::handle cu_seqlens_k, nb::handle max_seqlen_q, nb::handle max_seqlen_k) {
  cutlassfa::bindings::Request r;
  r.q = q, r.k = k, r.v = v, r.out = out, r.causal = causal, r.scale = scale_or_default(scale);
  r.window = window, r.softcap = softcap;
  r.cache_seqlens = cache_seqlens, r.cache_leftpad = cache_leftpad, r.block_table = block_table;
  r.k_new = k_new, r.v_new = v_new, r.num_splits = num_splits, r.sinks = sinks;
  r.alibi_slopes = alibi_slopes, r.k_descale = k_descale, r.v_descale = v_descale, r.q_descale = q_descale;
  r.out_dtype = out_dtype;
  r.cu_seqlens_q = cu_seqlens_q, r.cu_seqlens_k = cu_seqlens_k;
  r.max_seqlen_q = max_seqlen_q, r.max_seqlen_k = max_seqlen_k;
  return r;
}

#define CUTLASSFA_OPTION_ARGS                                                                                      \
  "window"_a.none() = nb::none(), "softcap"_a.none() = nb::none(), "cache_seqlens"_a.none() = nb::none(),           \
      "cache_leftpad"_a.none() = nb::none(), "block_table"_a.none() = nb::none(), "k_new"_a.none() = nb::none(),   \
      "v_new"_a.none() = nb::none(), "num_splits"_a.none() = nb::none(), "sinks"_a.none() = nb::none(),            \
      "alibi_slopes"_a.none() = nb::none(), "k_descale"_a.none() = nb::none(), "v_descale"_a.none() = nb::none(),  \
      "q_descale"_a.none() = nb::none(), "out_dtype"_a.none() = nb::none(),                                        \
      "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(),                                  \
      "max_seqlen_q"_a.none() = nb::none(), "max_seqlen_k"_a.none() = nb::none()
#define CUTLASSFA_OPTION_PARAMS                                                                                   \
  nb::handle window, nb::handle softcap, nb::handle cache_seqlens, nb::handle cache_leftpad, nb::handle block_table, \
      nb::handle k_new, nb::handle v_new, nb::handle num_splits, nb::handle sinks, nb::handle alibi_slopes,         \
      nb::handle k_descale, nb::handle v_descale, nb::handle q_descale, nb::handle out_dtype,                      \
      nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, nb::handle max_seqlen_q, nb::handle max_seqlen_k
#define CUTLASSFA_REQUEST                                                                                          \
  request(q, k, v, out, causal, scale, window, softcap, cache_seqlens, cache_leftpad, block_table, k_new, v_new,  \
          num_splits, sinks, alibi_slopes, k_descale, v_descale, q_descale, out_dtype, cu_seqlens_q, cu_seqlens_k,   \
          max_seqlen_q, max_seqlen_k)

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
  // Validation raises cutlassfa::ArgumentError (no Python state: it may be thrown without the GIL).
  nb::register_exception_translator([](const std::exception_ptr& error, void*) {
    try {
      std::rethrow_exception(error);
    } catch (const cutlassfa::ArgumentError& e) {
      PyObject* const type = e.kind() == cutlassfa::ArgumentError::Kind::kType ? PyExc_TypeError
                             : e.kind() == cutlassfa::ArgumentError::Kind::kNotImplemented ? PyExc_NotImplementedError
                                                                                            : PyExc_ValueError;
      PyErr_SetString(type, e.what());
    }
  });

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
  head_dims["sm90decode"] = int_tuple({CUTLASSFA_SM90_DECODE_HEAD_DIMS});
  head_dims["sm90ws_fp8"] = int_tuple({CUTLASSFA_SM90WS_FP8_HEAD_DIMS});  // fp8 attention
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
  m.def("head_dim_refusal", [](Backend b, int head_dim, const std::string& dtype, int device) {
          int const code = cutlassfa::bindings::dtype_of_name(dtype);
          if (code < 0) throw nb::value_error(("unknown dtype " + dtype).c_str());
          auto const d = static_cast<cutlassfa::DType>(code);
          if (d == cutlassfa::DType::kFloat8E4M3) {  // fp8 attention: its own kernel and head dims
            return cutlassfa::bindings::fp8_attention_refusal(b, d, head_dim, cutlassfa::device_capability(device));
          }
          return cutlassfa::head_dim_refusal(b, head_dim, d);
        },
        "backend"_a, "head_dim"_a, "dtype"_a, "device"_a = 0);
  m.def("fp8_attention_options_refusal", [](bool varlen, bool kv_cache, bool softcap, bool alibi, bool split) {
          return cutlassfa::bindings::fp8_attention_options_refusal(varlen, kv_cache, softcap, alibi, split);
        },
        "varlen"_a, "kv_cache"_a, "softcap"_a, "alibi"_a, "split"_a,
        "Why the GPU's fp8 attention refuses a call with these options (\"\" when it takes them).");
  m.attr("LIMIT_PREFIX") = cutlassfa::kLimitPrefix;
  m.def("set_check_device_values", &cutlassfa::bindings::set_check_device_values, "on"_a,
        "The debug switch of bindings/request.h: device index values read back and checked (one synchronization).");
  m.def("check_device_values", &cutlassfa::bindings::check_device_values);
  m.def("tensorcore_family", [](int device) {
    switch (cutlassfa::tensorcore_family(device)) {
      case cutlassfa::Family::kWgmma: return std::string("wgmma");
      case cutlassfa::Family::kMmaSync: return std::string("mma.sync");
      case cutlassfa::Family::kNone: break;
    }
    return std::string();
  }, "device"_a);
  m.def("validate", [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, nb::handle scale,
                       int backend, CUTLASSFA_OPTION_PARAMS) {
    return cutlassfa::bindings::resolve_backend(cutlassfa::bindings::validate(CUTLASSFA_REQUEST), backend);
  }, "q"_a, "k"_a, "v"_a, "out"_a.none(), "causal"_a, "scale"_a.none(), "backend"_a, CUTLASSFA_OPTION_ARGS,
        "Validates the arguments of forward (varlen_forward: cu_seqlens_q / cu_seqlens_k given) and returns the "
        "backend it would run (BACKEND_CPU for cpu).");

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
                      int backend, bool return_lse, nb::handle alloc, int64_t stream, bool sync, CUTLASSFA_OPTION_PARAMS) {
    return cutlassfa::bindings::forward(CUTLASSFA_REQUEST, backend, return_lse, alloc, stream, sync);
  }, "q"_a, "k"_a, "v"_a, "out"_a.none(), "causal"_a, "scale"_a.none(), "backend"_a, "return_lse"_a,
        "alloc"_a.none(), "stream"_a, "sync"_a, CUTLASSFA_OPTION_ARGS,
        "The whole call: validation, backend, outputs, launch. Returns (out, lse or None), or None when the "
        "backend is cpu (the caller runs it: the arguments are valid).");
  m.def("plan", [](nb::handle q, nb::handle k, nb::handle v, bool causal, nb::handle scale, int backend, int capability,
                   int multiprocessors, CUTLASSFA_OPTION_PARAMS) {
    nb::handle const out = nb::none();  // forward allocates it
    return cutlassfa::bindings::plan(CUTLASSFA_REQUEST, backend, capability, multiprocessors);
  }, "q"_a, "k"_a, "v"_a, "causal"_a, "scale"_a.none(), "backend"_a, "capability"_a, "multiprocessors"_a,
        CUTLASSFA_OPTION_ARGS,
        "What forward would launch for the call (bindings/forward.h), launching nothing; capability <= 0: on the "
        "arrays' device.");
  m.def("set_tuning", &cutlassfa::bindings::set_tuning, "capability"_a, "multiprocessors"_a, "entries"_a,
        "Installs the measured dispatch table for devices of (capability, multiprocessors) (bindings/forward.h).");
#else
  // Without CUDA: the same validation; every GPU backend is unavailable, so only cpu resolves.
  m.def("forward", [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, nb::handle scale,
                      int backend, bool, nb::handle, int64_t, bool, CUTLASSFA_OPTION_PARAMS) -> nb::object {
    cutlassfa::bindings::resolve_backend(cutlassfa::bindings::validate(CUTLASSFA_REQUEST), backend);
    return nb::none();
  }, "q"_a, "k"_a, "v"_a, "out"_a.none(), "causal"_a, "scale"_a.none(), "backend"_a, "return_lse"_a,
        "alloc"_a.none(), "stream"_a, "sync"_a, CUTLASSFA_OPTION_ARGS);
#endif
#if CUTLASSFA_HAS_JAX_FFI
  cutlassfa::register_jax_ffi(m);
#endif
}
