// Softcap or ALiBi (params.h) in the warp-specialized kernel's scored instantiations (Traits::kScoreTerm):
// applied to each S tile once its MMA has completed, before the mask's -inf, with the general kernels'
// arithmetic (common/softcap.h, common/alibi.h). One term an instantiation: the plain one carries neither
// (a run-time branch there cost the dense kernel 1-4 %, bench/NOTES-variants.md "ALiBi"), and an
// instantiation that branched between both at run time was 3-11 % slower than the plain one with neither
// applied (H200, bench/NOTES-variants.md "ALiBi on the warp-specialized kernel").
#pragma once

#include "common/alibi.h"
#include "common/softcap.h"
#include "common/tile.h"
#include "cutlassfa/params.h"
#include "cutlassfa/rules.h"
#include "sm90ws/launch_fwd.h"
#include "sm90ws/softmax.h"

namespace cutlassfa::sm90ws {

template <ScoreTerm kTerm, int kBlockM, int kBlockN>
struct ScoreTerms {
  // Whether apply() leaves a linear term to the softmax (sm90ws/softmax.h, update's kLinear).
  static constexpr bool kLinear = kTerm == ScoreTerm::kAlibi;
  float softcap_pre = 0.f;  // softcap's factor (params.h)
  float alibi_slope = 0.f;  // in raw score units (common/alibi.h)
  int row0 = 0;             // the tile's first query row within its entry
  int seqlen_q = 0, seqlen_k = 0;
  // The mask hides every key past (before) the diagonal: causal, or a window (L, 0) ((0, R)).
  bool hides_past = false, hides_before = false;

  // The tile (m_block) of query head `head` of entry `batch`; read when the tile starts.
  __forceinline__ __device__ ScoreTerms(FwdParams const& params, int batch, int head, int m_block, SeqInfo const& seq) {
    if constexpr (kTerm == ScoreTerm::kSoftcap) { softcap_pre = params.softcap_pre; }
    if constexpr (kTerm == ScoreTerm::kAlibi) {
      alibi_slope = alibi_slope_raw(params, batch, head);
      row0 = m_block * kBlockM;
      seqlen_q = seq.seqlen_q;
      seqlen_k = seq.seqlen_k;
      hides_past = params.window_right == 0;
      hides_before = params.window_left == 0;
    }
  }

  // acc_s: the S tile of K/V tile n_block in raw units; tScS: each element's (row, key) within the tile.
  // Returns what the softmax adds to the scores (sm90ws/softmax.h update; none but one-sided ALiBi's).
  // ALiBi costs one FFMA a score where the tile's visible keys lie on one side of every row's diagonal (every
  // tile under a causal mask; all but those the diagonal crosses without one): linear there, the softmax adds
  // it while it takes the max (common/alibi.h alibi_one_sided); elsewhere it is added here, three ops a score.
  template <class TensorS, class TensorC>
  __forceinline__ __device__ AlibiLinear apply(TensorS& acc_s, TensorC const& tScS, int n_block) const {
    AlibiLinear term;
    if constexpr (kTerm == ScoreTerm::kSoftcap) { apply_softcap(acc_s, softcap_pre); }
    if constexpr (kTerm == ScoreTerm::kAlibi) {
      int const key0 = n_block * kBlockN;
      // Distances diagonal(row) - key over the tile: at least / at most these.
      int const lowest = rules::mask_diagonal(row0, seqlen_q, seqlen_k) - (key0 + kBlockN - 1);
      int const highest = rules::mask_diagonal(row0 + kBlockM - 1, seqlen_q, seqlen_k) - key0;
      float const side = hides_past || lowest >= 0 ? 1.f : hides_before || highest <= 0 ? -1.f : 0.f;
      if (side != 0.f) {
        term = alibi_one_sided(tScS, alibi_slope, side, row0, key0, seqlen_q, seqlen_k);
      } else {
        apply_alibi(acc_s, tScS, alibi_slope, row0, key0, seqlen_q, seqlen_k);
      }
    }
    return term;
  }
};

template <class Traits>
using ScoreTermsOf = ScoreTerms<Traits::kScoreTerm, Traits::kBlockM, Traits::kBlockN>;

}  // namespace cutlassfa::sm90ws
