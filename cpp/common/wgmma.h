// Hopper warpgroup-MMA (wgmma) pieces shared by the two sm_90a kernels (sm90/ and sm90ws/): views of
// an accumulator in the mma.sync shapes (so common/mask.h and the online softmax apply unchanged), the
// S accumulator re-viewed as the register A operand of O += P V, and one warpgroup GEMM (and its form for
// fp32 inputs split into fp16 halves).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace cutlassfa {

// A wgmma accumulator fragment is ((2, 2, N/8), MMA_M, MMA_N): per 8-column chunk a thread holds
// columns (2c, 2c+1) of rows r and r+8, exactly the values of one mma.sync 16x8 atom. Regrouped as that
// fragment: ((2, 2), MMA_M, (N/8, MMA_N)).
template <class Layout>
__forceinline__ __device__ auto acc_as_sm80(Layout acc_layout) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc_layout))::value == 3 && decltype(rank(acc_layout))::value == 3);
  return make_layout(make_layout(get<0, 0>(acc_layout), get<0, 1>(acc_layout)), get<1>(acc_layout),
                     make_layout(get<0, 2>(acc_layout), get<2>(acc_layout)));
}

// The S accumulator as the register A operand of O += P V: two neighbouring 8-column chunks are the
// k and k+8 halves of one 64x16 A slice, so ((2, 2, N/8), MMA_M, MMA_N) becomes
// ((2, 2, 2), MMA_M, N/16 * MMA_N).
template <class Layout>
__forceinline__ __device__ auto acc_as_a_operand(Layout acc_layout) {
  using namespace cute;
  static_assert(decltype(size<0, 2>(acc_layout))::value % 2 == 0, "pairs of 8-column chunks make one K=16 slice");
  auto chunks = logical_divide(get<0, 2>(acc_layout), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(acc_layout), get<0, 1>(acc_layout), get<0, 0>(chunks)),
                     get<1>(acc_layout), coalesce(make_layout(get<0, 1>(chunks), get<2>(acc_layout))));
}

// acc (+)= A B for one warpgroup: all K slices issued as one wgmma batch and committed. kWait >= 0
// waits until at most kWait batches of this warpgroup are still in flight; -1 returns at once (the
// caller waits with warpgroup_wait before it reads acc or rewrites a register A operand).
// kZeroInit: the first slice overwrites acc. kARegisters: A is a register fragment (P) rather than
// shared-memory descriptors (Q); the fences keep the compiler from moving its uses across the MMA.
template <bool kZeroInit, int kWait, bool kARegisters, class TiledMma, class TensorA, class TensorB, class TensorC>
__forceinline__ __device__ void warpgroup_gemm(TiledMma& tiled_mma, TensorA& tCrA, TensorB const& tCrB, TensorC& tCrC) {
  using namespace cute;
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
  if constexpr (kWait >= 0) { warpgroup_wait<kWait>(); }
  warpgroup_fence_operand(tCrC);
  if constexpr (kARegisters) { warpgroup_fence_operand(tCrA); }
}

// fp32 inputs (cutlassfa/split_fp32.h): acc = Qhi Khi^T + Qhi Klo^T + Qlo Khi^T with both operands in
// shared memory as [hi | lo] column halves (the first half of the 16-column K slices hi, the second lo):
// three MMAs per slice, the small cross terms first; lo lo^T (~2^-22 relative) is dropped. Each half is
// stored once and read by two of the three products. kWait as warpgroup_gemm's.
template <int kWait, class TiledMma, class TensorA, class TensorB, class TensorC>
__forceinline__ __device__ void warpgroup_gemm_split(TiledMma& tiled_mma, TensorA& tCrA, TensorB const& tCrB,
                                                     TensorC& tCrC) {
  using namespace cute;
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
  if constexpr (kWait >= 0) { warpgroup_wait<kWait>(); }
  warpgroup_fence_operand(tCrC);
}

}  // namespace cutlassfa
