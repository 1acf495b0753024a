// FlashAttention forward on Hopper tensor cores: warpgroup MMA (wgmma, sm_90a) for S = Q K^T and
// O += P V, in CuTe. Same structure as the mma.sync kernel (sm80/flash_fwd_kernel.h), which it follows
// step for step: one CTA per kBlockM-row Q tile, K/V tiles walked from the last visible one down,
// one shared buffer each for K and V with FlashAttention-2's overlap
//     wait K[n] | issue V[n]   | S = Q K[n]^T (wgmma, Q and K from shared memory), mask
//     wait V[n] | issue K[n-1] | online softmax, O += P V[n] (wgmma, P from registers)
// What changes is the MMA: a warpgroup (4 warps) multiplies a 64-row slab in one asynchronous
// instruction stream that reads its B operand (K, V) from shared memory once per 64 rows, instead
// of every warp fetching it with ldmatrix for its own 16 rows. Mask, online softmax and epilogue
// are the shared ones (common/), run on re-viewed accumulators (sm90/utils.h). fp32 inputs arrive pre-split
// (launch_fp32.cu): the Q/K width (kHeadDimQK = 2 d, hi | lo), the S GEMM (warpgroup_gemm_split) and the
// output type differ.
#pragma once

#include <cute/tensor.hpp>

#include "cutlassfa/params.h"
#include "common/block_tile_work.h"
#include "common/epilogue.h"
#include "common/mask.h"
#include "common/online_softmax.h"
#include "common/alibi.h"
#include "common/softcap.h"
#include "common/tensor_utils.h"
#include "common/tile.h"
#include "sm90/kernel_traits.h"
#include "sm90/utils.h"

namespace cutlassfa::sm90 {

using namespace cute;

// kGeneral: the kernel for the rarer modes, a separate instantiation so that the plain one carries none
// of their code: K and V read one row address at a time with column predicates (a paged cache, or a head
// dim narrower than kHeadDim, zero-padded; every row zero-filled where hidden), softcap and left padding.
// (A run-time softcap branch in the plain kernel was if-converted: its predicated-off instructions
// doubled the instructions issued at d = 32.)
template <class Traits, bool kGeneral>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    flash_fwd_kernel(__grid_constant__ const FwdParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  using ElementOut = typename Traits::ElementOut;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDimQK = Traits::kHeadDimQK;  // columns of Q and K
  constexpr int kHeadDim = Traits::kHeadDim;      // columns of V and O

  extern __shared__ __align__(1024) char smem[];
  int const tidx = threadIdx.x;

  auto const work = BlockTileWork<kBlockM, kBlockN>::of_this_block(params);  // grid order: common/tile.h
  if (!work.has_queries) { return; }  // varlen: past this entry's queries
  float const head_sink = prefetch_sink(params, work.tile.head);  // used by the epilogue
  float const alibi_slope = kGeneral ? alibi_slope_raw(params, work.tile.batch, work.tile.head) : 0.f;

  // ---- Global tensors: Q and K of kHeadDimQK columns, V and O of kHeadDim ----------------------------
  auto const tiles =
      global_tiles<kBlockM, kBlockN, kHeadDimQK, kHeadDim, Element, ElementOut>(params, work.tile, work.seq);
  Tensor gQ = get<0>(tiles);  // (kBlockM, dQK)
  Tensor gK = get<1>(tiles);  // (kBlockN, dQK, n_blocks)
  Tensor gV = get<2>(tiles);  // (kBlockN, d, n_blocks)
  Tensor gO = get<3>(tiles);  // (kBlockM, d)

  // ---- Shared tensors: Q | K | V, each seen by the copies (swizzled layout) and by wgmma -----------
  Element* const smem_q = reinterpret_cast<Element*>(smem);
  Element* const smem_k = smem_q + cosize(typename Traits::SmemLayoutQ{});
  Element* const smem_v = smem_k + cosize(typename Traits::SmemLayoutK{});
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});  // (kBlockM, dQK)
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutK{});  // (kBlockN, dQK)
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutV{});  // (kBlockN, d)
  Tensor sQm = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQMma{});    // (kBlockM, dQK)
  Tensor sKm = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKMma{});    // (kBlockN, dQK)
  Tensor sVtm = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutVtMma{});  // (d, kBlockN)
  Tensor sO = make_tensor(make_smem_ptr(reinterpret_cast<ElementOut*>(smem)),
                          typename Traits::SmemLayoutO{});  // (kBlockM, d), over sQ

  // ---- Partitions ---------------------------------------------------------------------------------------
  typename Traits::GmemTiledCopyQK gmem_tiled_copy_QK;
  auto gmem_thr_copy_QK = gmem_tiled_copy_QK.get_thread_slice(tidx);
  typename Traits::GmemTiledCopyV gmem_tiled_copy_V;
  auto gmem_thr_copy_V = gmem_tiled_copy_V.get_thread_slice(tidx);
  // (row, col) of every copied element, for the row predicates of ragged tiles.
  Tensor cQ = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDimQK>>{});  // (kBlockM, dQK) -> (row, col)
  Tensor cK = make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDimQK>>{});  // (kBlockN, dQK) -> (row, col)
  Tensor cV = make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{});    // (kBlockN, d) -> (row, col)
  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});    // (kBlockM, d) -> (row, col)

  // The general kernel reads K and V one row address at a time with column predicates (common/tile.h:
  // paged caches, zero-padded head dims). The row addressing is built where used, not held in registers
  // across the K/V loop.
  auto rows_k = [&] {
    return kv_rows<Element>(params, work.seq, params.k, params.k_batch_stride, params.k_head_stride,
                            params.k_row_stride, work.tile);
  };
  auto rows_v = [&] {
    return kv_rows<Element>(params, work.seq, params.v, params.v_batch_stride, params.v_head_stride,
                            params.v_row_stride, work.tile);
  };
  // A paged cache: no row address waits on the block table. Tile n's table entries are fetched
  // (cp.async, fetch_pages) together with K[n + 1], turned into its rows' offsets in K and V between
  // the two barriers of step n + 1 (page_offsets), and read from slot n % 2 by the copies of K[n] (end
  // of step n + 1) and V[n] (step n). A table read in front of every row's copy cost paged caches
  // 1.35-1.76x the contiguous time (bench/NOTES-variants.md).
  bool const paged = kGeneral && params.block_table != nullptr;
  int* const page_slots = reinterpret_cast<int*>(smem + Traits::kSmemSizeQKV);  // (2, kPageSlots)
  int64_t* const offset_slots = reinterpret_cast<int64_t*>(page_slots + 2 * Traits::kPageSlots);  // (2, K | V, kBlockN)
  auto tile_offsets = [&](int const n_block, int const kv) { return offset_slots + ((n_block & 1) * 2 + kv) * kBlockN; };
  auto fetch_pages = [&](int const n_block) __attribute__((always_inline)) {
    if (!paged) { return; }
    KvRows<Element> const rows = rows_k();
    int const first = rows.page_of(n_block * kBlockN);
    int const count = rows.page_of(min((n_block + 1) * kBlockN, work.seq.seqlen_k) - 1) - first + 1;
    int* const slot = page_slots + (n_block & 1) * Traits::kPageSlots;
    for (int i = tidx; i < count; i += Traits::kNThreads) {
      SM80_CP_ASYNC_CACHEALWAYS<int>::copy(rows.table[first + i], slot[i]);
    }
  };
  auto page_offsets = [&](int const n_block) __attribute__((always_inline)) {  // after the entries' barrier
    if (!paged) { return; }
    int const key0 = n_block * kBlockN;
    int const* const slot = page_slots + (n_block & 1) * Traits::kPageSlots;
    KvRows<Element> const k = rows_k().with_table_slice(slot, rows_k().page_of(key0));
    KvRows<Element> const v = rows_v().with_table_slice(slot, k.table_first);
    for (int r = tidx; r < kBlockN && key0 + r < work.seq.seqlen_k; r += Traits::kNThreads) {
      tile_offsets(n_block, 0)[r] = k.row_offset(key0 + r);
      tile_offsets(n_block, 1)[r] = v.row_offset(key0 + r);
    }
  };
  // Columns of Q and K that hold data: the head dim, or all of them for pre-split fp32 (never padded).
  int const cols_qk = Traits::kSplitQK ? kHeadDimQK : params.head_dim;

  // cp.async of K or V tile n_block into sX through its tiled copy; is_predicated zero-fills the
  // hidden rows, col_end the padding columns.
  auto load_tile = [&](auto const& tiled_copy, auto const& thr_copy, auto const& gX, auto const& rows, int const kv,
                       auto& sX, auto const& cX, int const col_end, int const n_block,
                       auto is_predicated) __attribute__((always_inline)) {
    int const key0 = n_block * kBlockN;
    if constexpr (kGeneral) {
      copy_kv_tile_rows(tiled_copy, thr_copy, rows(), key0, sX, cX, work.seq.key_begin - key0,
                        work.seq.seqlen_k - key0, col_end, paged ? tile_offsets(n_block, kv) : nullptr);
    } else {
      copy_kv_tile<decltype(is_predicated)::value>(tiled_copy, thr_copy, gX(_, _, n_block), sX, cX,
                                                   work.seq.key_begin - key0, work.seq.seqlen_k - key0);
    }
  };
  auto load_k = [&](int const n_block, auto is_predicated) __attribute__((always_inline)) {
    load_tile(gmem_tiled_copy_QK, gmem_thr_copy_QK, gK, rows_k, 0, sK, cK, cols_qk, n_block, is_predicated);
  };
  auto load_v = [&](int const n_block, auto is_predicated) __attribute__((always_inline)) {
    load_tile(gmem_tiled_copy_V, gmem_thr_copy_V, gV, rows_v, 1, sV, cV, params.head_dim, n_block, is_predicated);
  };

  typename Traits::TiledMmaS tiled_mma_s;
  auto thr_mma_s = tiled_mma_s.get_thread_slice(tidx);
  Tensor tSrQ = thr_mma_s.partition_fragment_A(sQm);  // (MMA, MMA_M, MMA_K) descriptors
  Tensor tSrK = thr_mma_s.partition_fragment_B(sKm);  // (MMA, MMA_N, MMA_K) descriptors
  typename Traits::TiledMmaO tiled_mma_o;
  auto thr_mma_o = tiled_mma_o.get_thread_slice(tidx);
  Tensor tOrVt = thr_mma_o.partition_fragment_B(sVtm);  // (MMA, MMA_N, MMA_K) descriptors
  Tensor acc_o = partition_fragment_C(tiled_mma_o, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
  Tensor acc_o80 = make_tensor(acc_o.data(), acc_as_sm80(acc_o.layout()));                // mma.sync view
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});  // (kBlockM, kBlockN) -> (row, col)
  Tensor tScS = thr_mma_s.partition_C(cS);                                // (MMA, MMA_M, MMA_N)
  Tensor tScS80 = make_tensor(tScS.data(), acc_as_sm80(tScS.layout()));   // mma.sync view

  // ---- Prologue: Q and the first (highest) K tile in flight -------------------------------------------
  bool const has_keys = work.n_block_max > work.n_block_min;
  if (paged && has_keys) {
    fetch_pages(work.n_block_max - 1);
    cute::cp_async_fence();
  }
  {
    Tensor tQgQ = gmem_thr_copy_QK.partition_S(gQ);  // (QCPY, QCPY_M, QCPY_K)
    Tensor tQsQ = gmem_thr_copy_QK.partition_D(sQ);  // (QCPY, QCPY_M, QCPY_K)
    Tensor tQcQ = gmem_thr_copy_QK.partition_S(cQ);  // (QCPY, QCPY_M, QCPY_K) -> (row, col)
    copy_tile_zfill(gmem_tiled_copy_QK, tQgQ, tQsQ, tQcQ, work.rows_q, cols_qk);
  }
  if (paged && has_keys) {
    cute::cp_async_fence();
    cute::cp_async_wait<1>();  // the first tile's pages have landed (Q may still be in flight)
    __syncthreads();
    page_offsets(work.n_block_max - 1);
    __syncthreads();
  }
  if (has_keys) {
    load_k(work.n_block_max - 1, cute::true_type{});
    if (work.n_block_max - 1 > work.n_block_min) { fetch_pages(work.n_block_max - 2); }
  }
  cute::cp_async_fence();

  clear(acc_o);
  OnlineSoftmax<2 * decltype(size<1>(acc_o80))::value> softmax;

  // ---- K/V loop ----------------------------------------------------------------------------------------
  // Always inlined: an outlined step keeps the accumulators on the stack (the general mma.sync d = 256
  // kernel had a 3.3 KB frame and ran at 12 TFLOP/s).
  auto kv_step = [&](int const n_block, auto is_masked_step) __attribute__((always_inline)) {
    constexpr bool kMasked = decltype(is_masked_step)::value;
    Tensor acc_s = partition_fragment_C(tiled_mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    Tensor acc_s80 = make_tensor(acc_s.data(), acc_as_sm80(acc_s.layout()));              // mma.sync view

    cute::cp_async_wait<0>();
    fence_shared_to_async();
    __syncthreads();  // K[n] (and Q) have landed; every warpgroup is done reading V[n+1]
    load_v(n_block, cute::bool_constant<kMasked>{});  // only a masked step holds hidden keys
    cute::cp_async_fence();
    if (n_block > work.n_block_min) { page_offsets(n_block - 1); }  // its entries landed with K[n]

    if constexpr (Traits::kSplitQK) {
      warpgroup_gemm_split</*kWait=*/0>(tiled_mma_s, tSrQ, tSrK, acc_s);
    } else {
      warpgroup_gemm</*kZeroInit=*/true, /*kWait=*/0, /*kARegisters=*/false>(tiled_mma_s, tSrQ, tSrK, acc_s);
    }
    if constexpr (kGeneral) {  // before the mask's -inf
      if (params.softcap_pre > 0.f) { apply_softcap(acc_s, params.softcap_pre); }
      if (alibi_slope != 0.f) {
        apply_alibi(acc_s, tScS, alibi_slope, work.m_block * kBlockM, n_block * kBlockN, work.seq.seqlen_q,
                    work.seq.seqlen_k);
      }
      if (paged) {  // keys on a page that does not exist count as masked (rules.h); tile n's entries are in slot n % 2
        int const key0 = n_block * kBlockN;
        KvRows<Element> const rows = rows_k().with_table_slice(page_slots + (n_block & 1) * Traits::kPageSlots,
                                                                 rows_k().page_of(key0));
        mask_missing_pages(acc_s, tScS, rows, key0, work.seq.key_begin, min(work.seq.seqlen_k, key0 + kBlockN));
      }
    }
    if constexpr (kMasked) { work.mask.apply(acc_s80, tScS80, work.m_block, n_block, work.n_block_unmasked_begin); }

    cute::cp_async_wait<0>();
    fence_shared_to_async();
    __syncthreads();  // V[n] has landed; every warpgroup is done reading K[n]
    // Tiles below the last are full. (Left padding, which hides keys of lower tiles, runs on the general
    // kernel, whose row-addressed loads always zero-fill the hidden rows.)
    if (n_block > work.n_block_min) {
      load_k(n_block - 1, cute::false_type{});
      // Into slot n_block % 2: every thread has issued V[n]'s copies, the slot's last reader (barrier above).
      if (n_block - 1 > work.n_block_min) { fetch_pages(n_block - 2); }
      cute::cp_async_fence();
    }

    softmax.update(acc_s80, acc_o80, params.softmax_scale_log2);

    Tensor rP = convert_type<Element>(acc_s);                        // (MMA, MMA_M, MMA_N)
    Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));  // (MMA, MMA_M, kBlockN / 16)
    warpgroup_gemm</*kZeroInit=*/false, /*kWait=*/0, /*kARegisters=*/true>(tiled_mma_o, tOrP, tOrVt, acc_o);
  };

  for_each_kv_tile(work.n_block_min, work.n_block_max, work.n_block_unmasked_begin, work.n_block_unmasked_end,
                   kv_step);

  // ---- Epilogue (common/tile.h) ----------------------------------------------------------------------
  Tensor lse = softmax.finalize(acc_o80, params.softmax_scale);  // (nrow)
  Tensor taccOcO = thr_mma_o.partition_C(cO);                    // (MMA, MMA_M, MMA_N) -> (row, col)
  Tensor taccOcO_rc = make_tensor(taccOcO.data(), acc_layout_rowcol(acc_as_sm80(taccOcO.layout())));
  if (params.num_splits > 1) {
    cute::cp_async_wait<0>();  // nothing left in flight at exit
    Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_as_sm80(acc_o.layout())));  // (nrow, ncol)
    store_split(params, work.tile.batch, work.tile.head, work.tile.split, work.m_block * kBlockM, work.rows_q,
                acc_o_rc, lse, taccOcO_rc);
    return;
  }
  {
    Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_as_sm80(acc_o.layout())));  // (nrow, ncol)
    add_sinks(params, work.tile.head, work.m_block * kBlockM, work.rows_q, head_sink, acc_o_rc, lse, taccOcO_rc);
  }
  Tensor rO = convert_type<ElementOut>(acc_o);  // (MMA, MMA_M, MMA_N)
  store_tile<typename Traits::SmemCopyAtomO, typename Traits::GmemTiledCopyO>(
      lse_tile_row0(params, work.tile, work.seq, work.m_block * kBlockM), work.rows_q, params.head_dim, tiled_mma_o,
      rO, sO, gO, lse, taccOcO_rc, cO, tidx);
#endif
}

}  // namespace cutlassfa::sm90
