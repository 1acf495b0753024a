// Online softmax of one consumer warpgroup, split in two so that it can run while the previous tile's
// O += P V is still in flight: update() folds a new S tile into the running max and sum and turns it
// into P without touching O; rescale_o() applies the correction to O once that MMA has completed (the
// consumer does it under the next S = Q K^T).
// finalize() divides by the sum and gives lse (common/online_softmax.h's normalize_rows). The
// arithmetic of common/online_softmax.h (exp2 with the scale pre-multiplied by log2(e)), except that the
// reference max moves only when the max outgrew it by 2^8 in P; rows that have seen no key keep m = -inf.
#pragma once

#include <cute/tensor.hpp>

#include "common/alibi.h"  // AlibiLinear
#include "common/online_softmax.h"
#include "common/tensor_utils.h"

namespace cutlassfa::sm90ws {

using namespace cute;

// kNRows: accumulator rows held by one thread (2 per 16-row slab of a warp). kLaggingReference: the
// reference may lag the max (below); off for fp8 P, whose largest element must be exactly 1: e4m3 rounds
// a P of 2^x (x not an integer, up to 2^8 under a lagging reference) by up to 2^-4, and l, summed from the
// fp32 P, does not share that error, so a row dominated by one key is off by it (H100 self-test: 2.2 %
// against the 1.2 % of the rounding model on such rows with the reference lagging).
template <int kNRows, bool kLaggingReference = true>
struct TwoPhaseSoftmax {
  using RowTensor = decltype(make_tensor<float>(Shape<Int<kNRows>>{}));
  RowTensor row_max;  // the reference m_i (raw score units) that P and l are relative to, at most
                      // kMaxGrowthLog2 (in log2 units of P) below the running max; -inf until the
                      // row has seen a key
  RowTensor row_sum;  // l_i, this thread's columns only (the quad reduces at the end)
  // How far the max may outgrow the reference before O and l are rescaled, in log2 units of P
  // (common/online_softmax.h; H200 self-test: 1.02-1.05x at d = 96 / 128).
  static constexpr float kMaxGrowthLog2 = kLaggingReference ? kReferenceLagLog2 : 0.f;

  __forceinline__ __device__ TwoPhaseSoftmax() {
    fill(row_max, -INFINITY);
    fill(row_sum, 0.f);
  }

  // scores: (nrow, ncol) view of the S accumulator; overwritten with P = 2^(s * scale_log2 - m_i * scale_log2).
  // Returns alpha per row: the factor O must be multiplied by before P V is added (0 on the first tile,
  // 1 where the reference stayed).
  template <class TensorS>
  __forceinline__ __device__ RowTensor update(TensorS& scores, float scale_log2) {
    return update<false>(scores, scale_log2, AlibiLinear{}, scores);
  }
  // The same where score (mi, ni) is s + term.slope * offset + term.shift (one-sided ALiBi, common/alibi.h;
  // sm90ws/score_terms.h), offset = (row - row(0, 0)) - (key - key(0, 0)) from coords (the (nrow, ncol) view
  // of the elements' (row, key)), a compile-time number: one FFMA a score, fused into the max's loop; the shift
  // joins the max and leaves the exponent's addend, never added to each score.
  template <bool kLinear, class TensorS, class TensorC>
  __forceinline__ __device__ RowTensor update(TensorS& scores, float scale_log2, AlibiLinear const& term,
                                              TensorC const& coords) {
    static_assert(decltype(size<0>(scores))::value == kNRows);
    RowTensor alpha = make_tensor<float>(Shape<Int<kNRows>>{});
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
      float m_new;
      if constexpr (kLinear) {
        int const r0 = get<0>(coords(0, 0)), c0 = get<1>(coords(0, 0));
        float m_thread = -INFINITY;
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(scores); ++ni) {
          int const offset = (get<0>(coords(mi, ni)) - r0) - (get<1>(coords(mi, ni)) - c0);
          scores(mi, ni) = fmaf(term.slope, static_cast<float>(offset), scores(mi, ni));
          m_thread = fmaxf(m_thread, scores(mi, ni));
        }
        m_new = quad_allreduce(fmaxf(row_max(mi), m_thread + term.shift), MaxOp{});
      } else {
        m_new = quad_row_max(scores, mi, row_max(mi));
      }
      // The reference stays where it was while the max grows by at most kMaxGrowthLog2 (P then stays
      // <= 2^kMaxGrowthLog2, and O and l stay consistent with the reference): O needs no rescale at
      // most steps. A row that has only seen hidden keys has m = -inf: it takes 0 as the reference
      // (its scores are -inf and map to 2^-inf = 0) rather than computing -inf - -inf = NaN.
      bool const keep = row_max(mi) != -INFINITY && (m_new - row_max(mi)) * scale_log2 <= kMaxGrowthLog2;
      float const m_ref = keep ? row_max(mi) : finite_reference(m_new);
      alpha(mi) = keep ? 1.f : rescale_factor(row_max(mi), m_ref, scale_log2);
      row_max(mi) = keep ? row_max(mi) : m_new;
      float const m_ref_scaled = (kLinear ? m_ref - term.shift : m_ref) * scale_log2;
      row_sum(mi) = row_sum(mi) * alpha(mi) + exponentiate_row(scores, mi, scale_log2, m_ref_scaled);
    }
    return alpha;
  }

  // out: (nrow, d) view of the O accumulator, no MMA on it in flight.
  template <class TensorO>
  __forceinline__ __device__ void rescale_o(TensorO& out, RowTensor const& alpha) {
    bool any = false;  // a warp-uniform branch: skipped when no row of the warp moved its reference
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) { any |= alpha(mi) != 1.f; }
    if (!__any_sync(0xffffffffu, any)) { return; }
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
      CUTE_UNROLL
      for (int di = 0; di < size<1>(out); ++di) { out(mi, di) *= alpha(mi); }
    }
  }

  // O *= out_scale / l_i, returns lse (common/online_softmax.h, normalize_rows); out: the (nrow, d) view of O.
  template <class TensorO>
  __forceinline__ __device__ RowTensor finalize(TensorO& out, float scale, float out_scale) {
    return normalize_rows(out, row_max, row_sum, scale, out_scale);
  }
};

}  // namespace cutlassfa::sm90ws
