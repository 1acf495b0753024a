// Register-level helpers of the SM90 forward kernel: the split-fp16 S GEMM of fp32 inputs (the
// accumulator views and the warpgroup GEMM are common/wgmma.h's).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "common/wgmma.h"

namespace cutlassfa::sm90 {

using namespace cute;

// fp32 inputs: S = Qhi Khi^T + Qhi Klo^T + Qlo Khi^T with Q and K in shared memory as [hi | lo]
// column halves (the first half of the 16-column K slices hi, the second lo): three MMAs per
// slice, the small cross terms first; lo lo^T (~2^-22 relative) is dropped. Each half is stored
// once and read by two of the three products.
template <class TiledMma, class TensorA, class TensorB, class TensorC>
__forceinline__ __device__ void gemm_split(TiledMma& tiled_mma, TensorA& tCrA, TensorB const& tCrB, TensorC& tCrC) {
  constexpr int kHalf = decltype(size<2>(tCrA))::value / 2;
  static_assert(2 * kHalf == decltype(size<2>(tCrA))::value && decltype(size<2>(tCrB))::value == 2 * kHalf);
  warpgroup_fence_operand(tCrC);
  warpgroup_arrive();
  tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < 3 * kHalf; ++k) {
    int const part = k / kHalf;  // 0: Qhi Klo, 1: Qlo Khi, 2: Qhi Khi
    int const j = k % kHalf;
    int const a = part == 1 ? kHalf + j : j;
    int const b = part == 0 ? kHalf + j : j;
    cute::gemm(tiled_mma, tCrA(_, _, a), tCrB(_, _, b), tCrC);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tCrC);
}

// Make this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the async
// proxy that wgmma reads through; a barrier must still follow before another thread's wgmma.
__forceinline__ __device__ void fence_shared_to_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace cutlassfa::sm90
