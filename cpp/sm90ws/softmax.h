// Online softmax of one consumer warpgroup, split in two so that it can run while the previous tile's
// O += P V is still in flight: update() folds a new S tile into the running max and sum and turns it
// into P without touching O; rescale_o() applies the correction to O once that MMA has completed (the
// consumer does it under the next S = Q K^T).
// finalize() divides by the sum and gives lse (common/online_softmax.h's normalize_rows). Same
// arithmetic as common/online_softmax.h (exp2 with the scale pre-multiplied by log2(e)); rows that have
// seen no key keep m = -inf.
#pragma once

#include <cute/tensor.hpp>

#include "common/online_softmax.h"
#include "common/tensor_utils.h"

namespace cutlassfa::sm90ws {

using namespace cute;

// kNRows: accumulator rows held by one thread (2 per 16-row slab of a warp).
template <int kNRows>
struct TwoPhaseSoftmax {
  using RowTensor = decltype(make_tensor<float>(Shape<Int<kNRows>>{}));
  RowTensor row_max;  // m_i in raw score units; -inf until the row has seen a key
  RowTensor row_sum;  // l_i, this thread's columns only (the quad reduces at the end)

  __forceinline__ __device__ TwoPhaseSoftmax() {
    fill(row_max, -INFINITY);
    fill(row_sum, 0.f);
  }

  // scores: (nrow, ncol) view of the S accumulator; overwritten with P = 2^(s * scale_log2 - m_i * scale_log2).
  // Returns alpha per row: the factor O must be multiplied by before P V is added (0 on the first tile).
  template <class TensorS>
  __forceinline__ __device__ RowTensor update(TensorS& scores, float scale_log2) {
    static_assert(decltype(size<0>(scores))::value == kNRows);
    RowTensor alpha = make_tensor<float>(Shape<Int<kNRows>>{});
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
      float m_new = row_max(mi);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(scores); ++ni) { m_new = fmaxf(m_new, scores(mi, ni)); }
      m_new = quad_allreduce(m_new, MaxOp{});
      // A row that has only seen hidden keys has m = -inf: take 0 as the reference (its scores are
      // -inf and map to 2^-inf = 0) rather than computing -inf - -inf = NaN.
      float const m_ref = m_new == -INFINITY ? 0.f : m_new;
      float const m_ref_scaled = m_ref * scale_log2;
      alpha(mi) = row_max(mi) == -INFINITY ? 0.f : fast_exp2((row_max(mi) - m_ref) * scale_log2);
      row_max(mi) = m_new;
      float sum = 0.f;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(scores); ++ni) {
        scores(mi, ni) = fast_exp2(scores(mi, ni) * scale_log2 - m_ref_scaled);
        sum += scores(mi, ni);
      }
      row_sum(mi) = row_sum(mi) * alpha(mi) + sum;
    }
    return alpha;
  }

  // out: (nrow, d) view of the O accumulator, no MMA on it in flight.
  template <class TensorO>
  __forceinline__ __device__ void rescale_o(TensorO& out, RowTensor const& alpha) {
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
      CUTE_UNROLL
      for (int di = 0; di < size<1>(out); ++di) { out(mi, di) *= alpha(mi); }
    }
  }

  // O /= l_i, returns lse (common/online_softmax.h, normalize_rows); out: the (nrow, d) view of O.
  template <class TensorO>
  __forceinline__ __device__ RowTensor finalize(TensorO& out, float scale) {
    return normalize_rows(out, row_max, row_sum, scale);
  }
};

}  // namespace cutlassfa::sm90ws
