// The end of a forward tile, shared by the tensor-core families: lse rows to global memory, and
// the O tile staged in shared memory to global memory in whole 16-byte rows.
#pragma once

#include <cute/tensor.hpp>

#include "cutlassfa/params.h"
#include "cutlassfa/rules.h"

namespace cutlassfa {

using namespace cute;

// lse of the tile's rows [0, rows_valid), written from lse_row0 (the tile's first row in the lse
// array): one thread of each quad (the one holding column 0) writes the quad's rows. coords_rc is the
// (nrow, ncol) -> (row, col) view of this thread's accumulator coordinates, lse its (nrow) values.
template <class TensorLse, class TensorCoord>
__forceinline__ __device__ void write_lse(float* lse_row0, TensorLse const& lse, TensorCoord const& coords_rc,
                                          int rows_valid) {
  if (get<1>(coords_rc(0, 0)) == 0) {
    CUTE_UNROLL
    for (int mi = 0; mi < size(lse); ++mi) {
      int const row = get<0>(coords_rc(mi, 0));
      if (row < rows_valid) { lse_row0[row] = lse(mi); }
    }
  }
}

// Attention sinks (params.h). A tile's sink is read when the tile starts (prefetch_sink), so that the
// load's latency hides behind the K/V loop (read in the epilogue, it cost a 1024-row causal prefill 7 %:
// bench/NOTES-variants.md "Attention sinks"); a GQA-packed tile, whose rows are heads, reads one per row
// at the end. The asm volatile keeps the compiler from sinking the load to its use.
__forceinline__ __device__ float prefetch_sink(FwdParams const& params, int head) {
  float sink = 0.f;
  if (params.sinks != nullptr && params.sinks_row_stride == 0) {
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(sink) : "l"(params.sinks + head * params.sinks_head_stride));
  }
  return sink;
}

// Where an unsplit tile's rows are final: each row's normalized O and lse from finalize() take the sink's
// term (rules.h). head: the tile's (GQA-packed) head; row0: its first query row within the entry;
// head_sink: prefetch_sink's value; rows from rows_valid on are left alone. A split's rows are not final:
// the combine adds the sink once.
template <class TensorO, class TensorLse, class TensorCoord>
__forceinline__ __device__ void add_sinks(FwdParams const& params, int head, int row0, int rows_valid, float head_sink,
                                          TensorO& acc_o_rc, TensorLse& lse, TensorCoord const& coords_rc) {
  if (params.sinks == nullptr) return;
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(acc_o_rc); ++mi) {
    int const row = get<0>(coords_rc(mi, 0));
    if (row < rows_valid) {
      float const sink = params.sinks_row_stride == 0
                             ? head_sink
                             : params.sinks[head * params.sinks_head_stride + (row0 + row) * params.sinks_row_stride];
      float const sinked = rules::lse_with_sink(lse(mi), sink);
      float const scale = rules::sink_out_scale(lse(mi), sinked);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) { acc_o_rc(mi, ni) *= scale; }
      lse(mi) = sinked;
    }
  }
}

// Split keys: the normalized fp32 O of this split straight from the accumulator (acc_o, rowcol view
// by coords_rc) to o_accum, and its lse to lse_accum (params.h), rows [0, rows_valid) of the tile
// starting at query row0. Decode tiles hold few rows; the combine kernel reads these back.
template <class TensorO, class TensorLse, class TensorCoord>
__forceinline__ __device__ void store_split(FwdParams const& params, int batch, int head, int split, int row0,
                                            int rows_valid, TensorO const& acc_o_rc, TensorLse const& lse,
                                            TensorCoord const& coords_rc) {
  int64_t const entry = (static_cast<int64_t>(split) * params.batch + batch) * params.heads_q + head;
  float* lse_row0 = params.lse_accum + entry * params.seqlen_q + row0;
  float* o_row0 = params.o_accum + (entry * params.seqlen_q + row0) * params.head_dim;
  write_lse(lse_row0, lse, coords_rc, rows_valid);
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(acc_o_rc); ++mi) {
    int const row = get<0>(coords_rc(mi, 0));
    if (row < rows_valid) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) {
        int const col = get<1>(coords_rc(mi, ni));
        if (col < params.head_dim) { o_row0[static_cast<int64_t>(row) * params.head_dim + col] = acc_o_rc(mi, ni); }
      }
    }
  }
}

// sO -> gO, 16-byte coalesced stores of whole rows, rows >= rows_valid skipped (the ragged end of
// the queries), and columns >= col_end (zero padding of a narrower head dim). cO is the identity tensor
// of the tile's shape. sO must be complete (barrier first).
template <class GmemTiledCopyO, class TensorS, class TensorG, class TensorC>
__forceinline__ __device__ void store_o_rows(TensorS const& sO, TensorG& gO, TensorC const& cO, int rows_valid,
                                             int col_end, int tidx) {
  using ElementOut = typename TensorS::value_type;
  GmemTiledCopyO gmem_tiled_copy_O;
  auto gmem_thr_copy_O = gmem_tiled_copy_O.get_thread_slice(tidx);
  Tensor tOsO = gmem_thr_copy_O.partition_S(sO);       // (OCPY, OCPY_M, OCPY_K)
  Tensor tOgO = gmem_thr_copy_O.partition_D(gO);       // (OCPY, OCPY_M, OCPY_K)
  Tensor tOrO = make_tensor<ElementOut>(shape(tOgO));  // (OCPY, OCPY_M, OCPY_K)
  copy(gmem_tiled_copy_O, tOsO, tOrO);
  Tensor tOcO = gmem_thr_copy_O.partition_D(cO);  // (OCPY, OCPY_M, OCPY_K) -> (row, col)
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOrO); ++m) {
    if (get<0>(tOcO(0, m, 0)) < rows_valid) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tOrO); ++k) {
        if (get<1>(tOcO(0, m, k)) < col_end) { copy(gmem_tiled_copy_O, tOrO(_, m, k), tOgO(_, m, k)); }
      }
    }
  }
}

}  // namespace cutlassfa
