// The work of this block's Q tile in the kernels that run one tile per CTA (sm80/, sm90/): where the
// tile is, its sequence, its valid rows, and the K/V tiles its mask lets it see (this split's share
// when the keys are split), with the mask-free range among them. (sm90ws/ walks several tiles per CTA
// and has its own.)
#pragma once

#include "common/mask.h"
#include "common/tile.h"
#include "cutlassfa/params.h"

namespace cutlassfa {

template <int kBlockM, int kBlockN>
struct BlockTileWork {
  TileCoord tile;
  SeqInfo seq;
  int m_block;
  Mask<kBlockM, kBlockN> mask;
  int n_block_min, n_block_max;  // <= n_block_min: no row of this tile sees a key
  int n_block_unmasked_begin, n_block_unmasked_end;
  int rows_q;  // valid rows of this Q tile (may exceed kBlockM)

  bool has_queries;  // false past a varlen entry's queries: nothing to do (the rest is then unset)

  // The mask is built only after the has_queries test.
  static __forceinline__ __device__ BlockTileWork of_this_block(FwdParams const& params) {
    BlockTileWork w;
    w.tile = tile_of_this_block<kBlockM>(params);
    w.seq = seq_info(params, w.tile.batch);
    w.m_block = w.tile.m_block;
    w.has_queries = w.m_block * kBlockM < w.seq.seqlen_q;
    if (!w.has_queries) { return w; }
    w.mask = {w.seq.seqlen_q, w.seq.seqlen_k, w.seq.key_begin, &params};
    w.n_block_min = w.mask.n_block_min(w.m_block);
    w.n_block_max = w.mask.n_block_max(w.m_block);
    if (params.num_splits > 1) { split_kv_range(w.n_block_min, w.n_block_max, w.tile.split, params.num_splits); }
    w.n_block_unmasked_begin = w.mask.n_block_unmasked_begin(w.m_block);
    w.n_block_unmasked_end = w.mask.n_block_unmasked_end(w.m_block);
    w.rows_q = w.seq.seqlen_q - w.m_block * kBlockM;
    return w;
  }
};

}  // namespace cutlassfa
