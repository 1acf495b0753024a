// Standalone GPU check of launch_sm90ws (the warp-specialized Hopper kernel), independent of the Python
// package: random inputs, outputs poisoned with NaN before every run, an fp64 CPU reference on the same
// rounded inputs, the scope refusals (cudaErrorNotSupported), then cudaEvent timings. Built and run by
// cpp/sm90ws/selftest.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/reference_row.h"
#include "common/selftest_harness.h"
#include "common/static_switch.h"
#include "cutlassfa/params.h"
#include "sm90ws/head_dims.h"
#include "sm90ws/launch.h"

using cutlassfa::DType;
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
  bool head_major = false;  // (batch, heads, seqlen, d) instead of (batch, seqlen, heads, d)
};

struct Buffers {
  std::vector<char> hq, hk, hv, ho;
  std::vector<float> hlse;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *do_ = nullptr;
  float* dlse = nullptr;
  FwdParams p{};
};

// Element strides (batch, head, row) of a (batch, heads, rows, d) tensor in the case's layout.
void strides(const Case& c, int heads, int rows, long long& b, long long& h, long long& r) {
  long long const d = c.head_dim;
  b = static_cast<long long>(rows) * heads * d;
  if (c.head_major) {
    h = rows * d;
    r = d;
  } else {
    h = d;
    r = heads * d;
  }
}

Buffers make_buffers(const Case& c, unsigned seed, float amplitude) {
  Buffers b;
  size_t const nq = size_t(c.batch) * c.seqlen_q * c.heads_q * c.head_dim;
  size_t const nk = size_t(c.batch) * c.seqlen_k * c.heads_kv * c.head_dim;
  b.hq.resize(nq * 2);
  b.hk.resize(nk * 2);
  b.hv.resize(nk * 2);
  b.ho.resize(nq * 2);
  b.hlse.resize(size_t(c.batch) * c.heads_q * c.seqlen_q);
  // Fresh values for every element of the checked shapes; the timed ones (hundreds of millions of
  // elements) repeat a pool of 2^24, which keeps their set-up to about a second.
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-amplitude, amplitude);
  std::vector<float> pool(std::min<size_t>(std::max(nq, nk), size_t{1} << 24));
  for (char* dst : {b.hq.data(), b.hk.data(), b.hv.data()}) {
    size_t const n = dst == b.hq.data() ? nq : nk;
    for (float& x : pool) { x = u(rng); }
    for (size_t i = 0; i < n; ++i) { cutlassfa::store_element(c.dtype, dst, i, pool[i % pool.size()]); }
  }
  CHECK_CUDA(cudaMalloc(&b.dq, b.hq.size()));
  CHECK_CUDA(cudaMalloc(&b.dk, b.hk.size()));
  CHECK_CUDA(cudaMalloc(&b.dv, b.hv.size()));
  CHECK_CUDA(cudaMalloc(&b.do_, b.ho.size()));
  CHECK_CUDA(cudaMalloc(&b.dlse, b.hlse.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(b.dq, b.hq.data(), b.hq.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b.dk, b.hk.data(), b.hk.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b.dv, b.hv.data(), b.hv.size(), cudaMemcpyHostToDevice));

  FwdParams& p = b.p;
  p.q = b.dq;
  p.k = b.dk;
  p.v = b.dv;
  p.o = b.do_;
  p.lse = b.dlse;
  strides(c, c.heads_q, c.seqlen_q, p.q_batch_stride, p.q_head_stride, p.q_row_stride);
  strides(c, c.heads_q, c.seqlen_q, p.o_batch_stride, p.o_head_stride, p.o_row_stride);
  strides(c, c.heads_kv, c.seqlen_k, p.k_batch_stride, p.k_head_stride, p.k_row_stride);
  strides(c, c.heads_kv, c.seqlen_k, p.v_batch_stride, p.v_head_stride, p.v_row_stride);
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.heads_ratio = c.heads_q / c.heads_kv;
  p.seqlen_q = c.seqlen_q;
  p.seqlen_k = c.seqlen_k;
  p.head_dim = c.head_dim;
  p.softmax_scale = 1.f / std::sqrt(float(c.head_dim));
  p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
  if (c.causal) { p.window_right = 0; }
  p.lse_head_stride = c.seqlen_q;
  p.lse_batch_stride = static_cast<long long>(c.heads_q) * c.seqlen_q;
  p.dtype = c.dtype;
  return b;
}

void poison(Buffers& b) {
  CHECK_CUDA(cudaMemset(b.do_, 0xff, b.ho.size()));  // NaN in fp16, bf16 and fp32
  CHECK_CUDA(cudaMemset(b.dlse, 0xff, b.hlse.size() * sizeof(float)));
}

void free_buffers(Buffers& b) {
  CHECK_CUDA(cudaFree(b.dq));
  CHECK_CUDA(cudaFree(b.dk));
  CHECK_CUDA(cudaFree(b.dv));
  CHECK_CUDA(cudaFree(b.do_));
  CHECK_CUDA(cudaFree(b.dlse));
}

// rel-L2 of O against fp64 on the same rounded inputs, lse (abs), and the rows that see no key (O exactly
// 0, lse = -inf). Run twice with fresh poison: the second run must give bit-identical results.
bool check_case(const Case& c) {
  Buffers b = make_buffers(c, 1234u + c.head_dim + 7 * c.seqlen_q + 13 * c.seqlen_k + int(c.causal), 3.f);
  poison(b);
  CHECK_CUDA(cutlassfa::launch_sm90ws(b.p, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(b.ho.data(), b.do_, b.ho.size(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.hlse.data(), b.dlse, b.hlse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<char> ho_first = b.ho;
  std::vector<float> hlse_first = b.hlse;
  poison(b);
  CHECK_CUDA(cutlassfa::launch_sm90ws(b.p, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(b.ho.data(), b.do_, b.ho.size(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.hlse.data(), b.dlse, b.hlse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  bool const deterministic = ho_first == b.ho && std::memcmp(hlse_first.data(), b.hlse.data(), b.hlse.size() * 4) == 0;

  int const d = c.head_dim;
  double const scale = b.p.softmax_scale;
  auto widen = [&](std::vector<char> const& h) {  // the rounded inputs in fp64, converted once
    std::vector<double> out(h.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) { out[i] = load_element(c.dtype, h.data(), i); }
    return out;
  };
  std::vector<double> const q64 = widen(b.hq), k64 = widen(b.hk), v64 = widen(b.hv);
  OutputErrors errors{1e-3};
  std::vector<double> s(c.seqlen_k), o(d);
  for (int bi = 0; bi < c.batch; ++bi) {
    for (int h = 0; h < c.heads_q; ++h) {
      int const hk = h / (c.heads_q / c.heads_kv);
      for (int i = 0; i < c.seqlen_q; ++i) {
        size_t const qrow = size_t(b.p.q_batch_stride) * bi + size_t(b.p.q_head_stride) * h + size_t(b.p.q_row_stride) * i;
        // Bottom-right causal: query i sees keys j <= i + Nk - Nq.
        int const visible = c.causal ? std::min(c.seqlen_k, std::max(0, i + 1 + c.seqlen_k - c.seqlen_q)) : c.seqlen_k;
        auto const dot = [&](int j) {
          size_t const krow = size_t(b.p.k_batch_stride) * bi + size_t(b.p.k_head_stride) * hk + size_t(b.p.k_row_stride) * j;
          double acc = 0;
          for (int x = 0; x < d; ++x) { acc += q64[qrow + x] * k64[krow + x]; }
          return acc;
        };
        auto const value = [&](int j, int x) {
          return v64[size_t(b.p.v_batch_stride) * bi + size_t(b.p.v_head_stride) * hk + size_t(b.p.v_row_stride) * j + x];
        };
        ReferenceRow const row = reference_row(visible, d, scale, dot, value, s, o);
        float const lse_got = b.hlse[(size_t(bi) * c.heads_q + h) * c.seqlen_q + i];
        size_t const orow = size_t(b.p.o_batch_stride) * bi + size_t(b.p.o_head_stride) * h + size_t(b.p.o_row_stride) * i;
        errors.add_row(row, o, c.dtype, b.ho.data(), orow, d, lse_got);
      }
    }
  }
  double const rel = errors.rel_l2();
  double const tol = c.dtype == DType::kBFloat16 ? 1e-2 : 5e-3;
  bool const ok = errors.bad == 0 && rel <= tol && deterministic;
  std::printf("%s %s d=%3d B=%d H=%d/%d Nq=%5d Nk=%5d causal=%d %s  relL2=%.2e maxabs=%.2e lse=%.1e bad=%lld%s\n",
              ok ? "PASS" : "FAIL", dtype_name(c.dtype), d, c.batch, c.heads_q, c.heads_kv, c.seqlen_q, c.seqlen_k,
              int(c.causal), c.head_major ? "bhsd" : "bshd", rel, errors.max_abs, errors.max_lse, errors.bad,
              deterministic ? "" : " NOT-DETERMINISTIC");
  free_buffers(b);
  return ok;
}

// A varlen batch: entries of lq[b] queries and lk[b] keys packed into (total, heads, d) arrays with
// cu_seqlens, against fp64 per entry (empty entries, entries without keys and causal rows that see no
// key included), run twice with fresh poison for determinism.
bool check_varlen(DType t, int d, bool causal, int heads_q, int heads_kv, std::vector<int> const& lq,
                  std::vector<int> const& lk) {
  int const batch = static_cast<int>(lq.size());
  std::vector<int> cu_q(batch + 1, 0), cu_k(batch + 1, 0);
  for (int b = 0; b < batch; ++b) {
    cu_q[b + 1] = cu_q[b] + lq[b];
    cu_k[b + 1] = cu_k[b] + lk[b];
  }
  int const total_q = cu_q[batch], total_k = cu_k[batch];
  size_t const nq = size_t(total_q) * heads_q * d, nk = size_t(total_k) * heads_kv * d;
  std::vector<char> hq(nq * 2), hk(nk * 2), hv(nk * 2), ho(nq * 2);
  std::vector<float> hlse(size_t(heads_q) * total_q);
  std::mt19937 rng(4321u + d + 7 * total_q + 13 * total_k + int(causal));
  cutlassfa::fill_uniform(t, hq.data(), nq, rng, 3.f);
  cutlassfa::fill_uniform(t, hk.data(), nk, rng, 3.f);
  cutlassfa::fill_uniform(t, hv.data(), nk, rng, 3.f);
  void *dq, *dk, *dv, *dout;
  float* dlse;
  int *dcu_q, *dcu_k;
  CHECK_CUDA(cudaMalloc(&dq, hq.size()));
  CHECK_CUDA(cudaMalloc(&dk, hk.size()));
  CHECK_CUDA(cudaMalloc(&dv, hv.size()));
  CHECK_CUDA(cudaMalloc(&dout, ho.size()));
  CHECK_CUDA(cudaMalloc(&dlse, hlse.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dcu_q, cu_q.size() * sizeof(int)));
  CHECK_CUDA(cudaMalloc(&dcu_k, cu_k.size() * sizeof(int)));
  CHECK_CUDA(cudaMemcpy(dq, hq.data(), hq.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dk, hk.data(), hk.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, hv.data(), hv.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dcu_q, cu_q.data(), cu_q.size() * sizeof(int), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dcu_k, cu_k.data(), cu_k.size() * sizeof(int), cudaMemcpyHostToDevice));

  FwdParams p{};
  p.q = dq, p.k = dk, p.v = dv, p.o = dout, p.lse = dlse;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 0;  // entries by cu_seqlens
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.q_row_stride = p.o_row_stride = static_cast<long long>(heads_q) * d;
  p.k_row_stride = p.v_row_stride = static_cast<long long>(heads_kv) * d;
  p.batch = batch, p.heads_q = heads_q, p.heads_kv = heads_kv, p.heads_ratio = heads_q / heads_kv;
  p.seqlen_q = std::max(1, *std::max_element(lq.begin(), lq.end()));  // the grid: the longest entry
  p.seqlen_k = std::max(1, *std::max_element(lk.begin(), lk.end()));
  p.head_dim = d;
  p.softmax_scale = 1.f / std::sqrt(float(d));
  p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
  if (causal) { p.window_right = 0; }
  p.cu_seqlens_q = dcu_q, p.cu_seqlens_k = dcu_k, p.total_q = total_q, p.total_k = total_k;
  p.lse_batch_stride = 0, p.lse_head_stride = total_q;  // (heads_q, total_q)
  p.dtype = t;

  if (!cutlassfa::head_dim_listed<CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS>(d)) {  // no varlen instantiation: refused
    cudaError_t const err = cutlassfa::launch_sm90ws(p, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    bool const ok = err == cudaErrorNotSupported;
    std::printf("%s %s d=%3d varlen refused (%s)\n", ok ? "PASS" : "FAIL", dtype_name(t), d, cudaGetErrorName(err));
    for (void* ptr : {dq, dk, dv, dout, static_cast<void*>(dlse), static_cast<void*>(dcu_q), static_cast<void*>(dcu_k)}) {
      CHECK_CUDA(cudaFree(ptr));
    }
    return ok;
  }
  auto run = [&] {
    CHECK_CUDA(cudaMemset(dout, 0xff, ho.size()));  // NaN
    CHECK_CUDA(cudaMemset(dlse, 0xff, hlse.size() * sizeof(float)));
    CHECK_CUDA(cutlassfa::launch_sm90ws(p, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(ho.data(), dout, ho.size(), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hlse.data(), dlse, hlse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  };
  run();
  std::vector<char> const ho_first = ho;
  std::vector<float> const hlse_first = hlse;
  run();
  bool const deterministic = ho_first == ho && std::memcmp(hlse_first.data(), hlse.data(), hlse.size() * 4) == 0;

  double const scale = p.softmax_scale;
  OutputErrors errors{1e-3};
  std::vector<double> s, o(d);
  for (int b = 0; b < batch; ++b) {
    s.resize(std::max(1, lk[b]));
    for (int h = 0; h < heads_q; ++h) {
      int const h_kv = h / (heads_q / heads_kv);
      for (int i = 0; i < lq[b]; ++i) {
        size_t const qrow = (size_t(cu_q[b] + i) * heads_q + h) * d;
        int const visible = causal ? std::min(lk[b], std::max(0, i + 1 + lk[b] - lq[b])) : lk[b];
        auto const dot = [&](int j) {
          size_t const krow = (size_t(cu_k[b] + j) * heads_kv + h_kv) * d;
          double acc = 0;
          for (int x = 0; x < d; ++x) {
            acc += load_element(t, hq.data(), qrow + x) * load_element(t, hk.data(), krow + x);
          }
          return acc;
        };
        auto const value = [&](int j, int x) {
          return load_element(t, hv.data(), (size_t(cu_k[b] + j) * heads_kv + h_kv) * d + x);
        };
        ReferenceRow const row = reference_row(visible, d, scale, dot, value, s, o);
        errors.add_row(row, o, t, ho.data(), qrow, d, hlse[size_t(h) * total_q + cu_q[b] + i]);  // O has Q's strides
      }
    }
  }
  double const rel = errors.rel_l2();
  double const tol = t == DType::kBFloat16 ? 1e-2 : 5e-3;
  bool const ok = errors.bad == 0 && rel <= tol && deterministic;
  std::printf("%s %s d=%3d varlen B=%d H=%d/%d total %d x %d causal=%d  relL2=%.2e lse=%.1e bad=%lld%s\n",
              ok ? "PASS" : "FAIL", dtype_name(t), d, batch, heads_q, heads_kv, total_q, total_k, int(causal), rel,
              errors.max_lse, errors.bad, deterministic ? "" : " NOT-DETERMINISTIC");
  for (void* ptr : {dq, dk, dv, dout, static_cast<void*>(dlse), static_cast<void*>(dcu_q), static_cast<void*>(dcu_k)}) {
    CHECK_CUDA(cudaFree(ptr));
  }
  return ok;
}

// Outside the kernel's scope: cudaErrorNotSupported, and nothing written.
bool check_refusals() {
  Case const c{DType::kBFloat16, 1, 2, 2, 100, 100, 128, false};
  int failed = 0;
  auto expect = [&](const char* what, auto modify) {
    Buffers b = make_buffers(c, 7u, 1.f);
    modify(b.p);
    poison(b);
    cudaError_t const err = cutlassfa::launch_sm90ws(b.p, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    bool const ok = err == cudaErrorNotSupported;
    if (!ok) { ++failed; }
    std::printf("%s refuses %s (%s)\n", ok ? "PASS" : "FAIL", what, cudaGetErrorName(err));
    free_buffers(b);
  };
  if (!cutlassfa::head_dim_listed<CUTLASSFA_SM90WS_SOFTCAP_HEAD_DIMS>(c.head_dim)) {  // no softcap instantiation
    expect("softcap", [](FwdParams& p) { p.softcap_pre = 0.1f; });
  }
  expect("head_dim 80", [](FwdParams& p) { p.head_dim = 80; });
  expect("fp32", [](FwdParams& p) { p.dtype = DType::kFloat32; });
  expect("split keys", [](FwdParams& p) { p.num_splits = 2; });
  expect("a row stride off 16 bytes", [](FwdParams& p) { p.k_row_stride += 4; });
  expect("a base off 16 bytes", [](FwdParams& p) { p.v = static_cast<char const*>(p.v) + 2; });
  expect("a negative row stride", [](FwdParams& p) { p.q_row_stride = -p.q_row_stride; });
  return failed == 0;
}

void bench_case(const Case& c) {
  Buffers b = make_buffers(c, 99u, 1.f);
  float const ms = cutlassfa::time_launches_ms([&] { return cutlassfa::launch_sm90ws(b.p, nullptr); }, 3, 20);
  double const flops =
      4.0 * c.batch * c.heads_q * double(c.seqlen_q) * c.seqlen_k * c.head_dim * (c.causal ? 0.5 : 1.0);
  std::printf("BENCH %s d=%3d B=%d H=%d N=%5d causal=%d  %.3f ms  %.1f TFLOP/s\n", dtype_name(c.dtype), c.head_dim,
              c.batch, c.heads_q, c.seqlen_q, int(c.causal), ms, flops / ms * 1e-9);
  free_buffers(b);
}

}  // namespace

// No argument: the checks, then the timings; "check": the checks only; "bench": the timings only (tile
// sweeps of a build whose default tiles passed the checks).
int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out at once, also into a file that a timeout cuts
  bool const do_bench = argc < 2 || std::strcmp(argv[1], "check") != 0;
  bool const do_check = argc < 2 || std::strcmp(argv[1], "bench") != 0;
  int const head_dims[] = {CUTLASSFA_SM90WS_HEAD_DIMS};  // what this build instantiated (selftest.sh)
  int failed = 0, passed = 0;
  if (do_check) {
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      for (int d : head_dims) {
        for (bool causal : {false, true}) {
          Case const cases[] = {
              {t, 2, 8, 2, 77, 257, d, causal},         // GQA 4:1, Nq < Nk, ragged, B*H > 1
              {t, 1, 2, 2, 257, 77, d, causal},         // Nq > Nk: causal rows that see no key
              {t, 1, 2, 1, 1000, 1000, d, causal},      // ragged, many K/V steps
              {t, 2, 3, 3, 256, 384, d, causal, true},  // exact tiles, (batch, heads, seqlen, d) layout
              {t, 1, 2, 2, 384, 560, d, causal, true},  // whole 128- / 192-row Q tiles, 80- / 112-key tiles
              {t, 1, 4, 1, 1, 1000, d, causal},         // one query row, MQA
              {t, 1, 1, 1, 128, 1, d, causal},          // one key
              // More tiles than an H100's / H200's 132 SMs: CTAs walk several tiles (the dynamic
              // scheduler when causal), GQA 3:1; then Nq > Nk, where causal tiles without keys
              // alternate with the others.
              {t, 2, 36, 12, 200, 300, d, causal},
              {t, 1, 150, 150, 300, 40, d, causal},
          };
          for (const Case& c : cases) { check_case(c) ? ++passed : ++failed; }
          // Varlen: ragged entries of either side longer, an empty entry, an entry without keys, one
          // query; then entries of whole and partial tiles under GQA 4:1.
          check_varlen(t, d, causal, 4, 4, {77, 0, 300, 1, 193, 5}, {77, 9, 40, 64, 400, 0}) ? ++passed : ++failed;
          check_varlen(t, d, causal, 8, 2, {384, 1000, 129}, {384, 700, 1500}) ? ++passed : ++failed;
        }
      }
    }
    check_refusals() ? ++passed : ++failed;
  }
  if (do_bench) {
    // (B, H, N) of the timings: (4, 16, 8192), or BENCH_SHAPES="B,H,N B,H,N ..." (e.g. short sequences).
    std::vector<std::array<int, 3>> shapes;
    char const* const env = std::getenv("BENCH_SHAPES");
    for (char const* at = env; at != nullptr && *at != '\0';) {
      std::array<int, 3> bhn{};
      int used = 0;
      if (std::sscanf(at, " %d,%d,%d%n", &bhn[0], &bhn[1], &bhn[2], &used) != 3) { break; }
      shapes.push_back(bhn);
      at += used;
    }
    if (shapes.empty()) { shapes.push_back({4, 16, 8192}); }
    for (auto const& [batch, heads, n] : shapes) {
      for (DType t : {DType::kFloat16, DType::kBFloat16}) {
        for (int d : head_dims) {
          for (bool causal : {false, true}) { bench_case({t, batch, heads, heads, n, n, d, causal, true}); }
        }
      }
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
