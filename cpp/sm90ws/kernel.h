// The warp-specialized Hopper forward kernel, persistent: each CTA walks the tiles the scheduler gives
// it (sm90ws/scheduler.h). Warpgroup 0 is the producer (TMA, sm90ws/producer.h) and gives up its
// registers; warpgroups 1 .. kBlockM / 64 are the consumers (sm90ws/consumer.h, sm90ws/epilogue.h), 64
// query rows each.
// The roles meet only at mbarriers (Q full / empty with the tile index, per Q buffer; the K and V rings)
// and the consumers' named barriers. The K/V rings, the Q buffers and the ping-pong turns run on from
// one tile to the next.
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/mask.h"
#include "common/tile.h"
#include "cutlassfa/params.h"
#include "sm90ws/consumer.h"
#include "sm90ws/epilogue.h"
#include "sm90ws/fp8_descale.h"
#include "sm90ws/kernel_traits.h"
#include "sm90ws/producer.h"
#include "sm90ws/scheduler.h"
#include "sm90ws/score_terms.h"
#include "sm90ws/softmax.h"
#include "sm90ws/split_q.h"

namespace cutlassfa::sm90ws {

using namespace cute;

// Varlen: whether the tile's rows all lie past its entry's queries of `seqlen_q` (no rows: nothing to compute
// or write). The grid covers the longest entry, so the shorter ones' last Q tiles are such.
template <class Traits>
__forceinline__ __device__ bool past_entry_queries(TileCoord const& tile, int seqlen_q) {
  return tile.m_block * Traits::kBlockM >= seqlen_q;
}

// What both roles derive from a tile index, alike on both sides.
template <class Traits>
struct TileWork {
  TileCoord tile;
  SeqInfo seq;
  Mask<Traits::kBlockM, Traits::kBlockN> mask;
  int n_block_min, n_block_max;  // the K/V tiles some row sees

  __forceinline__ __device__ TileWork(FwdParams const& fwd, TileScheduler const& scheduler, int index)
      : tile(scheduler.tile(fwd, index)),
        seq(seq_info(fwd, tile.batch)),  // dense: the full lengths, no offsets; varlen: the entry's
        mask{seq.seqlen_q, seq.seqlen_k, seq.key_begin, &fwd},
        n_block_min(mask.n_block_min(tile.m_block)),
        n_block_max(mask.n_block_max(tile.m_block)) {
  }
  __forceinline__ __device__ bool has_keys() const { return n_block_max > n_block_min; }
};

// The Q buffer of the CTA's tile number `count` (0, 1, 2, ... in the order the CTA walks them) and the
// phase of that buffer's barriers for it: the buffers take the tiles in turn.
template <class Traits>
struct QSlot {
  int buffer, phase;
  __forceinline__ __device__ explicit QSlot(int count)
      : buffer(count % Traits::kQStages), phase((count / Traits::kQStages) & 1) {}
};

// The tile index goes through shared memory beside its buffer's barrier_q, whose arrive (release) and
// wait (acquire) order it in hardware; the empty asm statements keep the compiler from moving the
// access across the barrier calls (their asm has no memory clobber), and the volatile read is done
// once, never re-read after barrier_q_empty lets the producer overwrite it.
template <class Storage>
__forceinline__ __device__ void publish_tile_index(Storage& storage, int buffer, int index) {
  *static_cast<int volatile*>(&storage.tile_index[buffer]) = index;
  asm volatile("" ::: "memory");
}
template <class Storage>
__forceinline__ __device__ int read_tile_index(Storage& storage, int buffer) {
  asm volatile("" ::: "memory");
  return *static_cast<int volatile*>(&storage.tile_index[buffer]);
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) flash_fwd_ws_kernel(__grid_constant__ const KernelParams<Traits> params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Pipeline = typename Traits::Pipeline;
  constexpr int kBlockM = Traits::kBlockM;

  extern __shared__ __align__(1024) char smem[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  int const warp_group = cutlass::canonical_warp_group_idx();

  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    for (int b = 0; b < Traits::kQStages; ++b) {
      storage.barrier_q[b].init(1);
      storage.barrier_q_empty[b].init(Traits::kNConsumerThreads);
    }
  }
  // Barriers of the K and V rings, initialized by warp 0: full counts the producer's one arrival plus
  // the bytes, empty the consumer warpgroups' releases.
  auto pipeline_params = [&](uint32_t transaction_bytes) {
    typename Pipeline::Params pp;
    pp.transaction_bytes = transaction_bytes;
    pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pp.is_leader = threadIdx.x == 0;
    pp.num_consumers = Traits::kNConsumerThreads;
    return pp;
  };
  Pipeline pipeline_k(storage.pipeline_k, pipeline_params(Traits::kTmaBytesK), Shape<_1, _1, _1>{});
  Pipeline pipeline_v(storage.pipeline_v, pipeline_params(Traits::kTmaBytesV), Shape<_1, _1, _1>{});
  __syncthreads();  // barrier initialization visible to every thread (the pipelines fenced it)

  FwdParams const& fwd = params.fwd;
  TileScheduler const& scheduler = params.scheduler;

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (threadIdx.x == 0) {
      typename Traits::PipelineState write_k = cutlass::make_producer_start_state<Pipeline>();
      typename Traits::PipelineState write_v = cutlass::make_producer_start_state<Pipeline>();
      for (int index = scheduler.first(), count = 0;; index = scheduler.next(index), ++count) {
        if constexpr (Traits::kVarlen) {
          // A tile past its entry's queries is passed over here, never handed to the consumers (the
          // scheduler's and cu_seqlens' reads hidden behind their current tile), instead of going through the
          // Q barriers and an empty epilogue: with ten entries of 512-8192 rows, most of the grid's tiles.
          auto const past = [&](int i) {
            TileCoord const tile = scheduler.tile(fwd, i);
            return past_entry_queries<Traits>(tile, seq_info(fwd, tile.batch).seqlen_q);
          };
          while (index < scheduler.num_tiles && past(index)) { index = scheduler.next(index); }
        }
        QSlot<Traits> const slot(count);
        if (count >= Traits::kQStages) {  // the consumers are done with this buffer's last tile
          storage.barrier_q_empty[slot.buffer].wait(slot.phase ^ 1);
        }
        publish_tile_index(storage, slot.buffer, index);
        if (index >= scheduler.num_tiles) {
          storage.barrier_q[slot.buffer].arrive();  // the consumers read the end
          break;
        }
        TileWork<Traits> const work(fwd, scheduler, index);
        if (work.has_keys()) {
          produce<Traits>(params, storage, pipeline_k, pipeline_v, write_k, write_v, slot.buffer, work.tile,
                          work.seq, work.n_block_min, work.n_block_max);
        } else {
          storage.barrier_q[slot.buffer].arrive();  // no row sees a key: no Q, no K/V
        }
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    int const thread_idx = threadIdx.x - 128;
    typename Traits::PipelineState read_k;  // stage 0, phase 0
    typename Traits::PipelineState read_v;
    MmaTurnsOf<Traits>{thread_idx / 128}.first_turn();
    for (int count = 0;; ++count) {
      QSlot<Traits> const slot(count);
      storage.barrier_q[slot.buffer].wait(slot.phase);
      int const index = read_tile_index(storage, slot.buffer);
      if (index >= scheduler.num_tiles) { break; }
      TileWork<Traits> const work(fwd, scheduler, index);
      float const head_sink = prefetch_sink(fwd, work.tile.head);  // used by the epilogue
      TileScales const scales = tile_scales<Traits::kFp8>(fwd, work.tile.batch, work.tile.head_kv);
      ScoreTermsOf<Traits> const terms(fwd, work.tile.batch, work.tile.head, work.tile.m_block, work.seq);
      // A warpgroup whose rows all lie past the queries' end (the last tile of a sequence) only passes
      // the tiles on, with three consumer warpgroups (H200, 192-row tiles, N = 512 .. 4096: causal
      // 1.02-1.09x faster, non-causal 0.98-1.00x). With two, the 128-row tiles keep the kernel without
      // the branch: its mere presence cost d = 128 up to 2.5 % where it never runs.
      // warp_group is warp-uniform as the compiler sees it (a shuffle): a branch on thread_idx moved the
      // pipeline states out of uniform registers and cost 4-15 %.
      bool const has_rows = 64 * (warp_group - 1) < work.seq.seqlen_q - work.tile.m_block * kBlockM;
      if constexpr (Traits::kReleaseQAfterSplit) {  // fp32: this warpgroup's rows of Q, then the staging is free
        // Every warpgroup that runs GEMMs on the tile (pass_tiles below runs none), its rows past the
        // queries too: TMA filled them with zeros.
        if (work.has_keys() && (Traits::kNConsumerWarpGroups != 3 || has_rows)) {
          split_q_rows<Traits>(storage, slot.buffer, thread_idx);
        }
        storage.barrier_q_empty[slot.buffer].arrive();
      }
      if (Traits::kNConsumerWarpGroups == 3 && work.has_keys() && !has_rows) {
        // Takes part in the hand-overs only; writes nothing (O and lse have no such rows).
        pass_tiles<Traits>(storage, pipeline_k, pipeline_v, read_k, read_v, slot.buffer, work.n_block_min,
                           work.n_block_max, thread_idx);
        if constexpr (Traits::kReleaseQAfterEpilogue) { storage.barrier_q_empty[slot.buffer].arrive(); }
        continue;
      }
      typename Traits::TiledMmaPV tiled_mma_pv;
      Tensor acc_o =
          partition_fragment_C(tiled_mma_pv, Shape<Int<kBlockM>, Int<Traits::kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
      TwoPhaseSoftmax<2 * decltype(size<1>(acc_o))::value, !Traits::kFp8> softmax;
      if (work.has_keys()) {
        // Releases Q (barrier_q_empty) before its last P V when O has shared memory of its own.
        consume<Traits>(scales, terms, storage, pipeline_k, pipeline_v, read_k, read_v, slot.buffer, work.mask,
                        work.tile.m_block, work.n_block_min, work.n_block_max, thread_idx, acc_o, softmax);
      } else {
        clear(acc_o);  // finalize: O = 0, lse = -inf
        if constexpr (Traits::kReleaseQAfterLastS) { storage.barrier_q_empty[slot.buffer].arrive(); }
      }
      store_output<Traits>(fwd, storage, work.tile, work.seq, thread_idx, head_sink, scales, acc_o, softmax);
      if constexpr (Traits::kReleaseQAfterEpilogue) { storage.barrier_q_empty[slot.buffer].arrive(); }  // O was staged over Q
    }
  }
#endif
}

}  // namespace cutlassfa::sm90ws
