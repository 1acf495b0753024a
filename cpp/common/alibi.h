// ALiBi (params.h) in the tile kernels' steps: every score of the tile gains -slope * |diagonal(row) - key|
// (rules.h alibi_distance) in softmax units, i.e. -(slope / softmax_scale) * distance in the raw units the
// kernels exponentiate, after softcap and before the mask's -inf. A general kernel's step (score terms).
#pragma once

#include <cute/tensor.hpp>

#include "cutlassfa/params.h"
#include "cutlassfa/rules.h"

namespace cutlassfa {

// The slope of (entry `batch`, query head `head`) in raw score units: slope / softmax_scale (0: no ALiBi).
__forceinline__ __device__ float alibi_slope_raw(FwdParams const& params, int batch, int head) {
  if (params.alibi_slopes == nullptr) return 0.f;
  return params.alibi_slopes[batch * params.alibi_batch_stride + head] / params.softmax_scale;
}

// acc_s and tScS share a layout; tScS holds each element's (row, key) within the tile, whose first query
// row is row0 and first key key0 within the entry of seqlen_q queries and seqlen_k keys. The distance of
// element i is this thread's first element's plus a compile-time offset (the coordinates' differences
// fold), in float: one FADD and one FFMA with |.| a score (mask.h's apply_range does the same for limits).
template <class TensorS, class TensorC>
__forceinline__ __device__ void apply_alibi(TensorS& acc_s, TensorC const& tScS, float slope_raw, int row0, int key0,
                                            int seqlen_q, int seqlen_k) {
  int const r0 = cute::get<0>(tScS(0)), c0 = cute::get<1>(tScS(0));
  // diagonal(row0 + r0) - (key0 + c0): signed; alibi_distance is its absolute value (rules.h).
  float const first = static_cast<float>(rules::mask_diagonal(row0 + r0, seqlen_q, seqlen_k) - (key0 + c0));
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc_s); ++i) {
    int const offset = (cute::get<0>(tScS(i)) - r0) - (cute::get<1>(tScS(i)) - c0);
    acc_s(i) -= slope_raw * fabsf(first + static_cast<float>(offset));
  }
}

// The same bias where every visible key of the tile lies on one side of its row's diagonal (sign +1: at or
// before it, -1: at or after it): -slope * |d| = -slope * sign * d is then linear in the coordinates, the
// bias of this thread's element i slope * offset(i) + shift, offset(i) = (row(i) - row(0)) - (key(i) - key(0))
// a compile-time number (one FFMA a score, which the caller fuses with its next pass over the scores), and
// shift common to them (added to their max rather than to each). Elements on the other side (hidden keys)
// would get the wrong bias and must be masked.
struct AlibiLinear {
  float slope = 0.f, shift = 0.f;  // none
};
template <class TensorC>
__forceinline__ __device__ AlibiLinear alibi_one_sided(TensorC const& tScS, float slope_raw, float sign, int row0,
                                                       int key0, int seqlen_q, int seqlen_k) {
  int const r0 = cute::get<0>(tScS(0)), c0 = cute::get<1>(tScS(0));
  float const slope = -slope_raw * sign;
  return {slope, slope * static_cast<float>(rules::mask_diagonal(row0 + r0, seqlen_q, seqlen_k) - (key0 + c0))};
}

}  // namespace cutlassfa
