// Online softmax over the rows of the S = Q K^T accumulator, FlashAttention-2 style: the running
// max m_i and running sum l_i live in registers; O is rescaled by alpha = 2^((m_old - m_new) scale)
// whenever the max grows (or, with a lagging reference, below, outgrows it), and divided by l_i once at the end.
//
// The softmax scale arrives pre-multiplied by log2(e) (params.softmax_scale_log2), so that
// exp(x * scale - m * scale) = 2^(x * scale_log2 - m * scale_log2): one FFMA and one MUFU.EX2 per
// score instead of a multiply, a subtract and a natural exp.
#pragma once

#include <cute/tensor.hpp>

#include "common/tensor_utils.h"

namespace cutlassfa {

using namespace cute;

// End of the K/V loop, for every online softmax (this one and sm90ws/softmax.h's two-phase one):
// out (nrow, head_dim) /= l_i, one reciprocal per row, and lse = m_i * scale + ln(l_i) in natural-log
// units. A row that saw no key (l_i = 0) gets O = 0 and lse = -inf. row_sum holds this thread's
// columns only; the quad reduces it here. out_scale multiplies O in the same product (fp8's v_descale).
template <class TensorO, class RowTensor>
__forceinline__ __device__ RowTensor normalize_rows(TensorO& out, RowTensor const& row_max, RowTensor const& row_sum,
                                                    float scale, float out_scale = 1.f) {
  constexpr int kNRows = decltype(size(row_max))::value;
  RowTensor lse = make_tensor<float>(Shape<Int<kNRows>>{});
  CUTE_UNROLL
  for (int mi = 0; mi < kNRows; ++mi) {
    float const sum = quad_allreduce(row_sum(mi), SumOp{});
    bool const empty = sum == 0.f;
    float const inv_sum = empty ? 0.f : out_scale / sum;
    lse(mi) = empty ? -INFINITY : row_max(mi) * scale + logf(sum);
    CUTE_UNROLL
    for (int di = 0; di < size<1>(out); ++di) { out(mi, di) *= inv_sum; }
  }
  return lse;
}

// The row steps of every online softmax (the struct below and sm90ws/softmax.h's two-phase one), on the
// (nrow, ncol) view of an S tile.

// Row mi's max over this tile's scores and `start`, across the quad that holds the row.
template <class TensorS>
__forceinline__ __device__ float quad_row_max(TensorS const& scores, int mi, float start) {
  float m = start;
  CUTE_UNROLL
  for (int ni = 0; ni < size<1>(scores); ++ni) { m = fmaxf(m, scores(mi, ni)); }
  return quad_allreduce(m, MaxOp{});
}

// The reference P is taken against: a row that has seen only masked keys (max -inf) takes 0, since
// -inf - -inf would be NaN; its scores are all -inf and map to 2^-inf = 0.
__forceinline__ __device__ float finite_reference(float m) { return m == -INFINITY ? 0.f : m; }

// What O and l are multiplied by when their reference moves from `from` to `to`; 0 from -inf (the first
// key seen: O and l are still 0).
__forceinline__ __device__ float rescale_factor(float from, float to, float scale_log2) {
  return from == -INFINITY ? 0.f : fast_exp2((from - to) * scale_log2);
}

// Row mi's scores become P = 2^(s * scale_log2 - reference_scaled) in place; returns this thread's sum of
// them.
template <class TensorS>
__forceinline__ __device__ float exponentiate_row(TensorS& scores, int mi, float scale_log2, float reference_scaled) {
  float sum = 0.f;
  CUTE_UNROLL
  for (int ni = 0; ni < size<1>(scores); ++ni) {
    scores(mi, ni) = fast_exp2(scores(mi, ni) * scale_log2 - reference_scaled);
    sum += scores(mi, ni);
  }
  return sum;
}

// A lagging reference (FlashAttention-4's conditional rescale): a row's reference max, which P, l and O are
// relative to, moves only once the row's max outgrew it by more than this, in log2 units of P. P then stays
// <= 2^8 (as exact relative to 1 in fp16 / bf16 as below it; fp32 O and l have room to spare), and O is
// rescaled at few steps: after the first key tiles of most rows, at none.
constexpr float kReferenceLagLog2 = 8.f;

// kNRows: accumulator rows held by one thread (2 per 16-row MMA slab).
// kLaggingReference: the reference lags the max (kReferenceLagLog2), and O is rescaled only when some row of
// the warp moved its reference: a branch the warp takes together, so every lane of a warp must run the same
// steps (the decode kernel's warps: their own keys each).
template <int kNRows, bool kLaggingReference = false>
struct OnlineSoftmax {
  using RowTensor = decltype(make_tensor<float>(Shape<Int<kNRows>>{}));
  RowTensor row_max;  // m_i (lagging: the reference), raw (unscaled) score units; -inf until the row has seen a key
  RowTensor row_sum;  // l_i, partial: each thread sums its own columns, the quad reduces at the end

  __forceinline__ __device__ OnlineSoftmax() {
    fill(row_max, -INFINITY);
    fill(row_sum, 0.f);
  }

  // One K/V step: fold the scores of this tile (acc_s, accumulator layout) into m_i and l_i,
  // overwrite acc_s with P = 2^(s * scale_log2 - m_i * scale_log2), and rescale acc_o.
  template <class TensorS, class TensorO>
  __forceinline__ __device__ void update(TensorS& acc_s, TensorO& acc_o, float scale_log2) {
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));  // (nrow, ncol)
    Tensor out = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));     // (nrow, head_dim)
    static_assert(decltype(size<0>(scores))::value == kNRows);
    if constexpr (kLaggingReference) {
      update_lagging(scores, out, scale_log2);
    } else {
      CUTE_UNROLL
      for (int mi = 0; mi < kNRows; ++mi) {
        float const m_new = quad_row_max(scores, mi, row_max(mi));
        float const m_ref = finite_reference(m_new);
        float const alpha = rescale_factor(row_max(mi), m_ref, scale_log2);
        row_max(mi) = m_new;
        float const sum = exponentiate_row(scores, mi, scale_log2, m_ref * scale_log2);
        row_sum(mi) = row_sum(mi) * alpha + sum;
        CUTE_UNROLL
        for (int di = 0; di < size<1>(out); ++di) { out(mi, di) *= alpha; }
      }
    }
  }

  // update() with kLaggingReference: row_max is the reference the exponents use, not the running max.
  template <class TensorS, class TensorO>
  __forceinline__ __device__ void update_lagging(TensorS& scores, TensorO& out, float scale_log2) {
    float m_new[kNRows];
    bool grows = false;  // some row of this thread outgrew its reference by more than kReferenceLagLog2
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
      m_new[mi] = quad_row_max(scores, mi, row_max(mi));
      // -inf reference (no key seen yet): grows as soon as a key is visible; -inf - -inf is NaN, not > .
      grows |= (m_new[mi] - row_max(mi)) * scale_log2 > kReferenceLagLog2;
    }
    if (__any_sync(0xffffffffu, grows)) {
      CUTE_UNROLL
      for (int mi = 0; mi < kNRows; ++mi) {
        float const alpha = rescale_factor(row_max(mi), m_new[mi], scale_log2);
        row_max(mi) = m_new[mi];
        row_sum(mi) *= alpha;
        CUTE_UNROLL
        for (int di = 0; di < size<1>(out); ++di) { out(mi, di) *= alpha; }
      }
    }
    CUTE_UNROLL
    for (int mi = 0; mi < kNRows; ++mi) {
      row_sum(mi) += exponentiate_row(scores, mi, scale_log2, finite_reference(row_max(mi)) * scale_log2);
    }
  }

  // End of the K/V loop (normalize_rows): O /= l_i, returns lse; acc_o in accumulator layout.
  template <class TensorO>
  __forceinline__ __device__ RowTensor finalize(TensorO& acc_o, float scale) {
    Tensor out = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));  // (nrow, head_dim)
    return normalize_rows(out, row_max, row_sum, scale);
  }
};

}  // namespace cutlassfa
