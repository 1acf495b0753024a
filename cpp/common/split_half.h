// The split of fp32 values into fp16 halves that the fp32 path of the wgmma kernels multiplies:
// hi = fp16(x), lo = fp16(x - hi) (the difference is exact in fp32), so that hi + lo carries ~22 bits of
// x and Qhi Khi^T + Qhi Klo^T + Qlo Khi^T the scores to fp32 accuracy (cutlassfa/split_fp32.h). Shared
// by the pre-pass (src/split_fp32.cu) and the warp-specialized kernel's split of Q (sm90ws/split_q.h).
#pragma once

#include <cuda_fp16.h>

namespace cutlassfa {

// Eight consecutive values as two 16-byte rows of fp16: hi and lo.
struct SplitEight {
  uint4 hi;
  uint4 lo;
};

__device__ __forceinline__ SplitEight split_eight(float4 a, float4 b) {
  float const x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  __half2 hi[4];
  __half2 lo[4];
  for (int i = 0; i < 4; ++i) {
    hi[i] = __floats2half2_rn(x[2 * i], x[2 * i + 1]);
    float2 const hf = __half22float2(hi[i]);
    lo[i] = __floats2half2_rn(x[2 * i] - hf.x, x[2 * i + 1] - hf.y);
  }
  return {*reinterpret_cast<uint4 const*>(hi), *reinterpret_cast<uint4 const*>(lo)};
}

}  // namespace cutlassfa
