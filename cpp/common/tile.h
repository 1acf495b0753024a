// The part of a forward tile that is the same in every tensor-core family: which (Q tile, head, batch)
// a CTA owns, the global tensors of that tile, and the epilogue that writes O and lse.
#pragma once

#include <cute/tensor.hpp>

#include "common/epilogue.h"
#include "common/tensor_utils.h"
#include "cutlassfa/params.h"
#include "cutlassfa/rules.h"

namespace cutlassfa {

using namespace cute;

struct TileCoord {
  int m_block;  // Q tile index
  int head;     // query head
  int batch;
  int head_kv;  // the K/V head query head `head` reads (GQA)
  int split;    // which share of the key tiles (split keys); 0 without
};

// The CTA's tile, from the 1-D grid of common/launch_kernel.h: the split varies fastest, then m_block,
// so the CTAs sharing one K/V head run together and re-read it from L2; within a head the tiles go
// last-first, which under a causal mask launches the longest first.
template <int kBlockM>
__forceinline__ __device__ TileCoord tile_of_this_block(FwdParams const& params) {
  int const num_m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
  int const split = static_cast<int>(blockIdx.x % params.num_splits);
  int const tile = static_cast<int>(blockIdx.x / params.num_splits);
  int const m_block = num_m_blocks - 1 - tile % num_m_blocks;
  int const bh = tile / num_m_blocks;
  int const head = bh % params.heads_q;
  return {m_block, head, bh / params.heads_q, head / params.heads_ratio, split};
}

// The lengths and row offsets of one batch entry (params.h: varlen, KV cache, left padding).
struct SeqInfo {
  int seqlen_q;      // queries of this entry
  int seqlen_k;      // keys of this entry (L), within the capacity
  int key_begin;     // keys [0, key_begin) are hidden (left padding), 0 <= key_begin <= seqlen_k
  int q_row_offset;  // first row of this entry in q, o and lse (varlen); 0 otherwise
  int k_row_offset;  // first row of this entry in k and v (varlen); 0 otherwise
};

__forceinline__ __device__ SeqInfo seq_info(FwdParams const& params, int batch) {
  SeqInfo s{params.seqlen_q, params.seqlen_k, 0, 0, 0};
  if (params.cu_seqlens_q != nullptr) {
    int const begin = params.cu_seqlens_q[batch];
    s.q_row_offset = rules::varlen_entry_begin(begin, params.total_q);
    s.seqlen_q = rules::varlen_entry_rows(begin, params.cu_seqlens_q[batch + 1], params.seqlen_q, params.total_q);
  }
  if (params.cu_seqlens_k != nullptr) {
    int const begin = params.cu_seqlens_k[batch];
    s.k_row_offset = rules::varlen_entry_begin(begin, params.total_k);
    s.seqlen_k = rules::varlen_entry_rows(begin, params.cu_seqlens_k[batch + 1], params.seqlen_k, params.total_k);
  } else if (params.seqlens_k != nullptr) {
    s.seqlen_k = rules::cache_entry_keys(params.seqlens_k[batch], params.seqlens_k_added, params.seqlen_k);
  }
  if (params.leftpad_k != nullptr) { s.key_begin = rules::entry_leftpad(params.leftpad_k[batch], s.seqlen_k); }
  return s;
}

// Split keys: the share [n_block_min, n_block_max) of split `split` out of num_splits, as whole tiles
// (empty when the split has none: it then writes O = 0, lse = -inf for the combine).
__forceinline__ __device__ void split_kv_range(int& n_block_min, int& n_block_max, int split, int num_splits) {
  int const per_split = (max(0, n_block_max - n_block_min) + num_splits - 1) / num_splits;
  n_block_min += split * per_split;
  n_block_max = min(n_block_max, n_block_min + per_split);
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
// (fp32 inputs pre-split into [hi | lo] columns). gK and gV are those of a contiguous cache; a paged
// one is read through KvRows.
template <int kBlockM, int kBlockN, int kHeadDimQK, int kHeadDim, class ElementIn, class ElementOut>
__forceinline__ __device__ auto global_tiles(FwdParams const& params, TileCoord const& t, SeqInfo const& seq) {
  auto const* q = static_cast<ElementIn const*>(params.q) + static_cast<int64_t>(seq.q_row_offset) * params.q_row_stride;
  auto const* k = static_cast<ElementIn const*>(params.k) + static_cast<int64_t>(seq.k_row_offset) * params.k_row_stride;
  auto const* v = static_cast<ElementIn const*>(params.v) + static_cast<int64_t>(seq.k_row_offset) * params.v_row_stride;
  auto* o = static_cast<ElementOut*>(params.o) + static_cast<int64_t>(seq.q_row_offset) * params.o_row_stride;
  int const kv_batch = params.block_table != nullptr ? 0 : t.batch;
  Tensor mQ = head_tensor<kHeadDimQK>(q, params.q_batch_stride, params.q_head_stride, params.q_row_stride, t.batch,
                                      t.head, seq.seqlen_q);  // (seqlen_q, dQK)
  Tensor mK = head_tensor<kHeadDimQK>(k, params.k_batch_stride, params.k_head_stride, params.k_row_stride, kv_batch,
                                      t.head_kv, seq.seqlen_k);  // (seqlen_k, dQK)
  Tensor mV = head_tensor<kHeadDim>(v, params.v_batch_stride, params.v_head_stride, params.v_row_stride, kv_batch,
                                    t.head_kv, seq.seqlen_k);  // (seqlen_k, d)
  Tensor mO = head_tensor<kHeadDim>(o, params.o_batch_stride, params.o_head_stride, params.o_row_stride, t.batch,
                                    t.head, seq.seqlen_q);  // (seqlen_q, d)
  return make_tuple(local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDimQK>>{}, make_coord(t.m_block, 0)),
                    local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDimQK>>{}, make_coord(_, 0)),
                    local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0)),
                    local_tile(mO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(t.m_block, 0)));
}

// Rows of one K/V head, one address per key position: a paged cache (rules.h: key position p of the
// entry is row p % page_size of page table[p / page_size]; a page index outside [0, num_pages) is no
// page, its rows are never read), or a contiguous one (table == nullptr) read this way by the general
// kernel (zero-padded head dims, left padding, softcap; column-predicated copies).
template <class Element>
struct KvRows {
  // row_offset of a key whose page does not exist (not a real offset, whatever the strides' signs).
  static constexpr int64_t kNoRow = -0x7fffffffffffffffLL - 1;

  Element const* head_base;  // the K/V head's row 0 (of page 0 when paged)
  long long page_stride;
  long long row_stride;
  int const* table;  // this entry's row of the block table; nullptr: contiguous
  int page_size;
  int page_size_log2;  // -1 when page_size is not a power of two
  int num_pages;
  int table_first = 0;  // table[i] holds the entry of page table_first + i (a slice: see with_table_slice)

  // Table slot of key position p: a shift where page_size is a power of two, not an integer division.
  __forceinline__ __device__ int page_of(int p) const { return rules::page_slot_of_key(p, page_size, page_size_log2); }
  // The same rows read through a copy of the table's entries from page `first` on (a tile's slice in
  // shared memory, fetched ahead so that no row address waits on a global read of the table).
  __forceinline__ __device__ KvRows with_table_slice(int const* slice, int first) const {
    KvRows r = *this;
    r.table = slice;
    r.table_first = first;
    return r;
  }

  // Key position p's row, nullptr when its page does not exist.
  __forceinline__ __device__ Element const* row(int p) const {
    int64_t const offset = row_offset(p);
    return offset == kNoRow ? nullptr : head_base + offset;
  }

  // Elements from head_base to key position p's row; kNoRow when its page does not exist.
  __forceinline__ __device__ int64_t row_offset(int p) const {
    if (table == nullptr) { return p * row_stride; }
    int const slot = page_of(p);
    int const page = table[slot - table_first];
    if (!rules::page_index_valid(page, num_pages)) { return kNoRow; }
    return page * page_stride + rules::row_in_page(p, slot, page_size, page_size_log2) * row_stride;
  }

  // Whether the tile of `rows` keys from key0 lies in one page (always, when contiguous): its rows then
  // follow at row_stride, one block-table read for the tile instead of one per row.
  __forceinline__ __device__ bool in_one_page(int key0, int rows) const {
    if (table == nullptr) { return true; }
    return rules::row_in_page(key0, page_of(key0), page_size, page_size_log2) + rows <= page_size;
  }

  // Whether some key of [key_begin, key_end) lies on a page that does not exist, for the whole warp (every
  // lane must call): lane i reads the entry of the range's i-th page. Paged caches only.
  __forceinline__ __device__ bool any_page_missing(int key_begin, int key_end) const {
    bool missing = false;
    if (key_begin < key_end) {
      int const last = page_of(key_end - 1);
      for (int slot = page_of(key_begin) + static_cast<int>(threadIdx.x % 32); slot <= last; slot += 32) {
        missing |= !rules::page_index_valid(table[slot - table_first], num_pages);
      }
    }
    return __any_sync(0xffffffffu, missing);
  }
  __forceinline__ __device__ bool page_missing(int p) const {
    return !rules::page_index_valid(table[page_of(p) - table_first], num_pages);
  }
};

// Keys on a page that does not exist count as masked (rules.h): their scores become -inf. acc_s and tScS
// share the accumulator layout; tScS holds each element's (row, col) in the tile, whose keys start at
// key0; its keys in [key_begin, key_end) are checked (key_end at most the tile's end; the others are
// masked already). One table
// read a lane and a vote a step when every page exists, which is what a correct table always gives.
template <class TensorS, class TensorC, class Element>
__forceinline__ __device__ void mask_missing_pages(TensorS& acc_s, TensorC const& tScS, KvRows<Element> const& rows,
                                                   int key0, int key_begin, int key_end) {
  if (!rows.any_page_missing(max(key0, key_begin), key_end)) { return; }
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) {
    int const key = key0 + get<1>(tScS(i));
    if (key >= key_begin && key < key_end && rows.page_missing(key)) { acc_s(i) = -INFINITY; }
  }
}

// The K or V rows of tile t: `cache` is params.k or params.v with its strides.
template <class Element>
__forceinline__ __device__ KvRows<Element> kv_rows(FwdParams const& params, SeqInfo const& seq, void const* cache,
                                                   long long batch_stride, long long head_stride,
                                                   long long row_stride, TileCoord const& t) {
  Element const* head = static_cast<Element const*>(cache) + t.head_kv * head_stride;
  if (params.block_table == nullptr) {
    head += t.batch * batch_stride + static_cast<int64_t>(seq.k_row_offset) * row_stride;
    return {head, 0, row_stride, nullptr, 0, -1, 0};
  }
  return {head, batch_stride, row_stride, params.block_table + t.batch * params.block_table_stride, params.page_size,
          params.page_size_log2, params.num_pages};
}

// Copy of one K or V tile gX (kBlockN, d) into sX through this thread's slice of tiled_copy (cp.async);
// kPredicated copies only the tile rows [row_begin, row_end) and zero-fills the others (the ragged end
// of the keys, the left padding: hidden keys must load as zeros, a NaN there would survive P = 0).
// cX: the identity tensor of the tile.
template <bool kPredicated, class TiledCopy, class ThrCopy, class TensorG, class TensorS, class TensorC>
__forceinline__ __device__ void copy_kv_tile(TiledCopy const& tiled_copy, ThrCopy const& thr_copy, TensorG const& gX,
                                             TensorS& sX, TensorC const& cX, int row_begin, int row_end) {
  Tensor tXgX = thr_copy.partition_S(gX);  // (KCPY, KCPY_N, KCPY_K)
  Tensor tXsX = thr_copy.partition_D(sX);  // (KCPY, KCPY_N, KCPY_K)
  if constexpr (kPredicated) {
    Tensor tXcX = thr_copy.partition_S(cX);  // (KCPY, KCPY_N, KCPY_K) -> (row, col)
    copy_rows_zfill(tiled_copy, tXgX, tXsX, tXcX, row_begin, row_end);
  } else {
    copy(tiled_copy, tXgX, tXsX);
  }
}

// The same copy one row address at a time (KvRows: paged caches, narrow head dims): the tile's rows
// start at key position key0. Rows outside [row_begin, row_end) and columns >= col_end (a head dim
// narrower than the tile: zero padding) are zero-filled and never addressed, and so are rows on a page
// that does not exist (rules.h). row_offsets, when given: tile row r is at rows.head_base + row_offsets[r]
// (worked out ahead, in shared memory; KvRows::kNoRow for a missing page).
template <class TiledCopy, class ThrCopy, class Element, class TensorS, class TensorC>
__forceinline__ __device__ void copy_kv_tile_rows(TiledCopy const& tiled_copy, ThrCopy const& thr_copy,
                                                  KvRows<Element> const& rows, int key0, TensorS& sX,
                                                  TensorC const& cX, int row_begin, int row_end, int col_end,
                                                  int64_t const* row_offsets = nullptr) {
  Tensor tXsX = thr_copy.partition_D(sX);  // (KCPY, KCPY_N, KCPY_K)
  Tensor tXcX = thr_copy.partition_D(cX);  // (KCPY, KCPY_N, KCPY_K) -> (row, col)
  constexpr int kVec = decltype(size<0>(tXsX))::value;
  constexpr int kTileRows = decltype(size<0>(cX))::value;
  constexpr int kTileCols = decltype(size<1>(cX))::value;
  // Most tiles have no hidden row and no padding column: those copy without the per-row and per-column
  // tests (H200 decode, contiguous cache: these tests took the general kernel to 1.5x the plain kernel's
  // instructions and 1.09-1.15x its time, bench/NOTES-variants.md).
  bool const whole_tile = row_begin <= 0 && row_end >= kTileRows && col_end >= kTileCols;
  // address_of_row(row): the row's first element; may_be_missing: it may be nullptr (the row's page does
  // not exist), and the row is then zero-filled, not read.
  auto copy_rows = [&](auto const& address_of_row, auto may_be_missing) __attribute__((always_inline)) {
    constexpr bool kMayBeMissing = decltype(may_be_missing)::value;
    if (whole_tile) {
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tXsX); ++m) {
        Element const* src_row = address_of_row(get<0>(tXcX(0, m, 0)));
        if (kMayBeMissing && src_row == nullptr) {
          clear(tXsX(_, m, _));
          continue;
        }
        CUTE_UNROLL
        for (int kk = 0; kk < size<2>(tXsX); ++kk) {
          copy(tiled_copy, make_tensor(make_gmem_ptr(src_row + get<1>(tXcX(0, m, kk))), Layout<Shape<Int<kVec>>>{}),
               tXsX(_, m, kk));
        }
      }
      return;
    }
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tXsX); ++m) {
      int const row = get<0>(tXcX(0, m, 0));
      if (row >= row_begin && row < row_end) {
        Element const* src_row = address_of_row(row);
        if (kMayBeMissing && src_row == nullptr) {
          clear(tXsX(_, m, _));
          continue;
        }
        CUTE_UNROLL
        for (int kk = 0; kk < size<2>(tXsX); ++kk) {
          int const col = get<1>(tXcX(0, m, kk));
          if (col < col_end) {
            copy(tiled_copy, make_tensor(make_gmem_ptr(src_row + col), Layout<Shape<Int<kVec>>>{}), tXsX(_, m, kk));
          } else {
            clear(tXsX(_, m, kk));
          }
        }
      } else {
        clear(tXsX(_, m, _));
      }
    }
  };
  if (row_offsets != nullptr) {
    copy_rows(
        [&](int row) {
          int64_t const offset = row_offsets[row];
          return offset == KvRows<Element>::kNoRow ? nullptr : rows.head_base + offset;
        },
        cute::true_type{});
    return;
  }
  // Two copies of the loop, not one with a select per row: a select computed both addresses (the
  // block-table read included) and made pages smaller than the tile 10% slower (H200, bench/NOTES-variants.md).
  if (rows.in_one_page(key0, kTileRows)) {
    Element const* const tile_row0 = rows.table == nullptr ? rows.head_base + key0 * rows.row_stride : rows.row(key0);
    if (tile_row0 == nullptr) {  // the tile's page does not exist: zeros, nothing read
      clear(tXsX);
      return;
    }
    copy_rows([&](int row) { return tile_row0 + row * rows.row_stride; }, cute::false_type{});
  } else {
    copy_rows([&](int row) { return rows.row(key0 + row); }, cute::true_type{});
  }
}

// Where the lse of the tile's first row goes (params.h: lse strides, varlen rows), nullptr when not asked.
__forceinline__ __device__ float* lse_tile_row0(FwdParams const& params, TileCoord const& t, SeqInfo const& seq,
                                                int row0) {
  if (params.lse == nullptr) { return nullptr; }
  return params.lse + t.batch * params.lse_batch_stride + t.head * params.lse_head_stride + seq.q_row_offset + row0;
}

// End of the tile: rO (the normalized O accumulator, converted to the output type) staged through sO
// (which overlays the Q tile: every thread must be done with the K/V loop), lse rows, then O rows to
// global memory (columns < col_end). coords_rc: this thread's accumulator (nrow, ncol) -> (row, col); cO: the identity
// tensor of the O tile.
template <class SmemCopyAtomO, class GmemTiledCopyO, class TiledMmaO, class TensorRO, class TensorSO, class TensorGO,
          class TensorLse, class TensorCoordRC, class TensorCO>
__forceinline__ __device__ void store_tile(float* lse_row0, int rows_valid, int col_end,
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

  if (lse_row0 != nullptr) { write_lse(lse_row0, lse, coords_rc, rows_valid); }

  __syncthreads();  // sO complete before it is read back with another thread mapping
  store_o_rows<GmemTiledCopyO>(sO, gO, cO, rows_valid, col_end, tidx);
}

}  // namespace cutlassfa
