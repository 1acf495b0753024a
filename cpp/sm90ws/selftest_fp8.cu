// Standalone GPU check of fp8 attention on launch_sm90ws (e4m3 q, k, v; the V^T pre-pass and the fp8
// kernel), independent of the Python package: random e4m3 inputs with descales of each shape (none, one,
// (Hkv,), (B, Hkv)), outputs poisoned with NaN before every run, every CUDA call checked, an fp64 reference on
// the dequantized inputs, then cudaEvent timings. Built and run by `bash cpp/sm90ws/selftest.sh fp8`.
//
// The bound of O comes from a model of the algorithm on the same inputs, computed here beside the
// reference: P = exp(s - m) with the row's exact max m, rounded to e4m3 (round to nearest even), O =
// sum e4m3(P) v / sum P in fp64 (bench/fp8_rounding_model.py is the same model in numpy, over the bench
// shapes). The kernel's reference max moves by the tile, not the row, and O is rounded to bf16 / fp16
// once: kernel rel-L2 <= 1.5 x the model's + 4e-3.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <cutlass/numeric_types.h>

#include "common/reference_row.h"
#include "common/selftest_harness.h"
#include "common/static_switch.h"
#include "cutlassfa/params.h"
#include "sm90ws/launch.h"

using cutlassfa::DType;
using cutlassfa::FwdParams;

namespace {

enum class Descale { kNone, kOne, kPerHead, kPerEntryHead };
const char* descale_name(Descale d) {
  return d == Descale::kNone ? "none" : d == Descale::kOne ? "one" : d == Descale::kPerHead ? "(Hkv,)" : "(B,Hkv)";
}

struct Case {
  DType out;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  bool causal;
  Descale descale = Descale::kPerEntryHead;
};

double e4m3_value(uint8_t bits) {
  cutlass::float_e4m3_t x;
  std::memcpy(&x, &bits, 1);
  return static_cast<float>(x);
}
uint8_t e4m3_bits(float value) {
  cutlass::float_e4m3_t const x(value);
  uint8_t bits;
  std::memcpy(&bits, &x, 1);
  return bits;
}

// One (batch, K/V head) table of a descale: values in [0.25, 1); strides as params.h lays them out.
struct DescaleTable {
  std::vector<float> values;
  long long batch_stride = 0, head_stride = 0;
  float* device = nullptr;
  double at(int b, int h) const {
    return values.empty() ? 1.0 : values[static_cast<size_t>(b * batch_stride + h * head_stride)];
  }
};
DescaleTable make_descale(Descale kind, int batch, int heads_kv, std::mt19937& rng) {
  DescaleTable t;
  if (kind == Descale::kNone) { return t; }
  std::uniform_real_distribution<float> u(0.25f, 1.f);
  int const n = kind == Descale::kOne ? 1 : kind == Descale::kPerHead ? heads_kv : batch * heads_kv;
  for (int i = 0; i < n; ++i) { t.values.push_back(u(rng)); }
  t.head_stride = kind == Descale::kOne ? 0 : 1;
  t.batch_stride = kind == Descale::kPerEntryHead ? heads_kv : 0;
  CHECK_CUDA(cudaMalloc(&t.device, n * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(t.device, t.values.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return t;
}

struct Buffers {
  std::vector<uint8_t> hq, hk, hv;
  std::vector<char> ho;
  std::vector<float> hlse;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *do_ = nullptr;
  float* dlse = nullptr;
  DescaleTable q_descale, k_descale, v_descale;
  FwdParams p{};
};

// (batch, seqlen, heads, d) tensors; values uniform in [-amplitude, amplitude] rounded to e4m3.
Buffers make_buffers(const Case& c, unsigned seed, float amplitude) {
  Buffers b;
  int const d = c.head_dim;
  size_t const nq = size_t(c.batch) * c.seqlen_q * c.heads_q * d;
  size_t const nk = size_t(c.batch) * c.seqlen_k * c.heads_kv * d;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-amplitude, amplitude);
  // The timed shapes repeat a pool of 2^24 values, which keeps their set-up to about a second.
  std::vector<uint8_t> pool(std::min<size_t>(std::max(nq, nk), size_t{1} << 24));
  for (std::vector<uint8_t>* h : {&b.hq, &b.hk, &b.hv}) {
    size_t const n = h == &b.hq ? nq : nk;
    for (uint8_t& x : pool) { x = e4m3_bits(u(rng)); }
    h->resize(n);
    for (size_t i = 0; i < n; ++i) { (*h)[i] = pool[i % pool.size()]; }
  }
  b.ho.resize(nq * 2);
  b.hlse.resize(size_t(c.batch) * c.heads_q * c.seqlen_q);
  CHECK_CUDA(cudaMalloc(&b.dq, nq));
  CHECK_CUDA(cudaMalloc(&b.dk, nk));
  CHECK_CUDA(cudaMalloc(&b.dv, nk));
  CHECK_CUDA(cudaMalloc(&b.do_, b.ho.size()));
  CHECK_CUDA(cudaMalloc(&b.dlse, b.hlse.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(b.dq, b.hq.data(), nq, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b.dk, b.hk.data(), nk, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b.dv, b.hv.data(), nk, cudaMemcpyHostToDevice));
  b.q_descale = make_descale(c.descale, c.batch, c.heads_kv, rng);
  b.k_descale = make_descale(c.descale, c.batch, c.heads_kv, rng);
  b.v_descale = make_descale(c.descale, c.batch, c.heads_kv, rng);

  FwdParams& p = b.p;
  p.q = b.dq, p.k = b.dk, p.v = b.dv, p.o = b.do_, p.lse = b.dlse;
  p.q_head_stride = p.o_head_stride = d, p.q_row_stride = p.o_row_stride = static_cast<long long>(c.heads_q) * d;
  p.q_batch_stride = p.o_batch_stride = p.q_row_stride * c.seqlen_q;
  p.k_head_stride = p.v_head_stride = d, p.k_row_stride = p.v_row_stride = static_cast<long long>(c.heads_kv) * d;
  p.k_batch_stride = p.v_batch_stride = p.k_row_stride * c.seqlen_k;
  p.batch = c.batch, p.heads_q = c.heads_q, p.heads_kv = c.heads_kv, p.heads_ratio = c.heads_q / c.heads_kv;
  p.seqlen_q = c.seqlen_q, p.seqlen_k = c.seqlen_k, p.head_dim = d;
  p.softmax_scale = 1.f / std::sqrt(float(d));
  p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
  if (c.causal) { p.window_right = 0; }
  p.lse_head_stride = c.seqlen_q;
  p.lse_batch_stride = static_cast<long long>(c.heads_q) * c.seqlen_q;
  p.dtype = DType::kFloat8E4M3;
  p.out_dtype = c.out;
  p.kv_fp8 = true;
  p.q_descale = b.q_descale.device, p.k_descale = b.k_descale.device, p.v_descale = b.v_descale.device;
  p.q_descale_batch_stride = b.q_descale.batch_stride, p.q_descale_head_stride = b.q_descale.head_stride;
  p.k_descale_batch_stride = b.k_descale.batch_stride, p.k_descale_head_stride = b.k_descale.head_stride;
  p.v_descale_batch_stride = b.v_descale.batch_stride, p.v_descale_head_stride = b.v_descale.head_stride;
  return b;
}

void free_buffers(Buffers& b) {
  for (void* ptr : {b.dq, b.dk, b.dv, b.do_, static_cast<void*>(b.dlse), static_cast<void*>(b.q_descale.device),
                    static_cast<void*>(b.k_descale.device), static_cast<void*>(b.v_descale.device)}) {
    CHECK_CUDA(cudaFree(ptr));
  }
}

void run_poisoned(Buffers& b) {
  CHECK_CUDA(cudaMemset(b.do_, 0xff, b.ho.size()));  // NaN in bf16 and fp16
  CHECK_CUDA(cudaMemset(b.dlse, 0xff, b.hlse.size() * sizeof(float)));
  CHECK_CUDA(cutlassfa::launch_sm90ws(b.p, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(b.ho.data(), b.do_, b.ho.size(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.hlse.data(), b.dlse, b.hlse.size() * sizeof(float), cudaMemcpyDeviceToHost));
}

bool check_case(const Case& c) {
  Buffers b = make_buffers(c, 4242u + c.head_dim + 7 * c.seqlen_q + 13 * c.seqlen_k + int(c.causal), 3.f);
  run_poisoned(b);
  std::vector<char> const ho_first = b.ho;
  std::vector<float> const hlse_first = b.hlse;
  run_poisoned(b);
  bool const deterministic = ho_first == b.ho && std::memcmp(hlse_first.data(), b.hlse.data(), b.hlse.size() * 4) == 0;

  int const d = c.head_dim;
  double const scale = b.p.softmax_scale;
  auto widen = [](std::vector<uint8_t> const& h) {
    std::vector<double> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) { out[i] = e4m3_value(h[i]); }
    return out;
  };
  std::vector<double> const q8 = widen(b.hq), k8 = widen(b.hk), v8 = widen(b.hv);
  // lse comes from S, which Hopper's fp8 MMA accumulates with ~14 bits (not fp32's 24): up to 5e-3 off on
  // the largest scores here (descale none), 1e-4 on the scaled ones (H100, first run).
  cutlassfa::OutputErrors errors{1e-2};
  double model_err2 = 0, model_ref2 = 0;
  std::vector<double> s(c.seqlen_k), o(d), o_model(d);
  for (int bi = 0; bi < c.batch; ++bi) {
    for (int h = 0; h < c.heads_q; ++h) {
      int const hk = h / (c.heads_q / c.heads_kv);
      double const qd = b.q_descale.at(bi, hk), kd = b.k_descale.at(bi, hk), vd = b.v_descale.at(bi, hk);
      for (int i = 0; i < c.seqlen_q; ++i) {
        size_t const qrow = size_t(b.p.q_batch_stride) * bi + size_t(b.p.q_head_stride) * h + size_t(b.p.q_row_stride) * i;
        int const visible = c.causal ? std::min(c.seqlen_k, std::max(0, i + 1 + c.seqlen_k - c.seqlen_q)) : c.seqlen_k;
        auto const krow = [&](int j) {
          return size_t(b.p.k_batch_stride) * bi + size_t(b.p.k_head_stride) * hk + size_t(b.p.k_row_stride) * j;
        };
        auto const dot = [&](int j) {
          double acc = 0;
          for (int x = 0; x < d; ++x) { acc += q8[qrow + x] * k8[krow(j) + x]; }
          return acc * qd * kd;  // the dequantized inputs
        };
        auto const value = [&](int j, int x) { return v8[krow(j) + x] * vd; };
        cutlassfa::ReferenceRow const row = cutlassfa::reference_row(visible, d, scale, dot, value, s, o);
        errors.add_row(row, o, c.out, b.ho.data(), qrow, d, b.hlse[(size_t(bi) * c.heads_q + h) * c.seqlen_q + i]);
        if (row.sees_keys()) {  // the model: P rounded to e4m3 after the row's max, l from the unrounded P
          std::fill(o_model.begin(), o_model.end(), 0.0);
          for (int j = 0; j < visible; ++j) {
            double const p8 = e4m3_value(e4m3_bits(static_cast<float>(std::exp(s[j] - row.m))));
            for (int x = 0; x < d; ++x) { o_model[x] += p8 * value(j, x); }
          }
          for (int x = 0; x < d; ++x) {
            double const want = o[x] / row.l, got = o_model[x] / row.l;
            model_err2 += (got - want) * (got - want);
            model_ref2 += want * want;
          }
        }
      }
    }
  }
  double const rel = errors.rel_l2();
  double const model = model_ref2 > 0 ? std::sqrt(model_err2 / model_ref2) : 0.0;
  double const bound = 1.5 * model + 4e-3;
  bool const ok = errors.bad == 0 && rel <= bound && deterministic;
  std::printf("%s fp8->%s d=%3d B=%d H=%d/%d Nq=%5d Nk=%5d causal=%d descale %-7s relL2=%.2e (model %.2e, bound "
              "%.2e) maxabs=%.2e lse=%.1e bad=%lld%s\n",
              ok ? "PASS" : "FAIL", cutlassfa::dtype_name(c.out), d, c.batch, c.heads_q, c.heads_kv, c.seqlen_q,
              c.seqlen_k, int(c.causal), descale_name(c.descale), rel, model, bound, errors.max_abs, errors.max_lse,
              errors.bad, deterministic ? "" : " NOT-DETERMINISTIC");
  free_buffers(b);
  return ok;
}

// Outside the fp8 cover: cudaErrorNotSupported before any launch, nothing written.
bool check_refusals(int d) {
  Case const c{DType::kBFloat16, 1, 2, 2, 100, 100, d, false};
  int failed = 0;
  auto expect = [&](const char* what, auto modify) {
    Buffers b = make_buffers(c, 7u, 1.f);
    modify(b.p);
    CHECK_CUDA(cudaMemset(b.do_, 0xff, b.ho.size()));
    cudaError_t const err = cutlassfa::launch_sm90ws(b.p, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(b.ho.data(), b.do_, b.ho.size(), cudaMemcpyDeviceToHost));
    bool const untouched = std::all_of(b.ho.begin(), b.ho.end(), [](char x) { return x == char(0xff); });
    bool const ok = err == cudaErrorNotSupported && untouched;
    if (!ok) { ++failed; }
    std::printf("%s fp8 refuses %s (%s)\n", ok ? "PASS" : "FAIL", what, cudaGetErrorName(err));
    free_buffers(b);
  };
  expect("head_dim 96", [](FwdParams& p) { p.head_dim = 96; });
  expect("fp32 out", [](FwdParams& p) { p.out_dtype = DType::kFloat32; });
  expect("softcap", [](FwdParams& p) { p.softcap_pre = 0.1f; });
  expect("split keys", [](FwdParams& p) { p.num_splits = 2; });
  expect("a k row stride off 16 bytes", [](FwdParams& p) { p.k_row_stride += 8; });
  expect("a v base off 16 bytes", [](FwdParams& p) { p.v = static_cast<char const*>(p.v) + 8; });
  return failed == 0;
}

void bench_case(const Case& c) {
  Buffers b = make_buffers(c, 99u, 1.f);
  float const ms = cutlassfa::time_launches_ms([&] { return cutlassfa::launch_sm90ws(b.p, nullptr); }, 3, 20);
  double const flops =
      4.0 * c.batch * c.heads_q * double(c.seqlen_q) * c.seqlen_k * c.head_dim * (c.causal ? 0.5 : 1.0);
  std::printf("BENCH fp8->%s d=%3d B=%d H=%d N=%5d causal=%d  %.3f ms  %.1f TFLOP/s (V^T pre-pass included)\n",
              cutlassfa::dtype_name(c.out), c.head_dim, c.batch, c.heads_q, c.seqlen_q, int(c.causal), ms,
              flops / ms * 1e-9);
  free_buffers(b);
}

}  // namespace

// No argument: the checks, then the timings; "check": the checks only; "bench": the timings only.
int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bool const do_bench = argc < 2 || std::strcmp(argv[1], "check") != 0;
  bool const do_check = argc < 2 || std::strcmp(argv[1], "bench") != 0;
  std::vector<int> const head_dims{CUTLASSFA_SM90WS_FP8_HEAD_DIMS};  // what this build instantiated
  int failed = 0, passed = 0;
  if (do_check) {
    for (int d : head_dims) {
      for (bool causal : {false, true}) {
        Case const cases[] = {
            {DType::kBFloat16, 2, 8, 2, 77, 257, d, causal, Descale::kPerEntryHead},  // GQA 4:1, Nq < Nk, ragged
            {DType::kFloat16, 1, 2, 2, 257, 77, d, causal, Descale::kPerHead},        // Nq > Nk: rows without keys
            {DType::kBFloat16, 1, 2, 1, 1000, 1000, d, causal, Descale::kOne},         // many K/V steps
            {DType::kFloat16, 2, 3, 3, 256, 384, d, causal, Descale::kNone},           // whole tiles
            {DType::kBFloat16, 1, 4, 1, 1, 1000, d, causal, Descale::kPerHead},        // one query row, MQA
            {DType::kBFloat16, 1, 1, 1, 128, 1, d, causal, Descale::kOne},             // one key
            {DType::kBFloat16, 1, 2, 2, 64, 33, d, causal, Descale::kPerEntryHead},    // keys past a 32-key group
            {DType::kFloat16, 2, 36, 12, 200, 300, d, causal, Descale::kPerEntryHead}, // more tiles than SMs
        };
        for (const Case& c : cases) { check_case(c) ? ++passed : ++failed; }
      }
    }
    if (!head_dims.empty()) { check_refusals(head_dims.front()) ? ++passed : ++failed; }
  }
  if (do_bench) {
    for (int d : head_dims) {
      for (auto const& bhn : {std::array<int, 3>{8, 16, 4096}, std::array<int, 3>{2, 16, 16384}}) {
        for (bool causal : {false, true}) {
          bench_case({DType::kBFloat16, bhn[0], bhn[1], bhn[1], bhn[2], bhn[2], d, causal, Descale::kOne});
        }
      }
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
