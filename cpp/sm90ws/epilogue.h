// The end of one consumer warpgroup's 64 rows: O normalized, converted, staged in shared memory (O's
// own buffer, or its own rows of the Q tile: nobody reads them any more, its last S = Q K^T has
// completed), then written to global memory in 16-byte row pieces (common/epilogue.h), rows past the
// queries skipped; lse from the quads' column-0 threads. The warpgroups finish independently (a named
// barrier each).
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/arch/barrier.h>

#include "common/epilogue.h"
#include "common/tensor_utils.h"
#include "common/tile.h"
#include "sm90ws/fp8_descale.h"
#include "sm90ws/kernel_traits.h"
#include "sm90ws/utils.h"

namespace cutlassfa::sm90ws {

using namespace cute;

// acc_o: this thread's unnormalized O (or anything when the tile saw no key: kEmpty writes O = 0 and
// lse = -inf). thread_idx: 0 .. kNConsumerThreads - 1 among the consumers. head_sink: the tile's sink
// (common/epilogue.h prefetch_sink, read when the tile started); scales: the tile's lse scale and O's
// factor (sm90ws/fp8_descale.h).
template <class Traits, class TensorO, class Softmax>
__forceinline__ __device__ void store_output(FwdParams const& params, typename Traits::SharedStorage& storage,
                                             TileCoord const& tile, SeqInfo const& seq, int thread_idx,
                                             float head_sink, TileScales const& scales, TensorO& acc_o,
                                             Softmax& softmax) {
  using ElementO = typename Traits::ElementO;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  int const wg = thread_idx / 128;
  int const rows_q = seq.seqlen_q - tile.m_block * kBlockM;  // valid rows of the tile

  typename Traits::TiledMmaPV tiled_mma_pv;
  auto thr_mma_pv = tiled_mma_pv.get_thread_slice(thread_idx);
  Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_as_sm80(acc_o.layout())));  // (nrow, d)
  Tensor lse = softmax.finalize(acc_o_rc, scales.scale, scales.o_scale);                        // (nrow)
  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (kBlockM, d) -> (row, col)
  Tensor taccOcO = thr_mma_pv.partition_C(cO);                             // (MMA, MMA_M, MMA_N) -> (row, col)
  Tensor taccOcO_rc = make_tensor(taccOcO.data(), acc_layout_rowcol(acc_as_sm80(taccOcO.layout())));
  add_sinks(params, tile.head, tile.m_block * kBlockM, rows_q, head_sink, acc_o_rc, lse, taccOcO_rc);

  float* const lse_row0 = lse_tile_row0(params, tile, seq, tile.m_block * kBlockM);
  if (lse_row0 != nullptr) { write_lse(lse_row0, lse, taccOcO_rc, rows_q); }

  // Registers -> shared (this warpgroup's rows of the O tile, in O's own buffer or over its rows of Q),
  // once each thread of the warpgroup is done reading the last tile's O out of them.
  ElementO* const o_tile = Traits::kSeparateO ? storage.o.data() : reinterpret_cast<ElementO*>(storage.q.data());
  Tensor sO = make_tensor(make_smem_ptr(o_tile), typename Traits::SmemLayoutO{});  // (kBlockM, d)
  Tensor rO = make_tensor_like<ElementO>(acc_o);
  convert_into(acc_o, rO);
  cutlass::arch::NamedBarrier::sync(128, static_cast<uint32_t>(NamedBarriers::kEpilogue0) + wg);
  auto smem_tiled_copy_O = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma_pv);
  auto smem_thr_copy_O = smem_tiled_copy_O.get_thread_slice(thread_idx);
  copy(smem_tiled_copy_O, smem_thr_copy_O.retile_S(rO), smem_thr_copy_O.partition_D(sO));
  cutlass::arch::NamedBarrier::sync(128, static_cast<uint32_t>(NamedBarriers::kEpilogue0) + wg);

  // Shared -> global: this warpgroup's 64 rows.
  int64_t const first_row = Traits::kVarlen ? seq.q_row_offset : 0;  // the entry's, in a packed o
  ElementO* const o = static_cast<ElementO*>(params.o) + first_row * params.o_row_stride;
  Tensor mO = head_tensor<kHeadDim>(o, params.o_batch_stride, params.o_head_stride, params.o_row_stride, tile.batch,
                                    tile.head, seq.seqlen_q);  // (seqlen_q, d), the entry's rows
  int const wg_block = tile.m_block * Traits::kNConsumerWarpGroups + wg;  // 64-row block of the queries
  Tensor gO = local_tile(mO, Shape<Int<64>, Int<kHeadDim>>{}, make_coord(wg_block, _0{}));  // (64, d)
  Tensor sO_wg = local_tile(sO, Shape<Int<64>, Int<kHeadDim>>{}, make_coord(wg, _0{}));     // (64, d)
  Tensor cO_wg = make_identity_tensor(Shape<Int<64>, Int<kHeadDim>>{});
  store_o_rows<typename Traits::GmemTiledCopyO>(sO_wg, gO, cO_wg, rows_q - 64 * wg, kHeadDim, thread_idx % 128);
}

}  // namespace cutlassfa::sm90ws
