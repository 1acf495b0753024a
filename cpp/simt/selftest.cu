// Standalone check of the CUDA-core family (not part of the library build):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icpp/include -Icpp \
//        cpp/simt/selftest.cu cpp/simt/launch_naive.cu cpp/simt/launch_small_tile.cu \
//        cpp/simt/launch_large_tile.cu -o /tmp/simt_selftest && /tmp/simt_selftest
// Random inputs (ragged N, Nq != Nk, causal, GQA, strided / unaligned layouts, every dtype and head
// dim) against a CPU fp64 reference, outputs poisoned with NaN first; then CUDA-event timings.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cutlassfa/launch.h"
#include "simt/launch_flash_simt.h"

using namespace cutlassfa;

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, #x); \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

// Backend 3: the large_tile variant that sm_86 / sm_89 fall back to, run directly.
template <typename T, int D>
struct CompactLaunch {
  static cudaError_t run(const FwdParams& p, cudaStream_t s) {
    return simt::launch_flash_simt_kernel<simt::LargeTileCompact<D>, T>(p, s);
  }
};
static const char* kBackendNames[] = {"naive", "small_tile", "large_tile", "large_cmpct"};
static cudaError_t run_backend(int backend, const FwdParams& p, cudaStream_t s) {
  switch (backend) {
    case 0: return launch_naive(p, s);
    case 1: return launch_small_tile(p, s);
    case 2: return launch_large_tile(p, s);
    default: return simt::dispatch_flash_simt<CompactLaunch>(p, s);
  }
}

static size_t elem_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }
static const char* dtype_name(DType t) {
  return t == DType::kFloat32 ? "fp32" : (t == DType::kFloat16 ? "fp16" : "bf16");
}
// Rounds through the dtype and returns its bits (lower 16 for half types).
static float round_to(DType t, float x, unsigned* bits) {
  if (t == DType::kFloat32) {
    std::memcpy(bits, &x, 4);
    return x;
  }
  if (t == DType::kFloat16) {
    __half h = __float2half_rn(x);
    unsigned short u;
    std::memcpy(&u, &h, 2);
    *bits = u;
    return __half2float(h);
  }
  __nv_bfloat16 h = __float2bfloat16(x);
  unsigned short u;
  std::memcpy(&u, &h, 2);
  *bits = u;
  return __bfloat162float(h);
}
static float from_bits(DType t, const unsigned char* p) {
  if (t == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  unsigned short u;
  std::memcpy(&u, p, 2);
  if (t == DType::kFloat16) {
    __half h;
    std::memcpy(&h, &u, 2);
    return __half2float(h);
  }
  __nv_bfloat16 h;
  std::memcpy(&h, &u, 2);
  return __bfloat162float(h);
}

// A (batch, heads, seqlen, d) tensor with layout 0 = contiguous BHSD, 1 = BSHD, 2 = BHSD with the
// row stride padded by `pad` elements (pad 1 breaks 16-byte alignment: the scalar load path).
struct Tensor {
  int b, h, n, d;
  long long sb, sh, sr;
  size_t elems;
  DType t;
  std::vector<float> val;  // rounded values, (b, h, n, d) dense
  void* dev = nullptr;
  Tensor(int b_, int h_, int n_, int d_, int layout, int pad, DType t_) : b(b_), h(h_), n(n_), d(d_), t(t_) {
    if (layout == 1) {
      sr = (long long)h * d;
      sh = d;
      sb = (long long)n * h * d;
    } else {
      sr = d + (layout == 2 ? pad : 0);
      sh = (long long)n * sr;
      sb = (long long)h * sh;
    }
    elems = (size_t)sb * b;
    val.assign((size_t)b * h * n * d, 0.f);
    CHECK(cudaMalloc(&dev, elems * elem_size(t) + 64));
  }
  ~Tensor() { cudaFree(dev); }
  long long off(int ib, int ih, int in, int id) const { return ib * sb + ih * sh + in * sr + id; }
  float& at(int ib, int ih, int in, int id) { return val[(((size_t)ib * h + ih) * n + in) * d + id]; }
  void fill_random(std::mt19937& rng, float amp) {
    std::uniform_real_distribution<float> u(-amp, amp);
    std::vector<unsigned char> host(elems * elem_size(t), 0);
    for (int ib = 0; ib < b; ++ib)
      for (int ih = 0; ih < h; ++ih)
        for (int in = 0; in < n; ++in)
          for (int id = 0; id < d; ++id) {
            unsigned bits;
            at(ib, ih, in, id) = round_to(t, u(rng), &bits);
            std::memcpy(&host[off(ib, ih, in, id) * elem_size(t)], &bits, elem_size(t));
          }
    CHECK(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
};

struct Case {
  int B, Hq, Hkv, Nq, Nk, D;
  bool causal;
  int layout, pad;
};

static FwdParams make_params(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o, float* lse, bool causal) {
  FwdParams p{};
  p.q = q.dev, p.k = k.dev, p.v = v.dev, p.o = o.dev, p.lse = lse;
  p.q_batch_stride = q.sb, p.q_head_stride = q.sh, p.q_row_stride = q.sr;
  p.k_batch_stride = k.sb, p.k_head_stride = k.sh, p.k_row_stride = k.sr;
  p.v_batch_stride = v.sb, p.v_head_stride = v.sh, p.v_row_stride = v.sr;
  p.o_batch_stride = o.sb, p.o_head_stride = o.sh, p.o_row_stride = o.sr;
  p.batch = q.b, p.heads_q = q.h, p.heads_kv = k.h, p.heads_ratio = q.h / k.h;
  p.seqlen_q = q.n, p.seqlen_k = k.n, p.head_dim = q.d;
  p.softmax_scale = 1.f / std::sqrt((float)q.d);
  p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
  if (causal) p.window_right = 0;
  p.lse_head_stride = p.seqlen_q;
  p.lse_batch_stride = static_cast<long long>(p.heads_q) * p.seqlen_q;
  p.dtype = q.t;
  return p;
}

// fp64 reference of rows [row_begin, row_end) of (b, h); returns max errors into the accumulators.
static void reference_row(const Tensor& q, const Tensor& k, const Tensor& v, const FwdParams& p, int ib, int ih,
                          int i, std::vector<double>& o_ref, double& lse_ref) {
  const int hk = ih / p.heads_ratio;
  const int last = p.window_right == 0 ? i + p.seqlen_k - p.seqlen_q : p.seqlen_k - 1;
  const int n_vis = std::max(0, std::min(p.seqlen_k, last + 1));
  o_ref.assign(p.head_dim, 0.0);
  if (n_vis == 0) {
    lse_ref = -INFINITY;
    return;
  }
  std::vector<double> s(n_vis);
  double m = -1e300;
  const float* qr = &const_cast<Tensor&>(q).at(ib, ih, i, 0);
  for (int j = 0; j < n_vis; ++j) {
    const float* kr = &const_cast<Tensor&>(k).at(ib, hk, j, 0);
    double acc = 0;
    for (int d = 0; d < p.head_dim; ++d) acc += (double)qr[d] * kr[d];
    s[j] = acc * p.softmax_scale;
    m = std::max(m, s[j]);
  }
  double l = 0;
  for (int j = 0; j < n_vis; ++j) {
    s[j] = std::exp(s[j] - m);
    l += s[j];
  }
  for (int j = 0; j < n_vis; ++j) {
    const float* vr = &const_cast<Tensor&>(v).at(ib, hk, j, 0);
    for (int d = 0; d < p.head_dim; ++d) o_ref[d] += s[j] / l * vr[d];
  }
  lse_ref = m + std::log(l);
}

static int g_failures = 0;

// Compares the rows listed (all rows when `rows` is empty) against the reference.
static void check(const char* what, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const float* d_lse, const FwdParams& p, int max_rows_checked) {
  std::vector<unsigned char> host(o.elems * elem_size(o.t));
  CHECK(cudaMemcpy(host.data(), o.dev, host.size(), cudaMemcpyDeviceToHost));
  const size_t n_lse = (size_t)p.batch * p.heads_q * p.seqlen_q;
  std::vector<float> lse(n_lse);
  CHECK(cudaMemcpy(lse.data(), d_lse, n_lse * 4, cudaMemcpyDeviceToHost));
  const double atol = o.t == DType::kFloat32 ? 2e-5 : (o.t == DType::kFloat16 ? 2e-3 : 1.6e-2);
  double max_err = 0, max_lse_err = 0;
  bool bad = false;
  const long long total_rows = (long long)p.batch * p.heads_q * p.seqlen_q;
  const long long step = max_rows_checked > 0 && total_rows > max_rows_checked ? total_rows / max_rows_checked : 1;
  std::vector<double> o_ref;
  double lse_ref;
  for (long long r = 0; r < total_rows; r += step) {
    const long long rr = (step > 1) ? (r + (r * 7919) % step) % total_rows : r;
    const int i = (int)(rr % p.seqlen_q), ih = (int)((rr / p.seqlen_q) % p.heads_q),
              ib = (int)(rr / ((long long)p.seqlen_q * p.heads_q));
    reference_row(q, k, v, p, ib, ih, i, o_ref, lse_ref);
    for (int d = 0; d < p.head_dim; ++d) {
      const float got = from_bits(o.t, &host[o.off(ib, ih, i, d) * elem_size(o.t)]);
      const double err = std::fabs(got - o_ref[d]);
      if (!(err <= atol + 1e-2 * std::fabs(o_ref[d]) * (o.t == DType::kFloat32 ? 0.01 : 1))) {
        if (!bad) std::printf("    first bad O at b=%d h=%d i=%d d=%d: got %g want %g\n", ib, ih, i, d, got, o_ref[d]);
        bad = true;
      }
      if (!(err <= max_err)) max_err = std::isnan(err) ? INFINITY : err;
    }
    const float got_lse = lse[((size_t)ib * p.heads_q + ih) * p.seqlen_q + i];
    if (std::isinf(lse_ref)) {
      if (!(std::isinf(got_lse) && got_lse < 0)) {
        if (!bad) std::printf("    bad lse at b=%d h=%d i=%d: got %g want -inf\n", ib, ih, i, got_lse);
        bad = true;
      }
    } else {
      const double e = std::fabs(got_lse - lse_ref);
      if (!(e <= 1e-4 + 1e-5 * std::fabs(lse_ref))) {
        if (!bad) std::printf("    bad lse at b=%d h=%d i=%d: got %g want %g\n", ib, ih, i, got_lse, lse_ref);
        bad = true;
      }
      if (!(e <= max_lse_err)) max_lse_err = std::isnan(e) ? INFINITY : e;
    }
  }
  std::printf("  %-64s max|dO| %.2e  max|dlse| %.2e  %s\n", what, max_err, max_lse_err, bad ? "FAIL" : "ok");
  if (bad) ++g_failures;
}

static void run_case(int backend, DType t, const Case& c, std::mt19937& rng) {
  Tensor q(c.B, c.Hq, c.Nq, c.D, c.layout, c.pad, t), k(c.B, c.Hkv, c.Nk, c.D, c.layout, c.pad, t),
      v(c.B, c.Hkv, c.Nk, c.D, c.layout, c.pad, t), o(c.B, c.Hq, c.Nq, c.D, c.layout, c.pad, t);
  q.fill_random(rng, 1.5f);
  k.fill_random(rng, 1.5f);
  v.fill_random(rng, 1.f);
  CHECK(cudaMemset(o.dev, 0xff, o.elems * elem_size(t)));  // NaN poison
  float* lse;
  const size_t n_lse = (size_t)c.B * c.Hq * c.Nq;
  CHECK(cudaMalloc(&lse, n_lse * 4));
  CHECK(cudaMemset(lse, 0xff, n_lse * 4));
  FwdParams p = make_params(q, k, v, o, lse, c.causal);
  CHECK(run_backend(backend, p, 0));
  CHECK(cudaDeviceSynchronize());
  char what[256];
  std::snprintf(what, sizeof what, "%-10s %s B=%d Hq=%d Hkv=%d Nq=%d Nk=%d D=%d%s L%d/%d", kBackendNames[backend],
                dtype_name(t), c.B, c.Hq, c.Hkv, c.Nq, c.Nk, c.D, c.causal ? " causal" : "", c.layout, c.pad);
  check(what, q, k, v, o, lse, p, 3000);
  CHECK(cudaFree(lse));
}

// ---------------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------------
template <typename F>
static float time_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(f());  // warm-up
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) CHECK(f());
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms / reps;
}

// Extra d=64 configurations, timed for tuning only.
using Tune0 = simt::SimtTraits<64, 256, 32, 8, false, 1>;  // 8x4 S microtile, 8 warps, 114 KB
using Tune1 = simt::SimtTraits<32, 256, 64, 8, false, 1>;  // D=32, 8x8, 8 warps, 113 KB

static void bench(DType t, int D, int N, bool causal, bool with_tuning) {
  std::mt19937 rng(7);
  const int B = 2, H = 1;
  Tensor q(B, H, N, D, 0, 0, t), k(B, H, N, D, 0, 0, t), v(B, H, N, D, 0, 0, t), o(B, H, N, D, 0, 0, t);
  q.fill_random(rng, 1.5f);
  k.fill_random(rng, 1.5f);
  v.fill_random(rng, 1.f);
  float* lse;
  CHECK(cudaMalloc(&lse, (size_t)B * H * N * 4));
  FwdParams p = make_params(q, k, v, o, lse, causal);
  const double flop = 4.0 * B * H * (double)N * N * D * (causal ? 0.5 : 1.0);
  for (int backend = 1; backend <= 2; ++backend) {
    CHECK(cudaMemset(o.dev, 0xff, o.elems * elem_size(t)));
    const float ms = time_ms([&] { return run_backend(backend, p, 0); }, 3);
    std::printf("  BENCH %-10s %s D=%d B=%d H=%d N=%d%s: %8.3f ms  %6.2f TFLOP/s\n", kBackendNames[backend],
                dtype_name(t), D, B, H, N, causal ? " causal" : "", ms, flop / ms * 1e-9);
    char what[128];
    std::snprintf(what, sizeof what, "%s big-run spot check (%s)", kBackendNames[backend], dtype_name(t));
    check(what, q, k, v, o, lse, p, 24);
  }
  if (with_tuning && t == DType::kFloat32 && D == 64) {
    auto one = [&](const char* name, auto launch) {
      const float ms = time_ms(launch, 3);
      std::printf("  TUNE  %-40s %8.3f ms  %6.2f TFLOP/s\n", name, ms, flop / ms * 1e-9);
    };
    one("compact 128x64 4w (8x8 S)", [&] { return simt::launch_flash_simt_kernel<simt::LargeTileCompact<64>, float>(p, 0); });
    one("256x32 8w (8x4 S)", [&] { return simt::launch_flash_simt_kernel<Tune0, float>(p, 0); });
  }
  if (with_tuning && t == DType::kFloat32 && D == 32) {
    auto one = [&](const char* name, auto launch) {
      const float ms = time_ms(launch, 3);
      std::printf("  TUNE  %-40s %8.3f ms  %6.2f TFLOP/s\n", name, ms, flop / ms * 1e-9);
    };
    one("D=32 256x64 8w (8x8 S)", [&] { return simt::launch_flash_simt_kernel<Tune1, float>(p, 0); });
  }
  CHECK(cudaFree(lse));
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);

  // Invalid head dim -> cudaErrorInvalidValue from every launcher.
  {
    FwdParams p{};
    p.batch = p.heads_q = p.heads_kv = p.heads_ratio = p.seqlen_q = p.seqlen_k = 1;
    p.head_dim = 48;
    for (int backend = 0; backend < 3; ++backend) {
      const cudaError_t e = run_backend(backend, p, 0);
      std::printf("  %-10s head_dim=48 -> %s %s\n", kBackendNames[backend], cudaGetErrorName(e),
                  e == cudaErrorInvalidValue ? "ok" : "FAIL");
      if (e != cudaErrorInvalidValue) ++g_failures;
    }
  }

  const Case cases[] = {
      {2, 4, 2, 77, 131, 0, false, 0, 0},   // ragged, Nq < Nk, GQA 2
      {2, 4, 2, 77, 131, 0, true, 0, 0},    // causal, bottom-right aligned
      {1, 3, 1, 130, 65, 0, true, 1, 0},    // Nq > Nk causal: rows 0..64 see no key; MQA; BSHD
      {1, 2, 2, 200, 200, 0, true, 2, 8},   // square causal, padded rows
      {1, 2, 2, 33, 47, 0, false, 2, 1},    // unaligned rows (scalar path)
      {1, 1, 1, 1, 1, 0, false, 0, 0},      // single element
      {1, 2, 1, 1, 300, 0, true, 0, 0},     // decode-like: one query sees every key
      {3, 1, 1, 300, 1, 0, true, 0, 0},     // one key, causal: only the last row sees it
  };
  std::mt19937 rng(1234);
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const int dims[] = {32, 64, 128};
  for (int backend = 0; backend < 4; ++backend) {
    for (DType t : dtypes) {
      for (int D : dims) {
        for (const Case& c0 : cases) {
          Case c = c0;
          c.D = D;
          if (c.layout == 2 && c.pad == 1 && t != DType::kFloat32) c.pad = 3;
          run_case(backend, t, c, rng);
        }
      }
    }
    // Many heads: batch * heads > 65535 in one grid dimension.
    run_case(backend, DType::kFloat16, Case{2, 35000, 35000, 3, 5, 32, true, 0, 0}, rng);
  }
  // A longer causal sequence through every tile boundary.
  for (int backend = 0; backend < 4; ++backend)
    run_case(backend, DType::kFloat32, Case{1, 2, 1, 1000, 1100, 64, true, 1, 0}, rng);
  std::printf("correctness: %d failure(s)\n", g_failures);

  if (!quick) {
    bench(DType::kFloat32, 64, 32768, false, true);
    bench(DType::kFloat32, 64, 32768, true, false);
    bench(DType::kFloat16, 64, 32768, false, false);
    bench(DType::kFloat32, 128, 16384, false, false);
    bench(DType::kFloat32, 32, 16384, false, true);
    {
      // naive at a size whose workspace fits: B=2, N=8192 -> 512 MiB
      std::mt19937 r2(3);
      const int B = 2, N = 8192, D = 64;
      Tensor q(B, 1, N, D, 0, 0, DType::kFloat32), k(B, 1, N, D, 0, 0, DType::kFloat32),
          v(B, 1, N, D, 0, 0, DType::kFloat32), o(B, 1, N, D, 0, 0, DType::kFloat32);
      q.fill_random(r2, 1.f);
      k.fill_random(r2, 1.f);
      v.fill_random(r2, 1.f);
      FwdParams p = make_params(q, k, v, o, nullptr, false);
      const float ms = time_ms([&] { return launch_naive(p, 0); }, 3);
      std::printf("  BENCH naive      fp32 D=64 B=2 H=1 N=8192: %8.3f ms  %6.2f TFLOP/s\n", ms,
                  4.0 * B * (double)N * N * D / ms * 1e-9);
    }
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}
