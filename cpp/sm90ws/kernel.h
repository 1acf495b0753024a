// The warp-specialized Hopper forward kernel: one CTA per (kBlockM-row Q tile, head, batch), the grid
// order of common/tile.h. Warpgroup 0 is the producer (TMA, sm90ws/producer.h) and gives up its
// registers; warpgroups 1 .. kBlockM / 64 are the consumers (sm90ws/consumer.h, sm90ws/epilogue.h), 64
// query rows each.
// The roles meet only at mbarriers (Q, the K and V rings) and the consumers' named barriers.
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
#include "sm90ws/kernel_traits.h"
#include "sm90ws/producer.h"
#include "sm90ws/softmax.h"

namespace cutlassfa::sm90ws {

using namespace cute;

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1) flash_fwd_ws_kernel(__grid_constant__ const KernelParams<Traits> params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Pipeline = typename Traits::Pipeline;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;

  extern __shared__ __align__(1024) char smem[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  int const warp_group = cutlass::canonical_warp_group_idx();

  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    storage.barrier_q.init(1);
  }
  // Barriers of the K and V rings, initialized by warp 0: full counts the producer's one arrival plus
  // the bytes, empty the consumer warpgroups' releases.
  typename Pipeline::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kTmaBytesKV;
  pipeline_params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipeline_params.is_leader = threadIdx.x == 0;
  pipeline_params.num_consumers = Traits::kNConsumerThreads;
  Pipeline pipeline_k(storage.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  Pipeline pipeline_v(storage.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
  __syncthreads();  // barrier initialization visible to every thread (the pipelines fenced it)

  FwdParams const& fwd = params.fwd;
  TileCoord const tile = tile_of_this_block<kBlockM>(fwd);
  SeqInfo const seq = seq_info(fwd, tile.batch);  // dense: the full lengths, no offsets
  Mask</*kHasMask=*/true, kBlockM, kBlockN> const mask{seq.seqlen_q, seq.seqlen_k, seq.key_begin, &fwd};
  int const n_block_min = mask.n_block_min(tile.m_block);
  int const n_block_max = mask.n_block_max(tile.m_block);
  bool const has_keys = n_block_max > n_block_min;  // false: no row of the tile sees a key

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (threadIdx.x == 0 && has_keys) { produce<Traits>(params, storage, pipeline_k, pipeline_v, tile, n_block_min, n_block_max); }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    int const thread_idx = threadIdx.x - 128;
    typename Traits::TiledMmaPV tiled_mma_pv;
    Tensor acc_o = partition_fragment_C(tiled_mma_pv, Shape<Int<kBlockM>, Int<Traits::kHeadDim>>{});  // (MMA, MMA_M, MMA_N)
    TwoPhaseSoftmax<2 * decltype(size<1>(acc_o))::value> softmax;
    if (has_keys) {
      MmaTurnsOf<Traits>{thread_idx / 128}.first_turn();
      consume<Traits>(fwd, storage, pipeline_k, pipeline_v, mask, tile.m_block, n_block_min, n_block_max, thread_idx,
                      acc_o, softmax);
    } else {
      clear(acc_o);  // finalize: O = 0, lse = -inf
    }
    store_output<Traits>(fwd, storage, tile, seq, thread_idx, acc_o, softmax);
  }
#endif
}

}  // namespace cutlassfa::sm90ws
