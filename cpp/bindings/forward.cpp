#include "bindings/forward.h"

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/cuda_errors.h"
#include "bindings/device_buffer.h"
#include "bindings/problem.h"
#include "bindings/variant.h"
#include "cutlassfa/dispatch.h"
#include "cutlassfa/fill.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/workspace.h"

namespace cutlassfa::bindings {
namespace {

int item_bytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

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

// Allocates an array of `shape` (ndim dims) like q (fp32 when `fp32`, else q's dtype): through the
// framework's exchange API, numpy, or `alloc`; `strides` receives its strides in elements.
void allocate_array(Output& o, const Problem& p, const int64_t* shape, int ndim, bool fp32, nb::handle alloc,
                    int64_t* strides) {
  auto compact = [&] {
    int64_t step = 1;
    for (int i = ndim - 1; i >= 0; --i) strides[i] = step, step *= shape[i];
  };
  auto shape_tuple = [&] {
    nb::list items;
    for (int i = 0; i < ndim; ++i) items.append(shape[i]);
    return nb::steal<nb::tuple>(PySequence_Tuple(items.ptr()));
  };
  if (p.q.exchange != nullptr) {
    dlpack::Tensor prototype{};
    prototype.device = {p.device < 0 ? dlpack::kCPU : dlpack::kCUDA, p.device < 0 ? 0 : p.device};
    prototype.ndim = ndim;
    prototype.dtype = fp32 ? dlpack::DataType{dlpack::kFloat, 32, 1}
                           : (p.dtype == DType::kBFloat16 ? dlpack::DataType{dlpack::kBfloat, 16, 1}
                                                          : dlpack::DataType{dlpack::kFloat, uint8_t(8 * item_bytes(p.dtype)), 1});
    prototype.shape = const_cast<int64_t*>(shape);
    o.api = p.q.exchange;
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
  } else if (p.q.framework == Framework::kNumpy) {
    nb::object dtype = fp32 ? nb::module_::import_("numpy").attr("float32") : p.q.object.attr("dtype");
    o.result = nb::module_::import_("numpy").attr("empty")(shape_tuple(), dtype);
    ArrayRef const a = describe(o.result, "out");
    o.data = a.data;
    for (int i = 0; i < ndim; ++i) strides[i] = a.strides[i];
  } else {
    nb::tuple made = nb::cast<nb::tuple>(alloc(shape_tuple(), fp32 ? "float32" : p.q.dtype_name.c_str(), p.device));
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
void allocate(Output& o, const Problem& p, bool lse, nb::handle alloc) {
  int64_t shape[4];
  int n = 0;
  shape[n++] = p.batch;
  if (p.rank == 4) shape[n++] = p.heads_q;
  shape[n++] = p.seqlen_q;
  if (!lse) shape[n++] = p.head_dim;
  int64_t strides[4];
  allocate_array(o, p, shape, n, lse, alloc, strides);
  o.view = view_of(p, strides, lse);
}

FwdParams make_params(const Problem& p, const void* q, const void* k, const void* v, const Output& o,
                      const Output* lse, const long long (*qkv_strides)[3]) {
  FwdParams params{};
  params.q = q, params.k = k, params.v = v, params.o = o.data;
  params.lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  params.q_batch_stride = qkv_strides[0][0], params.q_head_stride = qkv_strides[0][1], params.q_row_stride = qkv_strides[0][2];
  params.k_batch_stride = qkv_strides[1][0], params.k_head_stride = qkv_strides[1][1], params.k_row_stride = qkv_strides[1][2];
  params.v_batch_stride = qkv_strides[2][0], params.v_head_stride = qkv_strides[2][1], params.v_row_stride = qkv_strides[2][2];
  params.o_batch_stride = o.view.strides[0], params.o_head_stride = o.view.strides[1], params.o_row_stride = o.view.strides[2];
  params.batch = p.batch, params.heads_q = p.heads_q, params.heads_kv = p.heads_kv;
  params.heads_ratio = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  params.seqlen_q = p.seqlen_q, params.seqlen_k = p.seqlen_k, params.head_dim = p.head_dim;
  params.softmax_scale = p.scale;
  params.softmax_scale_log2 = p.scale * static_cast<float>(M_LOG2E);
  if (p.causal) params.window_right = 0;
  if (lse != nullptr) {
    params.lse_head_stride = p.seqlen_q;
    params.lse_batch_stride = static_cast<long long>(p.heads_q) * p.seqlen_q;
  }
  params.dtype = p.dtype;
  return params;
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
  int const bytes = dtype == DType::kFloat32 ? 4 : 2;
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

// Small host problems go through one pinned staging buffer per thread: q, k, v packed compact on the
// CPU, one copy in, one launch, one copy out of O and lse. Each copy from pageable memory costs several
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

// Row by row between a strided (B, H, N, cols) host view and a compact one (pack: strided -> compact).
void host_rows(char* compact, char* strided, const long long* shape, const long long* strides, int bytes, bool pack) {
  size_t const row_bytes = static_cast<size_t>(shape[3]) * bytes;
  char* dst = compact;
  for (long long b = 0; b < shape[0]; ++b)
    for (long long h = 0; h < shape[1]; ++h)
      for (long long n = 0; n < shape[2]; ++n, dst += row_bytes) {
        char* row = strided + (b * strides[0] + h * strides[1] + n * strides[2]) * bytes;
        if (pack) std::memcpy(dst, row, row_bytes);
        else std::memcpy(row, dst, row_bytes);
      }
}

cudaError_t run_host_staged(const Problem& p, Backend backend, Output& o, Output* lse, cudaStream_t stream) {
  thread_local PinnedStaging staging;
  int const bytes = item_bytes(p.dtype);
  long long const q_elems = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q * p.head_dim;
  long long const kv_elems = static_cast<long long>(p.batch) * p.heads_kv * p.seqlen_k * p.head_dim;
  size_t const in_bytes = static_cast<size_t>(q_elems + 2 * kv_elems) * bytes;
  size_t const o_bytes = static_cast<size_t>(q_elems) * bytes;
  size_t const lse_bytes = lse != nullptr ? static_cast<size_t>(p.batch) * p.heads_q * p.seqlen_q * 4 : 0;
  size_t const lse_offset = (in_bytes + o_bytes + 15) / 16 * 16;  // fp32 lse after O, 16-byte aligned
  size_t const total = lse_offset + lse_bytes;
  cudaError_t err = staging.reserve(total);
  if (err != cudaSuccess) return err;
  char* const host = static_cast<char*>(staging.ptr);
  const ArrayRef* inputs[3] = {&p.q, &p.k, &p.v};
  long long compact[3][3];
  size_t offsets[3] = {0, static_cast<size_t>(q_elems) * bytes, static_cast<size_t>(q_elems + kv_elems) * bytes};
  for (int i = 0; i < 3; ++i) {
    int const heads = i == 0 ? p.heads_q : p.heads_kv;
    int const seqlen = i == 0 ? p.seqlen_q : p.seqlen_k;
    long long const shape[4] = {p.batch, heads, seqlen, p.head_dim};
    long long strides[4] = {0, 0, 0, 1};
    p.strides4(*inputs[i], &strides[0], &strides[1], &strides[2]);
    host_rows(host + offsets[i], static_cast<char*>(inputs[i]->data), shape, strides, bytes, /*pack=*/true);
    compact[i][2] = p.head_dim, compact[i][1] = static_cast<long long>(seqlen) * p.head_dim;
    compact[i][0] = compact[i][1] * heads;
  }
  char* device = nullptr;
  err = workspace_alloc(reinterpret_cast<void**>(&device), total, stream);
  if (err != cudaSuccess) return err;
  err = cudaMemcpyAsync(device, host, in_bytes, cudaMemcpyHostToDevice, stream);
  Output device_o, device_lse;
  int64_t o_strides[4], lse_strides[4];
  compact_strides(p, false, o_strides);
  compact_strides(p, true, lse_strides);
  device_o.view = view_of(p, o_strides, false);
  device_o.data = device + in_bytes;
  device_lse.view = view_of(p, lse_strides, true);
  device_lse.data = device + lse_offset;
  if (err == cudaSuccess) {
    FwdParams const params = make_params(p, device + offsets[0], device + offsets[1], device + offsets[2], device_o,
                                         lse != nullptr ? &device_lse : nullptr, compact);
    err = run_forward(backend, params, stream);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(host + in_bytes, device + in_bytes, total - in_bytes, cudaMemcpyDeviceToHost, stream);
  }
  cudaError_t const sync_err = cudaStreamSynchronize(stream);  // nothing in flight may outlive the buffers
  workspace_free(device, stream);
  if (err == cudaSuccess) err = sync_err;
  if (err != cudaSuccess) return err;
  host_rows(host + in_bytes, static_cast<char*>(o.data), o.view.shape, o.view.strides, bytes, /*pack=*/false);
  if (lse != nullptr) {
    host_rows(host + lse_offset, static_cast<char*>(lse->data), lse->view.shape, lse->view.strides, 4, false);
  }
  return cudaSuccess;
}

// numpy / torch CPU arrays on a GPU backend: compact device copies of q, k, v from the workspace pool,
// one launch, results copied back, on the calling thread's stream of CUDA device 0.
void run_host(const Problem& p, Backend backend, Output& o, Output* lse) {
  if (p.empty() || p.seqlen_k == 0) {
    fill_host(o.data, p.dtype, o.view, 0.f);
    if (lse != nullptr) fill_host(lse->data, DType::kFloat32, lse->view, -INFINITY);
    return;
  }
  DeviceGuard guard(0);
  {
    size_t const elems = static_cast<size_t>(p.batch) * p.head_dim *
                         (2 * static_cast<size_t>(p.heads_q) * p.seqlen_q + 2 * static_cast<size_t>(p.heads_kv) * p.seqlen_k);
    if (elems * item_bytes(p.dtype) <= kStagingLimit) {
      cudaError_t err;
      {
        nb::gil_scoped_release no_gil;
        err = run_host_staged(p, backend, o, lse, cudaStreamPerThread);
      }
      if (err != cudaSuccess) throw_cuda_error(err, "cutlassfa host path");
      return;
    }
  }
  cudaStream_t const stream = cudaStreamPerThread;
  int const bytes = item_bytes(p.dtype);
  std::vector<void*> buffers;
  auto release = [&] {
    for (void* b : buffers) workspace_free(b, stream);
    buffers.clear();
  };
  cudaError_t err = cudaSuccess;
  const char* what = "cutlassfa host path";
  size_t failed_bytes = 0;
  {
    nb::gil_scoped_release no_gil;
    const ArrayRef* inputs[3] = {&p.q, &p.k, &p.v};
    void* device_inputs[3] = {};
    long long compact[3][3];
    for (int i = 0; i < 3 && err == cudaSuccess; ++i) {
      int const heads = i == 0 ? p.heads_q : p.heads_kv;
      int const seqlen = i == 0 ? p.seqlen_q : p.seqlen_k;
      long long const shape[4] = {p.batch, heads, seqlen, p.head_dim};
      long long src[4] = {0, 0, 0, 1};
      p.strides4(*inputs[i], &src[0], &src[1], &src[2]);
      long long const dst[4] = {static_cast<long long>(heads) * seqlen * p.head_dim,
                                static_cast<long long>(seqlen) * p.head_dim, p.head_dim, 1};
      compact[i][0] = dst[0], compact[i][1] = dst[1], compact[i][2] = dst[2];
      size_t const size = static_cast<size_t>(p.batch) * dst[0] * bytes;
      err = workspace_alloc(&device_inputs[i], size, stream);
      if (err != cudaSuccess) {
        failed_bytes = size;
        break;
      }
      buffers.push_back(device_inputs[i]);
      err = copy_strided(device_inputs[i], dst, inputs[i]->data, src, shape, bytes, stream);
    }
    Output device_o, device_lse;
    if (err == cudaSuccess) {
      int64_t strides[4];
      compact_strides(p, false, strides);
      device_o.view = view_of(p, strides, false);
      size_t const size = static_cast<size_t>(p.batch) * p.heads_q * p.seqlen_q * p.head_dim * bytes;
      err = workspace_alloc(&device_o.data, size, stream);
      if (err == cudaSuccess) buffers.push_back(device_o.data);
      else failed_bytes = size;
    }
    if (err == cudaSuccess && lse != nullptr) {
      int64_t strides[4];
      compact_strides(p, true, strides);
      device_lse.view = view_of(p, strides, true);
      size_t const size = static_cast<size_t>(p.batch) * p.heads_q * p.seqlen_q * 4;
      err = workspace_alloc(&device_lse.data, size, stream);
      if (err == cudaSuccess) buffers.push_back(device_lse.data);
      else failed_bytes = size;
    }
    if (err == cudaSuccess) {
      FwdParams const params = make_params(p, device_inputs[0], device_inputs[1], device_inputs[2], device_o,
                                           lse != nullptr ? &device_lse : nullptr, compact);
      what = "cutlassfa kernel launch";
      err = run_forward(backend, params, stream);
    }
    if (err == cudaSuccess) {
      what = "cudaMemcpy2DAsync";
      err = copy_strided(o.data, o.view.strides, device_o.data, device_o.view.strides, o.view.shape, bytes, stream);
    }
    if (err == cudaSuccess && lse != nullptr) {
      err = copy_strided(lse->data, lse->view.strides, device_lse.data, device_lse.view.strides, lse->view.shape, 4,
                         stream);
    }
    if (err == cudaSuccess) {
      what = "cudaStreamSynchronize";
      err = cudaStreamSynchronize(stream);
    }
    if (err != cudaSuccess) cudaStreamSynchronize(stream);  // nothing in flight may outlive the buffers
    release();
  }
  if (err != cudaSuccess) throw_cuda_error(err, failed_bytes ? "cutlassfa workspace" : what, failed_bytes);
}

// The stream to launch on: `stream_arg` when given (>= 0), else the framework's current stream
// (DLPack exchange API), else the calling thread's default stream.
cudaStream_t launch_stream(const Problem& p, int64_t stream_arg) {
  if (stream_arg >= 0) return reinterpret_cast<cudaStream_t>(stream_arg);
  if (p.q.exchange != nullptr) {
    void* current = nullptr;
    if (p.q.exchange->current_work_stream(dlpack::kCUDA, p.device, &current) != 0) throw nb::python_error();
    return static_cast<cudaStream_t>(current);
  }
  return cudaStreamPerThread;
}

void run_device(const Problem& p, Backend backend, Output& o, Output* lse, int64_t stream_arg, bool sync) {
  DeviceGuard guard(p.device);
  cudaStream_t const stream = launch_stream(p, stream_arg);
  cudaError_t err;
  {
    nb::gil_scoped_release no_gil;
    if (p.empty() || p.seqlen_k == 0) {
      err = fill_device(o.data, p.dtype, o.view, 0.f, stream);
      if (err == cudaSuccess && lse != nullptr) err = fill_device(lse->data, DType::kFloat32, lse->view, -INFINITY, stream);
    } else {
      long long strides[3][3];
      p.strides4(p.q, &strides[0][0], &strides[0][1], &strides[0][2]);
      p.strides4(p.k, &strides[1][0], &strides[1][1], &strides[1][2]);
      p.strides4(p.v, &strides[2][0], &strides[2][1], &strides[2][2]);
      FwdParams params = make_params(p, p.q.data, p.k.data, p.v.data, o, lse, strides);
      params.num_splits = dense_num_splits(backend, p.device, params);
      err = run_forward(backend, params, stream);
    }
    if (err == cudaSuccess && sync) err = cudaStreamSynchronize(stream);
  }
  if (err != cudaSuccess) throw_cuda_error(err, "cutlassfa kernel launch");
}

// ---- The variant path ----------------------------------------------------------------------------

// The (1, H, total, cols) view of a varlen array (total, H, cols) (lse: (H, total), cols 1).
Strided4 varlen_view(int heads, int total, const int64_t* strides, int cols, bool lse) {
  Strided4 v{};
  v.shape[0] = 1, v.shape[1] = heads, v.shape[2] = total, v.shape[3] = cols;
  v.strides[0] = 0;
  if (lse) {
    v.strides[1] = strides[0], v.strides[2] = strides[1], v.strides[3] = 1;
  } else {
    v.strides[1] = strides[1], v.strides[2] = strides[0], v.strides[3] = strides[2];
  }
  return v;
}

// Host index values copied to the device in one buffer of the workspace pool (released in stream
// order after the launches that read it).
struct IndexUpload {
  void* buffer = nullptr;
  size_t failed_bytes = 0;

  cudaError_t upload(const std::vector<const IndexArray*>& indices, std::vector<const int*>& pointers,
                     cudaStream_t stream) {
    std::vector<int32_t> packed;
    std::vector<size_t> offsets;
    for (const IndexArray* index : indices) {
      offsets.push_back(packed.size());
      if (index->on_host()) {
        packed.insert(packed.end(), index->values.begin(), index->values.end());
        packed.resize((packed.size() + 3) / 4 * 4);  // each array 16-byte aligned
      }
    }
    pointers.clear();
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
    for (size_t i = 0; i < indices.size(); ++i) {
      const IndexArray* index = indices[i];
      pointers.push_back(!index->given ? nullptr
                         : index->on_host() ? static_cast<const int*>(buffer) + offsets[i]
                                            : index->device_data);
    }
    return cudaSuccess;
  }
};

// The FwdParams fields of the variant arguments (make_params has set the dense ones).
void apply_variant(FwdParams& params, const VariantProblem& vp, const std::vector<const int*>& index, const Output* lse) {
  const Problem& p = vp.problem;
  const Variant& w = vp.variant;
  params.window_left = w.window_left;
  params.window_right = w.window_right;
  if (w.softcap > 0.f) {  // c * tanh(scale * s / c): the cap becomes the softmax scale (params.h)
    params.softcap_pre = p.scale / w.softcap;
    params.softmax_scale = w.softcap;
    params.softmax_scale_log2 = w.softcap * static_cast<float>(M_LOG2E);
  }
  params.cu_seqlens_q = index[0];
  params.cu_seqlens_k = index[1];
  params.total_q = w.total_q;
  params.total_k = w.total_k;
  params.seqlens_k = index[2];
  params.leftpad_k = index[3];
  params.seqlens_k_added = w.n_new;
  if (w.paged) {
    params.block_table = index[4];
    params.block_table_stride = w.block_table.row_stride;
    params.page_size = w.page_size;
    if ((w.page_size & (w.page_size - 1)) == 0) {
      params.page_size_log2 = 0;
      while ((1 << params.page_size_log2) < w.page_size) ++params.page_size_log2;
    }
    params.num_pages = w.num_pages;
  }
  if (p.varlen && lse != nullptr) {  // (Hq, total_q)
    params.lse_batch_stride = 0;
    params.lse_head_stride = lse->view.strides[1];
  }
}

void run_variant(const VariantProblem& vp, Backend backend, Output& o, Output* lse, int64_t stream_arg, bool sync) {
  const Problem& p = vp.problem;
  const Variant& w = vp.variant;
  DeviceGuard guard(p.device);
  cudaStream_t const stream = launch_stream(p, stream_arg);
  cudaError_t err = cudaSuccess;
  const char* what = "cutlassfa index upload";
  IndexUpload uploads;
  {
    nb::gil_scoped_release no_gil;
    std::vector<const int*> index;
    err = uploads.upload({&w.cu_seqlens_q, &w.cu_seqlens_k, &w.cache_seqlens, &w.cache_leftpad, &w.block_table}, index,
                         stream);
    long long strides[3][3];
    p.strides4(p.q, &strides[0][0], &strides[0][1], &strides[0][2]);
    p.strides4(p.k, &strides[1][0], &strides[1][1], &strides[1][2]);
    p.strides4(p.v, &strides[2][0], &strides[2][1], &strides[2][2]);
    FwdParams params = make_params(p, p.q.data, p.k.data, p.v.data, o, lse, strides);
    if (err == cudaSuccess) apply_variant(params, vp, index, lse);
    if (err == cudaSuccess && w.k_new) {  // appended first, on the same stream: the kernel reads them
      what = "cutlassfa KV-cache append";
      AppendKV append{w.k_new->data, w.v_new->data, {}, {}, w.n_new};
      for (int i = 0; i < 3; ++i) append.k_new_strides[i] = w.k_new->strides[i], append.v_new_strides[i] = w.v_new->strides[i];
      err = launch_append_kv(params, append, stream);
    }
    if (err == cudaSuccess) {
      what = "cutlassfa kernel launch";
      if (p.empty() || p.seqlen_k == 0) {
        err = fill_device(o.data, p.dtype, o.view, 0.f, stream);
        if (err == cudaSuccess && lse != nullptr) err = fill_device(lse->data, DType::kFloat32, lse->view, -INFINITY, stream);
      } else {
        params.num_splits = resolve_num_splits(backend, p.device, params, w.num_splits);
        err = run_forward(backend, params, stream);
      }
    }
    workspace_free(uploads.buffer, stream);
    if (err == cudaSuccess && sync) err = cudaStreamSynchronize(stream);
  }
  if (err != cudaSuccess) throw_cuda_error(err, uploads.failed_bytes ? "cutlassfa workspace" : what, uploads.failed_bytes);
}

}  // namespace

nb::object forward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, double scale, int backend,
                   bool return_lse, nb::handle alloc, int64_t stream, bool sync) {
  Problem const p = validate(q, k, v, out, causal, scale);
  int const resolved = resolve_backend(p, backend);
  if (resolved == kBackendCpu) return nb::none();

  Output o;
  if (p.out) {
    o.result = nb::borrow(out);
    if (p.out->framework == Framework::kBuffer) {
      o.data = reinterpret_cast<void*>(nb::cast<DeviceBuffer&>(out).ptr());
      int64_t strides[4];
      compact_strides(p, false, strides);
      o.view = view_of(p, strides, false);
    } else {
      o.data = p.out->data;
      o.view = view_of(p, p.out->strides, false);
    }
  } else {
    allocate(o, p, false, alloc);
  }
  Output lse;
  if (return_lse) {
    allocate(lse, p, true, alloc);
    check_lse_compact(lse, p);
  }
  if (p.device < 0) {
    run_host(p, static_cast<Backend>(resolved), o, return_lse ? &lse : nullptr);
  } else {
    run_device(p, static_cast<Backend>(resolved), o, return_lse ? &lse : nullptr, stream, sync);
  }
  nb::object result = o.finish();
  return nb::make_tuple(result, return_lse ? lse.finish() : nb::none());
}

nb::object forward_variant(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, double scale,
                           int backend, bool return_lse, nb::handle alloc, int64_t stream, bool sync,
                           const VariantArgs& args) {
  VariantProblem const vp = validate_variant(q, k, v, out, causal, scale, args);
  const Problem& p = vp.problem;
  int const resolved = resolve_backend(p, backend);
  if (resolved == kBackendCpu) return nb::none();
  if (p.device < 0) {
    PyErr_SetString(PyExc_NotImplementedError,
                    "the variant arguments run on GPU backends for CUDA arrays (PyTorch, CuPy); host arrays run them "
                    "on the cpu backend");
    throw nb::python_error();
  }
  Output o;
  if (p.out) {
    o.result = nb::borrow(out);
    o.data = p.out->data;
    o.view = p.varlen ? varlen_view(p.heads_q, vp.variant.total_q, p.out->strides, p.head_dim, false)
                      : view_of(p, p.out->strides, false);
  } else if (p.varlen) {
    int64_t const shape[3] = {vp.variant.total_q, p.heads_q, p.head_dim};
    int64_t strides[3];
    allocate_array(o, p, shape, 3, false, alloc, strides);
    o.view = varlen_view(p.heads_q, vp.variant.total_q, strides, p.head_dim, false);
  } else {
    allocate(o, p, false, alloc);
  }
  Output lse;
  if (return_lse) {
    if (p.varlen) {
      int64_t const shape[2] = {p.heads_q, vp.variant.total_q};
      int64_t strides[2];
      allocate_array(lse, p, shape, 2, true, alloc, strides);
      if (vp.variant.total_q > 1 && strides[1] != 1) throw std::runtime_error("internal: the lse output is not compact");
      lse.view = varlen_view(p.heads_q, vp.variant.total_q, strides, 1, true);
    } else {
      allocate(lse, p, true, alloc);
      check_lse_compact(lse, p);
    }
  }
  run_variant(vp, static_cast<Backend>(resolved), o, return_lse ? &lse : nullptr, stream, sync);
  nb::object result = o.finish();
  return nb::make_tuple(result, return_lse ? lse.finish() : nb::none());
}

int select_backend(nb::handle q, nb::handle k, nb::handle v, bool causal, double scale, int backend) {
  return resolve_backend(validate(q, k, v, nb::none(), causal, scale), backend);
}

}  // namespace cutlassfa::bindings
