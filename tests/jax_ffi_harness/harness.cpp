// cpp/jax/ffi.cpp's handler run on XLA's CPU platform, for tests/test_jax.py on machines without a GPU:
// the real handler (attribute decoding, operands, layouts, vmap folding into the batch, Problem and
// FwdParams) in front of a float64 CPU attention standing in for enqueue_call, which also records the
// problem and params it was given. Built by the test with g++ and nanobind; the CUDA runtime calls the
// handler makes are stubbed below.
#include "jax/ffi.cpp"  // the handler under test

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {
cutlassfa::FwdParams g_last{};
cutlassfa::Problem g_problem{};
int g_backend = -1;
int g_calls = 0;
bool g_appended = false;
}  // namespace

namespace cutlassfa {

// Exact attention of a dense float32 call (other calls are only recorded): windows (bottom-right), GQA,
// any strides. The enqueue step asks the device (cpp/src/enqueue.cpp); this records what it was given.
cudaError_t enqueue_call(Backend backend, int, const Problem& problem, const FwdParams& p, const AppendKV* append,
                         const Strided4&, const Strided4*, cudaStream_t, EnqueueFailure*) {
  g_last = p;
  g_problem = problem;
  g_backend = static_cast<int>(backend);
  g_appended = append != nullptr;
  ++g_calls;
  if (p.dtype != DType::kFloat32 || problem.kv_cache || problem.varlen) return cudaSuccess;
  auto const* q = static_cast<const float*>(p.q);
  auto const* k = static_cast<const float*>(p.k);
  auto const* v = static_cast<const float*>(p.v);
  auto* o = static_cast<float*>(p.o);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads_q; ++h) {
      int const hk = h / p.heads_ratio;
      for (int i = 0; i < p.seqlen_q; ++i) {
        long long const diagonal = i + p.seqlen_k - p.seqlen_q;
        float const* qi = q + b * p.q_batch_stride + h * p.q_head_stride + i * p.q_row_stride;
        std::vector<double> s(p.seqlen_k, -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < p.seqlen_k; ++j) {
          if (p.window_right >= 0 && j > diagonal + p.window_right) continue;
          if (p.window_left >= 0 && j < diagonal - p.window_left) continue;
          float const* kj = k + b * p.k_batch_stride + hk * p.k_head_stride + j * p.k_row_stride;
          double dot = 0;
          for (int c = 0; c < p.head_dim; ++c) dot += double(qi[c]) * kj[c];
          s[j] = dot * p.softmax_scale;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (int j = 0; j < p.seqlen_k; ++j) l += s[j] > -INFINITY ? std::exp(s[j] - m) : 0.0;
        float* oi = o + b * p.o_batch_stride + h * p.o_head_stride + i * p.o_row_stride;
        for (int c = 0; c < p.head_dim; ++c) {
          double acc = 0;
          for (int j = 0; j < p.seqlen_k; ++j) {
            if (s[j] > -INFINITY) {
              acc += std::exp(s[j] - m) / l * v[b * p.v_batch_stride + hk * p.v_head_stride + j * p.v_row_stride + c];
            }
          }
          oi[c] = l > 0 ? static_cast<float>(acc) : 0.f;
        }
        if (p.lse != nullptr) {
          float const row_lse = l > 0 ? static_cast<float>(m + std::log(l)) : -INFINITY;
          p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = row_lse;
        }
      }
    }
  }
  return cudaSuccess;
}

}  // namespace cutlassfa

extern "C" {
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t) { return "stub"; }
cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(to, from, bytes);
  return cudaSuccess;
}
}

// XLA's CPU platform has no stream or device context: the same handler body, given none.
static ffi::Error on_cpu(cutlassfa::jax_ffi::Attributes attributes, ffi::AnyBuffer q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> o,
                         ffi::Result<ffi::Buffer<ffi::F32>> lse, ffi::RemainingRets rest_out) {
  return cutlassfa::jax_ffi::forward(nullptr, 0, attributes, q, k, v, rest, o, lse, rest_out);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(harness_forward, on_cpu,
                              ffi::Ffi::Bind()
                                  .Attrs<cutlassfa::jax_ffi::Attributes>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .RemainingRets());

NB_MODULE(jax_ffi_harness, m) {
  cutlassfa::register_jax_ffi(m);  // the module function the extension exports, checked to exist
  m.def("cpu_handler", [] { return nanobind::capsule(reinterpret_cast<void*>(&harness_forward)); });
  m.def("last_params", [] {
    cutlassfa::FwdParams const& p = g_last;
    cutlassfa::Problem const& problem = g_problem;
    nanobind::dict d;
    d["calls"] = g_calls;
    d["backend"] = g_backend;
    d["batch"] = p.batch;
    d["heads_q"] = p.heads_q;
    d["heads_kv"] = p.heads_kv;
    d["heads_ratio"] = p.heads_ratio;
    d["seqlen_q"] = p.seqlen_q;
    d["seqlen_k"] = p.seqlen_k;
    d["head_dim"] = p.head_dim;
    d["q_strides"] = nanobind::make_tuple(p.q_batch_stride, p.q_head_stride, p.q_row_stride);
    d["k_strides"] = nanobind::make_tuple(p.k_batch_stride, p.k_head_stride, p.k_row_stride);
    d["o_strides"] = nanobind::make_tuple(p.o_batch_stride, p.o_head_stride, p.o_row_stride);
    d["lse_strides"] = nanobind::make_tuple(p.lse_batch_stride, p.lse_head_stride);
    d["softmax_scale"] = p.softmax_scale;
    d["softmax_scale_log2"] = p.softmax_scale_log2;
    d["softcap_pre"] = p.softcap_pre;
    d["window"] = nanobind::make_tuple(p.window_left, p.window_right);
    d["causal"] = p.window_left < 0 && p.window_right == 0;  // causal is the window (-1, 0)
    d["dtype"] = static_cast<int>(p.dtype);
    d["kv_fp8"] = p.kv_fp8;
    d["kv_cache"] = problem.kv_cache;
    d["paged"] = problem.paged;
    d["varlen"] = problem.varlen;
    d["variant"] = problem.variant;
    d["num_splits"] = problem.num_splits;
    d["page_size"] = p.page_size;
    d["num_pages"] = p.num_pages;
    d["block_table_stride"] = p.block_table_stride;
    d["n_new"] = p.seqlens_k_added;
    d["appended"] = g_appended;
    d["total_q"] = p.total_q;
    d["total_k"] = p.total_k;
    d["lse"] = p.lse != nullptr;
    d["given"] = nanobind::make_tuple(p.seqlens_k != nullptr, p.leftpad_k != nullptr, p.block_table != nullptr,
                                      p.cu_seqlens_q != nullptr, p.cu_seqlens_k != nullptr, p.sinks != nullptr,
                                      p.alibi_slopes != nullptr, p.k_descale != nullptr, p.v_descale != nullptr);
    d["alibi_batch_stride"] = p.alibi_batch_stride;
    d["k_descale_strides"] = nanobind::make_tuple(p.k_descale_batch_stride, p.k_descale_head_stride);
    return d;
  });
}
