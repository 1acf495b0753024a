// Which keys a query row sees, and how many K/V tiles a Q tile visits: the bottom-right aligned
// causal mask of FlashAttention-2 (query i sees key j iff j <= i + seqlen_k - seqlen_q) plus the
// ragged end of the keys (j < seqlen_k). Trip counts (which K/V tiles a Q tile visits, which of them
// need element masking) and the per-element mask live together, and every tensor-core family uses
// this one struct.
#pragma once

#include <cute/tensor.hpp>

#include "common/tensor_utils.h"

namespace cutlassfa {

using namespace cute;

template <bool kIsCausal, int kBlockM, int kBlockN>
struct Mask {
  int seqlen_q;
  int seqlen_k;

  // K/V tiles [0, n_block_max) hold at least one key visible to some row of Q tile m_block. Zero
  // when every row of the tile precedes the first key (causal with seqlen_q > seqlen_k).
  __forceinline__ __device__ int n_block_max(int m_block) const {
    int const n_blocks_k = (seqlen_k + kBlockN - 1) / kBlockN;
    if constexpr (!kIsCausal) {
      return n_blocks_k;
    } else {
      int const last_row = min((m_block + 1) * kBlockM, seqlen_q) - 1;
      int const last_col = last_row + seqlen_k - seqlen_q;  // last key the tile's last row sees
      return last_col < 0 ? 0 : min(n_blocks_k, last_col / kBlockN + 1);
    }
  }

  // K/V tiles [0, n_block_unmasked_end) are fully visible to every row of the tile: no element
  // masking needed. The tiles above it (the diagonal ones, and the ragged last tile) are masked.
  __forceinline__ __device__ int n_block_unmasked_end(int m_block) const {
    int const full_tiles_k = seqlen_k / kBlockN;
    if constexpr (!kIsCausal) {
      return full_tiles_k;
    } else {
      int const first_col_end = m_block * kBlockM + seqlen_k - seqlen_q + 1;  // keys [0, end) seen by the first row
      return first_col_end <= 0 ? 0 : min(full_tiles_k, first_col_end / kBlockN);
    }
  }

  // Set the scores of invisible (row, key) pairs to -inf. acc_s and tScS share the accumulator
  // layout; tScS holds each element's (row, col) inside the (kBlockM, kBlockN) tile.
  template <class TensorS, class TensorC>
  __forceinline__ __device__ void apply(TensorS& acc_s, TensorC const& tScS, int m_block, int n_block) const {
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));  // (nrow, ncol)
    Tensor coords = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));    // (nrow, ncol) -> (row, col)
    // Compare compile-time offsets from this thread's first element against a limit made relative
    // to it. The limit goes through opaque(): otherwise the compiler folds the subtraction back into
    // a compare of the absolute column (loop invariant) with a uniform limit, and hoists all 64 of
    // them (rows x cols of the thread) out of the K/V loop as registers, which spilled.
    int const row0 = get<0>(coords(0, 0));
    int const col0 = get<1>(coords(0, 0));
    CUTE_UNROLL
    for (int mi = 0; mi < size<0>(scores); ++mi) {
      int const row = m_block * kBlockM + row0 + (get<0>(coords(mi, 0)) - row0);
      int col_end = seqlen_k;  // keys [0, col_end) are visible to this row
      if constexpr (kIsCausal) { col_end = min(col_end, row + 1 + seqlen_k - seqlen_q); }
      int const col_end_rel = opaque(col_end - n_block * kBlockN - col0);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(scores); ++ni) {
        if (get<1>(coords(mi, ni)) - col0 >= col_end_rel) { scores(mi, ni) = -INFINITY; }
      }
    }
  }
};

// The K/V loop order every family uses: from the last visible tile down to tile 0, the tiles that need
// element masking (the ragged last tile, the causal diagonal) first, then the mask-free ones.
// step(n_block, std::true_type / std::false_type) runs one tile, masked or not.
template <class Step>
__forceinline__ __device__ void for_each_kv_tile(int n_block_max, int n_block_unmasked_end, Step&& step) {
  int n_block = n_block_max - 1;
  for (; n_block >= n_block_unmasked_end; --n_block) { step(n_block, cute::true_type{}); }
  for (; n_block >= 0; --n_block) { step(n_block, cute::false_type{}); }
}

}  // namespace cutlassfa
