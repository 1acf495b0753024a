#include "bindings/problem.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "common/alignment.h"
#include "cutlassfa/config.h"

namespace cutlassfa::bindings {
// Python exceptions set from a copy of the message (nb::value_error keeps only the pointer in some
// nanobind versions, and the message is a temporary).
[[noreturn]] void value_error(const std::string& message) {
  PyErr_SetString(PyExc_ValueError, message.c_str());
  throw nb::python_error();
}
[[noreturn]] void type_error(const std::string& message) {
  PyErr_SetString(PyExc_TypeError, message.c_str());
  throw nb::python_error();
}

// Python's repr of a tuple of ints: (2, 3) or (5,). No iostreams: inserting an integer into an
// ostringstream crashed inside the CUDA build of the extension on the H200 machine's toolchain.
std::string tuple_text(const int64_t* values, int n) {
  std::string text = "(";
  for (int i = 0; i < n; ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + (n == 1 ? ",)" : ")");
}

namespace {
int recorded(const ArrayRef& a) { return a.ndim < ArrayRef::kMaxDims ? a.ndim : ArrayRef::kMaxDims; }
}  // namespace
std::string shape_text(const ArrayRef& a) { return tuple_text(a.shape, recorded(a)); }
std::string strides_text(const ArrayRef& a) { return tuple_text(a.strides, recorded(a)); }
std::string where(const ArrayRef& a) { return a.on_host() ? "host" : "cuda:" + std::to_string(a.device); }

namespace {

// (B, H, N, d) of a 3-D or 4-D array.
void dims4(const ArrayRef& a, int64_t* dims) {
  if (a.ndim == 3) {
    dims[0] = a.shape[0], dims[1] = 1, dims[2] = a.shape[1], dims[3] = a.shape[2];
  } else {
    for (int i = 0; i < 4; ++i) dims[i] = a.shape[i];
  }
}

const std::set<int>& all_head_dims() {
  static std::set<int> const dims{CUTLASSFA_SMALL_TILE_HEAD_DIMS, CUTLASSFA_LARGE_TILE_HEAD_DIMS,
                                  CUTLASSFA_SM80_HEAD_DIMS};
  return dims;
}

const char* backend_name(int backend) {
  if (backend == kBackendCpu) return "cpu";
  if (backend >= 0 && backend <= static_cast<int>(Backend::kTensorCoreSm80)) {
    return cutlassfa::backend_name(static_cast<Backend>(backend));
  }
  return "auto";
}

// The tensor-core families take the row max of unscaled scores (softmax_scale > 0), and read device
// arrays in 16-byte vectors (common/alignment.h). Host arrays are copied into compact device
// buffers, which always qualify.
bool tensorcore_accepts(const Problem& p) {
  if (!(p.scale > 0.f)) return false;
  if (p.device < 0) return true;
  int const bytes = p.dtype == DType::kFloat32 ? 4 : 2;
  auto aligned = [&](const ArrayRef& a, int extent, int heads, int seqlen) {
    long long b = 0, h = 0, n = 0;
    p.strides4(a, &b, &h, &n);
    return tensor_aligned16(a.data, b, h, n, extent, heads, seqlen, bytes);
  };
  int const kv_extent = p.kv_extent >= 0 ? p.kv_extent : p.batch;
  int const kv_rows = p.kv_rows >= 0 ? p.kv_rows : p.seqlen_k;
  return aligned(p.q, p.batch, p.heads_q, p.seqlen_q) && aligned(p.k, kv_extent, p.heads_kv, kv_rows) &&
         aligned(p.v, kv_extent, p.heads_kv, kv_rows) && (!p.out || aligned(*p.out, p.batch, p.heads_q, p.seqlen_q));
}

}  // namespace

void validate_out(Problem& p, nb::handle out, const int64_t* expected, int n) {
  ArrayRef o = describe(out, "out");
  if (o.framework == Framework::kBuffer) {  // our own output buffer (JAX): compact by construction
    p.out = o;
    return;
  }
  if (o.framework != p.q.framework) {
    type_error(std::string("out must be a ") + framework_name(p.q.framework) + " array like q, got " +
               framework_name(o.framework));
  }
  if (o.framework == Framework::kJax) type_error("out is not supported for JAX arrays (they are immutable)");
  bool same = o.ndim == n;
  for (int i = 0; same && i < n; ++i) same = o.shape[i] == expected[i];
  if (!same) value_error("out must have shape " + tuple_text(expected, n) + ", got " + shape_text(o));
  if (o.dtype != static_cast<int>(p.dtype)) {
    type_error("out must have dtype " + p.q.dtype_name + " like q, got " + o.dtype_name);
  }
  if (o.device != p.device) value_error("out must be on the same device as q");
  if (!o.empty() && (o.strides[o.ndim - 1] != 1 || !o.whole_strides)) {
    value_error("out must be contiguous in its last dim (stride 1), got strides " + strides_text(o));
  }
  if (o.readonly) value_error("out is read-only");
  p.out = o;
}

void Problem::strides4(const ArrayRef& a, long long* batch_stride, long long* head_stride,
                       long long* row_stride) const {
  if (a.framework == Framework::kBuffer) {  // compact (B, H, N, d)
    *row_stride = head_dim;
    *head_stride = static_cast<long long>(seqlen_q) * head_dim;
    *batch_stride = *head_stride * heads_q;
    return;
  }
  if (varlen) {  // (total, H, d): entries are located by cu_seqlens, not by a batch stride
    *batch_stride = 0, *head_stride = a.strides[1], *row_stride = a.strides[0];
  } else if (a.ndim == 3) {
    *batch_stride = a.strides[0], *head_stride = 0, *row_stride = a.strides[1];
  } else {
    *batch_stride = a.strides[0], *head_stride = a.strides[1], *row_stride = a.strides[2];
  }
}

std::string head_dims_text() {
  std::set<int> const& dims = all_head_dims();
  std::vector<int64_t> values(dims.begin(), dims.end());
  return tuple_text(values.data(), static_cast<int>(values.size()));
}

void describe_qkv(Problem& p, nb::handle q, nb::handle k, nb::handle v, int rank, const char* layout) {
  p.q = describe(q, "q");
  p.k = describe(k, "k");
  p.v = describe(v, "v");
  const ArrayRef* arrays[3] = {&p.q, &p.k, &p.v};
  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const ArrayRef& a = *arrays[i];
    if (rank == 0 ? (a.ndim != 3 && a.ndim != 4) : a.ndim != rank) {
      value_error(std::string(names[i]) + " must be " + layout + ", got shape " + shape_text(a));
    }
    if (a.dtype < 0) {
      type_error(std::string(names[i]) + " has dtype " + a.dtype_name +
                 "; expected one of float32, float16, bfloat16");
    }
  }
  if (!(p.q.ndim == p.k.ndim && p.k.ndim == p.v.ndim)) {
    value_error("q, k and v must have the same rank, got shapes " + shape_text(p.q) + ", " + shape_text(p.k) +
                ", " + shape_text(p.v));
  }
  if (!(p.q.dtype == p.k.dtype && p.k.dtype == p.v.dtype)) {
    type_error("q, k and v must have the same dtype, got " + p.q.dtype_name + ", " + p.k.dtype_name + ", " +
               p.v.dtype_name);
  }
  if (!(p.q.device == p.k.device && p.k.device == p.v.device)) {
    value_error("q, k and v must be on the same device, got " + where(p.q) + ", " + where(p.k) + ", " + where(p.v));
  }
  if (p.q.framework != p.k.framework || p.k.framework != p.v.framework) {
    type_error(std::string("q, k and v must be arrays of the same framework, got ") + framework_name(p.q.framework) +
               ", " + framework_name(p.k.framework) + ", " + framework_name(p.v.framework));
  }
  for (int i = 0; i < 3; ++i) check_row_contiguous(*arrays[i], names[i]);
  p.rank = p.q.ndim;
  p.dtype = static_cast<DType>(p.q.dtype);
  p.device = p.q.device;
}

void check_row_contiguous(const ArrayRef& a, const char* name) {
  if (a.empty()) return;  // nothing is read from an empty array; numpy gives it zero strides
  if (a.strides[a.ndim - 1] != 1) {
    value_error(std::string(name) + " must be contiguous in its last dim (stride 1), got strides " + strides_text(a));
  }
  if (!a.whole_strides) {
    value_error(std::string(name) + " has strides that are not whole elements: " + strides_text(a));
  }
}

void check_heads_and_head_dim(int64_t heads_q, int64_t heads_kv, int64_t head_dim, const char* kv_name) {
  if ((heads_kv == 0 && heads_q != 0) || (heads_kv != 0 && heads_q % heads_kv != 0)) {
    value_error("the heads of q (" + std::to_string(heads_q) + ") must be a multiple of the heads of " + kv_name +
                " (" + std::to_string(heads_kv) + ")");
  }
  // Every multiple of 8 up to 256 is a valid problem (the cpu backend takes them all); which backends have
  // kernels for it is resolve_backend's question.
  if (head_dim < 8 || head_dim > kMaxHeadDim || head_dim % 8 != 0) {
    value_error("head dim (last dim of q, k, v) must be a multiple of 8 from 8 to " + std::to_string(kMaxHeadDim) +
                ", got " + std::to_string(head_dim));
  }
}

float resolve_scale(double scale, int head_dim) {
  if (std::isnan(scale)) return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  if (!std::isfinite(scale)) {
    value_error(std::string("softmax_scale must be finite, got ") + (scale > 0 ? "inf" : "-inf"));
  }
  return static_cast<float>(scale);
}

Problem validate(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, double scale) {
  Problem p;
  describe_qkv(p, q, k, v, 0, "4-D (B, H, N, d) or 3-D (B, N, d)");
  int64_t dq[4], dk[4], dv[4];
  dims4(p.q, dq), dims4(p.k, dk), dims4(p.v, dv);
  if (!(dq[0] == dk[0] && dk[0] == dv[0])) {
    value_error("q, k and v must have the same batch size, got " + std::to_string(dq[0]) + ", " +
                std::to_string(dk[0]) + ", " + std::to_string(dv[0]));
  }
  if (!(dq[3] == dk[3] && dk[3] == dv[3])) {
    value_error("q, k and v must have the same head dim, got " + std::to_string(dq[3]) + ", " +
                std::to_string(dk[3]) + ", " + std::to_string(dv[3]));
  }
  if (dk[1] != dv[1]) {
    value_error("k and v must have the same number of heads, got " + std::to_string(dk[1]) + " and " +
                std::to_string(dv[1]));
  }
  if (dk[2] != dv[2]) {
    value_error("k and v must have the same sequence length, got " + std::to_string(dk[2]) + " and " +
                std::to_string(dv[2]));
  }
  check_heads_and_head_dim(dq[1], dk[1], dq[3], "k and v");
  int64_t const limit = (int64_t{1} << 31) - 1;
  if (dq[2] > limit || dk[2] > limit || dq[0] * dq[1] > limit) {
    value_error("sizes too large: N must be < 2^31 and B*H < 2^31, got B=" + std::to_string(dq[0]) +
                ", H=" + std::to_string(dq[1]) + ", Nq=" + std::to_string(dq[2]) + ", Nk=" + std::to_string(dk[2]));
  }
  p.batch = static_cast<int>(dq[0]);
  p.heads_q = static_cast<int>(dq[1]);
  p.heads_kv = static_cast<int>(dk[1]);
  p.seqlen_q = static_cast<int>(dq[2]);
  p.seqlen_k = static_cast<int>(dk[2]);
  p.head_dim = static_cast<int>(dq[3]);
  p.causal = causal;
  p.scale = resolve_scale(scale, p.head_dim);
  if (!out.is_none()) {
    int64_t expected[4];
    int n = 0;
    expected[n++] = p.batch;
    if (p.rank == 4) expected[n++] = p.heads_q;
    expected[n++] = p.seqlen_q;
    expected[n++] = p.head_dim;
    validate_out(p, out, expected, n);
  }
  return p;
}

int resolve_backend(const Problem& p, int backend) {
  int const device = p.device < 0 ? 0 : p.device;
  if (backend == kBackendCpu) {
    if (p.device >= 0) value_error("backend 'cpu' needs host (numpy) arrays; q, k and v are on a CUDA device");
    return kBackendCpu;
  }
  auto runs = [&](int b) {
    Backend const which = static_cast<Backend>(b);
    return backend_unavailable_reason(which, device).empty() && head_dim_runs(which, p.head_dim, p.dtype) &&
           (which != Backend::kTensorCore || tensorcore_accepts(p));
  };
  if (backend == kBackendAuto) {
    // naive last: it takes what the tiled kernels' limits refuse (small_tile's d > 192 on sm_61).
    for (Backend b : {Backend::kTensorCore, Backend::kLargeTile, Backend::kSmallTile, Backend::kNaive}) {
      if (runs(static_cast<int>(b))) return static_cast<int>(b);
    }
    if (p.device < 0) return kBackendCpu;
    std::string const refusal = head_dim_refusal(Backend::kNaive, p.head_dim, p.dtype);
    if (!refusal.empty() && backend_unavailable_reason(Backend::kNaive, device).empty()) {
      value_error("no GPU backend runs head dim " + std::to_string(p.head_dim) + ": " + refusal +
                  " (compiled head dims: " + head_dims_text() + "); host arrays run it on the cpu backend");
    }
    throw std::runtime_error("no GPU backend can run on cuda:" + std::to_string(device) + ": " +
                             backend_unavailable_reason(Backend::kSmallTile, device));
  }
  Backend const which = static_cast<Backend>(backend);
  std::string const reason = backend_unavailable_reason(which, device);
  if (!reason.empty()) {
    throw std::runtime_error(std::string("backend '") + backend_name(backend) + "' is not available: " + reason);
  }
  std::string const refusal = head_dim_refusal(which, p.head_dim, p.dtype);
  if (!refusal.empty()) {
    value_error(std::string("backend '") + backend_name(backend) + "' does not run head dim " +
                std::to_string(p.head_dim) + " with " + p.q.dtype_name + ": " + refusal);
  }
  bool const tensorcore = which == Backend::kTensorCore || which == Backend::kTensorCoreSm80;
  if (tensorcore && !tensorcore_accepts(p)) {
    value_error(std::string("backend '") + backend_name(backend) +
                "' needs softmax_scale > 0 and 16-byte aligned q, k, v and out with strides that are multiples of "
                "16 bytes; pass contiguous arrays or use backend='auto'");
  }
  return backend;
}

}  // namespace cutlassfa::bindings
