#include "bindings/request.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/alignment.h"
#include "cutlassfa/config.h"
#if CUTLASSFA_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace cutlassfa::bindings {

// Python's repr of a tuple of ints: (2, 3) or (5,). No iostreams: inserting an integer into an
// ostringstream crashed inside the CUDA build of the extension on the H200 machine's toolchain.
std::string tuple_text(const int64_t* values, int n) {
  std::string text = "(";
  for (int i = 0; i < n; ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + (n == 1 ? ",)" : ")");
}

namespace {

constexpr int64_t kInt32Max = (int64_t{1} << 31) - 1;

std::string num(int64_t x) { return std::to_string(x); }
int recorded(const ArrayRef& a) { return a.ndim < ArrayRef::kMaxDims ? a.ndim : ArrayRef::kMaxDims; }
std::string strides_text(const ArrayRef& a) { return tuple_text(a.strides, recorded(a)); }
std::string where(const ArrayRef& a) { return a.on_host() ? "host" : "cuda:" + std::to_string(a.device); }

std::string dtype_text(const ArrayRef& a) {
  if (a.dtype >= 0 || a.framework == Framework::kNumpy) return a.dtype_name;
  switch (a.dl_code) {
    case dlpack::kInt: return "int" + num(a.dl_bits);
    case dlpack::kUInt: return "uint" + num(a.dl_bits);
    case dlpack::kFloat: return "float" + num(a.dl_bits);
  }
  return a.dtype_name;
}

const std::set<int>& all_head_dims() {
  static std::set<int> const dims{CUTLASSFA_SMALL_TILE_HEAD_DIMS, CUTLASSFA_LARGE_TILE_HEAD_DIMS,
                                  CUTLASSFA_SM80_HEAD_DIMS};
  return dims;
}

const char* backend_label(int backend) {
  if (backend == kBackendCpu) return "cpu";
  if (backend >= 0 && backend <= static_cast<int>(Backend::kTensorCoreSm80)) {
    return backend_name(static_cast<Backend>(backend));
  }
  return "auto";
}

// ---- Arrays ----------------------------------------------------------------------------------------

void check_row_contiguous(const ArrayRef& a, const char* name) {
  if (a.empty()) return;  // nothing is read from an empty array; numpy gives it zero strides
  if (a.strides[a.ndim - 1] != 1) {
    value_error(std::string(name) + " must be contiguous in its last dim (stride 1), got strides " + strides_text(a));
  }
  if (!a.whole_strides) {
    value_error(std::string(name) + " has strides that are not whole elements: " + strides_text(a));
  }
}

// Call::out_dtype from out_dtype (None or a dtype name) and q's dtype.
void resolve_out_dtype(Call& c, nb::handle out_dtype) {
  bool const q_fp8 = c.q.dtype == static_cast<int>(DType::kFloat8E4M3);
  std::string name = q_fp8 ? "bfloat16" : c.q.dtype_name;
  if (out_dtype.is_valid() && !out_dtype.is_none()) {
    if (!nb::isinstance<nb::str>(out_dtype)) {
      type_error("out_dtype must be a dtype or its name, got " + nb::cast<std::string>(nb::repr(out_dtype)));
    }
    std::string const asked = nb::cast<std::string>(out_dtype);
    if (q_fp8 && asked != "bfloat16" && asked != "float16") {
      value_error("out_dtype of fp8 attention must be bfloat16 or float16, got " + asked);
    }
    if (!q_fp8 && asked != name) {
      value_error("out_dtype is for fp8 attention (float8_e4m3fn q, k and v); a " + name + " call returns " + name +
                  ", got out_dtype " + asked);
    }
    name = asked;
  }
  c.out_dtype_name = name;
  c.out_dtype = static_cast<DType>(dtype_of_name(name));
  if (q_fp8) c.problem.out_dtype = c.out_dtype;
}

// q, k, v described, of `rank` dims (0: 3 or 4; `layout` names the expected shape), one dtype, device
// and framework, rows contiguous.
void describe_qkv(Call& c, const Request& r, int rank, const char* layout) {
  c.q = describe(r.q, "q");
  c.k = describe(r.k, "k");
  c.v = describe(r.v, "v");
  const ArrayRef* arrays[3] = {&c.q, &c.k, &c.v};
  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const ArrayRef& a = *arrays[i];
    if (rank == 0 ? (a.ndim != 3 && a.ndim != 4) : a.ndim != rank) {
      value_error(std::string(names[i]) + " must be " + layout + ", got shape " + shape_text(a));
    }
    if (a.dtype < 0) {
      type_error(std::string(names[i]) + " has dtype " + dtype_text(a) +
                 "; expected one of float32, float16, bfloat16 (or float8_e4m3fn: fp8 attention, or k and v as a KV "
                 "cache with float16 / bfloat16 q)");
    }
  }
  if (!(c.q.ndim == c.k.ndim && c.k.ndim == c.v.ndim)) {
    value_error("q, k and v must have the same rank, got shapes " + shape_text(c.q) + ", " + shape_text(c.k) + ", " +
                shape_text(c.v));
  }
  // fp8 attention: q, k and v float8_e4m3fn. An fp8 cache (params.h kv_fp8): k and v float8_e4m3fn, q fp16 /
  // bf16. Else one dtype for all three.
  int const e4m3 = static_cast<int>(DType::kFloat8E4M3);
  bool const fp8 = c.k.dtype == e4m3 || c.v.dtype == e4m3;
  if (c.q.dtype == e4m3 && !(c.k.dtype == e4m3 && c.v.dtype == e4m3)) {
    type_error("q is float8_e4m3fn: k and v must be float8_e4m3fn too (fp8 attention), got " + c.k.dtype_name +
               " and " + c.v.dtype_name);
  }
  if (fp8 && c.k.dtype != c.v.dtype) {
    type_error("k and v must have the same dtype, got " + c.k.dtype_name + " and " + c.v.dtype_name);
  }
  if (fp8 && c.q.dtype == static_cast<int>(DType::kFloat32)) {
    type_error("q must be float16 or bfloat16 with a float8_e4m3fn KV cache (or float8_e4m3fn: fp8 attention), got " +
               c.q.dtype_name);
  }
  if (!fp8 && !(c.q.dtype == c.k.dtype && c.k.dtype == c.v.dtype)) {
    type_error("q, k and v must have the same dtype, got " + c.q.dtype_name + ", " + c.k.dtype_name + ", " +
               c.v.dtype_name);
  }
  if (!(c.q.device == c.k.device && c.k.device == c.v.device)) {
    value_error("q, k and v must be on the same device, got " + where(c.q) + ", " + where(c.k) + ", " + where(c.v));
  }
  if (c.q.framework != c.k.framework || c.k.framework != c.v.framework) {
    type_error(std::string("q, k and v must be arrays of the same framework, got ") + framework_name(c.q.framework) +
               ", " + framework_name(c.k.framework) + ", " + framework_name(c.v.framework));
  }
  for (int i = 0; i < 3; ++i) check_row_contiguous(*arrays[i], names[i]);
  c.problem.rank = c.q.ndim;
  c.problem.dtype = static_cast<DType>(c.q.dtype);
  c.problem.kv_fp8 = fp8;
  c.device = c.q.device;
  resolve_out_dtype(c, r.out_dtype);
}

void check_heads_and_head_dim(int64_t heads_q, int64_t heads_kv, int64_t head_dim, const char* kv_name) {
  if ((heads_kv == 0 && heads_q != 0) || (heads_kv != 0 && heads_q % heads_kv != 0)) {
    value_error("the heads of q (" + num(heads_q) + ") must be a multiple of the heads of " + kv_name + " (" +
                num(heads_kv) + ")");
  }
  // Every multiple of 8 up to 256 is a valid problem (the cpu backend takes them all); which backends have
  // kernels for it is resolve_backend's question.
  if (head_dim < 8 || head_dim > kMaxHeadDim || head_dim % 8 != 0) {
    value_error("head dim (last dim of q, k, v) must be a multiple of 8 from 8 to " + num(kMaxHeadDim) + ", got " +
                num(head_dim));
  }
}

// out of `expected` shape (n dims), q's dtype, framework and device, rows contiguous, writable.
void validate_out(Call& c, nb::handle out, const int64_t* expected, int n) {
  if (!out.is_valid() || out.is_none()) return;
  ArrayRef o = describe(out, "out");
  if (o.framework == Framework::kBuffer) {  // our own output buffer (JAX): compact by construction
    c.out = o;
    return;
  }
  if (o.framework != c.q.framework) {
    type_error(std::string("out must be a ") + framework_name(c.q.framework) + " array like q, got " +
               framework_name(o.framework));
  }
  if (o.framework == Framework::kJax) type_error("out is not supported for JAX arrays (they are immutable)");
  bool same = o.ndim == n;
  for (int i = 0; same && i < n; ++i) same = o.shape[i] == expected[i];
  if (!same) value_error("out must have shape " + tuple_text(expected, n) + ", got " + shape_text(o));
  if (o.dtype != static_cast<int>(c.out_dtype)) {
    type_error("out must have dtype " + c.out_dtype_name +
               (c.problem.dtype == DType::kFloat8E4M3 ? " (out_dtype)" : " like q") + ", got " + o.dtype_name);
  }
  if (o.device != c.device) value_error("out must be on the same device as q");
  if (!o.empty() && (o.strides[o.ndim - 1] != 1 || !o.whole_strides)) {
    value_error("out must be contiguous in its last dim (stride 1), got strides " + strides_text(o));
  }
  if (o.readonly) value_error("out is read-only");
  c.out = o;
}

// Element i (row-major over the recorded shape) of a host integer array, as int64.
int64_t host_int(const ArrayRef& a, int64_t i) {
  int64_t offset = 0;
  for (int d = a.ndim - 1; d >= 0; --d) {
    offset += (i % a.shape[d]) * a.strides[d];
    i /= a.shape[d];
  }
  const char* at = static_cast<const char*>(a.data) + offset * (a.dl_bits / 8);
  bool const is_signed = a.dl_code == dlpack::kInt;
  switch (a.dl_bits) {
    case 8: return is_signed ? int64_t(*reinterpret_cast<const int8_t*>(at)) : int64_t(*reinterpret_cast<const uint8_t*>(at));
    case 16: return is_signed ? int64_t(*reinterpret_cast<const int16_t*>(at)) : int64_t(*reinterpret_cast<const uint16_t*>(at));
    case 32: return is_signed ? int64_t(*reinterpret_cast<const int32_t*>(at)) : int64_t(*reinterpret_cast<const uint32_t*>(at));
    default: {
      uint64_t const bits = *reinterpret_cast<const uint64_t*>(at);
      return is_signed ? static_cast<int64_t>(bits) : (bits > uint64_t(kInt32Max) ? kInt32Max + 1 : int64_t(bits));
    }
  }
}

bool given(nb::handle h) { return h.is_valid() && !h.is_none(); }

std::atomic<bool> g_check_device_values{false};

// Reads a device index array back into index.values (check_device_values). The first read of a call
// waits for the device (`synchronized`), so that values written on any stream are there.
void read_back(IndexArray& index, const ArrayRef& a, const char* name, bool* synchronized) {
#if CUTLASSFA_HAS_CUDA
  int previous = 0;
  cudaError_t err = cudaGetDevice(&previous);
  if (err == cudaSuccess && previous != a.device) err = cudaSetDevice(a.device);
  if (err == cudaSuccess && !*synchronized) {
    err = cudaDeviceSynchronize();
    *synchronized = true;
  }
  index.values.resize(static_cast<size_t>(index.rows * index.cols));
  size_t const width = static_cast<size_t>(index.cols) * sizeof(int32_t);
  if (err == cudaSuccess && !index.values.empty()) {
    err = cudaMemcpy2D(index.values.data(), width, a.data, static_cast<size_t>(index.row_stride) * sizeof(int32_t),
                       width, static_cast<size_t>(index.rows), cudaMemcpyDeviceToHost);
  }
  if (previous != a.device) cudaSetDevice(previous);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("reading ") + name + " back (CUTLASSFA_CHECK_DEVICE_VALUES): " +
                             cudaGetErrorString(err));
  }
  index.read_back = true;
#else
  (void)index, (void)a, (void)synchronized;
  throw std::runtime_error(std::string("reading ") + name + " back needs the CUDA build of the extension");
#endif
}

std::string type_label(nb::handle h) { return nb::cast<std::string>(nb::type_name(h.type())); }

// An int option: a Python int or a numpy integer, not a bool. (Exact types first: a failed attribute
// lookup costs an exception, and this runs on every call that passes options.)
bool is_int(nb::handle h) {
  if (PyLong_CheckExact(h.ptr())) return true;
  if (!PyIndex_Check(h.ptr()) || PyBool_Check(h.ptr())) return false;
  return !nb::hasattr(h, "dtype") || nb::cast<std::string>(h.attr("dtype").attr("kind")) != "b";
}

int64_t int_value(nb::handle h) {
  int overflow = 0;
  nb::object index = nb::steal(PyNumber_Index(h.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  long long const x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) return overflow > 0 ? (int64_t{1} << 62) : -(int64_t{1} << 62);
  return x;
}

// An optional int option: -1 when None.
int64_t optional_int(nb::handle h, const char* name) {
  if (!given(h)) return -1;
  if (!is_int(h)) type_error(std::string(name) + " must be an int or None, got " + type_label(h));
  return int_value(h);
}

// window: None, or a pair (left, right) of ints (a masks.Window's fields).
void window_sides(nb::handle window, int64_t* left, int64_t* right) {
  *left = -1, *right = -1;
  if (!given(window)) return;
  nb::object pair = nb::borrow(window);
  if (!PyTuple_CheckExact(window.ptr()) && !PyList_CheckExact(window.ptr()) && nb::hasattr(window, "left") &&
      nb::hasattr(window, "right")) {  // a masks.Window
    pair = nb::make_tuple(window.attr("left"), window.attr("right"));
  }
  bool const sequence = PySequence_Check(pair.ptr()) && !PyUnicode_Check(pair.ptr()) && !PyBytes_Check(pair.ptr());
  if (!sequence || PySequence_Size(pair.ptr()) != 2) {
    PyErr_Clear();
    type_error("window must be a pair (left, right) of ints or None, got " + nb::cast<std::string>(nb::repr(window)));
  }
  nb::object const l = nb::steal(PySequence_GetItem(pair.ptr(), 0)), r = nb::steal(PySequence_GetItem(pair.ptr(), 1));
  if (!is_int(l) || !is_int(r)) {
    type_error("window must be a pair (left, right) of ints, got " + nb::cast<std::string>(nb::repr(window)));
  }
  *left = int_value(l), *right = int_value(r);
}

// softcap: a float (or int), not a bool; None means 0.
double softcap_value(nb::handle h) {
  if (!given(h)) return 0.0;
  if (PyFloat_CheckExact(h.ptr())) return PyFloat_AS_DOUBLE(h.ptr());
  bool const number = (PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr()) || nb::hasattr(h, "dtype")) &&
                      !PyBool_Check(h.ptr()) && PyNumber_Check(h.ptr());
  if (!number || (nb::hasattr(h, "dtype") && nb::cast<std::string>(h.attr("dtype").attr("kind")) == "b")) {
    type_error("softcap must be a float, got " + type_label(h));
  }
  double const value = PyFloat_AsDouble(h.ptr());
  if (value == -1.0 && PyErr_Occurred()) throw nb::python_error();
  return value;
}

// An index argument of `ndim` dims, on q's device as int32, or host integer values (copied). expected:
// the shape it must have, -1 for a free extent.
IndexArray read_index(nb::handle value, const char* name, int device, int ndim, const int64_t* expected,
                      bool* synchronized) {
  IndexArray index;
  if (!given(value)) return index;
  index.given = true;
  nb::object held;  // a numpy view of a Python sequence
  if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value)) {
    try {
      held = nb::module_::import_("numpy").attr("asarray")(value);
    } catch (const nb::python_error&) {
      value_error(std::string(name) + " must be a rectangular array of ints");
    }
    if (nb::cast<std::string>(held.attr("dtype").attr("kind")) == "f" && nb::cast<int64_t>(held.attr("size")) == 0) {
      held = held.attr("astype")("int32");  // [] is float64 to numpy
    }
    value = held;
  }
  ArrayRef const a = describe(value, name);
  bool const integer = a.dl_code == dlpack::kInt || a.dl_code == dlpack::kUInt;
  if (a.ndim != ndim) value_error(std::string(name) + " must be " + num(ndim) + "-D, got shape " + shape_text(a));
  int64_t want[2] = {expected[0], ndim == 2 ? expected[1] : 1};
  for (int d = 0; d < ndim; ++d) {
    if (want[d] < 0) want[d] = a.shape[d];
  }
  bool same = true;
  for (int d = 0; d < ndim; ++d) same = same && a.shape[d] == want[d];
  if (!same) value_error(std::string(name) + " must have shape " + tuple_text(want, ndim) + ", got " + shape_text(a));
  index.rows = a.shape[0];
  index.cols = ndim == 2 ? a.shape[1] : 1;
  if (a.on_host()) {
    if (!integer || a.dl_bits > 64 || a.dl_bits < 8) {
      type_error(std::string(name) + " must hold integers, got dtype " + dtype_text(a));
    }
    int64_t const count = index.rows * index.cols;
    index.values.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      int64_t const x = host_int(a, i);
      if (x < -kInt32Max - 1 || x > kInt32Max) value_error(std::string(name) + " holds values outside the int32 range");
      index.values[static_cast<size_t>(i)] = static_cast<int32_t>(x);
    }
    index.row_stride = index.cols;
    return index;
  }
  if (a.dl_code != dlpack::kInt || a.dl_bits != 32) {
    type_error(std::string(name) + " must be an int32 array, got dtype " + dtype_text(a));
  }
  if (a.device != device) {
    value_error(std::string(name) + " must be on q's device (" + (device < 0 ? std::string("host") : "cuda:" + num(device)) +
                "), got " + where(a));
  }
  if (a.shape[ndim - 1] > 1 && a.strides[ndim - 1] != 1) {
    value_error(std::string(name) + " must be contiguous in its last dim, got strides " + strides_text(a));
  }
  index.device_data = static_cast<const int*>(a.data);
  index.row_stride = ndim == 2 ? a.strides[0] : 1;
  if (check_device_values()) read_back(index, a, name, synchronized);
  return index;
}

// An IEEE half's bits as a float (host values of fp16 per-head arguments).
float half_bits_to_float(uint16_t h) {
  int const sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float const magnitude = exponent == 0    ? std::ldexp(static_cast<float>(mantissa), -24)
                          : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                           : std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  return sign ? -magnitude : magnitude;
}

// A per-head float argument: None, or (heads,) (or, when `batch` >= 0, (batch, heads)) floats of float32,
// float16 or bfloat16 on q's device, or host values. `what` says what one value is (for the messages).
FloatArray read_per_head(nb::handle value, const char* name, const char* what, int64_t heads, int64_t batch,
                         int device, bool one_value = false) {
  FloatArray array;
  if (!given(value)) return array;
  array.given = true;
  nb::object held;
  bool const number = PyFloat_Check(value.ptr()) || (PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr()));
  if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value) || (one_value && number)) {
    try {
      held = nb::module_::import_("numpy").attr("asarray")(value, "float32");
    } catch (const nb::python_error&) {
      type_error(std::string(name) + " must be a sequence of floats or an array");
    }
    value = held;
  }
  ArrayRef const a = describe(value, name);
  bool const per_entry = a.ndim == 2 && batch >= 0;
  bool const single = one_value && a.ndim == 0;  // one value for every head (and entry)
  if (!single && !(a.ndim == 1 && a.shape[0] == heads) && !(per_entry && a.shape[0] == batch && a.shape[1] == heads)) {
    int64_t const both[2] = {batch, heads};
    std::string const shapes = std::string(one_value ? "() (a float), " : "") + "(" + num(heads) + ",)" +
                               (batch >= 0 ? " or " + tuple_text(both, 2) : "");
    value_error(std::string(name) + " must have shape " + shapes + ", " + what + ", got " + shape_text(a));
  }
  if (a.dtype < 0 || a.dtype == static_cast<int>(DType::kFloat8E4M3)) {
    type_error(std::string(name) + " must be float32, float16 or bfloat16, got dtype " + dtype_text(a));
  }
  array.rows = per_entry ? static_cast<int>(batch) : 1;
  array.heads = single ? 1 : static_cast<int>(heads);
  array.head_stride = single ? 0 : 1;
  heads = array.heads;
  DType const dtype = static_cast<DType>(a.dtype);
  int64_t const head_stride = single ? 0 : a.strides[a.ndim - 1], row_stride = per_entry ? a.strides[0] : 0;
  if (a.on_host()) {
    // The item size from the dtype: numpy's bfloat16 (ml_dtypes) has no DLPack type to take it from.
    int64_t const itemsize = dtype_bytes(dtype);
    array.values.resize(static_cast<size_t>(array.rows) * heads);
    for (int64_t r = 0; r < array.rows; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const char* at = static_cast<const char*>(a.data) + (r * row_stride + h * head_stride) * itemsize;
        uint16_t bits16 = 0;
        if (dtype != DType::kFloat32) std::memcpy(&bits16, at, 2);
        float x = 0.f;
        if (dtype == DType::kFloat32) {
          std::memcpy(&x, at, 4);
        } else if (dtype == DType::kBFloat16) {
          uint32_t const bits = uint32_t{bits16} << 16;
          std::memcpy(&x, &bits, 4);
        } else {
          x = half_bits_to_float(bits16);
        }
        array.values[static_cast<size_t>(r * heads + h)] = x;
      }
    }
    array.row_stride = per_entry ? heads : 0;
    return array;
  }
  if (a.device != device) {
    value_error(std::string(name) + " must be on q's device (" +
                (device < 0 ? std::string("host") : "cuda:" + num(device)) + "), got " + where(a));
  }
  // fp16 / bf16 are converted as one contiguous run: rows back to back, unless there is one row.
  bool const contiguous = (heads <= 1 || head_stride == 1) &&
                          (array.rows <= 1 || row_stride == heads || dtype == DType::kFloat32);
  if (!contiguous) value_error(std::string(name) + " must be contiguous, got strides " + strides_text(a));
  array.device_data = a.data;
  array.device_dtype = dtype;
  array.row_stride = per_entry ? (dtype == DType::kFloat32 ? row_stride : heads) : 0;
  return array;
}

// ---- The three shapes of a call ---------------------------------------------------------------------

// (B, H, N, d) of a 3-D or 4-D array.
void dims4(const ArrayRef& a, int64_t* dims) {
  if (a.ndim == 3) {
    dims[0] = a.shape[0], dims[1] = 1, dims[2] = a.shape[1], dims[3] = a.shape[2];
  } else {
    for (int i = 0; i < 4; ++i) dims[i] = a.shape[i];
  }
}

// A dense call: q (B, Hq, Nq, d), k and v (B, Hkv, Nk, d), or all three (B, N, d).
void validate_dense(Call& c, const Request& r) {
  describe_qkv(c, r, 0, "4-D (B, H, N, d) or 3-D (B, N, d)");
  Problem& p = c.problem;
  int64_t dq[4], dk[4], dv[4];
  dims4(c.q, dq), dims4(c.k, dk), dims4(c.v, dv);
  if (!(dq[0] == dk[0] && dk[0] == dv[0])) {
    value_error("q, k and v must have the same batch size, got " + num(dq[0]) + ", " + num(dk[0]) + ", " + num(dv[0]));
  }
  if (!(dq[3] == dk[3] && dk[3] == dv[3])) {
    value_error("q, k and v must have the same head dim, got " + num(dq[3]) + ", " + num(dk[3]) + ", " + num(dv[3]));
  }
  if (dk[1] != dv[1]) value_error("k and v must have the same number of heads, got " + num(dk[1]) + " and " + num(dv[1]));
  if (dk[2] != dv[2]) {
    value_error("k and v must have the same sequence length, got " + num(dk[2]) + " and " + num(dv[2]));
  }
  check_heads_and_head_dim(dq[1], dk[1], dq[3], "k and v");
  if (dq[2] > kInt32Max || dk[2] > kInt32Max || dq[0] * dq[1] > kInt32Max) {
    value_error("sizes too large: N must be < 2^31 and B*H < 2^31, got B=" + num(dq[0]) + ", H=" + num(dq[1]) +
                ", Nq=" + num(dq[2]) + ", Nk=" + num(dk[2]));
  }
  p.batch = static_cast<int>(dq[0]);
  p.heads_q = static_cast<int>(dq[1]);
  p.heads_kv = static_cast<int>(dk[1]);
  p.seqlen_q = static_cast<int>(dq[2]);
  p.seqlen_k = static_cast<int>(dk[2]);
  p.head_dim = static_cast<int>(dq[3]);
  int64_t expected[4];
  int n = 0;
  expected[n++] = p.batch;
  if (p.rank == 4) expected[n++] = p.heads_q;
  expected[n++] = p.seqlen_q;
  expected[n++] = p.head_dim;
  validate_out(c, r.out, expected, n);
}

// q (B, Hq, Nq, d) against caches (B, Hkv, Ncache, d), or paged (num_pages, Hkv, page_size, d).
void validate_kvcache(Call& c, const Request& r) {
  describe_qkv(c, r, 4, "4-D: q (B, Hq, Nq, d), caches (B, Hkv, Ncache, d) or, paged, (num_pages, Hkv, page_size, d)");
  Problem& p = c.problem;
  bool synchronized = false;  // check_device_values: the device waited for once
  p.kv_cache = true;
  p.paged = given(r.block_table);
  int64_t const* qs = c.q.shape;
  int64_t const* ks = c.k.shape;
  int64_t const b = qs[0], hq = qs[1], d = qs[3];
  for (int i = 0; i < 4; ++i) {
    if (c.v.shape[i] != ks[i]) value_error("v must have k's shape " + shape_text(c.k) + ", got " + shape_text(c.v));
  }
  if (ks[3] != d) value_error("k's head dim " + num(ks[3]) + " differs from q's " + num(d));
  check_heads_and_head_dim(hq, ks[1], d, "k and v");
  if (!p.paged && ks[0] != b) {
    value_error("k must have q's batch size " + num(b) + " (or pass block_table for a paged cache), got " + num(ks[0]));
  }
  if (p.paged && ks[2] < 1) value_error("k's page size (dim 2) must be >= 1, got " + num(ks[2]));
  if (qs[2] > kInt32Max || b * hq > kInt32Max || ks[0] > kInt32Max) {
    value_error("sizes too large: Nq, B*H and the pages must be < 2^31");
  }
  int64_t capacity = ks[2];
  if (p.paged) {
    int64_t const table_shape[2] = {b, -1};
    c.block_table = read_index(r.block_table, "block_table", c.device, 2, table_shape, &synchronized);
    capacity = c.block_table.cols * ks[2];
    if (capacity > kInt32Max) value_error("block_table: max_pages * page_size must be < 2^31");
    p.page_size = static_cast<int>(ks[2]);
    p.num_pages = static_cast<int>(ks[0]);
    if (!given(r.cache_seqlens)) value_error("cache_seqlens is required with block_table (a paged cache)");
  }
  // k_new, v_new (B, Hkv, Nnew, d) of the cache's dtype, on its device.
  if (given(r.k_new) != given(r.v_new)) {
    value_error(std::string(given(r.v_new) ? "k_new" : "v_new") + " is missing: k_new and v_new go together");
  }
  if (given(r.k_new)) {
    if (!given(r.cache_seqlens)) value_error("cache_seqlens is required with k_new (it says where the new keys go)");
    c.k_new = describe(r.k_new, "k_new");
    c.v_new = describe(r.v_new, "v_new");
    for (const ArrayRef* a : {&*c.k_new, &*c.v_new}) {
      const char* name = a == &*c.k_new ? "k_new" : "v_new";
      if (a->ndim != 4) value_error(std::string(name) + " must be 4-D (B, Hkv, Nnew, d), got shape " + shape_text(*a));
      if (a->dtype != c.k.dtype) {
        type_error(std::string(name) + " must have the cache's dtype " + c.k.dtype_name + ", got " + dtype_text(*a));
      }
      if (a->device != c.device) value_error(std::string(name) + " must be on the device of q, got " + where(*a));
      check_row_contiguous(*a, name);
    }
    int64_t const want[4] = {b, ks[1], c.k_new->shape[2], d};
    for (int i = 0; i < 4; ++i) {
      if (c.k_new->shape[i] != want[i]) {
        value_error("k_new must have shape (B, Hkv, Nnew, d) = " + tuple_text(want, 4) + ", got " + shape_text(*c.k_new));
      }
      if (c.v_new->shape[i] != want[i]) {
        value_error("v_new must have k_new's shape " + tuple_text(want, 4) + ", got " + shape_text(*c.v_new));
      }
    }
    if (want[2] > kInt32Max) value_error("k_new: Nnew must be < 2^31");
    p.n_new = static_cast<int>(want[2]);
    if (c.k.readonly || c.v.readonly) value_error("k and v are read-only, but k_new / v_new are appended into them");
  }
  int64_t const per_entry[1] = {b};
  c.cache_seqlens = read_index(r.cache_seqlens, "cache_seqlens", c.device, 1, per_entry, &synchronized);
  c.cache_leftpad = read_index(r.cache_leftpad, "cache_leftpad", c.device, 1, per_entry, &synchronized);
  // Host values are checked in full: lengths within the capacity, leftpad within the length, the pages used.
  if (c.cache_seqlens.known()) {
    for (int64_t i = 0; i < b; ++i) {
      int64_t const n = c.cache_seqlens.values[i];
      if (n < 0) value_error("cache_seqlens must be >= 0, got " + num(n));
      if (n + p.n_new > capacity) {
        value_error("cache_seqlens[" + num(i) + "] = " + num(n) + (p.n_new ? " + " + num(p.n_new) + " new keys" : "") +
                    " exceeds the cache length " + num(capacity));
      }
    }
  }
  if (c.cache_leftpad.known()) {
    for (int64_t i = 0; i < b; ++i) {
      int64_t const pad = c.cache_leftpad.values[i];
      int64_t const limit = !c.cache_seqlens.given     ? capacity
                            : c.cache_seqlens.known() ? c.cache_seqlens.values[i]
                                                        : kInt32Max;
      if (pad < 0 || pad > limit) {
        value_error("cache_leftpad[" + num(i) + "] = " + num(pad) + " is outside [0, cache_seqlens[" + num(i) +
                    "] = " + num(limit) + "]");
      }
    }
  }
  if (c.block_table.known() && c.cache_seqlens.known()) {
    for (int64_t i = 0; i < b; ++i) {
      int64_t const used = (c.cache_seqlens.values[i] + p.n_new + p.page_size - 1) / p.page_size;
      for (int64_t j = 0; j < used; ++j) {
        int64_t const page = c.block_table.values[i * c.block_table.cols + j];
        if (page < 0 || page >= p.num_pages) {
          value_error("block_table[" + num(i) + "] holds page indices outside [0, " + num(p.num_pages) + ") (k has " +
                      num(p.num_pages) + " pages)");
        }
      }
    }
  }
  p.batch = static_cast<int>(b);
  p.heads_q = static_cast<int>(hq);
  p.heads_kv = static_cast<int>(ks[1]);
  p.seqlen_q = static_cast<int>(qs[2]);
  p.seqlen_k = static_cast<int>(capacity);
  p.head_dim = static_cast<int>(d);
  p.kv_extent = static_cast<int>(ks[0]);
  p.kv_rows = static_cast<int>(ks[2]);
  validate_out(c, r.out, qs, 4);
}

// A varlen batch: q (total_q, Hq, d), k and v (total_k, Hkv, d), cu_seqlens (B+1,).
void validate_varlen(Call& c, const Request& r) {
  describe_qkv(c, r, 3, "3-D (total, H, d)");
  Problem& p = c.problem;
  bool synchronized = false;  // check_device_values: the device waited for once
  int64_t const* qs = c.q.shape;
  int64_t const* ks = c.k.shape;
  for (int i = 0; i < 3; ++i) {
    if (c.v.shape[i] != ks[i]) value_error("v must have k's shape " + shape_text(c.k) + ", got " + shape_text(c.v));
  }
  if (ks[2] != qs[2]) value_error("k's head dim " + num(ks[2]) + " differs from q's " + num(qs[2]));
  check_heads_and_head_dim(qs[1], ks[1], qs[2], "k and v");
  if (qs[0] > kInt32Max || ks[0] > kInt32Max) value_error("sizes too large: total_q and total_k must be < 2^31");
  int64_t const free_length[1] = {-1};
  c.cu_seqlens_q = read_index(r.cu_seqlens_q, "cu_seqlens_q", c.device, 1, free_length, &synchronized);
  c.cu_seqlens_k = read_index(r.cu_seqlens_k, "cu_seqlens_k", c.device, 1, free_length, &synchronized);
  if (c.cu_seqlens_q.rows < 1) value_error("cu_seqlens_q must be 1-D (B+1,) with B >= 0, got shape (0,)");
  if (c.cu_seqlens_k.rows < 1) value_error("cu_seqlens_k must be 1-D (B+1,) with B >= 0, got shape (0,)");
  if (c.cu_seqlens_q.rows != c.cu_seqlens_k.rows) {
    value_error("cu_seqlens_q and cu_seqlens_k must have the same length B+1, got " + num(c.cu_seqlens_q.rows) +
                " and " + num(c.cu_seqlens_k.rows));
  }
  int64_t longest[2] = {qs[0], ks[0]};  // device values: the totals bound every entry
  const IndexArray* cus[2] = {&c.cu_seqlens_q, &c.cu_seqlens_k};
  const char* names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
  int64_t const totals[2] = {qs[0], ks[0]};
  for (int s = 0; s < 2; ++s) {
    const IndexArray& cu = *cus[s];
    if (!cu.known()) continue;
    std::string const name = names[s];
    if (cu.values[0] != 0) value_error(name + " must start at 0, got " + num(cu.values[0]));
    longest[s] = 0;
    for (int64_t i = 1; i < cu.rows; ++i) {
      if (cu.values[i] < cu.values[i - 1]) value_error(name + " must be non-decreasing");
      longest[s] = std::max<int64_t>(longest[s], cu.values[i] - cu.values[i - 1]);
    }
    if (cu.values[cu.rows - 1] != totals[s]) {
      value_error(name + " ends at " + num(cu.values[cu.rows - 1]) + " but the total length (dim 0) is " + num(totals[s]));
    }
  }
  int64_t const asked[2] = {optional_int(r.max_seqlen_q, "max_seqlen_q"), optional_int(r.max_seqlen_k, "max_seqlen_k")};
  const char* max_names[2] = {"max_seqlen_q", "max_seqlen_k"};
  for (int s = 0; s < 2; ++s) {
    if (!given(s == 0 ? r.max_seqlen_q : r.max_seqlen_k)) continue;  // the longest entry (host values) or the total
    bool const known = cus[s]->known();
    if (asked[s] < 0 || asked[s] > kInt32Max || (known && asked[s] < longest[s])) {
      value_error(std::string(max_names[s]) + " = " + num(asked[s]) + " must be >= the longest sequence (" +
                  num(known ? longest[s] : 0) + ") and < 2^31");
    }
    longest[s] = std::min(asked[s], totals[s]);  // no entry is longer than the total
  }
  p.varlen = true;
  p.total_q = static_cast<int>(qs[0]);
  p.total_k = static_cast<int>(ks[0]);
  p.batch = static_cast<int>(c.cu_seqlens_q.rows - 1);
  p.heads_q = static_cast<int>(qs[1]);
  p.heads_kv = static_cast<int>(ks[1]);
  p.seqlen_q = static_cast<int>(longest[0]);
  p.seqlen_k = static_cast<int>(longest[1]);
  p.head_dim = static_cast<int>(qs[2]);
  p.kv_extent = p.batch;
  p.kv_rows = p.seqlen_k;
  validate_out(c, r.out, qs, 3);
}

// The tensor-core families take the row max of unscaled scores (softmax_scale > 0), and read device
// arrays in 16-byte vectors (common/alignment.h). Host arrays are copied into compact device
// buffers, which always qualify.
bool tensorcore_accepts(const Call& c) {
  const Problem& p = c.problem;
  if (!(p.scale > 0.f)) return false;
  if (c.device < 0) return true;
  int const bytes = dtype_bytes(p.dtype);
  int const out_bytes = dtype_bytes(c.out_dtype);
  auto aligned = [&](const ArrayRef& a, int extent, int heads, int seqlen, int item_bytes) {
    TensorStrides const s = c.strides(a);
    return tensor_aligned16(a.data, s.batch, s.head, s.row, extent, heads, seqlen, item_bytes);
  };
  int const kv_extent = p.kv_extent_or_batch();
  int const kv_rows = p.kv_rows_or_seqlen();
  // An fp8 cache is read in place only by the decode kernel, which covers aligned ones alone
  // (sm90_decode_covers); the other kernels read its dequantized copy, compact in q's dtype. fp8 attention
  // reads k and v in place (q's dtype: bytes).
  bool const cache_copy = p.kv_fp8 && p.dtype != DType::kFloat8E4M3;
  bool const kv_aligned = cache_copy || (aligned(c.k, kv_extent, p.heads_kv, kv_rows, bytes) &&
                                         aligned(c.v, kv_extent, p.heads_kv, kv_rows, bytes));
  return aligned(c.q, p.batch, p.heads_q, p.seqlen_q, bytes) && kv_aligned &&
         (!c.out || aligned(*c.out, p.batch, p.heads_q, p.seqlen_q, out_bytes));
}

}  // namespace

std::string shape_text(const ArrayRef& a) { return tuple_text(a.shape, recorded(a)); }

TensorStrides Call::strides(const ArrayRef& a) const {
  const Problem& p = problem;
  if (a.framework == Framework::kBuffer) {  // compact (B, H, N, d)
    long long const row = p.head_dim, head = static_cast<long long>(p.seqlen_q) * p.head_dim;
    return {head * p.heads_q, head, row};
  }
  if (p.varlen) return {0, a.strides[1], a.strides[0]};  // (total, H, d): entries located by cu_seqlens
  if (a.ndim == 3) return {a.strides[0], 0, a.strides[1]};
  return {a.strides[0], a.strides[1], a.strides[2]};
}

void set_check_device_values(bool on) { g_check_device_values.store(on, std::memory_order_relaxed); }
bool check_device_values() { return g_check_device_values.load(std::memory_order_relaxed); }

std::string head_dims_text() {
  std::set<int> const& dims = all_head_dims();
  std::vector<int64_t> values(dims.begin(), dims.end());
  return tuple_text(values.data(), static_cast<int>(values.size()));
}

Call validate(const Request& r) {
  bool const varlen = given(r.cu_seqlens_q) || given(r.cu_seqlens_k);
  bool const kv_cache = given(r.cache_seqlens) || given(r.cache_leftpad) || given(r.block_table) || given(r.k_new) ||
                        given(r.v_new);
  Call c;
  if (varlen) {
    if (!given(r.cu_seqlens_q) || !given(r.cu_seqlens_k)) {
      value_error(std::string(given(r.cu_seqlens_q) ? "cu_seqlens_k" : "cu_seqlens_q") + " is missing");
    }
    if (kv_cache) value_error("varlen_forward takes no KV-cache arguments");
    validate_varlen(c, r);
  } else if (kv_cache) {
    validate_kvcache(c, r);
  } else {
    validate_dense(c, r);
  }
  Problem& p = c.problem;
  int64_t left, right;
  window_sides(r.window, &left, &right);
  p.window = fold_causal(r.causal, left, right);
  double const softcap = softcap_value(r.softcap);
  if (!std::isfinite(softcap) || softcap < 0) {
    value_error("softcap must be a finite float >= 0 (0 disables it), got " + nb::cast<std::string>(nb::repr(r.softcap)));
  }
  p.softcap = static_cast<float>(softcap);
  c.sinks = read_per_head(r.sinks, "sinks", "one per query head", p.heads_q, -1, c.device);
  c.alibi_slopes = read_per_head(r.alibi_slopes, "alibi_slopes", "one per query head (and batch entry)", p.heads_q,
                                 p.batch, c.device);
  bool const q_fp8 = p.dtype == DType::kFloat8E4M3;
  if (p.kv_fp8 && !kv_cache && !q_fp8) {
    type_error(std::string(varlen ? "varlen_forward" : "forward") + " takes float8_e4m3fn k and v with a float16 / " +
               "bfloat16 q as a KV cache only (pass cache_seqlens, or block_table); fp8 attention over dense or " +
               "packed arrays takes a float8_e4m3fn q too");
  }
  // A query head's descale is its K/V head's entry (head h: h / (Hq / Hkv)), as FlashAttention-3's.
  const char* const per_kv_head = "one per K/V head (and batch entry)";
  c.q_descale = read_per_head(r.q_descale, "q_descale", per_kv_head, p.heads_kv, p.batch, c.device, true);
  c.k_descale = read_per_head(r.k_descale, "k_descale", per_kv_head, p.heads_kv, p.batch, c.device, true);
  c.v_descale = read_per_head(r.v_descale, "v_descale", per_kv_head, p.heads_kv, p.batch, c.device, true);
  for (const FloatArray* descale : {&c.q_descale, &c.k_descale, &c.v_descale}) {
    bool const of_q = descale == &c.q_descale;
    const char* name = of_q ? "q_descale" : descale == &c.k_descale ? "k_descale" : "v_descale";
    if (descale->given && !(of_q ? q_fp8 : p.kv_fp8)) {
      value_error(std::string(name) + (of_q ? " scales a float8_e4m3fn q; q has dtype " + c.q.dtype_name
                                            : " scales float8_e4m3fn k and v; they have dtype " + c.k.dtype_name));
    }
    for (float x : descale->values) {
      if (!std::isfinite(x)) value_error(std::string(name) + " must be finite, got " + std::to_string(x));
    }
  }
  if (given(r.num_splits)) {
    if (!is_int(r.num_splits)) type_error("num_splits must be an int or None, got " + type_label(r.num_splits));
    int64_t const splits = int_value(r.num_splits);
    if (splits < 1 || splits > kInt32Max) {
      value_error("num_splits must be an int >= 1 (or None: the backend chooses), got " + num(splits));
    }
    p.num_splits = static_cast<int>(splits);
  }
  if (varlen) p.num_splits = 1;  // one pass per entry: varlen batches are not split
  p.variant = asks_options(p, r.causal, given(r.num_splits));
  p.scale = resolve_scale(r.scale, p.head_dim);
  return c;
}

std::string fp8_attention_refusal(Backend backend, DType dtype, int head_dim, int capability) {
  if (dtype != DType::kFloat8E4M3) return "";
  static std::vector<int64_t> const listed{CUTLASSFA_SM90WS_FP8_HEAD_DIMS};
  std::string const dims = listed.empty() ? std::string("none") : tuple_text(listed.data(), static_cast<int>(listed.size()));
  std::string const where = "the tensorcore backend runs it on sm_90 (head dims " + dims +
                            " in this build), the cpu backend on host arrays";
  if (backend != Backend::kTensorCore) {
    return std::string(kLimitPrefix) + backend_name(backend) +
           " has no fp8 attention kernel (float8_e4m3fn q, k and v); " + where;
  }
  if (listed.empty()) {
    return "tensorcore runs fp8 attention (float8_e4m3fn q, k and v) with the warp-specialized sm_90a kernel, which "
           "this build does not have; the cpu backend runs it on host arrays";
  }
  if (capability != 90) {
    return "tensorcore runs fp8 attention (float8_e4m3fn q, k and v) on sm_90 only in this version, not " +
           (capability > 0 ? "sm_" + num(capability) : std::string("without a CUDA device")) +
           "; the cpu backend runs it on host arrays";
  }
  if (std::find(listed.begin(), listed.end(), head_dim) == listed.end()) {
    return "tensorcore runs fp8 attention (float8_e4m3fn q, k and v) at head dims " + dims + " in this build, not " +
           num(head_dim) + "; the cpu backend runs it on host arrays";
  }
  return "";
}

std::string fp8_attention_options_refusal(bool varlen, bool kv_cache, bool softcap, bool alibi, bool split) {
  const char* option = varlen     ? "a varlen batch"
                       : kv_cache ? "a KV cache"
                       : softcap  ? "softcap"
                       : alibi    ? "alibi_slopes"
                       : split    ? "num_splits > 1"
                                  : nullptr;
  if (option == nullptr) return "";
  return std::string("fp8 attention (float8_e4m3fn q, k and v) on the GPU takes dense arrays, causal or windowed, "
                     "with or without sinks, and no KV cache, varlen, softcap, ALiBi or split keys in this version; "
                     "got ") +
         option + " (the cpu backend runs it on host arrays)";
}

std::string fp8_attention_options_refusal(const Call& c) {
  const Problem& p = c.problem;
  if (p.dtype != DType::kFloat8E4M3) return "";
  return fp8_attention_options_refusal(p.varlen, p.kv_cache, p.softcap > 0.f, c.alibi_slopes.given, p.num_splits > 1);
}

namespace {

// resolve_backend on a device whose backends' availability `unavailable` gives (empty: available), named
// `where` in errors; `cpu_fallback`: host arrays may resolve to cpu.
// `capability`: the device's compute capability (fp8 attention runs on sm_90 only).
template <class Unavailable>
int resolve_on(const Call& c, int backend, Unavailable unavailable, const std::string& where, bool cpu_fallback,
               int capability) {
  const Problem& p = c.problem;
  bool const fp8 = p.dtype == DType::kFloat8E4M3;
  auto runs = [&](int b) {
    Backend const which = static_cast<Backend>(b);
    return unavailable(which).empty() && (fp8 || head_dim_runs(which, p.head_dim, p.dtype)) &&
           fp8_attention_refusal(which, p.dtype, p.head_dim, capability).empty() &&
           fp8_attention_options_refusal(c).empty() && (which != Backend::kTensorCore || tensorcore_accepts(c));
  };
  if (backend == kBackendAuto) {
    // naive last: it takes what the tiled kernels' limits refuse (small_tile's d > 192 on sm_61).
    for (Backend b : {Backend::kTensorCore, Backend::kLargeTile, Backend::kSmallTile, Backend::kNaive}) {
      if (runs(static_cast<int>(b))) return static_cast<int>(b);
    }
    if (cpu_fallback) return kBackendCpu;
    if (fp8) {
      std::string const options = fp8_attention_options_refusal(c);
      std::string const refusal = fp8_attention_refusal(Backend::kTensorCore, p.dtype, p.head_dim, capability);
      if (unavailable(Backend::kTensorCore).empty() && (!options.empty() || !refusal.empty())) {
        value_error("no GPU backend runs this fp8 attention call: " + (options.empty() ? refusal : options));
      }
    }
    std::string const refusal = head_dim_refusal(Backend::kNaive, p.head_dim, p.dtype);
    if (!refusal.empty() && unavailable(Backend::kNaive).empty()) {
      value_error("no GPU backend runs head dim " + num(p.head_dim) + ": " + refusal + " (compiled head dims: " +
                  head_dims_text() + "); host arrays run it on the cpu backend");
    }
    throw std::runtime_error("no GPU backend can run on " + where + ": " + unavailable(Backend::kSmallTile));
  }
  Backend const which = static_cast<Backend>(backend);
  std::string const reason = unavailable(which);
  if (!reason.empty()) {
    throw std::runtime_error(std::string("backend '") + backend_label(backend) + "' is not available: " + reason);
  }
  std::string fp8_refusal = fp8_attention_refusal(which, p.dtype, p.head_dim, capability);
  if (fp8_refusal.empty()) fp8_refusal = fp8_attention_options_refusal(c);
  if (!fp8_refusal.empty()) value_error(std::string("backend '") + backend_label(backend) + "': " + fp8_refusal);
  std::string const refusal = fp8 ? std::string() : head_dim_refusal(which, p.head_dim, p.dtype);
  if (!refusal.empty()) {
    value_error(std::string("backend '") + backend_label(backend) + "' does not run head dim " + num(p.head_dim) +
                " with " + c.q.dtype_name + ": " + refusal);
  }
  bool const tensorcore = which == Backend::kTensorCore || which == Backend::kTensorCoreSm80;
  if (tensorcore && !tensorcore_accepts(c)) {
    value_error(std::string("backend '") + backend_label(backend) +
                "' needs softmax_scale > 0 and 16-byte aligned q, k, v and out with strides that are multiples of "
                "16 bytes; pass contiguous arrays or use backend='auto'");
  }
  return backend;
}

}  // namespace

int resolve_backend(const Call& c, int backend) {
  int const device = c.device < 0 ? 0 : c.device;
  if (backend == kBackendCpu) {
    if (c.device >= 0) value_error("backend 'cpu' needs host (numpy) arrays; q, k and v are on a CUDA device");
    return kBackendCpu;
  }
  return resolve_on(c, backend, [device](Backend b) { return backend_unavailable_reason(b, device); },
                    "cuda:" + num(device), c.device < 0, device_capability(device));
}

int resolve_backend_for(const Call& c, int backend, int capability) {
  if (backend == kBackendCpu) value_error("a plan for a GPU names a GPU backend, not 'cpu'");
  return resolve_on(c, backend, [capability](Backend b) { return backend_unavailable_for(b, capability); },
                    "sm_" + num(capability), false, capability);
}

}  // namespace cutlassfa::bindings
