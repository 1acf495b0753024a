// The producer: one thread of the producer warpgroup issues every TMA load of a tile with keys. Q (into
// the tile's Q buffer, or fp32 Q into the staging buffer that the consumers split it from:
// sm90ws/split_q.h; with that buffer's mbarrier, which also publishes the tile index:
// sm90ws/kernel.h), then K and V tiles into their rings (whose write states run on across the CTA's
// tiles) from the last visible tile down, in the order the consumers use them: S = Q K[n]^T runs one
// step ahead of O += P V[n+1], so K[n] is issued before V[n+1]. Each load first waits until every consumer warpgroup has released the buffer it
// overwrites (PipelineTmaAsync's empty barrier). Rows past the end of q, k or v (the ragged last
// tile) arrive as zeros: TMA fills what lies outside the tensor's extent.
#pragma once

#include <cute/tensor.hpp>

#include "common/tile.h"
#include "sm90ws/kernel_traits.h"

namespace cutlassfa::sm90ws {

using namespace cute;

template <class Traits>
__forceinline__ __device__ void produce(KernelParams<Traits> const& params, typename Traits::SharedStorage& storage,
                                        typename Traits::Pipeline& pipeline_k, typename Traits::Pipeline& pipeline_v,
                                        typename Traits::PipelineState& write_k,
                                        typename Traits::PipelineState& write_v, int q_buffer,
                                        TileCoord const& tile, SeqInfo const& seq, int n_block_min,
                                        int n_block_max) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimQK = Traits::kHeadDimQK;
  FwdParams const& p = params.fwd;

  constexpr int kHeadDimQLoad = Traits::kHeadDimQLoad;
  Tensor sQ = make_tensor(make_smem_ptr(storage.q_load(q_buffer)), typename Traits::SmemLayoutQLoad{});  // (kBlockM, dQ)
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});  // (kBlockN, dQK, stage)
  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutV{});  // (kBlockN, d, stage); fp8 (d, kBlockN, stage)

  // Coordinate tensors of the descriptors' (row, dim, head, batch) views (sm90ws/tma_extents.h), sliced
  // at this tile's heads and entry, from the entry's first row: a varlen batch is one packed entry.
  TmaExtents const extents = tma_extents(p, Traits::kVarlen);
  int const batch = Traits::kVarlen ? 0 : tile.batch;
  auto const q_rows = make_coord(Traits::kVarlen ? seq.q_row_offset : 0, _0{});
  auto const k_rows = make_coord(Traits::kVarlen ? seq.k_row_offset : 0, _0{});
  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(extents.rows_q, kHeadDimQLoad, p.heads_q, extents.batch))(_, _, tile.head, batch);
  Tensor mK = params.tma_k.get_tma_tensor(make_shape(extents.rows_k, kHeadDimQK, p.heads_kv, extents.batch))(_, _, tile.head_kv, batch);
  Tensor gQ = local_tile(domain_offset(q_rows, mQ), Shape<Int<kBlockM>, Int<kHeadDimQLoad>>{},
                         make_coord(tile.m_block, _0{}));  // (kBlockM, dQ)
  Tensor gK = local_tile(domain_offset(k_rows, mK), Shape<Int<kBlockN>, Int<kHeadDimQK>>{},
                         make_coord(_, _0{}));  // (kBlockN, dQK, n_blocks)
  // V tiles: (kBlockN, d, n_blocks); fp8: of the V^T workspace (d, keys), (d, kBlockN, n_blocks).
  Tensor gV = [&] {
    if constexpr (Traits::kFp8) {
      Tensor mVt = params.tma_v.get_tma_tensor(make_shape(kHeadDim, fp8_vt_keys(p.seqlen_k), p.heads_kv, p.batch))(
          _, _, tile.head_kv, tile.batch);
      return local_tile(mVt, Shape<Int<kHeadDim>, Int<kBlockN>>{}, make_coord(_0{}, _));
    } else {
      Tensor mV = params.tma_v.get_tma_tensor(make_shape(extents.rows_k, kHeadDim, p.heads_kv, extents.batch))(
          _, _, tile.head_kv, batch);
      return local_tile(domain_offset(k_rows, mV), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
    }
  }();

  auto tma_q = params.tma_q.get_slice(_0{});
  auto tma_k = params.tma_k.get_slice(_0{});
  auto tma_v = params.tma_v.get_slice(_0{});
  Tensor tQgQ = tma_q.partition_S(gQ);  // (TMA, TMA_M, TMA_K)
  Tensor tQsQ = tma_q.partition_D(sQ);  // (TMA, TMA_M, TMA_K)
  Tensor tKgK = tma_k.partition_S(gK);  // (TMA, TMA_N, TMA_K, n_blocks)
  Tensor tKsK = tma_k.partition_D(sK);  // (TMA, TMA_N, TMA_K, stage)
  Tensor tVgV = tma_v.partition_S(gV);  // (TMA, TMA_N, TMA_K, n_blocks)  (TMA_K, TMA_N for fp8)
  Tensor tVsV = tma_v.partition_D(sV);  // (TMA, TMA_N, TMA_K, stage)

  // Q is read by this CTA only: evict it first; K and V are re-read by the other Q tiles of the head.
  storage.barrier_q[q_buffer].arrive_and_expect_tx(Traits::kTmaBytesQ);
  copy(params.tma_q.with(reinterpret_cast<uint64_t&>(storage.barrier_q[q_buffer]), 0, TMA::CacheHintSm90::EVICT_FIRST), tQgQ,
       tQsQ);

  auto load = [&](auto const& tma, typename Traits::Pipeline& pipeline, typename Traits::PipelineState& write,
                  auto const& tXgX, auto& tXsX, int n_block) {
    pipeline.producer_acquire(write);  // the buffer is free; arms its full barrier with the byte count
    copy(tma.with(*pipeline.producer_get_barrier(write), 0, TMA::CacheHintSm90::EVICT_LAST), tXgX(_, _, _, n_block),
         tXsX(_, _, _, write.index()));
    ++write;
  };

  load(params.tma_k, pipeline_k, write_k, tKgK, tKsK, n_block_max - 1);
  CUTE_NO_UNROLL
  for (int n_block = n_block_max - 2; n_block >= n_block_min; --n_block) {
    load(params.tma_k, pipeline_k, write_k, tKgK, tKsK, n_block);
    load(params.tma_v, pipeline_v, write_v, tVgV, tVsV, n_block + 1);
  }
  load(params.tma_v, pipeline_v, write_v, tVgV, tVsV, n_block_min);
}

}  // namespace cutlassfa::sm90ws
