// Compile-time configuration of the warp-specialized Hopper (sm_90a) forward kernel: tile shapes per
// head dim, the CTA's roles and their registers, the shared layouts seen by TMA and by wgmma, the TMA
// copy types, the named barriers, and the shared storage.
//
// One CTA = 1 producer warpgroup (one thread issues every TMA load) + 2 consumer warpgroups, each
// owning 64 of the tile's kBlockM = 128 query rows and running both GEMMs and the softmax for them.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cutlassfa/params.h"

namespace cutlassfa::sm90ws {

using namespace cute;

// Tile per head dim (kBlockM is always 128: two consumer warpgroups of 64 rows). FlashAttention-3
// takes kBlockN = 128 at d = 128 for causal masks (176 non-causal) and a 192-row tile with three
// consumer warpgroups at d = 64; this kernel keeps two consumer warpgroups and power-of-two key tiles
// for its first version, so 128 keys at both: S then costs 64 fp32 registers a thread beside O (32 at
// d = 64, 64 at d = 128), well inside the 240 a consumer thread gets. Two K/V stages: shared memory
// 80 KB at d = 64, 160 KB at d = 128 (Q 128 rows, K and V 2 x 128 rows each).
// Another head dim adds a row here (and to CUTLASSFA_SM90WS_HEAD_DIMS): d = 96 would take a 64-byte
// swizzle (SmemLayoutAtom below), d = 192 / 256 a narrower key tile (kBlockN = 112 / 80 in FA3).
template <int kHeadDim> struct TileConfig;
template <> struct TileConfig<64>  { static constexpr int kBlockN = 128, kStages = 2; };
template <> struct TileConfig<128> { static constexpr int kBlockN = 128, kStages = 2; };

// Named barrier ids (cutlass::arch::NamedBarrier adds the ids CUTLASS reserves; 0 is __syncthreads).
enum class NamedBarriers : uint32_t {
  kMmaTurn0 = 0,  // consumer warpgroup 0 may issue its GEMMs (ping-pong), 256 threads
  kMmaTurn1 = 1,  // consumer warpgroup 1 may issue its GEMMs
  kEpilogue0 = 2, // consumer warpgroup 0's O tile is complete in shared memory, 128 threads
  kEpilogue1 = 3,
};

template <int kHeadDim_, class Element_>
struct Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = TileConfig<kHeadDim>::kBlockN;
  static constexpr int kStages = TileConfig<kHeadDim>::kStages;
  static constexpr int kNConsumerWarpGroups = kBlockM / 64;
  static constexpr int kNConsumerThreads = 128 * kNConsumerWarpGroups;
  static constexpr int kNThreads = 128 + kNConsumerThreads;  // producer warpgroup first
  // setmaxnreg: the producer warpgroup only issues TMA; the consumers take the rest of the register
  // file (128 x 24 + 256 x 240 = 64512 of 65536), FlashAttention-3's split.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(kNConsumerWarpGroups == 2, "ping-pong between two consumer warpgroups");
  static_assert(kHeadDim % 32 == 0, "a 64- or 128-byte swizzle atom spans the columns");
  // Ping-pong: the consumer warpgroups take turns issuing their GEMMs (sm90ws/consumer.h, MmaTurns).
  // false lets both issue whenever their operands are ready, for measuring what the turns buy.
  static constexpr bool kPingPong = true;

  // ---- MMA: S = Q K^T (both from shared memory), O += P V (P from registers) ------------------------
  // Warpgroup w of the consumers owns rows [64w, 64w + 64): the atom layout stacks the two along M.
  using AtomLayout = Layout<Shape<Int<kNConsumerWarpGroups>, _1, _1>>;
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(),
      AtomLayout{}));
  // V is stored as rows of head_dim (the N index of P V is contiguous): an MN-major B operand.
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayout{}));

  // ---- Shared layouts: one layout per tile, written by TMA and read by wgmma ------------------------
  // 8 rows x 64 columns with the 16-byte chunk XORed by the row (128-byte swizzle), K-major; rows of
  // 32 (mod 64) columns (d = 96) take the 64-byte swizzle.
  using SmemLayoutAtom = cute::conditional_t<kHeadDim % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                             GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;  // (kBlockN, d, stage), as TMA writes it
  // The same bytes as (d, kBlockN, stage): the B operand of P V.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{},
                                 Stride<Int<kBlockN>, _1, Int<kBlockN * kHeadDim>>{})));
  // The O tile is staged over the Q tile (same layout): each consumer warpgroup overwrites its own 64
  // rows once its last S = Q K^T has completed.
  using SmemLayoutO = SmemLayoutQ;
  using SmemCopyAtomO = Copy_Atom<UniversalCopy<uint32_t>, Element>;  // two columns a store
  // Shared -> global for one warpgroup's 64 rows: 16 bytes a thread, whole rows.
  static constexpr int kThreadsPerRowO = kHeadDim / 8;
  static_assert(128 % kThreadsPerRowO == 0, "whole rows per pass of the warpgroup (d = 96, 192: another layout)");
  using GmemTiledCopyO = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{},
      Layout<Shape<Int<128 / kThreadsPerRowO>, Int<kThreadsPerRowO>>, Stride<Int<kThreadsPerRowO>, _1>>{},
      Layout<Shape<_1, _8>>{}));

  // ---- TMA: q, k, v seen as (row, dim, head, batch) tensors, one descriptor each ---------------------
  using ShapeRDHB = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideRDHB = cute::Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeRDHB{},
                                          StrideRDHB{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutK{}),
                                       Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesKV = kBlockN * kHeadDim * sizeof(Element);  // out-of-range rows count too

  // ---- Pipelines: K and V each a ring of kStages buffers (full: TMA landed; empty: both consumer
  // warpgroups are done reading) ------------------------------------------------------------------------
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  struct SharedStorage {
    // 1024-byte alignment: the 128-byte swizzle repeats every 8 rows of 128 bytes, by address.
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q;  // Q landed (one phase: Q loads once)
    alignas(16) typename Pipeline::SharedStorage pipeline_k;
    alignas(16) typename Pipeline::SharedStorage pipeline_v;
  };
  static constexpr int kSmemSize = sizeof(SharedStorage);
  static_assert(kSmemSize <= 227 * 1024, "one CTA per SM fits its shared memory");
};

// What the kernel receives: the run-time problem and the three TMA descriptors (in parameter space,
// __grid_constant__, where TMA reads them).
template <class Traits>
struct KernelParams {
  FwdParams fwd;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
};

}  // namespace cutlassfa::sm90ws
