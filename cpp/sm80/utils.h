// Register-level helpers of the SM80 forward kernel: accumulator layout views, type conversion,
// the two warp-level GEMMs with their ldmatrix software pipeline, and quad reductions.
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace cutlassfa::sm80 {

using namespace cute;

// An SM80 accumulator fragment is ((2, 2), MMA_M, MMA_N): per 16x8 atom a thread holds columns
// (2c, 2c+1) of rows r and r+8. View it as (rows, cols) = ((2, MMA_M), (2, MMA_N)) so the softmax
// can reduce over mode 1.
template <class Layout>
__forceinline__ __device__ auto acc_layout_rowcol(Layout acc_layout) {
  static_assert(decltype(size<0>(acc_layout))::value == 4, "16x8 accumulator atom: 4 values per thread");
  static_assert(decltype(rank(acc_layout))::value == 3);
  auto l = logical_divide(acc_layout, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// The accumulator of S = Q K^T reused as the A operand of O = P V without leaving registers: two
// neighbouring 16x8 C atoms (columns n, n+8) are exactly the k and k+8 halves of one 16x16 A atom,
// so ((2, 2), MMA_M, MMA_N) becomes ((2, 2, 2), MMA_M, MMA_N / 2).
template <class Layout>
__forceinline__ __device__ auto acc_layout_to_a_operand(Layout acc_layout) {
  static_assert(decltype(size<0>(acc_layout))::value == 4);
  static_assert(decltype(size<2>(acc_layout))::value % 2 == 0, "pairs of 16x8 atoms make one K=16 step");
  auto l = logical_divide(acc_layout, Shape<Underscore, Underscore, _2>{});  // ((2, 2), MMA_M, (2, MMA_N / 2))
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

// Element-wise conversion of a register fragment, vectorized (cvt.rn.f16x2.f32 / bf16x2 pairs).
template <class To, class Engine, class Layout>
__forceinline__ __device__ auto convert_type(Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int kNumel = decltype(size(src))::value;
  Tensor dst = make_tensor<To>(src.layout());
  cutlass::NumericArrayConverter<To, From, kNumel> convert_op;
  *reinterpret_cast<cutlass::Array<To, kNumel>*>(dst.data()) =
      convert_op(*reinterpret_cast<cutlass::Array<From, kNumel> const*>(src.data()));
  return dst;
}

// acc += A B^T with both operands in shared memory. The ldmatrix of k-step k+1 is issued before
// the MMAs of step k so shared-memory latency hides behind tensor-core work.
template <class Tensor0, class Tensor1, class Tensor2, class Tensor3, class Tensor4, class TiledMma,
          class TiledCopyA, class TiledCopyB, class ThrCopyA, class ThrCopyB>
__forceinline__ __device__ void gemm_ss(Tensor0& acc, Tensor1& tCrA, Tensor2& tCrB, Tensor3 const& tCsA,
                                        Tensor4 const& tCsB, TiledMma tiled_mma, TiledCopyA smem_tiled_copy_A,
                                        TiledCopyB smem_tiled_copy_B, ThrCopyA smem_thr_copy_A,
                                        ThrCopyB smem_thr_copy_B) {
  Tensor tCrA_view = smem_thr_copy_A.retile_D(tCrA);  // (CPY, CPY_M, CPY_K)
  Tensor tCrB_view = smem_thr_copy_B.retile_D(tCrB);  // (CPY, CPY_N, CPY_K)
  CUTE_STATIC_ASSERT_V(size<1>(tCsA) == size<1>(tCrA_view));
  CUTE_STATIC_ASSERT_V(size<1>(tCsB) == size<1>(tCrB_view));
  copy(smem_tiled_copy_A, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
  copy(smem_tiled_copy_B, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k < size<2>(tCrA) - 1) {
      copy(smem_tiled_copy_A, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
      copy(smem_tiled_copy_B, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// acc += A B^T with A already in registers (P) and B in shared memory (V^T).
template <class Tensor0, class Tensor1, class Tensor2, class Tensor3, class TiledMma, class TiledCopyB,
          class ThrCopyB>
__forceinline__ __device__ void gemm_rs(Tensor0& acc, Tensor1 const& tCrA, Tensor2& tCrB, Tensor3 const& tCsB,
                                        TiledMma tiled_mma, TiledCopyB smem_tiled_copy_B,
                                        ThrCopyB smem_thr_copy_B) {
  Tensor tCrB_view = smem_thr_copy_B.retile_D(tCrB);  // (CPY, CPY_N, CPY_K)
  CUTE_STATIC_ASSERT_V(size<1>(tCsB) == size<1>(tCrB_view));
  copy(smem_tiled_copy_B, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k < size<2>(tCrA) - 1) {
      copy(smem_tiled_copy_B, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// The 4 threads of a quad (lanes 4r .. 4r+3) hold the columns of the same accumulator rows.
template <class Op>
__forceinline__ __device__ float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 2));
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return x;
}

struct MaxOp {
  __forceinline__ __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __forceinline__ __device__ float operator()(float a, float b) const { return a + b; }
};

// 2^x on the special-function unit (what exp2f becomes under --use_fast_math): inputs are
// scores minus the row max, <= 0, where the approximation's 2 ulp are far below fp16/bf16 rounding
// of P; -inf gives exactly 0, which the masking relies on.
__forceinline__ __device__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace cutlassfa::sm80
