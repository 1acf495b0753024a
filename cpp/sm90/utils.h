// Register-level helpers of the SM90 forward kernel: views of the wgmma accumulator in the mma.sync
// shapes (so the shared mask and online softmax apply unchanged) and one warpgroup GEMM.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace cutlassfa::sm90 {

using namespace cute;

// A wgmma accumulator fragment is ((2, 2, N/8), MMA_M, MMA_N): per 8-column chunk a thread holds
// columns (2c, 2c+1) of rows r and r+8, exactly the values of one mma.sync 16x8 atom. Regroup it as
// that fragment ((2, 2), MMA_M, (N/8, MMA_N)).
template <class Layout>
__forceinline__ __device__ auto acc_as_sm80(Layout acc_layout) {
  static_assert(decltype(rank<0>(acc_layout))::value == 3 && decltype(rank(acc_layout))::value == 3);
  return make_layout(make_layout(get<0, 0>(acc_layout), get<0, 1>(acc_layout)), get<1>(acc_layout),
                     make_layout(get<0, 2>(acc_layout), get<2>(acc_layout)));
}

// The S accumulator reused as the register A operand of O += P V: two neighbouring 8-column chunks
// are the k and k+8 halves of one 64x16 A slice, so ((2, 2, N/8), MMA_M, MMA_N) becomes
// ((2, 2, 2), MMA_M, N/16 * MMA_N).
template <class Layout>
__forceinline__ __device__ auto acc_as_a_operand(Layout acc_layout) {
  static_assert(decltype(size<0, 2>(acc_layout))::value % 2 == 0, "pairs of 8-column chunks make one K=16 slice");
  auto chunks = logical_divide(get<0, 2>(acc_layout), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(acc_layout), get<0, 1>(acc_layout), get<0, 0>(chunks)),
                     get<1>(acc_layout), coalesce(make_layout(get<0, 1>(chunks), get<2>(acc_layout))));
}

// acc (+)= A B^T for one warpgroup tile: all K slices issued as one wgmma batch, then waited for.
// kZeroInit: the first slice overwrites acc (no clear needed). kARegisters: A is a register
// fragment (P) rather than shared-memory descriptors (Q); the fences keep the compiler from
// touching those registers while the asynchronous MMAs may still read or write them.
template <bool kZeroInit, bool kARegisters, class TiledMma, class TensorA, class TensorB, class TensorC>
__forceinline__ __device__ void gemm(TiledMma& tiled_mma, TensorA& tCrA, TensorB const& tCrB, TensorC& tCrC) {
  if constexpr (kARegisters) { warpgroup_fence_operand(tCrA); }
  warpgroup_fence_operand(tCrC);
  warpgroup_arrive();
  if constexpr (kZeroInit) { tiled_mma.accumulate_ = GMMA::ScaleOut::Zero; }
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), tCrC);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tCrC);
  if constexpr (kARegisters) { warpgroup_fence_operand(tCrA); }
}

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
