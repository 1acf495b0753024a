// Register-level helpers of the warp-specialized Hopper kernel: a conversion into an existing fragment
// (the accumulator views and the warpgroup GEMM are common/wgmma.h's).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "common/wgmma.h"

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

}  // namespace cutlassfa::sm90ws
