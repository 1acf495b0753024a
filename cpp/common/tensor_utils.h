// Register-level helpers every tensor-core family uses: the (rows, cols) view of an mma.sync-shaped
// accumulator, vectorized type conversion, quad reductions, exp2 on the special-function unit,
// optimizer barriers, and the row-predicated global-to-shared tile copy.
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "common/opaque.h"

namespace cutlassfa {

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

// Copy the rows of a (CPY, CPY_ROWS, CPY_K) partition whose tile row is in [row_begin, row_end) and
// zero the others, so rows past the end of the sequence never read out of bounds nor leave stale data
// (a NaN left in a V row would survive the P = 0 weight: 0 * NaN = NaN).
template <class TiledCopy, class TensorSrc, class TensorDst, class TensorCoord>
__forceinline__ __device__ void copy_rows_zfill(TiledCopy const& tiled_copy, TensorSrc const& src, TensorDst& dst,
                                                TensorCoord const& coords, int row_begin, int row_end) {
  // Relative to this thread's first row, behind opaque(): see Mask::apply.
  int const row0 = get<0>(coords(0, 0, 0));
  int const row_end_rel = opaque(row_end - row0);
  int const row_begin_rel = opaque(row_begin - row0);
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    int const r = get<0>(coords(0, m, 0)) - row0;
    if (r < row_end_rel && r >= row_begin_rel) {
      copy(tiled_copy, src(_, m, _), dst(_, m, _));
    } else {
      clear(dst(_, m, _));
    }
  }
}

// The Q tile, loaded once per CTA: rows < rows_valid and columns < col_end (a head dim narrower than
// the tile: zero padding) are copied, the rest zero-filled and never addressed.
template <class TiledCopy, class TensorSrc, class TensorDst, class TensorCoord>
__forceinline__ __device__ void copy_tile_zfill(TiledCopy const& tiled_copy, TensorSrc const& src, TensorDst& dst,
                                                TensorCoord const& coords, int rows_valid, int col_end) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      if (get<0>(coords(0, m, k)) < rows_valid && get<1>(coords(0, m, k)) < col_end) {
        copy(tiled_copy, src(_, m, k), dst(_, m, k));
      } else {
        clear(dst(_, m, k));
      }
    }
  }
}

}  // namespace cutlassfa
