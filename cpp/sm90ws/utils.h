// Register-level helpers of the warp-specialized Hopper kernel: conversions into an existing fragment
// (the accumulator views and the warpgroup GEMM are common/wgmma.h's).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "common/wgmma.h"
#include "sm90ws/fp8_p_operand.h"

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

// fp8: P (the fp32 S accumulator after the softmax) into tOrP, the e4m3 A operand of P V, in the key order
// of sm90ws/fp8_key_order.h: each 32-bit register of tOrP is 4 values of this thread's own accumulator
// (two cvt.rn.satfinite.e4m3x2.f32), no shuffle. tOrP: ((4, 2, 2), MMA_M, N/32), compact, as
// fp8_p_layout gives.
template <class AccLayout>
__forceinline__ __device__ auto fp8_p_layout(AccLayout acc_layout) {
  return make_layout(shape(acc_as_fp8_a_operand(acc_layout)));
}
template <class EngineS, class LayoutS, class EngineP, class LayoutP>
__forceinline__ __device__ void convert_p_fp8(Tensor<EngineS, LayoutS> const& acc_s, Tensor<EngineP, LayoutP>& tOrP) {
  static_assert(std::is_same_v<typename EngineP::value_type, cutlass::float_e4m3_t>);
  Tensor p_a = make_tensor(acc_s.data(), acc_as_fp8_a_operand(acc_s.layout()));  // A's value order
  constexpr int kRegisters = decltype(size(tOrP))::value / 4;
  static_assert(decltype(size(p_a))::value == 4 * kRegisters);
  Tensor tOrP_u32 = recast<uint32_t>(tOrP);  // (kRegisters)
  cutlass::NumericArrayConverter<cutlass::float_e4m3_t, float, 4> convert_op;
  CUTE_UNROLL
  for (int r = 0; r < kRegisters; ++r) {
    cutlass::Array<float, 4> four;
    CUTE_UNROLL
    for (int j = 0; j < 4; ++j) { four[j] = p_a(4 * r + j); }
    cutlass::Array<cutlass::float_e4m3_t, 4> const packed = convert_op(four);
    tOrP_u32(r) = reinterpret_cast<uint32_t const&>(packed);
  }
}

}  // namespace cutlassfa::sm90ws
