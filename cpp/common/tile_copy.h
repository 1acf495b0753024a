// The copy side of a FlashAttention tile that every tensor-core family shares: 128-byte swizzled
// shared-memory layouts of the Q, K, V and O tiles, the cp.async global -> shared copy of Q/K/V rows,
// and the O staging copies of the epilogue. A family's traits add their MMA on top of this.
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/numeric_types.h>

namespace cutlassfa {

using namespace cute;

// kNThreads threads move (kBlockM or kBlockN) x kHeadDim tiles of Element; O is written in ElementOut.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNThreads_, class Element_, class ElementOut_>
struct TileCopyTraits {
  using Element = Element_;
  using ElementOut = ElementOut_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNThreads = kNThreads_;
  static_assert(kHeadDim % 32 == 0, "head dim must be a multiple of 32 (one swizzle atom)");

  // ---- Shared memory: Q, K, V --------------------------------------------------------------------
  // Atoms are 8 rows x 64 elements (128 B per row) with Swizzle<3,3,3>: the 16-byte chunk index is
  // XORed with the row index, so the 8 rows an ldmatrix phase reads (and the 8 chunks a cp.async
  // warp writes) land in 8 different bank groups. For d = 32 a row is 64 B, two rows share one
  // 128-B bank line, so Swizzle<2,3,3> XORs the 2 chunk bits with (row / 2).
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzle = kBlockKSmem == 32 ? 2 : 3;
  using SmemLayoutAtomQKV = decltype(composition(
      Swizzle<kSwizzle, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtomQKV{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtomQKV{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // ---- Shared memory: O staging for the epilogue (aliases Q, and K too when O is fp32) ------------
  // 128-byte rows again: 64 x 16-bit with Swizzle<3,3,3>, 32 x fp32 with Swizzle<3,2,3> (4-float
  // chunks), 32 x 16-bit for d = 32 with Swizzle<2,3,3>.
  // 16-bit rows of d = 96 take the 64-byte (32-column) atom: 96 is not a multiple of 64.
  static constexpr int kBlockKSmemO = sizeof(ElementOut) == 2 && kHeadDim % 64 != 0
                                          ? 32
                                          : cute::min(kHeadDim, 128 / static_cast<int>(sizeof(ElementOut)));
  static constexpr int kSwizzleO = kBlockKSmemO * static_cast<int>(sizeof(ElementOut)) == 64 ? 2 : 3;
  static constexpr int kSwizzleBaseO = sizeof(ElementOut) == 4 ? 2 : 3;
  using SmemLayoutAtomO = decltype(composition(
      Swizzle<kSwizzleO, kSwizzleBaseO, 3>{}, Layout<Shape<_8, Int<kBlockKSmemO>>, Stride<Int<kBlockKSmemO>, _1>>{}));
  using SmemLayoutO = decltype(tile_to_shape(SmemLayoutAtomO{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));


  // ---- Copies --------------------------------------------------------------------------------------
  // Registers -> shared for O: each thread holds 2 adjacent columns of an accumulator row.
  using SmemCopyAtomO = Copy_Atom<UniversalCopy<cute::uint_bit_t<2 * sizeof_bits_v<ElementOut>>>, ElementOut>;

  // Global -> shared: cp.async of 16 bytes per thread, bypassing L1 (.cg) since every tile is read
  // once per CTA. Threads of one row cover one 128-B (64-B for d = 32) swizzle-atom row.
  static constexpr int kGmemElemsPerLoad = 16 / sizeof(Element);
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  static_assert(kNThreads % kGmemThreadsPerRow == 0);
  using GmemLayoutAtom = Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
                                Stride<Int<kGmemThreadsPerRow>, _1>>;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{}, GmemLayoutAtom{},
      Layout<Shape<_1, Int<kGmemElemsPerLoad>>>{}));
  static_assert(kBlockM % (kNThreads / kGmemThreadsPerRow) == 0);
  static_assert(kBlockN % (kNThreads / kGmemThreadsPerRow) == 0);

  // Shared -> global for O: 16-byte vector stores, threads of a row cover one 128-B atom row.
  static constexpr int kGmemElemsPerStoreO = 16 / sizeof(ElementOut);
  static constexpr int kGmemThreadsPerRowO = kBlockKSmemO / kGmemElemsPerStoreO;
  using GmemLayoutAtomO = Layout<Shape<Int<kNThreads / kGmemThreadsPerRowO>, Int<kGmemThreadsPerRowO>>,
                                 Stride<Int<kGmemThreadsPerRowO>, _1>>;
  using GmemTiledCopyO = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<cute::uint128_t>, ElementOut>{}, GmemLayoutAtomO{},
      Layout<Shape<_1, Int<kGmemElemsPerStoreO>>>{}));
  static_assert(kBlockM % (kNThreads / kGmemThreadsPerRowO) == 0);
};

}  // namespace cutlassfa
