// The consumer mainloop of one warpgroup (64 query rows): S = Q K^T and O += P V on wgmma, mask and
// online softmax in registers, with FlashAttention-3's two overlaps:
//  - intra-warpgroup: step n issues S[n] = Q K[n]^T and O += P[n+1] V[n+1] back to back, then runs
//    the softmax of S[n] while the P V MMA is still in flight (O is rescaled under the next S);
//  - ping-pong between the consumer warpgroups: named barriers hand the tensor cores from one
//    warpgroup to the next each step, so the others' softmax runs under one's GEMMs.
// K and V buffers come from the producer's rings; each is released as soon as its MMA has completed.
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/arch/barrier.h>

#include "common/mask.h"
#include "common/tensor_utils.h"
#include "sm90ws/fp8_descale.h"
#include "sm90ws/kernel_traits.h"
#include "sm90ws/score_terms.h"
#include "sm90ws/softmax.h"
#include "sm90ws/utils.h"

namespace cutlassfa::sm90ws {

using namespace cute;

// Ping-pong turns: one token goes round the consumer warpgroups 0, 1, .., kN - 1, 0, ...; warpgroup wg
// waits for it (its barrier kMmaTurn0 + wg: its own 128 threads and the 128 arrivals of the previous
// warpgroup) before issuing its GEMMs and hands it to the next one right after issuing them. Warpgroup 0
// puts the token in (first_turn). Every warpgroup takes the same number of turns (they walk the same
// K/V tiles); the one arrival left on a barrier at the end is never waited for. kEnabled = false: no
// turns (Traits::kPingPong).
template <bool kEnabled, int kN>
struct MmaTurns {
  int wg;  // 0 .. kN - 1 among the consumers
  __forceinline__ __device__ void first_turn() const {
    if (kEnabled && wg == 0) {
      cutlass::arch::NamedBarrier::arrive(256, static_cast<uint32_t>(NamedBarriers::kMmaTurn0));
    }
  }
  __forceinline__ __device__ void wait_turn() const {
    if constexpr (kEnabled) {
      cutlass::arch::NamedBarrier::sync(256, static_cast<uint32_t>(NamedBarriers::kMmaTurn0) + wg);
    }
  }
  __forceinline__ __device__ void pass_turn() const {
    if constexpr (kEnabled) {
      int const next = wg + 1 == kN ? 0 : wg + 1;
      cutlass::arch::NamedBarrier::arrive(256, static_cast<uint32_t>(NamedBarriers::kMmaTurn0) + next);
    }
  }
};
template <class Traits>
using MmaTurnsOf = MmaTurns<Traits::kPingPong, Traits::kNConsumerWarpGroups>;

// Runs the K/V tiles [n_block_min, n_block_max) (non-empty) for this thread's rows, Q having landed;
// acc_o ends unnormalized, softmax holds m and l. read_k / read_v run on across the CTA's tiles.
// thread_idx: 0 .. kNConsumerThreads - 1 among the consumers. scales: the tile's (sm90ws/fp8_descale.h);
// terms: its softcap or ALiBi (sm90ws/score_terms.h; nothing outside those instantiations).
template <class Traits, class MaskT, class TensorO, class Softmax>
__forceinline__ __device__ void consume(TileScales const& scales, ScoreTermsOf<Traits> const& terms,
                                        typename Traits::SharedStorage& storage,
                                        typename Traits::Pipeline& pipeline_k, typename Traits::Pipeline& pipeline_v,
                                        typename Traits::PipelineState& read_k,
                                        typename Traits::PipelineState& read_v, int q_buffer, MaskT const& mask,
                                        int m_block,
                                        int n_block_min, int n_block_max, int thread_idx, TensorO& acc_o,
                                        Softmax& softmax) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;

  Tensor sQ = make_tensor(make_smem_ptr(storage.q_tile(q_buffer)), typename Traits::SmemLayoutQ{});  // (kBlockM, dQK)
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});    // (kBlockN, dQK, stage)
  Tensor sVt = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{});  // (d, kBlockN, stage)

  typename Traits::TiledMmaQK tiled_mma_qk;
  typename Traits::TiledMmaPV tiled_mma_pv;
  auto thr_mma_qk = tiled_mma_qk.get_thread_slice(thread_idx);
  auto thr_mma_pv = tiled_mma_pv.get_thread_slice(thread_idx);
  Tensor tSrQ = thr_mma_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K) descriptors
  Tensor tSrK = thr_mma_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage) descriptors
  Tensor tOrV = thr_mma_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage) descriptors
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});  // (kBlockM, kBlockN) -> (row, col)
  Tensor tScS = thr_mma_qk.partition_C(cS);                               // (MMA, MMA_M, MMA_N)
  Tensor tScS80 = make_tensor(tScS.data(), acc_as_sm80(tScS.layout()));   // mma.sync view for the mask
  Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_as_sm80(acc_o.layout())));  // (nrow, d)

  // P: the softmax output in Element, laid out as the A operand of P V; the same registers every step.
  // fp8: 32 keys a k step, in the key order of sm90ws/fp8_key_order.h.
  Tensor acc_s_shape = partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  auto const p_layout = [&] {
    if constexpr (Traits::kFp8) {
      return fp8_p_layout(acc_s_shape.layout());  // (MMA, MMA_M, kBlockN / 32)
    } else {
      return acc_as_a_operand(acc_s_shape.layout());  // (MMA, MMA_M, kBlockN / 16)
    }
  }();
  Tensor tOrP = make_tensor<Element>(p_layout);
  auto to_p = [&](auto const& acc_s) {
    if constexpr (Traits::kFp8) {
      convert_p_fp8(acc_s, tOrP);
    } else {
      convert_into(acc_s, tOrP);
    }
  };

  int const n_block_unmasked_begin = mask.n_block_unmasked_begin(m_block);
  MmaTurnsOf<Traits> const turns{thread_idx / 128};
  auto wait = [](typename Traits::Pipeline& pipeline, typename Traits::PipelineState const& state) {
    pipeline.consumer_wait(state, pipeline.consumer_try_wait(state));
  };
  // S = Q K[stage]^T, issued (not waited for): for fp32 inputs, the three products of the halves.
  auto issue_s = [&](auto& acc_s, int stage) {
    if constexpr (Traits::kSplitQK) {
      warpgroup_gemm_split</*kWait=*/-1>(tiled_mma_qk, tSrQ, tSrK(_, _, _, stage), acc_s);
    } else {
      warpgroup_gemm</*kZeroInit=*/true, /*kWait=*/-1, /*kARegisters=*/false>(tiled_mma_qk, tSrQ,
                                                                              tSrK(_, _, _, stage), acc_s);
    }
  };
  // S -> P (in place, fp32) -> tOrP; returns the rescale factors of O. term: what terms.apply returned.
  Tensor tScS_rc = make_tensor(tScS80.data(), acc_layout_rowcol(tScS80.layout()));  // (nrow, ncol) -> (row, col)
  auto softmax_step = [&](auto& acc_s, AlibiLinear const& term) {
    Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_as_sm80(acc_s.layout())));  // (nrow, ncol)
    if constexpr (ScoreTermsOf<Traits>::kLinear) {
      return softmax.template update</*kLinear=*/true>(scores, scales.scale_log2, term, tScS_rc);
    } else {
      return softmax.update(scores, scales.scale_log2);
    }
  };

  // ---- First (highest) K/V tile: S alone, always masked (the ragged end or the diagonal lies here) ----
  {
    Tensor acc_s = partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
    wait(pipeline_k, read_k);
    turns.wait_turn();
    issue_s(acc_s, read_k.index());
    turns.pass_turn();
    warpgroup_wait<0>();
    pipeline_k.consumer_release(read_k);
    ++read_k;
    Tensor acc_s80 = make_tensor(acc_s.data(), acc_as_sm80(acc_s.layout()));
    AlibiLinear const term = terms.apply(acc_s80, tScS80, n_block_max - 1);  // before the mask's -inf
    mask.apply(acc_s80, tScS80, m_block, n_block_max - 1, n_block_unmasked_begin);
    softmax_step(acc_s, term);  // alpha is 0: O starts at zero
    to_p(acc_s);
  }
  clear(acc_o);

  // ---- Steps n = n_block_max - 2 .. n_block_min: S[n] and P[n+1] V[n+1] in flight together -------------
  // O is rescaled by the factor of the last softmax between issuing S[n] and P[n+1] V[n+1], while the
  // tensor cores run S[n], rather than after the softmax, where it delayed this warpgroup's next turn
  // (FlashAttention-3's order; H200 self-test: 1.01-1.04x at d = 64 / 128, bench/NOTES-tensorcore.md).
  auto alpha_pending = softmax.row_max;  // same shape; 0 after the first tile, where O starts at zero
  fill(alpha_pending, 0.f);
  auto kv_step = [&](int const n_block, auto is_masked_step) __attribute__((always_inline)) {
    Tensor acc_s = partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
    wait(pipeline_k, read_k);
    turns.wait_turn();
    issue_s(acc_s, read_k.index());
    softmax.rescale_o(acc_o_rc, alpha_pending);
    wait(pipeline_v, read_v);
    warpgroup_gemm</*kZeroInit=*/false, /*kWait=*/-1, /*kARegisters=*/true>(tiled_mma_pv, tOrP,
                                                                            tOrV(_, _, _, read_v.index()), acc_o);
    turns.pass_turn();
    warpgroup_wait<1>();  // S[n] has completed (P V may still run)
    pipeline_k.consumer_release(read_k);
    ++read_k;
    AlibiLinear term;
    if constexpr (Traits::kScoreTerm != ScoreTerm::kNone || decltype(is_masked_step)::value) {
      Tensor acc_s80 = make_tensor(acc_s.data(), acc_as_sm80(acc_s.layout()));
      term = terms.apply(acc_s80, tScS80, n_block);
      if constexpr (decltype(is_masked_step)::value) { mask.apply(acc_s80, tScS80, m_block, n_block, n_block_unmasked_begin); }
    }
    auto const alpha = softmax_step(acc_s, term);
    warpgroup_wait<0>();  // P[n+1] V[n+1] has completed: O and tOrP are free
    warpgroup_fence_operand(acc_o);
    warpgroup_fence_operand(tOrP);
    pipeline_v.consumer_release(read_v);
    ++read_v;
    to_p(acc_s);
    alpha_pending = alpha;
  };
  for_each_kv_tile(n_block_min, n_block_max - 1, n_block_unmasked_begin, mask.n_block_unmasked_end(m_block), kv_step);

  // ---- Last P V (every S = Q K^T has completed: Q may go, unless O is to be staged over it) -------------
  if constexpr (Traits::kReleaseQAfterLastS) { storage.barrier_q_empty[q_buffer].arrive(); }
  softmax.rescale_o(acc_o_rc, alpha_pending);
  wait(pipeline_v, read_v);
  warpgroup_gemm</*kZeroInit=*/false, /*kWait=*/0, /*kARegisters=*/true>(tiled_mma_pv, tOrP,
                                                                         tOrV(_, _, _, read_v.index()), acc_o);
  pipeline_v.consumer_release(read_v);
  ++read_v;  // the state runs on into the CTA's next tile
}

// What `consume` does for a warpgroup whose 64 rows all lie past the queries (the last tile of a
// sequence that is not a multiple of kBlockM: 1024 queries are five 192-row tiles and 64 rows): no GEMM
// and no softmax, only its part in the hand-overs, in the same order, so that the rings and the turns
// run on and the other warpgroups have the tensor cores to themselves. Each buffer is waited for
// before its release: an early release would count towards the ring's current phase.
template <class Traits>
__forceinline__ __device__ void pass_tiles(typename Traits::SharedStorage& storage,
                                           typename Traits::Pipeline& pipeline_k, typename Traits::Pipeline& pipeline_v,
                                           typename Traits::PipelineState& read_k,
                                           typename Traits::PipelineState& read_v, int q_buffer, int n_block_min,
                                           int n_block_max, int thread_idx) {
  MmaTurnsOf<Traits> const turns{thread_idx / 128};
  auto pass = [](typename Traits::Pipeline& pipeline, typename Traits::PipelineState& state) {
    pipeline.consumer_wait(state, pipeline.consumer_try_wait(state));
    pipeline.consumer_release(state);
    ++state;
  };
  for (int n_block = n_block_max - 1; n_block >= n_block_min; --n_block) {  // one turn a step, as consume
    turns.wait_turn();
    turns.pass_turn();
    pass(pipeline_k, read_k);
    if (n_block < n_block_max - 1) { pass(pipeline_v, read_v); }
  }
  if constexpr (Traits::kReleaseQAfterLastS) { storage.barrier_q_empty[q_buffer].arrive(); }
  pass(pipeline_v, read_v);
}

}  // namespace cutlassfa::sm90ws
