// Register-level helpers of the warp-specialized Hopper kernel: a conversion into an existing fragment
// and one warpgroup GEMM that may be left in flight (the accumulator views are common/wgmma_layouts.h's).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "common/wgmma_layouts.h"

namespace cutlassfa::sm90ws {

using namespace cute;

// dst = src converted element-wise (cvt.rn.f16x2.f32 / bf16x2 pairs). dst is an existing fragment (P):
// its registers stay the same from one K/V step to the next, which keeps the in-flight P V MMA
// reading registers nothing else writes.
template <class EngineS, class LayoutS, class EngineD, class LayoutD>
__forceinline__ __device__ void convert_into(Tensor<EngineS, LayoutS> const& src, Tensor<EngineD, LayoutD>& dst) {
  using From = typename EngineS::value_type;
  using To = typename EngineD::value_type;
  constexpr int kNumel = decltype(size(src))::value;
  static_assert(kNumel == decltype(size(dst))::value);
  cutlass::NumericArrayConverter<To, From, kNumel> convert_op;
  *reinterpret_cast<cutlass::Array<To, kNumel>*>(dst.data()) =
      convert_op(*reinterpret_cast<cutlass::Array<From, kNumel> const*>(src.data()));
}

// acc (+)= A B for one warpgroup: all K slices issued as one wgmma batch and committed. kWait >= 0
// waits until at most kWait batches of this warpgroup are still in flight; -1 returns at once (the
// caller waits with warpgroup_wait before it reads acc or rewrites a register A operand).
// kZeroInit: the first slice overwrites acc. kARegisters: A is a register fragment (P) rather than
// shared-memory descriptors (Q); the fences keep the compiler from moving its uses across the MMA.
template <bool kZeroInit, int kWait, bool kARegisters, class TiledMma, class TensorA, class TensorB, class TensorC>
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
  if constexpr (kWait >= 0) { warpgroup_wait<kWait>(); }
  warpgroup_fence_operand(tCrC);
  if constexpr (kARegisters) { warpgroup_fence_operand(tCrA); }
}

}  // namespace cutlassfa::sm90ws
