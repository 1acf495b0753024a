// Standalone GPU check of launch_sm80 (the mma.sync family), independent of the Python package: random inputs in a
// strided (batch, seqlen, heads, head_dim) layout, output poisoned with NaN, fp64 CPU reference,
// then cudaEvent timings of the benchmark shapes. Built and run by cpp/sm80/selftest.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/reference_row.h"
#include "common/selftest_harness.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"

using cutlassfa::DType;
using cutlassfa::dtype_bytes;
using cutlassfa::dtype_name;
using cutlassfa::FwdParams;
using cutlassfa::load_element;
using cutlassfa::OutputErrors;
using cutlassfa::reference_row;
using cutlassfa::ReferenceRow;

namespace {

struct Case {
  DType dtype;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  bool causal;
};

// Tensors live as (batch, seqlen, heads, head_dim), as most frameworks store them, so the row
// stride (heads * d) differs from head_dim and the head stride is d.
struct Buffers {
  std::vector<char> hq, hk, hv, ho;
  std::vector<float> hlse;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *do_ = nullptr;
  float* dlse = nullptr;
  FwdParams p{};
};

Buffers make_buffers(const Case& c, unsigned seed, float amplitude) {
  Buffers b;
  int const eb = dtype_bytes(c.dtype);
  size_t const nq = size_t(c.batch) * c.seqlen_q * c.heads_q * c.head_dim;
  size_t const nk = size_t(c.batch) * c.seqlen_k * c.heads_kv * c.head_dim;
  b.hq.resize(nq * eb);
  b.hk.resize(nk * eb);
  b.hv.resize(nk * eb);
  b.ho.resize(nq * eb);
  b.hlse.resize(size_t(c.batch) * c.heads_q * c.seqlen_q);
  std::mt19937 rng(seed);
  cutlassfa::fill_uniform(c.dtype, b.hq.data(), nq, rng, amplitude);
  cutlassfa::fill_uniform(c.dtype, b.hk.data(), nk, rng, amplitude);
  cutlassfa::fill_uniform(c.dtype, b.hv.data(), nk, rng, amplitude);
  CHECK_CUDA(cudaMalloc(&b.dq, b.hq.size()));
  CHECK_CUDA(cudaMalloc(&b.dk, b.hk.size()));
  CHECK_CUDA(cudaMalloc(&b.dv, b.hv.size()));
  CHECK_CUDA(cudaMalloc(&b.do_, b.ho.size()));
  CHECK_CUDA(cudaMalloc(&b.dlse, b.hlse.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(b.dq, b.hq.data(), b.hq.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b.dk, b.hk.data(), b.hk.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b.dv, b.hv.data(), b.hv.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(b.do_, 0xff, b.ho.size()));  // NaN in every float format
  CHECK_CUDA(cudaMemset(b.dlse, 0xff, b.hlse.size() * sizeof(float)));

  FwdParams& p = b.p;
  p.q = b.dq;
  p.k = b.dk;
  p.v = b.dv;
  p.o = b.do_;
  p.lse = b.dlse;
  long long const d = c.head_dim;
  p.q_row_stride = p.o_row_stride = c.heads_q * d;
  p.q_head_stride = p.o_head_stride = d;
  p.q_batch_stride = p.o_batch_stride = (long long)c.seqlen_q * c.heads_q * d;
  p.k_row_stride = p.v_row_stride = c.heads_kv * d;
  p.k_head_stride = p.v_head_stride = d;
  p.k_batch_stride = p.v_batch_stride = (long long)c.seqlen_k * c.heads_kv * d;
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.heads_ratio = c.heads_q / c.heads_kv;
  p.seqlen_q = c.seqlen_q;
  p.seqlen_k = c.seqlen_k;
  p.head_dim = c.head_dim;
  p.softmax_scale = 1.f / std::sqrt(float(c.head_dim));
  p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
  if (c.causal) p.window_right = 0;
  p.lse_head_stride = c.seqlen_q;
  p.lse_batch_stride = static_cast<long long>(c.heads_q) * c.seqlen_q;
  p.dtype = c.dtype;
  return b;
}

void free_buffers(Buffers& b) {
  cudaFree(b.dq);
  cudaFree(b.dk);
  cudaFree(b.dv);
  cudaFree(b.do_);
  cudaFree(b.dlse);
}

// Returns true when the case passes. rel-L2 of O against fp64 on the same (rounded) inputs, max abs
// error, lse, and the rows that see no key (O exactly 0, lse = -inf).
bool check_case(const Case& c) {
  float const amplitude = 3.f;
  Buffers b = make_buffers(c, 1234u + c.head_dim + 7 * c.seqlen_q, amplitude);
  CHECK_CUDA(cutlassfa::launch_sm80(b.p, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(b.ho.data(), b.do_, b.ho.size(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.hlse.data(), b.dlse, b.hlse.size() * sizeof(float), cudaMemcpyDeviceToHost));

  int const d = c.head_dim;
  double const scale = b.p.softmax_scale;
  OutputErrors errors{1e-2};
  std::vector<double> s(c.seqlen_k), o(d);
  for (int bi = 0; bi < c.batch; ++bi) {
    for (int h = 0; h < c.heads_q; ++h) {
      int const hk = h / (c.heads_q / c.heads_kv);
      for (int i = 0; i < c.seqlen_q; ++i) {
        size_t const qrow = size_t(b.p.q_batch_stride) * bi + size_t(b.p.q_head_stride) * h + size_t(b.p.q_row_stride) * i;
        int const visible = c.causal ? std::min(c.seqlen_k, std::max(0, i + 1 + c.seqlen_k - c.seqlen_q)) : c.seqlen_k;
        auto const dot = [&](int j) {
          size_t const krow = size_t(b.p.k_batch_stride) * bi + size_t(b.p.k_head_stride) * hk + size_t(b.p.k_row_stride) * j;
          double acc = 0;
          for (int x = 0; x < d; ++x) {
            acc += load_element(c.dtype, b.hq.data(), qrow + x) * load_element(c.dtype, b.hk.data(), krow + x);
          }
          return acc;
        };
        auto const value = [&](int j, int x) {
          size_t const vrow = size_t(b.p.v_batch_stride) * bi + size_t(b.p.v_head_stride) * hk + size_t(b.p.v_row_stride) * j;
          return load_element(c.dtype, b.hv.data(), vrow + x);
        };
        ReferenceRow const row = reference_row(visible, d, scale, dot, value, s, o);
        float const lse_got = b.hlse[(size_t(bi) * c.heads_q + h) * c.seqlen_q + i];
        errors.add_row(row, o, c.dtype, b.ho.data(), qrow, d, lse_got);  // O has Q's strides
      }
    }
  }
  double const rel = errors.rel_l2();
  double const tol = c.dtype == DType::kBFloat16 ? 1.6e-2 : 3e-3;
  bool const ok = errors.bad == 0 && rel <= tol && (c.dtype != DType::kFloat32 || errors.max_abs <= 5e-3);
  std::printf("%s %s d=%3d B=%d H=%d/%d Nq=%5d Nk=%5d causal=%d  relL2=%.2e maxabs=%.2e lse=%.1e bad=%lld\n",
              ok ? "PASS" : "FAIL", dtype_name(c.dtype), d, c.batch, c.heads_q, c.heads_kv, c.seqlen_q, c.seqlen_k,
              int(c.causal), rel, errors.max_abs, errors.max_lse, errors.bad);
  free_buffers(b);
  return ok;
}

void bench_case(const Case& c) {
  Buffers b = make_buffers(c, 99u, 1.f);
  float const ms = cutlassfa::time_launches_ms([&] { return cutlassfa::launch_sm80(b.p, nullptr); }, 3, 10);
  double const flops = 4.0 * c.batch * c.heads_q * double(c.seqlen_q) * c.seqlen_k * c.head_dim * (c.causal ? 0.5 : 1.0);
  std::printf("BENCH %s d=%3d B=%d H=%d N=%5d causal=%d  %.3f ms  %.1f TFLOP/s\n", dtype_name(c.dtype), c.head_dim,
              c.batch, c.heads_q, c.seqlen_q, int(c.causal), ms, flops / ms * 1e-9);
  free_buffers(b);
}

}  // namespace

int main(int argc, char** argv) {
  bool const do_bench = argc < 2 || std::strcmp(argv[1], "check") != 0;
  int failed = 0, passed = 0;
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (int d : {32, 64, 128}) {
      for (bool causal : {false, true}) {
        Case const cases[] = {
            {t, 2, 4, 2, 200, 333, d, causal},  // ragged, GQA, seqlen_q < seqlen_k
            {t, 1, 2, 1, 300, 77, d, causal},   // seqlen_q > seqlen_k: causal rows that see no key
            {t, 1, 1, 1, 1, 1, d, causal},
            {t, 1, 3, 3, 256, 256, d, causal},  // exact tiles
        };
        for (const Case& c : cases) { check_case(c) ? ++passed : ++failed; }
      }
    }
  }
  if (do_bench) {
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      for (int d : {64, 128}) {
        for (bool causal : {false, true}) {
          bench_case({t, 8, 16, 16, 4096, 4096, d, causal});
          bench_case({t, 2, 16, 16, 16384, 16384, d, causal});
        }
      }
    }
    bench_case({DType::kFloat32, 2, 1, 1, 32768, 32768, 64, false});
    bench_case({DType::kFloat32, 2, 1, 1, 32768, 32768, 64, true});
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
