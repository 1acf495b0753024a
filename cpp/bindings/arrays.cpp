#include "bindings/arrays.h"

#include <unordered_map>

#include "bindings/device_buffer.h"
#include "cutlassfa/params.h"

namespace cutlassfa::bindings {
namespace {

// (DLPack type code, bits) -> DType, or -1.
int dtype_from_dlpack(uint8_t code, uint8_t bits) {
  if (code == dlpack::kFloat && bits == 32) return static_cast<int>(DType::kFloat32);
  if (code == dlpack::kFloat && bits == 16) return static_cast<int>(DType::kFloat16);
  if (code == dlpack::kBfloat && bits == 16) return static_cast<int>(DType::kBFloat16);
  if (code == dlpack::kFloat8E4M3FN && bits == 8) return static_cast<int>(DType::kFloat8E4M3);
  return -1;
}

const char* dtype_label(int dtype) {
  switch (dtype) {
    case 0: return "float32";
    case 1: return "float16";
    case 2: return "bfloat16";
    case 3: return "float8_e4m3fn";
  }
  return "";
}

[[noreturn]] void type_error(const std::string& message) {
  PyErr_SetString(PyExc_TypeError, message.c_str());
  throw nb::python_error();
}

std::string type_name_of(nb::handle object) { return nb::cast<std::string>(nb::type_name(object.type())); }

// The first component of the type's module: "numpy", "torch", "cupy", "jax"/"jaxlib", ...; looked up
// once per type (the GIL is held).
const std::string& module_root(nb::handle object) {
  static std::unordered_map<PyTypeObject*, std::string> by_type;
  PyTypeObject* const type = Py_TYPE(object.ptr());
  auto it = by_type.find(type);
  if (it != by_type.end()) return it->second;
  std::string root;
  nb::object module = nb::getattr(object.type(), "__module__", nb::none());
  if (nb::isinstance<nb::str>(module)) {
    root = nb::cast<std::string>(module);
    root = root.substr(0, root.find('.'));
  }
  return by_type.emplace(type, root).first->second;
}

void fill_from_dltensor(ArrayRef& a, const dlpack::Tensor& t) {
  a.data = static_cast<char*>(t.data) + t.byte_offset;
  a.ndim = t.ndim;
  int64_t step = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (i < ArrayRef::kMaxDims) {
      a.shape[i] = t.shape[i];
      a.strides[i] = t.strides != nullptr ? t.strides[i] : step;
    }
    step *= t.shape[i];
  }
  a.dtype = dtype_from_dlpack(t.dtype.code, t.dtype.bits);
  if (t.dtype.lanes == 1) a.dl_code = t.dtype.code, a.dl_bits = t.dtype.bits;
  if (a.dtype < 0 || t.dtype.lanes != 1) {
    a.dtype = -1;
    a.dtype_name = "dlpack(code=" + std::to_string(t.dtype.code) + ", bits=" + std::to_string(t.dtype.bits) + ")";
  }
  a.device = t.device.device_type == dlpack::kCPU ? -1 : t.device.device_id;
}

void describe_numpy(ArrayRef& a, nb::handle object) {
  nb::object dtype = object.attr("dtype");
  std::string const name = nb::cast<std::string>(dtype.attr("name"));
  int64_t const itemsize = nb::cast<int64_t>(dtype.attr("itemsize"));
  a.dtype = dtype_of_name(name);
  a.dtype_name = name;
  std::string const kind = nb::cast<std::string>(dtype.attr("kind"));
  if (kind == "i" || kind == "u" || kind == "f") {
    a.dl_code = kind == "i" ? dlpack::kInt : kind == "u" ? dlpack::kUInt : dlpack::kFloat;
    a.dl_bits = static_cast<uint8_t>(8 * itemsize);
  }
  nb::dict interface = nb::cast<nb::dict>(object.attr("__array_interface__"));
  nb::tuple data = nb::cast<nb::tuple>(interface["data"]);
  a.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(data[0]));
  a.readonly = nb::cast<bool>(data[1]);
  nb::tuple shape = nb::cast<nb::tuple>(object.attr("shape"));
  nb::tuple strides = nb::cast<nb::tuple>(object.attr("strides"));  // bytes
  a.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < a.ndim && i < ArrayRef::kMaxDims; ++i) {
    a.shape[i] = nb::cast<int64_t>(shape[i]);
    int64_t const bytes = nb::cast<int64_t>(strides[i]);
    a.strides[i] = bytes / itemsize;
    if (bytes % itemsize != 0) a.whole_strides = false;
  }
  a.device = -1;
}

void describe_dlpack(ArrayRef& a, nb::handle object, const char* name) {
  nb::ndarray<nb::ro> view;
  try {
    view = nb::cast<nb::ndarray<nb::ro>>(object);
  } catch (const std::exception& error) {
    type_error(std::string(name) + ": cannot read this " + framework_name(a.framework) +
               " array through DLPack (" + error.what() + ")");
  }
  a.data = const_cast<void*>(static_cast<const void*>(view.data()));
  a.ndim = static_cast<int>(view.ndim());
  for (int i = 0; i < a.ndim && i < ArrayRef::kMaxDims; ++i) {
    a.shape[i] = static_cast<int64_t>(view.shape(i));
    a.strides[i] = view.stride(i);
  }
  nb::dlpack::dtype const dt = view.dtype();
  a.dtype = dtype_from_dlpack(dt.code, dt.bits);
  if (dt.lanes == 1) a.dl_code = dt.code, a.dl_bits = dt.bits;
  if (a.dtype < 0) a.dtype_name = "dlpack(code=" + std::to_string(dt.code) + ", bits=" + std::to_string(dt.bits) + ")";
  int const device_type = view.device_type();
  if (device_type == dlpack::kCPU) {
    type_error(std::string(name) + " is a host " + framework_name(a.framework) +
               " array; pass numpy arrays (or PyTorch tensors) for host computation");
  }
  if (device_type != dlpack::kCUDA) {
    type_error(std::string(name) + " lives on DLPack device type " + std::to_string(device_type) +
               "; only CUDA devices are supported");
  }
  a.device = view.device_id();
  a.keep_alive = nb::cast(view);
}

}  // namespace

int dtype_of_name(const std::string& name) {
  if (name == "float32") return static_cast<int>(DType::kFloat32);
  if (name == "float16") return static_cast<int>(DType::kFloat16);
  if (name == "bfloat16") return static_cast<int>(DType::kBFloat16);
  if (name == "float8_e4m3fn") return static_cast<int>(DType::kFloat8E4M3);
  return -1;
}

const char* framework_name(Framework framework) {
  switch (framework) {
    case Framework::kNumpy: return "numpy";
    case Framework::kTorch: return "torch";
    case Framework::kCupy: return "cupy";
    case Framework::kJax: return "jax";
    case Framework::kBuffer: return "DeviceBuffer";
  }
  return "?";
}

bool ArrayRef::empty() const {
  for (int i = 0; i < ndim && i < kMaxDims; ++i) {
    if (shape[i] == 0) return true;
  }
  return false;
}

const dlpack::ExchangeApi* exchange_api(nb::handle object) {
  // Looked up once per type (the GIL is held: the map needs no lock of its own).
  static std::unordered_map<PyTypeObject*, const dlpack::ExchangeApi*> by_type;
  PyTypeObject* const type = Py_TYPE(object.ptr());
  auto it = by_type.find(type);
  if (it != by_type.end()) return it->second;
  const dlpack::ExchangeApi* api = nullptr;
  nb::object capsule = nb::getattr(object.type(), "__dlpack_c_exchange_api__", nb::none());
  if (capsule.is_valid() && PyCapsule_CheckExact(capsule.ptr())) {
    api = static_cast<const dlpack::ExchangeApi*>(PyCapsule_GetPointer(capsule.ptr(), "dlpack_exchange_api"));
    if (api == nullptr) PyErr_Clear();
    // Only the 1.x table layout is known here; the header chain leads to older ones if any.
    if (api != nullptr && (api->header.version.major != 1 || api->dltensor_from_py_object_no_sync == nullptr ||
                           api->current_work_stream == nullptr)) {
      api = nullptr;
    }
  } else {
    PyErr_Clear();
  }
  by_type[type] = api;
  return api;
}

ArrayRef describe(nb::handle object, const char* name) {
  ArrayRef a;
  a.object = object;
  if (nb::isinstance<DeviceBuffer>(object)) {
    a.framework = Framework::kBuffer;
    return a;
  }
  std::string const& root = module_root(object);
  if (root == "numpy" && nb::hasattr(object, "__array_interface__")) {
    a.framework = Framework::kNumpy;
    describe_numpy(a, object);
    return a;
  }
  if (root == "torch") {
    a.framework = Framework::kTorch;
  } else if (root == "cupy") {
    a.framework = Framework::kCupy;
  } else if (root == "jax" || root == "jaxlib") {
    a.framework = Framework::kJax;
    if (!nb::hasattr(object, "__dlpack__")) {
      type_error(std::string(name) + ": this JAX object is not a concrete array (tracers are not supported)");
    }
  } else {
    type_error(std::string(name) + " must be a numpy array or an array of PyTorch, CuPy or JAX, got " +
               type_name_of(object));
  }
  if (const dlpack::ExchangeApi* api = exchange_api(object)) {
    dlpack::Tensor tensor{};
    if (api->dltensor_from_py_object_no_sync(object.ptr(), &tensor) != 0) {
      PyErr_Clear();
      type_error(std::string(name) + ": cannot read this " + framework_name(a.framework) + " array through DLPack");
    }
    fill_from_dltensor(a, tensor);
    a.exchange = api;
  } else {
    describe_dlpack(a, object, name);
  }
  if (a.dtype >= 0) a.dtype_name = dtype_label(a.dtype);
  return a;
}

}  // namespace cutlassfa::bindings
