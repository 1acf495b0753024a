#include "bindings/forward.h"

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/cuda_errors.h"
#include "bindings/device_buffer.h"
#include "bindings/request.h"
#include "cutlassfa/dispatch.h"
#include "cutlassfa/enqueue.h"
#include "cutlassfa/fill.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/tuning.h"
#include "cutlassfa/workspace.h"

namespace cutlassfa::bindings {
namespace {

// One output (O or lse) while it is being produced: what goes back to Python, and where to write.
struct Output {
  nb::object result;                                  // the array handed back (set at the end for `managed`)
  dlpack::ManagedTensorVersioned* managed = nullptr;  // allocated through the exchange API, not yet a Python object
  const dlpack::ExchangeApi* api = nullptr;
  void* data = nullptr;
  Strided4 view{};  // (B, H, N, d) for O, (B, H, N, 1) for lse

  Output() = default;
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  ~Output() {
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }

  nb::object finish() {
    if (managed != nullptr) {
      void* object = nullptr;
      dlpack::ManagedTensorVersioned* const owned = managed;
      managed = nullptr;  // stolen by the call, whatever it returns
      if (api->managed_tensor_to_py_object_no_sync(owned, &object) != 0) throw nb::python_error();
      result = nb::steal(static_cast<PyObject*>(object));
    }
    return result;
  }
};

void set_allocator_error(void* context, const char* kind, const char* message) {
  PyObject* type = PyExc_RuntimeError;
  if (std::strcmp(kind, "MemoryError") == 0) type = PyExc_MemoryError;
  if (std::strcmp(kind, "TypeError") == 0) type = PyExc_TypeError;
  if (std::strcmp(kind, "ValueError") == 0) type = PyExc_ValueError;
  PyErr_SetString(type, message);
  (void)context;
}

// The (B, H, N, d) view of an output of `rank` (3: (B, N, d), no head dim) with `strides` in elements;
// lse drops d.
Strided4 view_of(const Problem& p, const int64_t* strides, bool lse) {
  Strided4 v{};
  long long const cols = lse ? 1 : p.head_dim;
  v.shape[0] = p.batch, v.shape[1] = p.heads_q, v.shape[2] = p.seqlen_q, v.shape[3] = cols;
  if (p.rank == 4) {
    for (int i = 0; i < (lse ? 3 : 4); ++i) v.strides[i] = strides[i];
  } else {
    v.strides[0] = strides[0], v.strides[1] = 0, v.strides[2] = strides[1];
    if (!lse) v.strides[3] = strides[2];
  }
  if (lse) v.strides[3] = 1;
  return v;
}

// Compact strides of a (B, H, N, cols) array written in `rank` dims.
void compact_strides(const Problem& p, bool lse, int64_t* strides) {
  long long const cols = lse ? 1 : p.head_dim;
  if (p.rank == 4) {
    strides[3] = 1, strides[2] = cols, strides[1] = cols * p.seqlen_q, strides[0] = strides[1] * p.heads_q;
  } else {
    strides[2] = 1, strides[1] = cols, strides[0] = cols * p.seqlen_q;
  }
  if (lse) {  // lse has one dim fewer: shift (B, H, N) / (B, N) strides down
    if (p.rank == 4) strides[0] = static_cast<long long>(p.heads_q) * p.seqlen_q, strides[1] = p.seqlen_q, strides[2] = 1;
    else strides[0] = p.seqlen_q, strides[1] = 1;
  }
}

// Allocates an array of `shape` (ndim dims) like q (fp32 when `fp32`, else the output's dtype): through the
// framework's exchange API, numpy, or `alloc`; `strides` receives its strides in elements.
void allocate_array(Output& o, const Call& c, const int64_t* shape, int ndim, bool fp32, nb::handle alloc,
                    int64_t* strides) {
  const Problem& p = c.problem;
  auto compact = [&] {
    int64_t step = 1;
    for (int i = ndim - 1; i >= 0; --i) strides[i] = step, step *= shape[i];
  };
  auto shape_tuple = [&] {
    nb::list items;
    for (int i = 0; i < ndim; ++i) items.append(shape[i]);
    return nb::steal<nb::tuple>(PySequence_Tuple(items.ptr()));
  };
  if (c.q.exchange != nullptr) {
    dlpack::Tensor prototype{};
    prototype.device = {c.device < 0 ? dlpack::kCPU : dlpack::kCUDA, c.device < 0 ? 0 : c.device};
    prototype.ndim = ndim;
    DType const out = c.out_dtype;
    prototype.dtype = fp32 ? dlpack::DataType{dlpack::kFloat, 32, 1}
                           : (out == DType::kBFloat16 ? dlpack::DataType{dlpack::kBfloat, 16, 1}
                                                      : dlpack::DataType{dlpack::kFloat, uint8_t(8 * dtype_bytes(out)), 1});
    prototype.shape = const_cast<int64_t*>(shape);
    o.api = c.q.exchange;
    if (o.api->managed_tensor_allocator(&prototype, &o.managed, nullptr, set_allocator_error) != 0 || o.managed == nullptr) {
      o.managed = nullptr;
      throw nb::python_error();
    }
    dlpack::Tensor const& t = o.managed->dl_tensor;
    o.data = static_cast<char*>(t.data) + t.byte_offset;
    if (t.strides != nullptr) {
      for (int i = 0; i < ndim; ++i) strides[i] = t.strides[i];
    } else {
      compact();
    }
  } else if (c.q.framework == Framework::kNumpy) {
    nb::object dtype = fp32                          ? nb::module_::import_("numpy").attr("float32")
                       : c.out_dtype == p.dtype      ? c.q.object.attr("dtype")
                       : c.out_dtype == DType::kBFloat16 ? nb::module_::import_("ml_dtypes").attr("bfloat16")
                                                     : nb::module_::import_("numpy").attr(c.out_dtype_name.c_str());
    o.result = nb::module_::import_("numpy").attr("empty")(shape_tuple(), dtype);
    ArrayRef const a = describe(o.result, "out");
    o.data = a.data;
    for (int i = 0; i < ndim; ++i) strides[i] = a.strides[i];
  } else {
    nb::tuple made = nb::cast<nb::tuple>(alloc(shape_tuple(), fp32 ? "float32" : c.out_dtype_name.c_str(), c.device));
    o.result = nb::borrow(made[0]);
    nb::handle target = made[1];
    if (nb::isinstance<DeviceBuffer>(target)) {
      o.data = reinterpret_cast<void*>(nb::cast<DeviceBuffer&>(target).ptr());
      compact();
    } else {
      ArrayRef const a = describe(target, "out");
      o.data = a.data;
      for (int i = 0; i < ndim; ++i) strides[i] = a.strides[i];
    }
  }
}

// Allocates O (lse = false) or lse like q: (B, H, N, d) / (B, H, N), or (B, N, d) / (B, N).
void allocate(Output& o, const Call& c, bool lse, nb::handle alloc) {
  const Problem& p = c.problem;
  int64_t shape[4];
  int n = 0;
  shape[n++] = p.batch;
  if (p.rank == 4) shape[n++] = p.heads_q;
  shape[n++] = p.seqlen_q;
  if (!lse) shape[n++] = p.head_dim;
  int64_t strides[4];
  allocate_array(o, c, shape, n, lse, alloc, strides);
  o.view = view_of(p, strides, lse);
}

// lse rows are written contiguous per (batch, head) by every kernel: a caller-visible lse must be
// compact, which allocate() gives (the user never passes lse).
void check_lse_compact(const Output& lse, const Problem& p) {
  if (p.empty()) return;  // nothing is written; numpy gives empty arrays any strides
  if ((p.seqlen_q > 1 && lse.view.strides[2] != 1) || (p.heads_q > 1 && lse.view.strides[1] != p.seqlen_q) ||
      (p.batch > 1 && lse.view.strides[0] != static_cast<long long>(p.heads_q) * p.seqlen_q)) {
    throw std::runtime_error("internal: the lse output is not compact");
  }
}

// Copies a strided 4-D block (strides in elements; the last dim contiguous in both) with as few 2-D
// copies as the strides allow: dims contiguous in both arrays are merged first.
cudaError_t copy_strided(void* dst, const long long* dst_strides, const void* src, const long long* src_strides,
                         const long long* shape, int itemsize, cudaStream_t stream) {
  struct Dim {
    long long n, d, s;
  };
  std::vector<Dim> merged;
  for (int i = 3; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (!merged.empty() && dst_strides[i] == merged.back().n * merged.back().d &&
        src_strides[i] == merged.back().n * merged.back().s) {
      merged.back().n *= shape[i];
    } else {
      merged.push_back({shape[i], dst_strides[i], src_strides[i]});
    }
  }
  if (merged.empty()) merged.push_back({1, 1, 1});
  // merged[0] is the innermost (contiguous) run.
  size_t const width = merged[0].n * itemsize;
  size_t height = 1, dst_pitch = width, src_pitch = width;
  size_t first_outer = 1;
  if (merged.size() >= 2) {
    height = merged[1].n, dst_pitch = merged[1].d * itemsize, src_pitch = merged[1].s * itemsize;
    first_outer = 2;
  }
  long long outer_count = 1;
  for (size_t i = first_outer; i < merged.size(); ++i) outer_count *= merged[i].n;
  for (long long index = 0; index < outer_count; ++index) {
    long long rest = index, dst_off = 0, src_off = 0;
    for (size_t i = first_outer; i < merged.size(); ++i) {
      long long const j = rest % merged[i].n;
      rest /= merged[i].n;
      dst_off += j * merged[i].d, src_off += j * merged[i].s;
    }
    cudaError_t const err = cudaMemcpy2DAsync(static_cast<char*>(dst) + dst_off * itemsize, dst_pitch,
                                              static_cast<const char*>(src) + src_off * itemsize, src_pitch, width,
                                              height, cudaMemcpyDefault, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// Fills a strided host view: fp32 with `value` (0 or -inf), fp16 / bf16 with zero (all zero bits; the
// only value used there).
void fill_host(void* data, DType dtype, const Strided4& v, float value) {
  int const bytes = dtype_bytes(dtype);
  uint16_t const zero16 = 0;
  for (long long a = 0; a < v.shape[0]; ++a)
    for (long long b = 0; b < v.shape[1]; ++b)
      for (long long c = 0; c < v.shape[2]; ++c)
        for (long long d = 0; d < v.shape[3]; ++d) {
          char* at = static_cast<char*>(data) +
                     (a * v.strides[0] + b * v.strides[1] + c * v.strides[2] + d * v.strides[3]) * bytes;
          if (bytes == 4) std::memcpy(at, &value, 4);
          else std::memcpy(at, &zero16, 2);
        }
}

// (B, H, N, d) view of an output (O, or lse with lse = true) with `strides` in elements, in its own
// layout: (B, H, N, d) / (B, N, d), or a varlen (total, H, d) / lse (H, total) as (1, H, total, d).
Strided4 output_view(const Problem& p, const int64_t* strides, bool lse) {
  if (!p.varlen) return view_of(p, strides, lse);
  Strided4 v{};
  v.shape[0] = 1, v.shape[1] = p.heads_q, v.shape[2] = p.total_q, v.shape[3] = lse ? 1 : p.head_dim;
  v.strides[0] = 0;
  if (lse) {
    v.strides[1] = strides[0], v.strides[2] = strides[1], v.strides[3] = 1;
  } else {
    v.strides[1] = strides[1], v.strides[2] = strides[0], v.strides[3] = strides[2];
  }
  return v;
}

// Allocates O (lse = false) or lse like q, in the call's layout.
void allocate_output(Output& o, const Call& c, bool lse, nb::handle alloc) {
  const Problem& p = c.problem;
  if (!p.varlen) {
    allocate(o, c, lse, alloc);
    if (lse) check_lse_compact(o, p);
    return;
  }
  int64_t strides[3];
  if (lse) {
    int64_t const shape[2] = {p.heads_q, p.total_q};
    allocate_array(o, c, shape, 2, true, alloc, strides);
    if (p.total_q > 1 && strides[1] != 1) throw std::runtime_error("internal: the lse output is not compact");
  } else {
    int64_t const shape[3] = {p.total_q, p.heads_q, p.head_dim};
    allocate_array(o, c, shape, 3, false, alloc, strides);
  }
  o.view = output_view(p, strides, lse);
}

// Host index values and host per-head floats (sinks, ALiBi slopes, descales) copied to the device in one buffer of
// the workspace pool, and fp16 / bf16 device floats converted to float32 in another each; all released in
// stream order after the launches that read them.
struct IndexUpload {
  static constexpr int kMaxFloats = 5;
  void* buffer = nullptr;
  void* converted[kMaxFloats] = {};
  size_t failed_bytes = 0;

  cudaError_t upload(const IndexArray* const* indices, int count, const int** pointers, const FloatArray* const* floats,
                     int float_count, const float** float_pointers, cudaStream_t stream) {
    std::vector<int32_t> packed;
    size_t offsets[8] = {}, float_offsets[kMaxFloats] = {};
    for (int i = 0; i < count; ++i) {
      offsets[i] = packed.size();
      if (indices[i]->on_host()) {
        packed.insert(packed.end(), indices[i]->values.begin(), indices[i]->values.end());
        packed.resize((packed.size() + 3) / 4 * 4);  // each array 16-byte aligned
      }
    }
    for (int i = 0; i < float_count; ++i) {
      float_offsets[i] = packed.size();
      if (floats[i]->on_host()) {
        size_t const n = floats[i]->values.size();
        packed.resize(float_offsets[i] + (n + 3) / 4 * 4);
        std::memcpy(packed.data() + float_offsets[i], floats[i]->values.data(), n * sizeof(float));
      }
    }
    if (!packed.empty()) {
      size_t const bytes = packed.size() * sizeof(int32_t);
      cudaError_t err = workspace_alloc(&buffer, bytes, stream);
      if (err != cudaSuccess) {
        failed_bytes = bytes;
        return err;
      }
      // From pageable memory: the call returns once `packed` is staged, so it may go out of scope.
      err = cudaMemcpyAsync(buffer, packed.data(), bytes, cudaMemcpyHostToDevice, stream);
      if (err != cudaSuccess) return err;
    }
    for (int i = 0; i < count; ++i) {
      const IndexArray* index = indices[i];
      pointers[i] = !index->given      ? nullptr
                    : index->on_host() ? static_cast<const int*>(buffer) + offsets[i]
                                       : index->device_data;
    }
    for (int i = 0; i < float_count; ++i) {
      const FloatArray& f = *floats[i];
      float_pointers[i] = nullptr;
      if (f.on_host()) {
        float_pointers[i] = reinterpret_cast<const float*>(static_cast<const int32_t*>(buffer) + float_offsets[i]);
      } else if (f.given && f.device_dtype == DType::kFloat32) {
        float_pointers[i] = static_cast<const float*>(f.device_data);
      } else if (f.given) {  // rows back to back (request.cpp checks it)
        int const n = f.rows * f.heads;
        size_t const bytes = static_cast<size_t>(n) * sizeof(float);
        cudaError_t err = workspace_alloc(&converted[i], bytes, stream);
        if (err != cudaSuccess) {
          failed_bytes = bytes;
          return err;
        }
        err = convert_to_float32(f.device_data, f.device_dtype, static_cast<float*>(converted[i]), n, stream);
        if (err != cudaSuccess) return err;
        float_pointers[i] = static_cast<const float*>(converted[i]);
      }
    }
    return cudaSuccess;
  }

  // Releases the buffers (in stream order); the first error, if any.
  cudaError_t release(cudaStream_t stream) {
    cudaError_t err = buffer != nullptr ? workspace_free(buffer, stream) : cudaSuccess;
    buffer = nullptr;
    for (void*& c : converted) {
      cudaError_t const e = c != nullptr ? workspace_free(c, stream) : cudaSuccess;
      if (err == cudaSuccess) err = e;
      c = nullptr;
    }
    return err;
  }
};

// The call's index arrays and float arrays, in the order call_tensors reads their device pointers.
struct CallArrays {
  const IndexArray* indices[5];  // cu_seqlens_q, cu_seqlens_k, cache_seqlens, cache_leftpad, block_table
  const FloatArray* floats[5];   // sinks, alibi_slopes, k_descale, v_descale, q_descale
  bool any_given() const {
    for (const IndexArray* a : indices) {
      if (a->given) return true;
    }
    for (const FloatArray* f : floats) {
      if (f->given) return true;
    }
    return false;
  }
};
CallArrays call_arrays(const Call& c) {
  return {{&c.cu_seqlens_q, &c.cu_seqlens_k, &c.cache_seqlens, &c.cache_leftpad, &c.block_table},
          {&c.sinks, &c.alibi_slopes, &c.k_descale, &c.v_descale, &c.q_descale}};
}

// The call's tensors as its kernels see them: q, k, v (c's), o and lse (the outputs), the index arrays at
// `pointers` (cu_seqlens_q, cu_seqlens_k, cache_seqlens, cache_leftpad, block_table) and the float ones
// at `float_pointers` (sinks, alibi_slopes, k_descale, v_descale, q_descale).
CallTensors call_tensors(const Call& c, const Output& o, const Output* lse, const int* const* pointers,
                         const float* const* float_pointers) {
  const Problem& p = c.problem;
  CallTensors t;
  t.sinks = float_pointers[0];
  t.alibi_slopes = float_pointers[1];
  t.alibi_batch_stride = c.alibi_slopes.row_stride;
  t.k_descale = float_pointers[2], t.v_descale = float_pointers[3];
  t.k_descale_strides = {c.k_descale.row_stride, c.k_descale.head_stride, 0};
  t.v_descale_strides = {c.v_descale.row_stride, c.v_descale.head_stride, 0};
  t.q_descale = float_pointers[4];
  t.q_descale_strides = {c.q_descale.row_stride, c.q_descale.head_stride, 0};
  t.cu_seqlens_q = pointers[0], t.cu_seqlens_k = pointers[1], t.seqlens_k = pointers[2];
  t.leftpad_k = pointers[3], t.block_table = pointers[4];
  t.block_table_stride = c.block_table.row_stride;
  t.q = c.q.data, t.k = c.k.data, t.v = c.v.data, t.o = o.data;
  t.q_strides = c.strides(c.q), t.k_strides = c.strides(c.k), t.v_strides = c.strides(c.v);
  // Varlen entries are located by cu_seqlens: no batch stride (a compact (1, H, total, d) copy has one).
  t.o_strides = {p.varlen ? 0 : o.view.strides[0], o.view.strides[1], o.view.strides[2]};
  if (lse != nullptr) {
    t.lse = static_cast<float*>(lse->data);
    // Compact rows per (batch, head) (allocate_output checks it): (B, Hq, Nq), or (Hq, total_q) for varlen.
    t.lse_batch_stride = p.varlen ? 0 : static_cast<long long>(p.heads_q) * p.seqlen_q;
    t.lse_head_stride = p.varlen ? lse->view.strides[1] : p.seqlen_q;
  }
  return t;
}

// Enqueues the whole call on `stream` (the current device is the arrays'): host index values uploaded,
// k_new / v_new appended, the kernels (or, with nothing to compute, a fill of the outputs).
cudaError_t launch_call(const Call& c, Backend backend, int device, const Output& o, const Output* lse,
                        cudaStream_t stream, IndexUpload& uploads, const char** what) {
  const Problem& p = c.problem;
  const int* pointers[5] = {};
  const float* float_pointers[5] = {};
  CallArrays const arrays = call_arrays(c);
  if (arrays.any_given()) {
    *what = "cutlassfa index upload";
    cudaError_t const err = uploads.upload(arrays.indices, 5, pointers, arrays.floats, 5, float_pointers, stream);
    if (err != cudaSuccess) return err;
  }
  FwdParams const params = make_params(p, call_tensors(c, o, lse, pointers, float_pointers));
  AppendKV append{};
  if (c.k_new) {
    append = {c.k_new->data, c.v_new->data, {}, {}, p.n_new};
    for (int i = 0; i < 3; ++i) append.k_new_strides[i] = c.k_new->strides[i], append.v_new_strides[i] = c.v_new->strides[i];
  }
  EnqueueFailure failure;
  cudaError_t const err = enqueue_call(backend, device, p, params, c.k_new ? &append : nullptr, o.view,
                                       lse != nullptr ? &lse->view : nullptr, stream, &failure);
  *what = failure.step;
  if (failure.workspace_bytes) uploads.failed_bytes = failure.workspace_bytes;
  return err;
}

// The stream to launch on: `stream_arg` when given (>= 0), else the framework's current stream
// (DLPack exchange API), else the calling thread's default stream.
cudaStream_t launch_stream(const Call& c, int64_t stream_arg) {
  if (stream_arg >= 0) return reinterpret_cast<cudaStream_t>(stream_arg);
  if (c.q.exchange != nullptr) {
    void* current = nullptr;
    if (c.q.exchange->current_work_stream(dlpack::kCUDA, c.device, &current) != 0) throw nb::python_error();
    return static_cast<cudaStream_t>(current);
  }
  return cudaStreamPerThread;
}

// CUDA arrays: launched in place on the framework's stream.
void run_device(const Call& c, Backend backend, Output& o, Output* lse, int64_t stream_arg, bool sync) {
  DeviceGuard guard(c.device);
  cudaStream_t const stream = launch_stream(c, stream_arg);
  IndexUpload uploads;
  const char* what = "cutlassfa kernel launch";
  cudaError_t err;
  {
    nb::gil_scoped_release no_gil;
    err = launch_call(c, backend, c.device, o, lse, stream, uploads, &what);
    uploads.release(stream);
    if (err == cudaSuccess && sync) err = cudaStreamSynchronize(stream);
  }
  if (err != cudaSuccess) throw_cuda_error(err, uploads.failed_bytes ? "cutlassfa workspace" : what, uploads.failed_bytes);
}

// ---- Host arrays on a GPU backend ------------------------------------------------------------------

// Host arrays run on CUDA device 0.
constexpr int kDeviceOfHostCalls = 0;

// One host array of the call and its compact copy in the device buffer: `view` is the array in its own
// dims, padded in front to 4-D (lower ranks get extent 1, stride 0).
struct HostCopy {
  void* host = nullptr;
  Strided4 view{};
  Strided4 compact{};  // the device copy's strides
  int itemsize = 0;
  size_t offset = 0, bytes = 0;
  bool to_device = false, to_host = false;
};

Strided4 padded_view(const ArrayRef& a) {
  Strided4 v{};
  int const pad = 4 - a.ndim;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = i < pad ? 1 : a.shape[i - pad];
    v.strides[i] = i < pad ? 0 : a.strides[i - pad];
  }
  return v;
}

Strided4 compact_of(const Strided4& v) {
  Strided4 c = v;
  long long step = 1;
  for (int i = 3; i >= 0; --i) c.strides[i] = step, step *= v.shape[i];
  return c;
}

HostCopy host_copy(void* host, const Strided4& view, int itemsize, size_t* offset, bool to_device, bool to_host) {
  HostCopy h;
  h.host = host, h.view = view, h.compact = compact_of(view), h.itemsize = itemsize;
  h.bytes = static_cast<size_t>(view.shape[0] * view.shape[1] * view.shape[2] * view.shape[3]) * itemsize;
  h.offset = *offset;
  *offset += (h.bytes + 15) / 16 * 16;  // 16-byte aligned, as the tensor-core families read
  h.to_device = to_device, h.to_host = to_host;
  return h;
}

// Turns the description of a host array into that of its device copy: same shape, compact strides,
// on `device`. Plain fields only: it runs without the GIL.
void move_to_device(ArrayRef& a, const HostCopy& h, char* base, int device) {
  a.data = base + h.offset;
  int const pad = 4 - a.ndim;
  for (int i = 0; i < a.ndim; ++i) a.strides[i] = h.compact.strides[i + pad];
  a.device = device;
  a.exchange = nullptr;
}

// Rows between a strided host view and a compact buffer (pack: strided -> compact).
void host_rows(char* compact, const HostCopy& h, bool pack) {
  size_t const row_bytes = static_cast<size_t>(h.view.shape[3]) * h.itemsize;
  char* dst = compact;
  for (long long a = 0; a < h.view.shape[0]; ++a)
    for (long long b = 0; b < h.view.shape[1]; ++b)
      for (long long n = 0; n < h.view.shape[2]; ++n, dst += row_bytes) {
        char* row = static_cast<char*>(h.host) +
                    (a * h.view.strides[0] + b * h.view.strides[1] + n * h.view.strides[2]) * h.itemsize;
        if (pack) std::memcpy(dst, row, row_bytes);
        else std::memcpy(row, dst, row_bytes);
      }
}

// Small host calls go through one pinned staging buffer per thread: the inputs packed compact on the
// CPU, one copy in, the launches, one copy out. Each copy from pageable memory costs several
// microseconds of its own; four or five of them were most of a tiny host call (~60 us).
constexpr size_t kStagingLimit = size_t{16} << 20;

struct PinnedStaging {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~PinnedStaging() {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }
  cudaError_t reserve(size_t wanted) {
    if (wanted <= bytes) return cudaSuccess;
    if (ptr != nullptr) cudaFreeHost(ptr);
    ptr = nullptr, bytes = 0;
    cudaError_t const err = cudaMallocHost(&ptr, wanted);
    if (err == cudaSuccess) bytes = wanted;
    return err;
  }
};

// numpy / torch CPU arrays on a GPU backend: compact device copies of the arrays (caches and appended
// keys too) from the workspace pool, the same launches as for CUDA arrays, the results (and caches
// that keys were appended into) copied back, on the calling thread's stream of CUDA device 0.
void run_host(const Call& c, Backend backend, Output& o, Output* lse) {
  const Problem& p = c.problem;
  if ((p.empty() || p.seqlen_k == 0) && !c.k_new) {
    fill_host(o.data, c.out_dtype, o.view, 0.f);
    if (lse != nullptr) fill_host(lse->data, DType::kFloat32, lse->view, -INFINITY);
    return;
  }
  constexpr int kDevice = kDeviceOfHostCalls;
  DeviceGuard guard(kDevice);
  cudaStream_t const stream = cudaStreamPerThread;
  int const bytes = dtype_bytes(p.dtype), kv_bytes = dtype_bytes(static_cast<DType>(c.k.dtype));
  bool const append = c.k_new.has_value();
  size_t total = 0;
  std::vector<HostCopy> copies;
  copies.push_back(host_copy(c.q.data, padded_view(c.q), bytes, &total, true, false));
  copies.push_back(host_copy(c.k.data, padded_view(c.k), kv_bytes, &total, true, append));
  copies.push_back(host_copy(c.v.data, padded_view(c.v), kv_bytes, &total, true, append));
  if (append) {
    copies.push_back(host_copy(c.k_new->data, padded_view(*c.k_new), kv_bytes, &total, true, false));
    copies.push_back(host_copy(c.v_new->data, padded_view(*c.v_new), kv_bytes, &total, true, false));
  }
  size_t const inputs_end = total;
  copies.push_back(host_copy(o.data, o.view, dtype_bytes(c.out_dtype), &total, false, true));
  if (lse != nullptr) copies.push_back(host_copy(lse->data, lse->view, 4, &total, false, true));

  thread_local PinnedStaging staging;
  bool const staged = total <= kStagingLimit;
  Call d = c;  // the call on the device copies (copied and destroyed with the GIL held: it holds handles)
  d.device = kDevice;
  d.out.reset();
  IndexUpload uploads;
  char* device = nullptr;
  cudaError_t err = cudaSuccess;
  const char* what = "cutlassfa host path";
  size_t failed_bytes = 0;
  {
    nb::gil_scoped_release no_gil;
    err = staged ? staging.reserve(total) : cudaSuccess;
    if (err == cudaSuccess) {
      err = workspace_alloc(reinterpret_cast<void**>(&device), total, stream);
      if (err != cudaSuccess) failed_bytes = total, device = nullptr;
    }
    char* const pinned = static_cast<char*>(staging.ptr);
    for (const HostCopy& h : copies) {
      if (err != cudaSuccess || !h.to_device) continue;
      if (staged) host_rows(pinned + h.offset, h, /*pack=*/true);
      else err = copy_strided(device + h.offset, h.compact.strides, h.host, h.view.strides, h.view.shape, h.itemsize, stream);
    }
    if (err == cudaSuccess && staged) err = cudaMemcpyAsync(device, pinned, inputs_end, cudaMemcpyHostToDevice, stream);
    if (err == cudaSuccess) {
      move_to_device(d.q, copies[0], device, kDevice);
      move_to_device(d.k, copies[1], device, kDevice);
      move_to_device(d.v, copies[2], device, kDevice);
      if (append) {
        move_to_device(*d.k_new, copies[3], device, kDevice);
        move_to_device(*d.v_new, copies[4], device, kDevice);
      }
      const HostCopy& oc = copies[append ? 5 : 3];
      Output device_o, device_lse;
      device_o.data = device + oc.offset;
      device_o.view = oc.compact;
      if (lse != nullptr) {
        device_lse.data = device + copies.back().offset;
        device_lse.view = copies.back().compact;
      }
      err = launch_call(d, backend, kDevice, device_o, lse != nullptr ? &device_lse : nullptr, stream, uploads, &what);
      if (uploads.failed_bytes) failed_bytes = uploads.failed_bytes, what = "cutlassfa workspace";
    }
    if (err == cudaSuccess) {
      what = "cudaMemcpyAsync";
      if (staged) {
        // One copy from the first array that comes back to the end of the last (O and lse are last). The
        // inputs' region was written whole by the upload; past it, the kernels write O and lse but not
        // the 16-byte alignment padding after them: O's (rows of an odd byte count) is zeroed rather than
        // copied uninitialized, lse's is left out of the copy.
        size_t const first = std::find_if(copies.begin(), copies.end(), [](const HostCopy& h) { return h.to_host; })->offset;
        const HostCopy& last = copies.back();
        for (const HostCopy& h : copies) {
          size_t const padding = (h.bytes + 15) / 16 * 16 - h.bytes;
          if (err == cudaSuccess && h.offset >= inputs_end && &h != &last && padding > 0) {
            err = cudaMemsetAsync(device + h.offset + h.bytes, 0, padding, stream);
          }
        }
        if (err == cudaSuccess) {
          err = cudaMemcpyAsync(pinned + first, device + first, last.offset + last.bytes - first, cudaMemcpyDeviceToHost,
                                stream);
        }
      }
      for (const HostCopy& h : copies) {
        if (err != cudaSuccess || staged || !h.to_host) continue;
        err = copy_strided(h.host, h.view.strides, device + h.offset, h.compact.strides, h.view.shape, h.itemsize, stream);
      }
    }
    cudaError_t const sync_err = cudaStreamSynchronize(stream);  // nothing in flight may outlive the buffers
    if (err == cudaSuccess && sync_err != cudaSuccess) err = sync_err, what = "cudaStreamSynchronize";
    uploads.release(stream);
    if (device != nullptr) workspace_free(device, stream);
    if (err == cudaSuccess && staged) {
      for (const HostCopy& h : copies) {
        if (h.to_host) host_rows(pinned + h.offset, h, /*pack=*/false);
      }
    }
  }
  if (err != cudaSuccess) throw_cuda_error(err, failed_bytes ? "cutlassfa workspace" : what, failed_bytes);
}

}  // namespace

nb::object forward(const Request& request, int backend, bool return_lse, nb::handle alloc, int64_t stream, bool sync) {
  Call const c = validate(request);
  int const resolved = resolve_backend(c, backend);
  if (resolved == kBackendCpu) return nb::none();
  const Problem& p = c.problem;

  Output o;
  if (c.out) {
    o.result = nb::borrow(request.out);
    if (c.out->framework == Framework::kBuffer) {
      o.data = reinterpret_cast<void*>(nb::cast<DeviceBuffer&>(request.out).ptr());
      int64_t strides[4];
      compact_strides(p, false, strides);
      o.view = view_of(p, strides, false);
    } else {
      o.data = c.out->data;
      o.view = output_view(p, c.out->strides, false);
    }
  } else {
    allocate_output(o, c, false, alloc);
  }
  Output lse;
  if (return_lse) allocate_output(lse, c, true, alloc);
  if (c.device < 0) {
    run_host(c, static_cast<Backend>(resolved), o, return_lse ? &lse : nullptr);
  } else {
    run_device(c, static_cast<Backend>(resolved), o, return_lse ? &lse : nullptr, stream, sync);
  }
  nb::object result = o.finish();
  return nb::make_tuple(result, return_lse ? lse.finish() : nb::none());
}

nb::dict plan(const Request& request, int backend, int capability, int multiprocessors) {
  Call c = validate(request);
  const Problem& p = c.problem;
  bool const present = capability <= 0;
  int const device = c.device < 0 ? kDeviceOfHostCalls : c.device;
  int const resolved = present ? resolve_backend(c, backend) : resolve_backend_for(c, backend, capability);
  nb::dict result;
  result["backend"] = resolved == kBackendCpu ? "cpu" : backend_name(static_cast<Backend>(resolved));
  result["kernel"] = resolved == kBackendCpu ? "cpu" : "fill";  // the cpu backend's numpy code; no kernel
  result["num_splits"] = 1;
  result["gqa_packed"] = false;
  result["tile"] = nb::none();
  result["kernel_head_dim"] = nb::none();
  result["fp8_dequantized"] = false;
  result["tuned"] = false;
  result["tune_class"] = nb::none();
  if (resolved == kBackendCpu || call_is_fill(p)) return result;
  Backend const which = static_cast<Backend>(resolved);
  PlanDevice const dev =
      present ? plan_device(device) : PlanDevice{capability, multiprocessors, tensorcore_family_for(capability)};

  // The tensors as the launch describes them, at an address never dereferenced (16-byte aligned, as every
  // copy and allocation of the call is): host arrays as their compact device copies (run_host), the output
  // as given on the device or else compact, the index and float arrays anywhere on the device.
  char* const placeholder = reinterpret_cast<char*>(std::uintptr_t{1} << 40);
  if (c.device < 0) {
    int const bytes = dtype_bytes(p.dtype), kv_bytes = dtype_bytes(static_cast<DType>(c.k.dtype));
    size_t total = 0;
    for (ArrayRef* a : {&c.q, &c.k, &c.v}) {
      move_to_device(*a, host_copy(a->data, padded_view(*a), a == &c.q ? bytes : kv_bytes, &total, true, false),
                     placeholder, kDeviceOfHostCalls);
    }
  }
  Output o;
  o.data = placeholder;
  if (c.out && c.device >= 0 && c.out->framework != Framework::kBuffer) {
    o.data = c.out->data;
    o.view = output_view(p, c.out->strides, false);
  } else if (p.varlen) {
    int64_t const strides[3] = {static_cast<int64_t>(p.heads_q) * p.head_dim, p.head_dim, 1};  // (total_q, Hq, d)
    o.view = output_view(p, strides, false);
  } else {
    int64_t strides[4];
    compact_strides(p, false, strides);
    o.view = view_of(p, strides, false);
  }
  CallArrays const arrays = call_arrays(c);
  const int* pointers[5] = {};
  const float* float_pointers[4] = {};
  for (int i = 0; i < 5; ++i) {
    const IndexArray& a = *arrays.indices[i];
    if (a.given) pointers[i] = a.on_host() ? reinterpret_cast<const int*>(placeholder) : a.device_data;
  }
  for (int i = 0; i < 4; ++i) {
    const FloatArray& f = *arrays.floats[i];
    if (f.given) float_pointers[i] = reinterpret_cast<const float*>(f.on_host() ? placeholder : f.device_data);
  }
  FwdParams const params = make_params(p, call_tensors(c, o, nullptr, pointers, float_pointers));
  DequantizedKV const copy = dequantized_kv_in(params, placeholder);
  CallPlan const call_plan = plan_call(which, dev, p, params, copy);
  const Plan& chosen = call_plan.plan;
  result["kernel"] = kernel_name(chosen.kernel);
  result["num_splits"] = chosen.num_splits;
  result["gqa_packed"] = chosen.pack_gqa;
  if (chosen.tile.block_m > 0) result["tile"] = nb::make_tuple(chosen.tile.block_m, chosen.tile.block_n);
  if (chosen.tile.head_dim > 0) result["kernel_head_dim"] = chosen.tile.head_dim;
  result["fp8_dequantized"] = call_plan.dequantized;
  result["tuned"] = chosen.tuned;
  TuneClass const cls = tune_class(call_plan.dequantized ? dequantized_params(params, copy) : params);
  result["tune_class"] = nb::make_tuple(cls[0], cls[1], cls[2], cls[3], cls[4], cls[5], cls[6]);
  return result;
}

void set_tuning(int capability, int multiprocessors, const std::vector<nb::tuple>& entries) {
  std::vector<TunedChoice> table;
  for (size_t i = 0; i < entries.size(); ++i) {
    const nb::tuple& e = entries[i];
    TunedChoice choice{};
    bool ok = e.size() == 3 && nb::isinstance<nb::tuple>(e[0]) && nb::isinstance<nb::str>(e[1]) &&
              nb::isinstance<nb::int_>(e[2]) && tunable_kernel(nb::cast<std::string>(e[1]), &choice.kernel);
    nb::tuple const cls = ok ? nb::borrow<nb::tuple>(e[0]) : nb::tuple();
    if (ok && cls.size() == choice.cls.size()) {
      for (size_t j = 0; j < choice.cls.size(); ++j) {
        ok = ok && nb::isinstance<nb::int_>(cls[j]);
        if (ok) choice.cls[j] = nb::cast<int>(cls[j]);
      }
      choice.num_splits = nb::cast<int>(e[2]);
      ok = ok && choice.num_splits >= 1 && choice.num_splits <= kMaxCombinedSplits;
    } else {
      ok = false;
    }
    if (!ok) {
      throw nb::value_error(("tuning entry " + std::to_string(i) + " is not ((7 ints), a tile kernel's name, "
                             "num_splits in [1, " + std::to_string(kMaxCombinedSplits) + "])").c_str());
    }
    table.push_back(choice);
  }
  set_tuning_table(capability, multiprocessors, std::move(table));
}

}  // namespace cutlassfa::bindings
