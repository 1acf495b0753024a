// One description of every array `forward` accepts: numpy on the host, PyTorch tensors (host or CUDA,
// through the DLPack C exchange API), CuPy and JAX CUDA arrays (through DLPack), and our own device
// buffers (outputs for JAX, whose arrays are immutable).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "bindings/dlpack_abi.h"

namespace cutlassfa::bindings {

namespace nb = nanobind;

enum class Framework { kNumpy, kTorch, kCupy, kJax, kBuffer };

const char* framework_name(Framework framework);

struct ArrayRef {
  nb::handle object;
  Framework framework = Framework::kNumpy;
  void* data = nullptr;
  int ndim = 0;
  static constexpr int kMaxDims = 8;  // dims beyond are not recorded (the validator refuses ndim > 4)
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements
  bool whole_strides = true;          // false: a byte stride that is not a multiple of the item size
  int dtype = -1;                     // a DType, or -1 when unsupported (dtype_name says which)
  uint8_t dl_code = 255, dl_bits = 0;  // the DLPack type (code, bits): integer arrays are told apart by it
  std::string dtype_name;
  int device = -1;  // CUDA ordinal, -1 on the host
  bool readonly = false;
  const dlpack::ExchangeApi* exchange = nullptr;  // the framework's C exchange API, when it has one
  nb::object keep_alive;                          // the DLPack view, when one was made

  bool on_host() const { return device < 0; }
  bool empty() const;
};

// The DType of a dtype name ("float32", "float16", "bfloat16"), or -1 for any other name.
int dtype_of_name(const std::string& name);

// Describes `object`, raising TypeError naming `name` for anything that is not a supported array (ndim
// above 4 is reported by the validator).
ArrayRef describe(nb::handle object, const char* name);

// The framework's C exchange API of `object`'s type, cached per type; nullptr when it has none.
const dlpack::ExchangeApi* exchange_api(nb::handle object);

}  // namespace cutlassfa::bindings
