// The part of a forward tile that is the same in every tensor-core family: which (Q tile, head, batch)
// a CTA owns, the global tensors of that tile, and the epilogue that writes O and lse.
#pragma once

#include <cute/tensor.hpp>

#include "common/epilogue.h"
#include "common/tensor_utils.h"
#include "cutlassfa/params.h"

namespace cutlassfa {

using namespace cute;

struct TileCoord {
  int m_block;  // Q tile index
  int head;     // query head
  int batch;
  int head_kv;  // the K/V head query head `head` reads (GQA)
};

// The CTA's tile, from the 1-D grid of common/launch_kernel.h. m_block varies fastest so the CTAs
// sharing one K/V head run together and re-read it from L2; within a head the tiles go last-first,
// which under a causal mask launches the longest first.
template <int kBlockM>
__forceinline__ __device__ TileCoord tile_of_this_block(FwdParams const& params) {
  int const num_m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
  int const m_block = num_m_blocks - 1 - static_cast<int>(blockIdx.x % num_m_blocks);
  int const bh = static_cast<int>(blockIdx.x / num_m_blocks);
  int const head = bh % params.heads_q;
  return {m_block, head, bh / params.heads_q, head / params.heads_ratio};
}

// One head of a (batch, heads, seqlen, kCols) tensor as (seqlen, kCols), row stride from params
// (64-bit offsets: batch * batch_stride can exceed 2^31).
template <int kCols, class Element>
__forceinline__ __device__ auto head_tensor(Element* base, long long batch_stride, long long head_stride,
                                            long long row_stride, int batch, int head, int seqlen) {
  int64_t const offset = batch * batch_stride + head * head_stride;
  return make_tensor(make_gmem_ptr(base + offset), make_shape(seqlen, Int<kCols>{}),
                     make_stride(static_cast<int64_t>(row_stride), _1{}));  // (seqlen, kCols)
}

// (gQ, gK, gV, gO) of the tile: gQ (kBlockM, kHeadDimQK), gK (kBlockN, kHeadDimQK, n_blocks),
// gV (kBlockN, kHeadDim, n_blocks), gO (kBlockM, kHeadDim). Q and K may be wider than V and O
// (fp32 inputs pre-split into [hi | lo] columns).
template <int kBlockM, int kBlockN, int kHeadDimQK, int kHeadDim, class ElementIn, class ElementOut>
__forceinline__ __device__ auto global_tiles(FwdParams const& params, TileCoord const& t) {
  auto const* q = static_cast<ElementIn const*>(params.q);
  auto const* k = static_cast<ElementIn const*>(params.k);
  auto const* v = static_cast<ElementIn const*>(params.v);
  auto* o = static_cast<ElementOut*>(params.o);
  Tensor mQ = head_tensor<kHeadDimQK>(q, params.q_batch_stride, params.q_head_stride, params.q_row_stride, t.batch,
                                      t.head, params.seqlen_q);  // (seqlen_q, dQK)
  Tensor mK = head_tensor<kHeadDimQK>(k, params.k_batch_stride, params.k_head_stride, params.k_row_stride, t.batch,
                                      t.head_kv, params.seqlen_k);  // (seqlen_k, dQK)
  Tensor mV = head_tensor<kHeadDim>(v, params.v_batch_stride, params.v_head_stride, params.v_row_stride, t.batch,
                                    t.head_kv, params.seqlen_k);  // (seqlen_k, d)
  Tensor mO = head_tensor<kHeadDim>(o, params.o_batch_stride, params.o_head_stride, params.o_row_stride, t.batch,
                                    t.head, params.seqlen_q);  // (seqlen_q, d)
  return make_tuple(local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDimQK>>{}, make_coord(t.m_block, 0)),
                    local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDimQK>>{}, make_coord(_, 0)),
                    local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0)),
                    local_tile(mO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(t.m_block, 0)));
}

// Copy of one K or V tile gX (kBlockN, d) into sX through this thread's slice of tiled_copy (cp.async);
// kPredicated zero-fills the rows >= rows_valid (the ragged end of the keys). cX: the identity tensor
// of the tile.
template <bool kPredicated, class TiledCopy, class ThrCopy, class TensorG, class TensorS, class TensorC>
__forceinline__ __device__ void copy_kv_tile(TiledCopy const& tiled_copy, ThrCopy const& thr_copy, TensorG const& gX,
                                             TensorS& sX, TensorC const& cX, int rows_valid) {
  Tensor tXgX = thr_copy.partition_S(gX);  // (KCPY, KCPY_N, KCPY_K)
  Tensor tXsX = thr_copy.partition_D(sX);  // (KCPY, KCPY_N, KCPY_K)
  if constexpr (kPredicated) {
    Tensor tXcX = thr_copy.partition_S(cX);  // (KCPY, KCPY_N, KCPY_K) -> (row, col)
    copy_rows_zfill(tiled_copy, tXgX, tXsX, tXcX, rows_valid);
  } else {
    copy(tiled_copy, tXgX, tXsX);
  }
}

// End of the tile: rO (the normalized O accumulator, converted to the output type) staged through sO
// (which overlays the Q tile: every thread must be done with the K/V loop), lse rows, then O rows to
// global memory. coords_rc: this thread's accumulator (nrow, ncol) -> (row, col); cO: the identity
// tensor of the O tile.
template <class SmemCopyAtomO, class GmemTiledCopyO, class TiledMmaO, class TensorRO, class TensorSO, class TensorGO,
          class TensorLse, class TensorCoordRC, class TensorCO>
__forceinline__ __device__ void store_tile(FwdParams const& params, TileCoord const& t, int row0, int rows_valid,
                                           TiledMmaO const& tiled_mma_o, TensorRO const& rO, TensorSO& sO,
                                           TensorGO& gO, TensorLse const& lse, TensorCoordRC const& coords_rc,
                                           TensorCO const& cO, int tidx) {
  cute::cp_async_wait<0>();  // the Q load is still in flight when no K/V step ran
  __syncthreads();           // sO overwrites sQ (and sK): every thread must be done with them

  auto smem_tiled_copy_O = make_tiled_copy_C(SmemCopyAtomO{}, tiled_mma_o);
  auto smem_thr_copy_O = smem_tiled_copy_O.get_thread_slice(tidx);
  Tensor taccOrO = smem_thr_copy_O.retile_S(rO);     // (CPY, CPY_M, CPY_N)
  Tensor taccOsO = smem_thr_copy_O.partition_D(sO);  // (CPY, CPY_M, CPY_N)
  copy(smem_tiled_copy_O, taccOrO, taccOsO);

  if (params.lse != nullptr) { write_lse(params, t.batch, t.head, row0, lse, coords_rc, rows_valid); }

  __syncthreads();  // sO complete before it is read back with another thread mapping
  store_o_rows<GmemTiledCopyO>(sO, gO, cO, rows_valid, tidx);
}

}  // namespace cutlassfa
