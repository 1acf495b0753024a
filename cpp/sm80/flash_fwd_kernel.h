// FlashAttention-2 forward on SM80 tensor cores (mma.sync m16n8k16, fp32 accumulate), in CuTe.
//
// One CTA owns one kBlockM-row Q tile of one (batch, head) and walks the K/V tiles from the last
// visible one down to tile 0, so the steps that need masking (ragged last tile, causal diagonal)
// come first and the rest run mask-free. K and V each have one shared-memory buffer; the loads are
// overlapped with compute as in FlashAttention-2:
//     wait K[n] | issue V[n]   | S = Q K[n]^T, mask
//     wait V[n] | issue K[n-1] | online softmax, O += P V[n]
// S stays in registers: converted to fp16/bf16 it is directly the A operand of the second GEMM.
//
// fp32 inputs (Traits::kSplitQK): Q is read to registers once and stored as two fp16 tiles
// (hi, lo); K and V are cp.async'd as fp32 into one staging tile and, after each thread's own
// wait, split by that thread into fp16 tiles (K hi/lo, V hi only) before the barrier that already
// follows the wait. S = Qhi Khi^T + Qhi Klo^T + Qlo Khi^T (gemm_ss_split); P V is unchanged.
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
#include "sm80/gemm.h"
#include "sm80/kernel_traits.h"

namespace cutlassfa::sm80 {

using namespace cute;

// kGeneral: the kernel for the rarer modes, a separate instantiation so that the plain one carries none
// of their code: K and V read one row address at a time with column predicates (a paged cache, or a head
// dim narrower than kHeadDim, zero-padded; every row zero-filled where hidden), softcap and left padding.
// (A run-time softcap branch in the plain kernel was if-converted: its predicated-off instructions
// doubled the instructions issued at d = 32.)
template <class Traits, bool kGeneral>
__global__ void __launch_bounds__(Traits::kNThreads) flash_fwd_kernel(__grid_constant__ const FwdParams params) {
  using Element = typename Traits::Element;
  using ElementOut = typename Traits::ElementOut;
  using ElementIn = typename Traits::ElementIn;
  constexpr bool kSplit = Traits::kSplitQK;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;

  extern __shared__ __align__(1024) char smem[];
  int const tidx = threadIdx.x;

  auto const work = BlockTileWork<kBlockM, kBlockN>::of_this_block(params);  // grid order: common/tile.h
  if (!work.has_queries) { return; }  // varlen: past this entry's queries
  float const head_sink = prefetch_sink(params, work.tile.head);  // used by the epilogue
  float const alibi_slope = kGeneral ? alibi_slope_raw(params, work.tile.batch, work.tile.head) : 0.f;

  // ---- Global tensors --------------------------------------------------------------------------------
  auto const tiles =
      global_tiles<kBlockM, kBlockN, kHeadDim, kHeadDim, ElementIn, ElementOut>(params, work.tile, work.seq);
  Tensor gQ = get<0>(tiles);  // (kBlockM, d)
  Tensor gK = get<1>(tiles);  // (kBlockN, d, n_blocks)
  Tensor gV = get<2>(tiles);  // (kBlockN, d, n_blocks)
  Tensor gO = get<3>(tiles);  // (kBlockM, d)

  // ---- Shared tensors ------------------------------------------------------------------------------
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                          typename Traits::SmemLayoutQ{});                         // (kBlockM, d)
  // kSplit: the lo halves of Q and K follow their hi tiles (otherwise sQlo, sKlo alias and are unused).
  Tensor sQlo = make_tensor(sQ.data() + (kSplit ? size(sQ) : 0), typename Traits::SmemLayoutQ{});  // (kBlockM, d)
  Tensor sK = make_tensor(sQ.data() + (kSplit ? 2 : 1) * size(sQ), typename Traits::SmemLayoutKV{});  // (kBlockN, d)
  Tensor sKlo = make_tensor(sK.data() + (kSplit ? size(sK) : 0), typename Traits::SmemLayoutKV{});  // (kBlockN, d)
  Tensor sV = make_tensor(sK.data() + (kSplit ? 2 : 1) * size(sK), typename Traits::SmemLayoutKV{});  // (kBlockN, d)
  // kSplit: the fp32 K or V tile in flight (cp.async target), split into sK/sKlo or sV on arrival.
  Tensor sStage = make_tensor(make_smem_ptr(reinterpret_cast<ElementIn*>(raw_pointer_cast((sV.data() + size(sV))))),
                              typename Traits::SmemLayoutStage{});  // (kBlockN, d)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});           // (d, kBlockN)
  Tensor sVtNoSwizzle = make_tensor(sV.data(), typename Traits::SmemLayoutVtNoSwizzle{});  // (d, kBlockN)
  // The epilogue stages O over the Q (and, for fp32 O, K) buffers once the K/V loop is done.
  Tensor sO = make_tensor(make_smem_ptr(reinterpret_cast<ElementOut*>(smem)),
                          typename Traits::SmemLayoutO{});  // (kBlockM, d)

  // ---- Partitions ------------------------------------------------------------------------------------
  typename Traits::GmemTiledCopyQKV gmem_tiled_copy_QKV;
  auto gmem_thr_copy_QKV = gmem_tiled_copy_QKV.get_thread_slice(tidx);
  Tensor tQgQ = gmem_thr_copy_QKV.partition_S(gQ);  // (QCPY, QCPY_M, QCPY_K)
  Tensor tQsQ = gmem_thr_copy_QKV.partition_D(sQ);  // (QCPY, QCPY_M, QCPY_K)
  // (row, col) of every copied element, for the row predicates of ragged tiles.
  Tensor cQ = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (kBlockM, d) -> (row, col)
  Tensor cKV = make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{});  // (kBlockN, d) -> (row, col)
  Tensor tQcQ = gmem_thr_copy_QKV.partition_S(cQ);    // (QCPY, QCPY_M, QCPY_K)

  // The general kernel reads K and V one row address at a time with column predicates (common/tile.h:
  // paged caches, zero-padded head dims). The row addressing is built where used, not held in registers
  // across the K/V loop.
  auto rows_k = [&] {
    return kv_rows<ElementIn>(params, work.seq, params.k, params.k_batch_stride, params.k_head_stride,
                              params.k_row_stride, work.tile);
  };
  auto rows_v = [&] {
    return kv_rows<ElementIn>(params, work.seq, params.v, params.v_batch_stride, params.v_head_stride,
                              params.v_row_stride, work.tile);
  };
  // cp.async of K or V tile n_block into sX; is_predicated zero-fills the hidden rows. The
  // partitions are rebuilt at each call from tid, as the ldmatrix ones in kv_step, so that the
  // per-row global addresses are not held in registers across the K/V loop.
  // kSplit: the fp32 tile goes to sStage instead of sX.
  auto load_kv = [&](auto const& gX, auto const& rows, auto& sX, int const n_block, int const tid, auto is_predicated) {
    auto load = [&](auto const& gmem_tiled_copy_KV, auto& sDst) {
      int const key0 = n_block * kBlockN;
      auto gmem_thr_copy_KV = gmem_tiled_copy_KV.get_thread_slice(tid);
      if constexpr (kGeneral) {
        copy_kv_tile_rows(gmem_tiled_copy_KV, gmem_thr_copy_KV, rows(), key0, sDst, cKV, work.seq.key_begin - key0,
                          work.seq.seqlen_k - key0, params.head_dim);
      } else {
        copy_kv_tile<decltype(is_predicated)::value>(gmem_tiled_copy_KV, gmem_thr_copy_KV, gX(_, _, n_block), sDst,
                                                     cKV, work.seq.key_begin - key0, work.seq.seqlen_k - key0);
      }
    };
    if constexpr (kSplit) {
      load(typename Traits::GmemTiledCopyKVIn{}, sStage);
    } else {
      load(gmem_tiled_copy_QKV, sX);
    }
  };

  // kSplit: after this thread's cp.async wait, split the staging elements it copied itself (same
  // partition as load_kv) into sHi (and sLo). Rows the load zero-filled give zeros.
  auto split_stage = [&](auto& sHi, auto& sLo, int const tid, auto with_lo) {
    auto gmem_thr_copy_KV = typename Traits::GmemTiledCopyKVIn{}.get_thread_slice(tid);
    Tensor tXsStage = gmem_thr_copy_KV.partition_D(sStage);  // (KCPY, KCPY_N, KCPY_K) fp32
    Tensor tXsHi = gmem_thr_copy_KV.partition_D(sHi);        // (KCPY, KCPY_N, KCPY_K) fp16
    Tensor tXsLo = gmem_thr_copy_KV.partition_D(sLo);        // (KCPY, KCPY_N, KCPY_K) fp16
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tXsStage); ++m) {
      Tensor rX = make_fragment_like(tXsStage(_, m, _));  // (KCPY, KCPY_K) fp32
      copy(Copy_Atom<UniversalCopy<cute::uint128_t>, ElementIn>{}, tXsStage(_, m, _), rX);
      store_split_fp16<decltype(with_lo)::value>(rX, tXsHi(_, m, _), tXsLo(_, m, _));
    }
  };

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tidx);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);             // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK);             // (MMA, MMA_N, MMA_K)
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);  // (MMA, MMA_K = d / 8, MMA_N = kBlockN / 16)
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_K)
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});  // (kBlockM, kBlockN) -> (row, col)
  Tensor tScS = thr_mma.partition_C(cS);                                 // (MMA, MMA_M, MMA_N)

  // ---- Prologue: Q and the first (highest) K tile in flight --------------------------------------------
  if constexpr (kSplit) {  // Q: fp32 to registers (LDG.128), split into sQ / sQlo
    typename Traits::GmemTiledCopyQIn gmem_tiled_copy_Qin;
    auto gmem_thr_copy_Qin = gmem_tiled_copy_Qin.get_thread_slice(tidx);
    Tensor tQgQin = gmem_thr_copy_Qin.partition_S(gQ);  // (QCPY, QCPY_M, QCPY_K) fp32
    Tensor tQcQin = gmem_thr_copy_Qin.partition_S(cQ);  // (QCPY, QCPY_M, QCPY_K) -> (row, col)
    Tensor tQrQin = make_fragment_like(tQgQin);        // (QCPY, QCPY_M, QCPY_K) fp32
    copy_tile_zfill(gmem_tiled_copy_Qin, tQgQin, tQrQin, tQcQin, work.rows_q, params.head_dim);
    store_split_fp16<true>(tQrQin, gmem_thr_copy_Qin.partition_D(sQ), gmem_thr_copy_Qin.partition_D(sQlo));
  } else {
    copy_tile_zfill(gmem_tiled_copy_QKV, tQgQ, tQsQ, tQcQ, work.rows_q, params.head_dim);
  }
  if (work.n_block_max > work.n_block_min) {
    load_kv(gK, rows_k, sK, work.n_block_max - 1, tidx, cute::true_type{});
  }
  cute::cp_async_fence();

  clear(acc_o);
  OnlineSoftmax<2 * decltype(size<1>(acc_o))::value> softmax;

  // ---- K/V loop ------------------------------------------------------------------------------------------
  // Always inlined: an outlined step keeps the accumulators on the stack (the general mma.sync d = 256
  // kernel had a 3.3 KB frame and ran at 12 TFLOP/s).
  auto kv_step = [&](int const n_block, auto is_masked_step) __attribute__((always_inline)) {
    constexpr bool kMasked = decltype(is_masked_step)::value;
    // The ldmatrix addresses are loop invariant, and the compiler keeps them all in registers (one
    // per swizzled 16-byte column chunk) next to the accumulators; rebuilding them from an opaque
    // thread index at every step costs a few integer instructions and frees those registers.
    int const tid = opaque_volatile(tidx);
    auto smem_tiled_copy_Q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
    auto smem_thr_copy_Q = smem_tiled_copy_Q.get_thread_slice(tid);
    Tensor tSsQ = smem_thr_copy_Q.partition_S(sQ);  // (CPY, CPY_M, CPY_K)
    auto smem_tiled_copy_K = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
    auto smem_thr_copy_K = smem_tiled_copy_K.get_thread_slice(tid);
    Tensor tSsK = smem_thr_copy_K.partition_S(sK);  // (CPY, CPY_N, CPY_K)
    auto smem_tiled_copy_V = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
    auto smem_thr_copy_V = smem_tiled_copy_V.get_thread_slice(tid);
    Tensor tOsVt = smem_thr_copy_V.partition_S(sVt);  // (CPY, CPY_K, CPY_N)

    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    clear(acc_s);

    cute::cp_async_wait<0>();
    if constexpr (kSplit) { split_stage(sK, sKlo, tid, cute::true_type{}); }
    __syncthreads();  // K[n] (and Q) have landed; every warp is done reading V[n+1] from sV
    if constexpr (kMasked) {  // only a masked step can hold hidden keys
      load_kv(gV, rows_v, sV, n_block, tid, cute::true_type{});
    } else {
      load_kv(gV, rows_v, sV, n_block, tid, cute::false_type{});
    }
    cute::cp_async_fence();

    if constexpr (kSplit) {
      Tensor tSsQlo = smem_thr_copy_Q.partition_S(sQlo);  // (CPY, CPY_M, CPY_K)
      Tensor tSsKlo = smem_thr_copy_K.partition_S(sKlo);  // (CPY, CPY_N, CPY_K)
      gemm_ss_split(acc_s, tSrQ, tSrK, tSsQ, tSsQlo, tSsK, tSsKlo, tiled_mma, smem_tiled_copy_Q, smem_tiled_copy_K,
                    smem_thr_copy_Q, smem_thr_copy_K);
    } else {
      gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_tiled_copy_Q, smem_tiled_copy_K, smem_thr_copy_Q,
              smem_thr_copy_K);
    }
    if constexpr (kGeneral) {  // before the mask's -inf
      if (params.softcap_pre > 0.f) { apply_softcap(acc_s, params.softcap_pre); }
      if (alibi_slope != 0.f) {
        apply_alibi(acc_s, tScS, alibi_slope, work.m_block * kBlockM, n_block * kBlockN, work.seq.seqlen_q,
                    work.seq.seqlen_k);
      }
      if (params.block_table != nullptr) {  // keys on a page that does not exist count as masked (rules.h)
        int const key0 = n_block * kBlockN;
        mask_missing_pages(acc_s, tScS, rows_k(), key0, work.seq.key_begin, min(work.seq.seqlen_k, key0 + kBlockN));
      }
    }
    if constexpr (kMasked) { work.mask.apply(acc_s, tScS, work.m_block, n_block, work.n_block_unmasked_begin); }

    cute::cp_async_wait<0>();
    // kSplit: sV is free, every warp passed the barrier above after its P V[n+1].
    if constexpr (kSplit) { split_stage(sV, sV, tid, cute::false_type{}); }
    __syncthreads();  // V[n] has landed; every warp is done reading K[n] from sK
    // Tiles below the last are full. (Left padding, which hides keys of lower tiles, runs on the general
    // kernel, whose row-addressed loads always zero-fill the hidden rows.)
    if (n_block > work.n_block_min) {
      load_kv(gK, rows_k, sK, n_block - 1, tid, cute::false_type{});
      cute::cp_async_fence();
    }

    softmax.update(acc_s, acc_o, params.softmax_scale_log2);

    Tensor rP = convert_type<Element>(acc_s);                                     // (MMA, MMA_M, MMA_N)
    Tensor tOrP = make_tensor(rP.data(), acc_layout_to_a_operand(rP.layout()));  // (MMA, MMA_M, MMA_N / 2)
    gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_tiled_copy_V, smem_thr_copy_V);
  };

  for_each_kv_tile(work.n_block_min, work.n_block_max, work.n_block_unmasked_begin, work.n_block_unmasked_end,
                   kv_step);

  // ---- Epilogue --------------------------------------------------------------------------------------------
  Tensor lse = softmax.finalize(acc_o, params.softmax_scale);  // (nrow)
  Tensor taccOcO = thr_mma.partition_C(cQ);                    // (MMA, MMA_M, MMA_K) -> (row, col)
  Tensor taccOcO_rc = make_tensor(taccOcO.data(), acc_layout_rowcol(taccOcO.layout()));  // (nrow, ncol)
  if (params.num_splits > 1) {
    cute::cp_async_wait<0>();  // nothing left in flight at exit
    Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));  // (nrow, ncol)
    store_split(params, work.tile.batch, work.tile.head, work.tile.split, work.m_block * kBlockM, work.rows_q,
                acc_o_rc, lse, taccOcO_rc);
    return;
  }
  {
    Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));  // (nrow, ncol)
    add_sinks(params, work.tile.head, work.m_block * kBlockM, work.rows_q, head_sink, acc_o_rc, lse, taccOcO_rc);
  }
  Tensor rO = convert_type<ElementOut>(acc_o);  // (MMA, MMA_M, MMA_K)
  store_tile<typename Traits::SmemCopyAtomO, typename Traits::GmemTiledCopyO>(
      lse_tile_row0(params, work.tile, work.seq, work.m_block * kBlockM), work.rows_q, params.head_dim, tiled_mma,
      rO, sO, gO, lse, taccOcO_rc, cQ, tidx);
}

}  // namespace cutlassfa::sm80
