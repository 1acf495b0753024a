// Host code the standalone self-tests share (cpp/sm80/selftest.cu, cpp/sm90ws/selftest.cu,
// cpp/simt/selftest.cu), so that each keeps only its own cases: the CUDA error check, values rounded
// into a device dtype and read back, the uniform random fill, the error measures of output rows against
// the float64 reference (common/reference_row.h), and cudaEvent timings. Not part of the library build.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/reference_row.h"
#include "cutlassfa/params.h"

// A self-test has nothing to recover from a CUDA error: it names the call and exits.
#define CHECK_CUDA(expr)                                                                            \
  do {                                                                                              \
    cudaError_t const err_ = (expr);                                                                \
    if (err_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

namespace cutlassfa {

inline const char* dtype_name(DType t) {
  return t == DType::kFloat32 ? "fp32" : (t == DType::kFloat16 ? "fp16" : "bf16");
}

// Element i of an fp32 / fp16 / bf16 array: written from a float with the dtype's rounding, read back
// widened. The reference reads the rounded inputs, as the kernel does.
inline void store_element(DType t, void* base, size_t i, float x) {
  if (t == DType::kFloat32) { static_cast<float*>(base)[i] = x; }
  if (t == DType::kFloat16) { static_cast<__half*>(base)[i] = __float2half_rn(x); }
  if (t == DType::kBFloat16) { static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x); }
}
inline double load_element(DType t, const void* base, size_t i) {
  if (t == DType::kFloat32) { return static_cast<const float*>(base)[i]; }
  if (t == DType::kFloat16) { return __half2float(static_cast<const __half*>(base)[i]); }
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

// Elements [0, n) of a dtype-t array: uniform in [-amplitude, amplitude], drawn in order.
inline void fill_uniform(DType t, void* base, size_t n, std::mt19937& rng, float amplitude) {
  std::uniform_real_distribution<float> u(-amplitude, amplitude);
  for (size_t i = 0; i < n; ++i) { store_element(t, base, i, u(rng)); }
}

// Output rows against the float64 reference: rel-L2 of O over every row added, max |dO|, max |dlse| of
// the rows that see a key, and `bad`: NaN in O, lse off by more than lse_tolerance, or a row that sees
// no key without O = 0 and lse = -inf.
struct OutputErrors {
  double lse_tolerance;
  double err2 = 0, ref2 = 0, max_abs = 0, max_lse = 0;
  long long bad = 0;

  // One row: `ref` and `o` as reference_row left them (o unnormalized), against the d values of the
  // dtype-t array `out` from element `row`, and the kernel's lse.
  void add_row(ReferenceRow const& ref, std::vector<double> const& o, DType t, const void* out, size_t row, int d,
               float lse_got) {
    if (!ref.sees_keys()) {
      if (!(std::isinf(lse_got) && lse_got < 0)) { ++bad; }
    } else {
      double const e = std::fabs(lse_got - ref.lse());
      if (!(e <= lse_tolerance)) { ++bad; }
      max_lse = std::max(max_lse, e);
    }
    for (int x = 0; x < d; ++x) {
      double const want = ref.sees_keys() ? o[x] / ref.l : 0.0;
      double const got = load_element(t, out, row + x);
      if (std::isnan(got) || (!ref.sees_keys() && got != 0.0)) { ++bad; }
      err2 += (got - want) * (got - want);
      ref2 += want * want;
      max_abs = std::max(max_abs, std::fabs(got - want));
    }
  }
  double rel_l2() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2); }
};

// Milliseconds per launch, the mean of `reps` launches between two cudaEvents on the default stream,
// after `warmups` untimed ones. launch() returns the launch's cudaError_t.
template <class Launch>
float time_launches_ms(Launch&& launch, int warmups, int reps) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmups; ++i) { CHECK_CUDA(launch()); }
  CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) { CHECK_CUDA(launch()); }
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms / reps;
}

}  // namespace cutlassfa
