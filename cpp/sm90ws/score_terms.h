// Softcap and ALiBi (params.h) in the warp-specialized kernel's scored instantiation (Traits::kScoreTerms):
// applied to each S tile once its MMA has completed, before the mask's -inf, in the general kernels' order
// and arithmetic (common/softcap.h, then common/alibi.h). A call may carry either or both: warp-uniform
// run-time branches. The plain instantiations carry none of this (a run-time branch there cost the dense
// kernel 1-4 %, bench/NOTES-variants.md "ALiBi").
#pragma once

#include "common/alibi.h"
#include "common/softcap.h"
#include "common/tile.h"
#include "cutlassfa/params.h"

namespace cutlassfa::sm90ws {

template <bool kEnabled, int kBlockM, int kBlockN>
struct ScoreTerms {
  float softcap_pre = 0.f;  // > 0: softcap
  float alibi_slope = 0.f;  // in raw score units (common/alibi.h); 0: no ALiBi
  int row0 = 0;             // the tile's first query row within its entry
  int seqlen_q = 0, seqlen_k = 0;

  // The tile (m_block) of query head `head` of entry `batch`; read when the tile starts.
  __forceinline__ __device__ ScoreTerms(FwdParams const& params, int batch, int head, int m_block, SeqInfo const& seq) {
    if constexpr (kEnabled) {
      softcap_pre = params.softcap_pre;
      alibi_slope = alibi_slope_raw(params, batch, head);
      row0 = m_block * kBlockM;
      seqlen_q = seq.seqlen_q;
      seqlen_k = seq.seqlen_k;
    }
  }

  // acc_s: the S tile of K/V tile n_block in raw units; tScS: each element's (row, key) within the tile.
  template <class TensorS, class TensorC>
  __forceinline__ __device__ void apply(TensorS& acc_s, TensorC const& tScS, int n_block) const {
    if constexpr (kEnabled) {
      if (softcap_pre > 0.f) { apply_softcap(acc_s, softcap_pre); }
      if (alibi_slope != 0.f) { apply_alibi(acc_s, tScS, alibi_slope, row0, n_block * kBlockN, seqlen_q, seqlen_k); }
    }
  }
};

template <class Traits>
using ScoreTermsOf = ScoreTerms<Traits::kScoreTerms, Traits::kBlockM, Traits::kBlockN>;

}  // namespace cutlassfa::sm90ws
