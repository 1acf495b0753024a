// cpp/jax/ffi.cpp's handler run on XLA's CPU platform, for tests/test_jax.py on machines without a GPU:
// the real handler (attribute decoding, buffer shapes, vmap folding into the batch, FwdParams) in front
// of a float64 CPU attention standing in for run_plan, which also records the params it was given.
// Built by the test with g++ and nanobind; the CUDA runtime calls the handler makes are stubbed below.
#include "jax/ffi.cpp"  // the handler under test, with its anonymous-namespace forward()

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {
cutlassfa::FwdParams g_last{};
int g_backend = -1;
int g_calls = 0;
}  // namespace

namespace cutlassfa {

// Exact attention of float32 params (other dtypes are only recorded), bottom-right causal, GQA.
// The plan asks the device (cpp/src/dispatch.cpp); the CPU stand-in records the backend and runs one pass.
Plan make_plan(Backend backend, int, const FwdParams&, int) {
  Plan plan;
  plan.backend = backend;
  return plan;
}

cudaError_t run_plan(const Plan& plan, const FwdParams& p, cudaStream_t) {
  g_last = p;
  g_backend = static_cast<int>(plan.backend);
  ++g_calls;
  if (p.dtype != DType::kFloat32) return cudaSuccess;
  auto const* q = static_cast<const float*>(p.q);
  auto const* k = static_cast<const float*>(p.k);
  auto const* v = static_cast<const float*>(p.v);
  auto* o = static_cast<float*>(p.o);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads_q; ++h) {
      int const hk = h / p.heads_ratio;
      for (int i = 0; i < p.seqlen_q; ++i) {
        float const* qi = q + b * p.q_batch_stride + h * p.q_head_stride + i * p.q_row_stride;
        std::vector<double> s(p.seqlen_k, -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < p.seqlen_k; ++j) {
          if (p.window_right >= 0 && j > i + p.seqlen_k - p.seqlen_q + p.window_right) continue;
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
        p.lse[(static_cast<long long>(b) * p.heads_q + h) * p.seqlen_q + i] =
            l > 0 ? static_cast<float>(m + std::log(l)) : -INFINITY;
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
}

// XLA's CPU platform has no stream or device context: the same handler body, given none.
static ffi::Error on_cpu(int32_t backend, double softmax_scale, bool causal, ffi::AnyBuffer q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::Buffer<ffi::F32>> lse) {
  return cutlassfa::forward(nullptr, 0, backend, softmax_scale, causal, q, k, v, o, lse);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(harness_forward, on_cpu,
                              ffi::Ffi::Bind()
                                  .Attr<int32_t>("backend")
                                  .Attr<double>("softmax_scale")
                                  .Attr<bool>("causal")
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

NB_MODULE(jax_ffi_harness, m) {
  cutlassfa::register_jax_ffi(m);  // the module function the extension exports, checked to exist
  m.def("cpu_handler", [] { return nanobind::capsule(reinterpret_cast<void*>(&harness_forward)); });
  m.def("last_params", [] {
    cutlassfa::FwdParams const& p = g_last;
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
    d["softmax_scale"] = p.softmax_scale;
    d["softmax_scale_log2"] = p.softmax_scale_log2;
    d["causal"] = p.window_left < 0 && p.window_right == 0;  // causal is the window (-1, 0)
    d["dtype"] = static_cast<int>(p.dtype);
    return d;
  });
}
