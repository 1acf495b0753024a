// Which keys a query row sees, and which K/V tiles a Q tile visits, for the tensor-core families: the
// row range [lo, hi) is rules.h's (mask_row_lo / mask_row_hi; python/cutlassfa/masks.py states the same
// rule for the reference and the cpu backend). Each row sees one contiguous range, both ends
// non-decreasing in the row: the trip counts of a tile (which K/V tiles a Q tile visits, which of them
// need element masking) follow from its first and last rows, and live here with the per-element mask.
#pragma once

#include <cute/tensor.hpp>

#include "common/tensor_utils.h"
#include "cutlassfa/params.h"
#include "cutlassfa/rules.h"

namespace cutlassfa {

using namespace cute;

// The bounds are run-time values read by the masked steps alone: a row that sees every key costs its
// unmasked steps nothing; the non-causal rows stayed within the ±3% run-to-run noise of a former
// mask-free instantiation (bench/NOTES-variants.md), which doubled the build.
template <int kBlockM, int kBlockN>
struct Mask {
  int seqlen_q;
  int seqlen_k;
  int key_begin;  // keys before it are hidden (KV-cache left padding); 0 otherwise
  // window_left / window_right (-1: unbounded) are read from the kernel parameters where needed: the
  // compiler reloads them from the constant bank instead of holding two registers across the loop.
  FwdParams const* params;

  // First key row `row` sees (before clamping to the keys that exist).
  __forceinline__ __device__ int row_lo(int row) const {
    return rules::mask_row_lo(row, seqlen_q, seqlen_k, params->window_left, key_begin);
  }
  // One past the last key row `row` sees.
  __forceinline__ __device__ int row_hi(int row) const {
    return rules::mask_row_hi(row, seqlen_q, seqlen_k, params->window_right);
  }

  __forceinline__ __device__ int first_row(int m_block) const { return m_block * kBlockM; }
  __forceinline__ __device__ int last_row(int m_block) const { return min((m_block + 1) * kBlockM, seqlen_q) - 1; }

  // K/V tiles [n_block_min, n_block_max) hold every key some row of Q tile m_block sees; empty
  // (n_block_max <= n_block_min) when no row of the tile sees a key.
  __forceinline__ __device__ int n_block_min(int m_block) const { return max(0, row_lo(first_row(m_block))) / kBlockN; }
  __forceinline__ __device__ int n_block_max(int m_block) const {
    int const hi = row_hi(last_row(m_block));
    return hi <= 0 ? 0 : (hi + kBlockN - 1) / kBlockN;
  }

  // K/V tiles [n_block_unmasked_begin, n_block_unmasked_end) are fully visible to every row of the
  // tile: no element masking. The others (window edges, the causal diagonal, the left padding, the
  // ragged last tile) are masked. The range may be empty (begin >= end).
  __forceinline__ __device__ int n_block_unmasked_begin(int m_block) const {
    return (max(0, row_lo(last_row(m_block))) + kBlockN - 1) / kBlockN;
  }
  __forceinline__ __device__ int n_block_unmasked_end(int m_block) const {
    int const full_tiles_k = seqlen_k / kBlockN;
    int const hi = row_hi(first_row(m_block));
    return hi <= 0 ? 0 : min(full_tiles_k, hi / kBlockN);
  }

  // Set the scores of invisible (row, key) pairs to -inf. acc_s and tScS share the accumulator
  // layout; tScS holds each element's (row, col) inside the (kBlockM, kBlockN) tile. Tiles at or above
  // n_block_unmasked_begin need only the right end of each row's range (the causal diagonal, the ragged
  // end): one compare per score instead of two.
  template <class TensorS, class TensorC>
  __forceinline__ __device__ void apply(TensorS& acc_s, TensorC const& tScS, int m_block, int n_block,
                                        int n_block_unmasked_begin) const {
    if (n_block < n_block_unmasked_begin) {
      apply_range<true>(acc_s, tScS, m_block, n_block);
    } else {
      apply_range<false>(acc_s, tScS, m_block, n_block);
    }
  }

  template <bool kLeft, class TensorS, class TensorC>
  __forceinline__ __device__ void apply_range(TensorS& acc_s, TensorC const& tScS, int m_block, int n_block) const {
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));  // (nrow, ncol)
    Tensor coords = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));    // (nrow, ncol) -> (row, col)
    // Compare compile-time offsets from this thread's first element against limits made relative
    // to it. The limits go through opaque(): otherwise the compiler folds the subtraction back into
    // a compare of the absolute column (loop invariant) with a uniform limit, and hoists all 64 of
    // them (rows x cols of the thread) out of the K/V loop as registers, which spilled.
    int const row0 = get<0>(coords(0, 0));
    int const col0 = get<1>(coords(0, 0));
    int const col_base = n_block * kBlockN + col0;
    CUTE_UNROLL
    for (int mi = 0; mi < size<0>(scores); ++mi) {
      int const row = m_block * kBlockM + row0 + (get<0>(coords(mi, 0)) - row0);
      int const col_end_rel = opaque(row_hi(row) - col_base);  // keys [lo, hi) are visible to this row
      int const col_begin_rel = opaque(row_lo(row) - col_base);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(scores); ++ni) {
        int const c = get<1>(coords(mi, ni)) - col0;
        bool const hidden = kLeft ? (c >= col_end_rel || c < col_begin_rel) : c >= col_end_rel;
        if (hidden) { scores(mi, ni) = -INFINITY; }
      }
    }
  }
};

// The K/V loop order of the tensor-core families (sm80/, sm90/, sm90ws/): from the last visible tile down to n_block_min. The tiles
// that need element masking (the ragged last tile, the right window edge / causal diagonal, the left
// window edge, the left padding) run step(n_block, std::true_type), the others
// step(n_block, std::false_type). One loop with two call sites: a third call site made the compiler
// outline the step and keep the accumulators on the stack (864 bytes, 13x slower at d = 128).
template <class Step>
__forceinline__ __device__ void for_each_kv_tile(int n_block_min, int n_block_max, int n_block_unmasked_begin,
                                                 int n_block_unmasked_end, Step&& step) {
  for (int n_block = n_block_max - 1; n_block >= n_block_min; --n_block) {
    if (n_block >= n_block_unmasked_end || n_block < n_block_unmasked_begin) {
      step(n_block, cute::true_type{});
    } else {
      step(n_block, cute::false_type{});
    }
  }
}

}  // namespace cutlassfa
